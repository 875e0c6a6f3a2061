"""The process-group backend: the local fallback that always works.

Commands run in a new session under a private runner process (``sandboxrun/_runner.py``) that
is a child subreaper: descendants that double-fork or ``setsid`` re-parent to it and stay
visible, and termination sweeps the whole tree. It gives ``own-session`` and
``descendant-sweep``; it cannot confine the filesystem, the network or resources.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import time
from contextlib import suppress
from pathlib import Path

import anyio
import anyio.to_thread
import psutil

from sandboxrun.argv import join_path_prepend, shell_argv, wrapper_env
from sandboxrun.backends import Probe
from sandboxrun.capture import StreamCapture
from sandboxrun.errors import BackendError
from sandboxrun.isolation import LocalPlan, plan_for, probe_host
from sandboxrun.models import BackendName, ExecResult, Policy
from sandboxrun.pipes import FdPump, output_pipe
from sandboxrun.process import (
    KILL_BUDGET_S,
    RunFacts,
    Termination,
    build_result,
    captures,
    finish_result,
    sandbox_error_result,
    supervise_request,
)
from sandboxrun.runner_client import Channel, RunnerClient
from sandboxrun.spec import ExecRequest

MARKER_VAR = "SANDBOXRUN_RUN_ID"
ISOLATION = ("own-session", "descendant-sweep")
SPAWN_TIMEOUT_S = 10.0
ANSWER_MARGIN_S = 5.0


def probe_pgroup(policy: Policy | None = None) -> Probe:
    if not sys.platform.startswith("linux") or not Path("/proc/self/stat").exists():
        return Probe("process-group", False, "needs Linux with /proc", ())
    support = probe_host()
    layers = support.layers(policy or Policy())
    return Probe("process-group", True, None, (*ISOLATION, *layers), support)


def spawn_exit_code(err: int) -> int:
    """Shell conventions: 127 not found, 126 found but not executable / not runnable."""
    return 127 if err in (errno.ENOENT, errno.ENOTDIR) else 126


class _Run:
    """The ``RunHandle`` of one command under the runner."""

    def __init__(
        self,
        client: RunnerClient,
        channel: Channel,
        streams: list[tuple[int, StreamCapture]],
        stdin: tuple[int, bytes] | None,
    ) -> None:
        self._client = client
        self._channel = channel
        self._pump = FdPump(streams, stdin)
        self._termination: Termination | None = None

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
        return Termination(
            survivors=int(done["survivors"]),
            cpu_s=round(float(done["cpu_s"]), 6),
            peak_rss_bytes=int(rss) * 1024 if rss else None,
        )

    def close_stdin(self) -> None:
        self._pump.close_stdin()

    async def pump(self) -> None:
        await self._pump.pump()


def local_env(request: ExecRequest, plan: LocalPlan | None = None) -> dict[str, str]:
    """The command's environment on the host: the built env (with the sandbox's private
    ``HOME`` and ``TMPDIR`` under the isolation layer), the run marker, PATH prepends
    (in shell mode applied by the login shell after the profile, which also re-applies an
    explicit PATH: the profile may assign PATH)."""
    env = dict(request.env) if plan is None else plan.command_env(request.env, request.explicit)
    env[MARKER_VAR] = request.run_id
    if request.script is not None:
        explicit = env.get("PATH") if "PATH" in request.explicit else None
        env.update(wrapper_env(explicit_path=explicit, prepend=request.path_prepend))
    elif request.path_prepend:
        joined = join_path_prepend(request.path_prepend)
        env["PATH"] = f"{joined}:{env['PATH']}" if env.get("PATH") else joined
    return env


def local_command(request: ExecRequest) -> list[str]:
    """The argv that runs ``request`` on the host (argv mode as is; shell mode via bash/sh)."""
    if request.script is None:
        assert request.argv is not None
        return list(request.argv)
    shell = shutil.which("bash", path=request.env.get("PATH")) or shutil.which(
        "sh", path=request.env.get("PATH")
    )
    return shell_argv(request.script, shell=shell or "/bin/sh")


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


class ProcessGroupBackend:
    name: BackendName = "process-group"

    def __init__(
        self,
        grace_s: float = 3.0,
        policy: Policy | None = None,
        workspace: Path | None = None,
        tools: tuple[str, ...] = (),
    ) -> None:
        self._plan = plan_for(policy, workspace, tools)
        self._client = RunnerClient(self._plan)
        self._grace_s = grace_s
        self._layers: list[str] = []

    async def open(self) -> None:
        await self._client.start()
        self._layers = self._client.layers_in_force()

    async def close(self) -> None:
        # Closing terminates what still runs: give it the grace and the kill budget.
        await self._client.close(self._grace_s + KILL_BUDGET_S + ANSWER_MARGIN_S + 10.0)

    def isolation(self, request: ExecRequest) -> list[str]:
        return [*ISOLATION, *self._layers]

    def command(self, request: ExecRequest) -> list[str]:
        return local_command(request)

    def describe(self, request: ExecRequest) -> list[str]:
        return self.command(request)

    def check_request(self, request: ExecRequest) -> None:
        """Any bytes can be carried (argv, env and cwd are passed as bytes): nothing to refuse."""

    async def exec(
        self, request: ExecRequest, facts: RunFacts
    ) -> tuple[ExecResult, BaseException | None]:
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
            channel = self._client.open_channel(request.run_id)
            try:
                with anyio.CancelScope(shield=True):
                    try:
                        spawn_error = await self._spawn(channel, request, [in_r, out_w, err_w])
                    except BackendError as exc:
                        return sandbox_error_result(facts, out, err, started, exc), None
                    for fd in (in_r, out_w, err_w):
                        fds.remove(fd)
                        os.close(fd)
                if spawn_error is not None:
                    return spawn_error_result(facts, spawn_error, out, err, started), None
                run = _Run(
                    self._client,
                    channel,
                    [(out_r, out), (err_r, err)],
                    None if request.stdin is None else (in_w, request.stdin),
                )
                if request.stdin is not None:
                    fds.remove(in_w)  # the pump owns it now
                try:
                    sup = await supervise_request(run, request, started)
                finally:
                    run.close_stdin()
            finally:
                self._client.close_channel(request.run_id)
        finally:
            for fd in fds:
                with suppress(OSError):
                    os.close(fd)
            out.close()
            err.close()
        return build_result(facts, sup, out, err), sup.cancel_exc

    async def _spawn(
        self, channel: Channel, request: ExecRequest, stdio: list[int]
    ) -> dict[str, object] | None:
        """Send the spawn; return the runner's spawn_error message, or None when it started."""
        message = {
            "argv": self.command(request),
            "env": local_env(request, self._plan),
            "cwd": str(request.workdir),
            "grace": request.limits.grace_s,
        }
        await self._client.spawn(channel, message, stdio)
        with anyio.move_on_after(SPAWN_TIMEOUT_S):
            await self._client.wait_for(lambda: channel.spawned is not None or channel.lost)
        if channel.spawned is None:
            with suppress(BackendError):  # should it spawn late, it must not run unwatched
                await self._client.terminate(channel.run_id, 0.0)
            raise BackendError(self._client.dead or "the runner did not answer the spawn request")
        return channel.spawned if channel.spawned["op"] == "spawn_error" else None


def spawn_error_result(
    facts: RunFacts,
    reply: dict[str, object],
    out: StreamCapture,
    err: StreamCapture,
    started: float,
) -> ExecResult:
    code = reply.get("errno")
    return finish_result(
        facts,
        status="spawn_error",
        exit_code=spawn_exit_code(code if isinstance(code, int) else 0),
        stdout=out,
        stderr=err,
        duration_s=time.monotonic() - started,
        error=str(reply.get("error")),
    )
