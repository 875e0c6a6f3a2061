"""One command under a sandbox's supervisor (``sandboxrun/supervisor/runner.py``), for every
backend that has one: process-group (on the host, inside the sandbox's namespaces) and docker
(inside the container). The host makes the run's pipes (``engine.launch.Stdio``), passes their
far ends with the spawn (SCM_RIGHTS), and reads the output straight into its captures; the
supervisor ``execve``s, reports the exact errno of a failed spawn, the exit status and rusage,
and kills the run's tree on request.

The host never trusts the supervisor for more than it must: its frames are bounded and
validated (``RunnerClient``), and a backend can check quiescence itself (``verify``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from typing import Any

import anyio
import anyio.to_thread
import psutil

from sandboxrun.backends.client import Channel, RunnerClient
from sandboxrun.engine.capture.pipes import FdPump
from sandboxrun.engine.capture.pty_pump import PtyPump
from sandboxrun.engine.launch import Launch, Stdio
from sandboxrun.engine.request import ExecRequest
from sandboxrun.engine.results import NotStarted, spawn_exit_code
from sandboxrun.engine.supervise import KILL_BUDGET_S, Termination
from sandboxrun.errors import BackendError
from sandboxrun.supervisor.procfs import MARKER_VAR
from sandboxrun.supervisor.protocol import clip

SPAWN_TIMEOUT_S = 10.0
ANSWER_MARGIN_S = 5.0


class SupervisedRun:
    """The ``RunHandle`` of one command under the supervisor."""

    def __init__(
        self,
        client: RunnerClient,
        channel: Channel,
        pump: FdPump | PtyPump,
        verify: Callable[[str], Awaitable[int]] | None = None,
    ) -> None:
        self._client = client
        self._channel = channel
        self._pump = pump
        self._termination: Termination | None = None
        self._verify = verify
        """After the supervisor said the run is over: find (and kill) what of the run is
        still alive, seen from the host; returns how many could not be killed."""

    @property
    def run_id(self) -> str:
        return self._channel.run_id

    @property
    def client(self) -> RunnerClient:
        return self._client

    def close(self) -> None:
        """The run is over: its channel is forgotten (idempotent)."""
        self._client.close_channel(self._channel.run_id)

    async def wait_exit(self) -> int | None:
        channel = self._channel
        if self._termination is None or channel.terminated is not None:
            await self._client.wait_for(lambda: channel.exited is not None or channel.lost)
        # else: the runner failed to terminate; the marker sweep was the fallback, no status
        return None if channel.exited is None else channel.exited.get("status")

    async def terminate(self, grace_s: float) -> Termination:
        if self._termination is None:
            self._termination = await self._terminate(grace_s)
        return self._termination

    async def _terminate(self, grace_s: float) -> Termination:
        channel = self._channel
        if channel.terminated is None and not channel.lost:
            with suppress(BackendError):
                await self._client.terminate(channel.run_id, grace_s)
        with anyio.move_on_after(grace_s + KILL_BUDGET_S + ANSWER_MARGIN_S):
            await self._client.wait_for(lambda: channel.terminated is not None or channel.lost)
        done = channel.terminated
        if done is None:  # the runner died or does not answer: find the run by its marker
            survivors = await anyio.to_thread.run_sync(sweep_marked, channel.run_id, grace_s)
            reason = self._client.dead or "the runner did not answer the terminate request"
            return Termination(survivors=survivors, error=reason)
        rss = done.get("maxrss_kb")
        survivors, error = _number(done.get("survivors")), None
        if self._verify is not None and not survivors:
            survivors = await self._verify(channel.run_id)
            if survivors:
                error = "the supervisor reported the run over while some of it lived"
        return Termination(
            survivors=survivors,
            cpu_s=round(_number(done.get("cpu_s"), float), 6),
            peak_rss_bytes=int(rss) * 1024 if isinstance(rss, int) and rss > 0 else None,
            error=error,
        )

    async def pump(self) -> None:
        await self._pump.pump()


def _number(value: Any, kind: type = int) -> Any:
    """A count or duration from the supervisor's message: a wrong type or a negative value
    is never believed (0)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return kind(0)
    return kind(value)


