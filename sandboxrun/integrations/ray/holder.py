"""``Holder``: one warm sandbox slot on a Ray node, the body of a Ray actor.

The driver (``sandboxrun.integrations.ray.pool``) makes it an actor with ``max_restarts=0``
and ``max_task_retries=0`` (an actor task is at most once: a lost actor never runs a command a
second time) and one ``sandbox_slots`` of its node. The actor is async: its methods are tasks
of one asyncio loop, so ``ray.cancel`` reaches a running command as a cancellation, which ends
it the way ``Sandbox.exec`` ends every cancelled run (its whole process tree killed).

Inside, a one-sandbox ``sandboxrun.SandboxPool`` keeps the slot warm: ``fresh`` (each command
in a sandbox no earlier one touched, replaced in the background after it, or reset in place
with ``reset``) or not (commands share the slot's sandbox, which is replaced only when it
broke). A ``session`` holds one
sandbox of its own from ``session_begin`` to ``session_end``. The actor's owner is this
worker process: when Ray kills it (its driver died, its node was lost, ``ray.kill``), every
sandbox of it ends by the supervisor's owner-death rule.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from sandboxrun.api.pool import SandboxPool
from sandboxrun.api.sandbox import Sandbox
from sandboxrun.errors import InputError
from sandboxrun.models import ExecResult

EXEC_OPTIONS = frozenset(
    {"shell", "workdir", "env", "pass_env", "timeout", "stdin", "path_prepend", "idle_timeout"}
)
"""What ``exec`` takes besides argv (a callable, a sink or an escalation hook, cannot cross to
another process)."""


class _Held:
    """A sandbox taken from the slot's pool and kept until ``done`` is set."""

    def __init__(self) -> None:
        self.sandbox: Sandbox | None = None
        self.error: BaseException | None = None
        self.ready = anyio.Event()
        self.done = anyio.Event()
        self.closed = anyio.Event()


