"""One command under a sandbox's supervisor (``sandboxrun/supervisor/runner.py``), for every
backend that
has one: process-group (on the host, inside the sandbox's namespaces) and docker (inside the
container). The host makes the run's pipes, passes their far ends with the spawn (SCM_RIGHTS),
and reads the output straight into its captures; the supervisor ``execve``s, reports the exact
errno of a failed spawn, the exit status and rusage, and kills the run's tree on request.

The host never trusts the supervisor for more than it must: its frames are bounded and
validated (``RunnerClient``), and a backend can check quiescence itself (``Checks.verify``).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import psutil

from sandboxrun.backends.client import Channel, RunnerClient
from sandboxrun.engine.capture.pipes import FdPump, StdinFeed, output_pipe
from sandboxrun.engine.capture.stream import StreamCapture
from sandboxrun.engine.request import ExecRequest
from sandboxrun.engine.supervise import (
    KILL_BUDGET_S,
    RunFacts,
    Termination,
    build_result,
    captures,
    finish_result,
    sandbox_error_result,
    supervise_request,
)
from sandboxrun.errors import BackendError
from sandboxrun.models import ExecResult
from sandboxrun.supervisor.procfs import MARKER_VAR
from sandboxrun.supervisor.runner import clip

SPAWN_TIMEOUT_S = 10.0
ANSWER_MARGIN_S = 5.0


def spawn_exit_code(err: int) -> int:
    """Shell conventions: 127 not found, 126 found but not executable / not runnable."""
    return 127 if err in (errno.ENOENT, errno.ENOTDIR) else 126


@dataclass
class Checks:
    """What a backend adds around a supervised run (all optional)."""

    verify: Callable[[str], Awaitable[int]] | None = None
    """After the supervisor said the run is over: find (and kill) what of the run is still
    alive, seen from the host; returns how many could not be killed."""
    classify: Callable[[ExecResult], Awaitable[ExecResult]] | None = None
    """Turn the result into what really happened (an OOM kill, the sandbox's death)."""
    before: Callable[[], None] | None = None
    """Called before the spawn (e.g. read the OOM counter)."""


class SupervisedRun:
    """The ``RunHandle`` of one command under the supervisor."""

    def __init__(
        self,
        client: RunnerClient,
        channel: Channel,
        streams: list[tuple[int, StreamCapture]],
        stdin: StdinFeed | None,
        verify: Callable[[str], Awaitable[int]] | None = None,
    ) -> None:
        self._client = client
        self._channel = channel
        self._pump = FdPump(streams, stdin)
        self._termination: Termination | None = None
        self._verify = verify

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

    def close_stdin(self) -> None:
        self._pump.close_stdin()

    async def pump(self) -> None:
        await self._pump.pump()


def _number(value: Any, kind: type = int) -> Any:
    """A count or duration from the supervisor's message: a wrong type or a negative value
    is never believed (0)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return kind(0)
    return kind(value)


async def supervised_exec(
    client: RunnerClient,
    request: ExecRequest,
    facts: RunFacts,
    message: dict[str, Any],
    checks: Checks | None = None,
) -> tuple[ExecResult, BaseException | None]:
    """Run ``request`` under ``client``'s supervisor (``message``: the spawn's argv, env, cwd
    and options) and supervise it to its end (``process.supervise``)."""
    checks = checks or Checks()
    started = time.monotonic()
    out, err = captures(request)
    fds: list[int] = []
    try:
        out_r, out_w = output_pipe()
        fds += [out_r, out_w]
        err_r, err_w = output_pipe()
        fds += [err_r, err_w]
        if request.stdin is None:
            in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
            fds.append(in_r)
        else:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            fds += [in_r, in_w]
            os.set_blocking(in_w, False)
        if checks.before is not None:
            checks.before()
        channel = client.open_channel(request.run_id)
        try:
            with anyio.CancelScope(shield=True):
                try:
                    spawn_error = await _spawn(
                        client, channel, request, message, [in_r, out_w, err_w]
                    )
                except BackendError as exc:
                    return sandbox_error_result(facts, out, err, started, exc), None
                for fd in (in_r, out_w, err_w):
                    fds.remove(fd)
                    os.close(fd)
            if spawn_error is not None:
                return spawn_error_result(facts, spawn_error, out, err, started), None
            run = SupervisedRun(
                client,
                channel,
                [(out_r, out), (err_r, err)],
                None if request.stdin is None else (in_w, request.stdin),
                checks.verify,
            )
            if request.stdin is not None:
                fds.remove(in_w)  # the pump owns it now
            try:
                sup = await supervise_request(run, request, started)
            finally:
                run.close_stdin()
        finally:
            client.close_channel(request.run_id)
    finally:
        for fd in fds:
            with suppress(OSError):
                os.close(fd)
        out.close()
        err.close()
    result = build_result(facts, sup, out, err)
    if checks.classify is not None:
        with anyio.CancelScope(shield=True):
            result = await checks.classify(result)
    return result, sup.cancel_exc


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


def spawn_error_result(
    facts: RunFacts,
    reply: dict[str, object],
    out: StreamCapture,
    err: StreamCapture,
    started: float,
) -> ExecResult:
    code = reply.get("errno")
    error = reply.get("error")
    return finish_result(
        facts,
        status="spawn_error",
        exit_code=spawn_exit_code(code if isinstance(code, int) else 0),
        stdout=out,
        stderr=err,
        duration_s=time.monotonic() - started,
        error=clip(str(error)) if error is not None else "the command could not be started",
    )


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