async def start_supervised(
    client: RunnerClient,
    launch: Launch,
    stdio: Stdio,
    extra: Mapping[str, object] | None = None,
    verify: Callable[[str], Awaitable[int]] | None = None,
) -> SupervisedRun:
    """Start ``launch`` under ``client``'s supervisor (the spawn's argv, env and cwd from the
    plan, ``extra`` options beside them), its stdio passed with the spawn, or, for a run on a
    terminal (``request.tty``), the master received with the answer. ``NotStarted`` when it
    could not be executed or the supervisor did not answer."""
    request = launch.request
    tty = request.tty
    message: dict[str, Any] = {"argv": launch.argv, "env": launch.env, "cwd": launch.cwd}
    message.update(extra or {})
    pipes = None
    if tty is None:
        pipes = stdio.pipes()
    else:
        message["tty"] = tty.spawn_options()
    channel = client.open_channel(request.run_id, tty=tty is not None)
    try:
        spawned = await _spawn(
            client, channel, request, message, [] if pipes is None else list(pipes.child)
        )
    except BackendError as exc:
        client.close_channel(request.run_id)
        raise NotStarted("sandbox_error", str(exc)) from None
    except BaseException:
        client.close_channel(request.run_id)
        raise
    if spawned is not None:
        client.close_channel(request.run_id)
        if spawned.get("_host"):  # it runs, but the host cannot use what came: end it
            with suppress(BackendError):
                await client.terminate(request.run_id, 0.0)
        code, error = spawned.get("errno"), spawned.get("error")
        raise NotStarted(
            "spawn_error",
            clip(str(error)) if error is not None else "the command could not be started",
            exit_code=spawn_exit_code(code if isinstance(code, int) else 0),
        )
    if pipes is not None:
        stdio.sent()
        return SupervisedRun(client, channel, pipes.pump, verify)
    assert tty is not None and channel.master is not None
    run_id = request.run_id

    async def signaller(sig: int, target: str) -> None:
        await client.signal(run_id, sig, target)

    try:
        master, channel.master = channel.master, None
        pump = stdio.terminal(master)  # owned by the run's streams from here
        tty.attach(master, signaller)
    except BaseException:  # it runs: it must not run unwatched
        client.close_channel(run_id)
        with suppress(BackendError):
            await client.terminate(run_id, 0.0)
        raise
    return SupervisedRun(client, channel, pump, verify)


async def _spawn(
    client: RunnerClient,
    channel: Channel,
    request: ExecRequest,
    message: dict[str, Any],
    stdio: list[int],
) -> dict[str, object] | None:
    """Send the spawn; return the runner's spawn_error message, or None when it started."""
    await client.spawn(channel, {**message, "grace": request.limits.grace_s}, stdio)
    with anyio.move_on_after(SPAWN_TIMEOUT_S):
        await client.wait_for(lambda: channel.spawned is not None or channel.lost)
    if channel.spawned is None:
        with suppress(BackendError):  # should it spawn late, it must not run unwatched
            await client.terminate(channel.run_id, 0.0)
        raise BackendError(
            client.dead
            or f"the sandbox's supervisor did not answer the spawn request within "
            f"{SPAWN_TIMEOUT_S:g} s"
        )
    return channel.spawned if channel.spawned["op"] == "spawn_error" else None


def sweep_marked(run_id: str, grace_s: float) -> int:
    """Last resort when the runner is gone: find the run's processes by their environment
    marker, TERM, grace, KILL. Returns how many are still alive."""

    def marked() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter():
            with suppress(psutil.Error):
                if proc.environ().get(MARKER_VAR) == run_id:
                    found.append(proc)
        return found

    procs = marked()
    for proc in procs:
        with suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with suppress(psutil.Error):
            proc.kill()
    _, alive = psutil.wait_procs(alive, timeout=2.0)
    return len(alive)
