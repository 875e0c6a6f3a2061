"""``SandboxPool``: warm sandboxes on one host, each handed out once.

A pool keeps ``size`` sandboxes ready: opened (container started, supervisor connected) and
with the login-shell snapshot taken, each on a private copy of the workspace template (or an
empty directory, or one a factory filled). ``async with pool.acquire() as sb`` takes one at
once when one is ready, else waits (at most ``acquire_timeout_s``: ``PoolExhaustedError``
names what the pool holds and its last failure). A released sandbox is never handed out
again: it is closed in the background (every process of it killed, its container removed,
its workspace deleted) while a fresh one opens in its place, so nothing a command left (a
process, a file in ``/tmp``, a change to the workspace, a tainted root) can reach the next
holder. With ``reset=True`` a released sandbox whose holder only ran plain commands is
instead reset in place where that can be checked (``api.pool_reset``: every process killed,
the scratch directories emptied, every other writable file system as it was made, the
workspace refilled), in milliseconds, and handed on as a new ``Sandbox`` object; any doubt
discards it as above. Opens run ``open_concurrency`` at a time; a failed one is retried with
a growing pause (at most ``MAX_RETRY_S``), and waiting acquirers see its error.

The pool's background work is one anyio task group: ``async with SandboxPool(...) as pool``
(or ``await pool.open()`` / ``await pool.aclose()`` in the same task, no scope entered in
between left open). Closing it closes every sandbox, ready or held (a holder's later calls
then fail as on a closed ``Sandbox``), and removes their workspaces; what could not be
removed is in ``close_errors``.
"""

from __future__ import annotations

import logging
import math
import shutil
import statistics
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc
import anyio.to_thread

from sandboxrun.api import pool_reset
from sandboxrun.api.sandbox import Sandbox
from sandboxrun.engine.capture.spill import SpillSession
from sandboxrun.errors import ConfigError, PoolExhaustedError, SandboxrunError

log = logging.getLogger("sandboxrun")

MAX_RETRY_S = 5.0
"""The longest pause between two failed opens."""
WAITS_KEPT = 1000
"""How many acquire waits ``stats`` summarises (the latest)."""

Template = Path | str | Callable[[Path], None] | None
"""A pooled sandbox's workspace: a directory copied for each one, a callable that fills the
empty directory it is given, or None (an empty one)."""


@dataclass(frozen=True)
class PoolStats:
    """What a pool holds and has done (``SandboxPool.stats``)."""

    size: int
    ready: int
    """Opened, snapshot taken, not handed out."""
    in_use: int
    opening: int
    closing: int
    """Released, being closed (they still count against ``size``)."""
    opened: int
    """Every sandbox this pool opened so far."""
    discarded: int
    """Released (or closed with the pool) and closed."""
    failed_opens: int
    acquired: int
    waiting: int
    """Acquirers waiting now."""
    acquire_wait_p50_s: float | None
    acquire_wait_max_s: float | None
    last_error: str | None
    """The last failed open's error, or None."""
    backend: str | None = None
    """The backend the pool's sandboxes opened on (the one ``auto`` chose), None before the
    first opened."""
    reset: int = 0
    """Released and handed on in place (``reset=True``)."""
    resetting: int = 0
    """Released, being reset."""
    last_discard_reason: str | None = None
    """With ``reset=True``: why the last released sandbox that was discarded could not be
    reset in place (or why this pool's sandboxes never can be)."""