class Holder:
    """One slot: see the module. ``options``: ``Sandbox(...)``'s; ``template``: the pooled
    workspaces' (a directory on this node, a callable, or None); ``root``: where they are made
    on this node."""

    def __init__(
        self,
        options: dict[str, Any],
        template: Path | str | Callable[[Path], None] | None,
        root: str | None,
        fresh: bool,
        open_timeout_s: float,
        reset: bool = False,
    ) -> None:
        self.options = options
        self.template = template
        self.root = root
        self.fresh = fresh
        self.reset = reset
        """A released sandbox reset in place where it can be (``SandboxPool(reset=True)``)."""
        self.open_timeout_s = open_timeout_s
        self._pool: SandboxPool | None = None
        self._group: anyio.abc.TaskGroup | None = None
        self._up = anyio.Event()
        self._stop = anyio.Event()
        self._main: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self._shared: _Held | None = None
        self._sessions: dict[str, _Held] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> dict[str, Any]:
        """Open the slot's pool and wait for its first sandbox: what this slot is (node,
        host, pid, backend), or the open's error (the node cannot give this sandbox)."""
        self._main = asyncio.get_running_loop().create_task(self._run())
        await self._up.wait()
        if self._failed is not None:
            raise self._failed
        pool = self._pool
        assert pool is not None
        deadline = time.monotonic() + self.open_timeout_s
        while True:
            stats = pool.stats()
            if stats.ready or stats.in_use:
                break
            if stats.failed_opens or time.monotonic() > deadline:
                why = stats.last_error or f"no sandbox opened within {self.open_timeout_s:g}s"
                raise RuntimeError(f"this node cannot open the sandbox: {why}")
            await anyio.sleep(0.02)
        if not self.fresh:
            await self._hold_shared()
        return self.identity(stats.backend)

    def identity(self, backend: str | None = None) -> dict[str, Any]:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "backend": backend,
        }

    async def _run(self) -> None:
        try:
            async with SandboxPool(
                1,
                workspace=self.template,
                root=self.root,
                acquire_timeout_s=self.open_timeout_s,
                open_concurrency=1,
                reset=self.reset,
                **self.options,
            ) as pool:
                self._pool = pool
                async with anyio.create_task_group() as group:
                    self._group = group
                    self._up.set()
                    await self._stop.wait()
                    group.cancel_scope.cancel()
        except BaseException as exc:
            self._failed = exc
            raise
        finally:
            self._up.set()

    async def stop(self) -> list[str]:
        """Close every sandbox of the slot; what could not be cleaned up, one sentence each."""
        self._stop.set()
        if self._main is not None:
            try:
                await self._main
            except Exception as exc:
                return [f"the slot did not close cleanly: {exc}"]
        return [] if self._pool is None else list(self._pool.close_errors)

    # -- holding ---------------------------------------------------------------------------------
    async def _take(self) -> _Held:
        """A sandbox of the slot's pool, kept by a task of the slot until ``done``."""
        if self._group is None or self._pool is None or self._stop.is_set():
            raise RuntimeError("the slot is not open")
        pool, held = self._pool, _Held()

        async def keep() -> None:
            try:
                async with pool.acquire() as sb:
                    held.sandbox = sb
                    held.ready.set()
                    await held.done.wait()
            except anyio.get_cancelled_exc_class():
                raise  # (the slot closing)
            except Exception as exc:  # said to the waiter; never the slot's end
                held.error = exc
            finally:
                held.ready.set()
                held.closed.set()

        self._group.start_soon(keep)
        try:
            await held.ready.wait()
        except BaseException:  # the waiter cancelled (ray.cancel): the sandbox goes back
            held.done.set()
            raise
        if held.sandbox is None:
            raise RuntimeError(f"the slot could not take a sandbox: {held.error}")
        return held

    async def _hold_shared(self) -> Sandbox:
        held = self._shared
        if held is None or held.done.is_set() or held.sandbox is None:
            held = self._shared = await self._take()
        assert held.sandbox is not None
        return held.sandbox

    def _drop_shared(self) -> None:
        if self._shared is not None:
            self._shared.done.set()
            self._shared = None

    # -- running ---------------------------------------------------------------------------------
    async def exec(self, argv: list[str] | None, options: dict[str, Any]) -> ExecResult:
        """One command in the slot's sandbox (``fresh``: one no command used before)."""
        if self.fresh:
            held = await self._take()
            try:
                assert held.sandbox is not None
                return await _run(held.sandbox, argv, options)
            finally:
                held.done.set()
        sb = await self._hold_shared()
        try:
            result = await _run(sb, argv, options)
        except (TypeError, ValueError, InputError):
            raise  # refused for what it is, before anything ran: the sandbox is intact
        except BaseException:
            self._drop_shared()  # (a cancelled run: its result is the driver's to make)
            raise
        if result.status == "sandbox_error":
            self._drop_shared()  # broken: the next command gets a new one
        return result

    async def session_begin(self, session: str) -> None:
        """A sandbox of the session's own, kept until ``session_end`` (the shared sandbox of
        a slot that is not ``fresh`` is closed first: the session's is new)."""
        self._drop_shared()
        self._sessions[session] = await self._take()  # (cancelled: nothing kept)

    async def alive(self) -> None:
        """Returns when the slot stops: the driver waits on it to see an idle slot's loss."""
        await self._stop.wait()

    async def session_exec(
        self, session: str, argv: list[str] | None, options: dict[str, Any]
    ) -> ExecResult:
        held = self._sessions.get(session)
        if held is None or held.sandbox is None:  # (a session used after its end: refused,
            # nothing of the slot broke; it may serve another caller now)
            raise InputError(f"no session {session!r} in this slot (it has ended)")
        return await _run(held.sandbox, argv, options)

    async def session_end(self, session: str) -> None:
        held = self._sessions.pop(session, None)
        if held is not None:
            held.done.set()
            await held.closed.wait()


async def _run(sb: Sandbox, argv: list[str] | None, options: dict[str, Any]) -> ExecResult:
    unknown = set(options) - EXEC_OPTIONS
    if unknown:
        raise TypeError(f"exec takes no {', '.join(sorted(unknown))} on a Ray pool")
    return await sb.exec(argv, **options)