class SandboxPool:
    """Up to ``size`` warm sandboxes, each handed out once. ``workspace``: the template of
    each sandbox's private workspace (``Template``); ``root``: where those workspaces are
    made (a private directory under the system's temporary one by default).
    ``sandbox_options``: what each ``Sandbox`` is made with (``backend``, ``image``,
    ``policy``, ``limits``, ``env``, ...), as ``Sandbox(...)`` takes them (checked at
    ``open``: a bad one is refused there, not retried). ``reset``: hand a released sandbox
    on in place when that can be checked (``api.pool_reset``), else discard it; either way
    a holder's calls after its block fail as on a closed ``Sandbox``."""

    def __init__(
        self,
        size: int,
        *,
        workspace: Template = None,
        acquire_timeout_s: float = 60.0,
        open_concurrency: int = 2,
        root: Path | str | None = None,
        reset: bool = False,
        **sandbox_options: Any,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(
                f"SandboxPool size must be a whole number of at least 1, got {size!r}"
            )
        check_wait(acquire_timeout_s, "acquire_timeout_s", zero=False)
        if (
            isinstance(open_concurrency, bool)
            or not isinstance(open_concurrency, int)
            or open_concurrency < 1
        ):
            raise ConfigError(
                f"open_concurrency must be a whole number of at least 1, got {open_concurrency!r}"
            )
        for taken in ("workspace", "detach", "name"):
            if taken in sandbox_options:
                raise ConfigError(f"SandboxPool takes no {taken!r} for its sandboxes")
        if isinstance(workspace, (str, Path)) and not Path(workspace).is_dir():
            raise ConfigError(
                f"SandboxPool workspace template {str(workspace)!r} is not a directory"
            )
        self.size = size
        self.template = workspace
        self.acquire_timeout_s = acquire_timeout_s
        self.open_concurrency = open_concurrency
        self.sandbox_options = sandbox_options
        if not isinstance(reset, bool):
            raise ConfigError(f"reset must be True or False, got {reset!r}")
        self.reset = reset
        self._baselines: dict[Sandbox, pool_reset.Baseline] = {}
        """The ready and held sandboxes that may be reset in place, with their baselines."""
        self._resetting = 0
        self._discard_reason: str | None = None
        self.close_errors: list[str] = []
        """What closing a sandbox or removing a workspace could not do, one sentence each."""
        self._root_given = None if root is None else Path(root)
        self._root: Path | None = None
        self._group: anyio.abc.TaskGroup | None = None
        self._owner: int | None = None
        """The task that opened the pool (only it may close it: its task group is there)."""
        self._send, self._ready = anyio.create_memory_object_stream[Sandbox](size)
        self._held: set[Sandbox] = set()
        self._every: set[Sandbox] = set()
        """Every sandbox of the pool whose close has not begun (opening, ready, held)."""
        self._closes: dict[Sandbox, anyio.Event] = {}
        """The closes under way, each set once done."""
        self._opening = 0
        self._slots = 0
        """Sandboxes alive or on their way (opening, ready, held, closing): at most ``size``."""
        self._want = anyio.Event()
        """Set when the pool may be short of sandboxes (the filler looks again)."""
        self._closing = False
        self._closed = anyio.Event()
        self._counts = {"opened": 0, "discarded": 0, "failed_opens": 0, "acquired": 0, "reset": 0}
        self._waiting = 0
        self._waits: deque[float] = deque(maxlen=WAITS_KEPT)
        self._last_error: str | None = None
        self._failed_in_a_row = 0
        self._backend: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def open(self) -> Self:
        """Start filling the pool (it returns at once: ``acquire`` waits for the first). The
        options of the sandboxes are checked first: a bad one raises here."""
        if self._group is not None or self._closing:
            raise RuntimeError("a SandboxPool is opened once")
        with tempfile.TemporaryDirectory(prefix="sandboxrun-pool-check-") as probe:
            Sandbox(probe, **self.sandbox_options)  # (made, never opened: nothing to close)
        self._root = self._root_given or Path(tempfile.mkdtemp(prefix="sandboxrun-pool-"))
        self._root.mkdir(mode=0o700, parents=True, exist_ok=True)
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        self._owner = anyio.get_current_task().id
        group.start_soon(self._fill)
        return self

    async def aclose(self) -> None:
        """Close every sandbox of the pool, ready or held, at once, and remove their
        workspaces (idempotent; it finishes even when cancelled). In the task that opened
        the pool (``RuntimeError`` elsewhere, before anything is touched)."""
        if self._closing:
            with anyio.CancelScope(shield=True):
                await self._closed.wait()
            return
        if self._owner is not None and anyio.get_current_task().id != self._owner:
            raise RuntimeError(
                "a SandboxPool is closed by the task that opened it (its task group is "
                "there): use `async with SandboxPool(...)`"
            )
        self._closing = True
        self._want.set()
        group, self._group = self._group, None
        try:
            if group is not None:
                group.cancel_scope.cancel()  # the filler and the opens under way
                await group.__aexit__(None, None, None)
        finally:
            with anyio.CancelScope(shield=True):
                self._send.close()
                async with anyio.create_task_group() as closing:
                    for sb in list(self._every):
                        closing.start_soon(self._release, sb)
                for done in list(self._closes.values()):
                    await done.wait()
                while True:  # the ready ones were closed above: forget them
                    try:
                        self._ready.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                self._ready.close()
                root = self._root
                if root is not None and self._root_given is None:
                    await anyio.to_thread.run_sync(self._remove, root)
                self._closed.set()

    # -- handing out ---------------------------------------------------------------------------
    @asynccontextmanager
    async def acquire(self, timeout_s: float | None = None) -> AsyncIterator[Sandbox]:
        """A ready sandbox for the block; closed and replaced after it. ``timeout_s``: the
        longest wait (default ``acquire_timeout_s``; 0: only one ready now):
        ``PoolExhaustedError`` past it."""
        wait = self.acquire_timeout_s if timeout_s is None else timeout_s
        check_wait(wait, "timeout_s", zero=True)
        sb = await self._take(wait)
        try:
            yield sb
        finally:
            self._held.discard(sb)
            handed = self._retire(sb)  # (at once: the holder's reference is dead from here)
            if self._group is not None and not self._closing:
                self._group.start_soon(self._release, sb, handed)
            else:
                await self._release(sb, handed)

    async def _take(self, timeout_s: float) -> Sandbox:
        if self._group is None or self._closing:
            raise RuntimeError("the SandboxPool is not open (use `async with SandboxPool(...)`)")
        began = time.monotonic()
        self._waiting += 1
        try:
            try:
                sb = self._ready.receive_nowait()
            except anyio.WouldBlock:
                with anyio.move_on_after(timeout_s):
                    sb = await self._ready.receive()  # cancellation-safe: nothing is lost
                    return self._handed(sb, began)
            else:
                return self._handed(sb, began)
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise RuntimeError("the SandboxPool was closed") from None
        finally:
            self._waiting -= 1
        raise PoolExhaustedError(self._exhausted(timeout_s))

    def _handed(self, sb: Sandbox, began: float) -> Sandbox:
        self._held.add(sb)  # (no await since the receive: a cancel cannot drop it)
        self._counts["acquired"] += 1
        self._waits.append(time.monotonic() - began)
        return sb

    def _exhausted(self, timeout_s: float) -> str:
        s = self.stats()
        why = f"; the last open failed: {s.last_error}" if s.last_error else ""
        return (
            f"no sandbox of the pool was ready within {timeout_s:g}s (size {s.size}: "
            f"{s.in_use} in use, {s.opening} opening, {s.waiting} waiting){why}"
        )

    def stats(self) -> PoolStats:
        waits = list(self._waits)
        ready = self._ready.statistics().current_buffer_used
        return PoolStats(
            size=self.size,
            ready=ready,
            in_use=len(self._held),
            opening=self._opening,
            closing=len(self._closes),
            opened=self._counts["opened"],
            discarded=self._counts["discarded"],
            failed_opens=self._counts["failed_opens"],
            acquired=self._counts["acquired"],
            waiting=self._waiting,
            acquire_wait_p50_s=statistics.median(waits) if waits else None,
            acquire_wait_max_s=max(waits) if waits else None,
            last_error=self._last_error,
            backend=self._backend,
            reset=self._counts["reset"],
            resetting=self._resetting,
            last_discard_reason=self._discard_reason,
        )

    # -- filling -------------------------------------------------------------------------------
    async def _fill(self) -> None:
        """Keep ``size`` sandboxes in the pool (ready, held, opening or closing), opening at
        most ``open_concurrency`` at once."""
        assert self._group is not None
        while not self._closing:
            self._want = anyio.Event()
            for _ in range(min(self.size - self._slots, self.open_concurrency - self._opening)):
                self._opening += 1
                self._slots += 1
                self._group.start_soon(self._open_one)
            await self._want.wait()

    async def _open_one(self) -> None:
        """One sandbox into the pool; a failure is kept (``last_error``) and its slot held
        for a growing pause (no storm of opens), then freed for another try."""
        assert self._root is not None
        workspace = Path(tempfile.mkdtemp(prefix="ws-", dir=self._root))
        sb: Sandbox | None = None
        try:
            await anyio.to_thread.run_sync(self._fill_workspace, workspace)
            sb = Sandbox(workspace, **self.sandbox_options)
            self._every.add(sb)
            await sb.open()
            warm = await sb.exec(["true"])  # the login-shell snapshot taken now, not at first use
            if not warm.ok:
                raise PoolOpenError(f"its first command ended {warm.status}: {warm.error or ''}")
            if self.reset:
                base, why = await pool_reset.baseline(sb)
                if base is not None:
                    self._baselines[sb] = base
                elif why != self._discard_reason:
                    self._discard_reason = why
                    log.info("sandboxrun: pooled sandboxes are not reset in place: %s", why)
        except anyio.get_cancelled_exc_class():
            self._opening -= 1
            await self._discard(sb, workspace, failed=True)
            raise
        except Exception as exc:  # a failed open: retried after a pause, its error kept
            self._counts["failed_opens"] += 1
            self._failed_in_a_row += 1
            self._last_error = f"{type(exc).__name__}: {exc}"
            pause = min(MAX_RETRY_S, 0.1 * 2 ** min(self._failed_in_a_row, 8))
            await self._discard(sb, workspace, failed=True, free=False)
            try:  # the slot stays taken meanwhile: no other open starts in its place
                await anyio.sleep(pause)
            finally:
                self._opening -= 1
                self._free()
            return
        self._opening -= 1
        self._failed_in_a_row = 0
        self._counts["opened"] += 1
        self._backend = sb.backend.name
        self._want.set()  # room for the next open, if the pool is still short
        try:
            self._send.send_nowait(sb)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            await self._release(sb)  # (the pool is closing)

    def _fill_workspace(self, path: Path) -> None:
        template = self.template
        if isinstance(template, (str, Path)):
            shutil.copytree(template, path, symlinks=True, dirs_exist_ok=True)
        elif template is not None:
            template(path)

    def _retire(self, sb: Sandbox) -> Handoff | None:
        """A released ``sb`` that may be reset in place: a new ``Sandbox`` object on its
        backend (``Sandbox._adopt``: only an idle one), to be reset; None when it is
        discarded (why: ``last_discard_reason``). No await: the released object is closed
        for its holder before the holder's next step, whatever happens next."""
        sb._retired = True  # (its calls fail from here; the pool's close of it works)
        base = self._baselines.pop(sb, None)
        if base is None or self._closing:
            return None
        why = sb._taint
        if why is None:
            try:
                fresh = Sandbox(sb.workspace.root, **self.sandbox_options)
                spill = fresh._adopt(sb)  # (RuntimeError: a command of it still runs)
            except Exception as exc:  # (or the workspace gone, say): discarded
                why = f"it could not be handed on: {exc or type(exc).__name__}"
            else:
                self.close_errors += sb.close_errors
                self._every.discard(sb)
                self._every.add(fresh)
                return Handoff(fresh, base, spill, sb.keep_spill)
        self._discard_reason = why
        return None

    async def _release(self, sb: Sandbox, handed: Handoff | None = None) -> None:
        """Reset ``handed`` (``_retire``) and put it among the ready ones, or close and
        replace ``sb`` (or the reset one when its reset finds it unclean)."""
        if handed is None:
            await self._discard(sb, sb.workspace.root)
            return
        fresh, base, spill = handed.sandbox, handed.baseline, handed.spill
        with anyio.CancelScope(shield=True):  # (bounded: the listing's timeout)
            if spill is not None:
                keep = handed.keep_spill
                await anyio.to_thread.run_sync(lambda: spill.close(keep=keep))
            if self._closing:  # no reset to hand it on to nobody: closed with the pool
                await self._discard(fresh, fresh.workspace.root)
                return
            self._resetting += 1
            try:
                why = await pool_reset.reset(fresh, base, self._fill_workspace)
            except Exception as exc:  # never the pool's end: discarded
                why = f"its reset failed: {type(exc).__name__}: {exc}"
            finally:
                self._resetting -= 1
        if why is None and not self._closing:
            self._baselines[fresh] = base
            try:
                self._send.send_nowait(fresh)
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._baselines.pop(fresh, None)
            else:
                self._counts["reset"] += 1
                return
        self._discard_reason = why or self._discard_reason
        await self._discard(fresh, fresh.workspace.root)

    async def _discard(
        self,
        sb: Sandbox | None,
        workspace: Path | None,
        *,
        failed: bool = False,
        free: bool = True,
    ) -> None:
        """Close ``sb`` (every process of it killed, its container removed), remove its
        ``workspace`` and free its slot (``free``): the filler then opens another. Once per
        sandbox: a second call waits for the first's end."""
        with anyio.CancelScope(shield=True):
            if sb is not None:
                if sb in self._closes:
                    await self._closes[sb].wait()
                    return
                if sb not in self._every:
                    return
                self._every.discard(sb)  # (before any await: nobody closes it twice)
                done = self._closes[sb] = anyio.Event()
            try:
                if sb is not None:
                    await sb.aclose()
                    self.close_errors += sb.close_errors
            except Exception as exc:  # never the pool's end: what it left is said
                self.close_errors.append(f"a pooled sandbox did not close: {exc}")
                log.warning("sandboxrun: a pooled sandbox did not close: %s", exc)
            finally:
                try:
                    if workspace is not None:
                        await anyio.to_thread.run_sync(self._remove, workspace)
                except Exception as exc:  # (said; the slot is freed all the same)
                    self.close_errors.append(f"could not remove the pooled workspace: {exc}")
                    log.warning("sandboxrun: could not remove the pooled workspace: %s", exc)
                finally:
                    if sb is not None:
                        self._counts["discarded"] += 0 if failed else 1
                        self._closes.pop(sb, None)
                        done.set()
                    if free:
                        self._free()

    def _free(self) -> None:
        self._slots -= 1
        self._want.set()

    def _remove(self, path: Path) -> None:
        """Remove the tree at ``path``, making its directories writable where a command took
        that away; what is left is said (``close_errors``, the log)."""
        pool_reset.remove_tree(path)
        if path.exists():
            message = f"could not remove the pooled workspace {path}"
            self.close_errors.append(message)
            log.warning("sandboxrun: %s", message)


@dataclass(frozen=True)
class Handoff:
    """A released sandbox on its way to the next holder (``SandboxPool._retire``)."""

    sandbox: Sandbox
    """The new object on the released one's backend."""
    baseline: pool_reset.Baseline
    spill: SpillSession | None
    """The released object's spill directory, closed before the reset."""
    keep_spill: bool


def check_wait(value: float, name: str, *, zero: bool) -> None:
    """A wait in seconds: finite, positive (or 0 where ``zero``)."""
    ok = isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
    if not ok or (value == 0 and not zero):
        least = "0 or more" if zero else "more than 0"
        raise ConfigError(f"{name} must be a number of seconds, {least}, got {value!r}")


class PoolOpenError(SandboxrunError):
    """A pooled sandbox opened but could not run its first command (retried)."""
