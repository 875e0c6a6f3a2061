"""A backend that runs nothing, for testing code that drives sandboxrun (an agent loop, an
evaluation pipeline) without an engine: ``Sandbox(workspace, backend=FakeBackend(respond))``.
As httpx ships ``MockTransport``, sandboxrun ships this real, small implementation of its backend
contract (``sandboxrun.backends.base.Backend``): the results are built by the very engine the
real backends use (output accounting, spill files, masking, timeouts, cancellation), only the
command's outcome is scripted.

``respond(launch)`` says what a command does: ``Reply(stdout=..., exit_code=...)``. It sees the
``Launch`` the sandbox planned (``launch.argv``, ``launch.env``, ``launch.cwd``,
``launch.request.stdin``: bytes given to ``exec``; a job's streamed stdin is refused, as by a
command that closed it) and is called as the command starts, which cannot be interrupted: it
must return at once (a command that takes time says so in ``Reply.duration_s``, during which
deadlines and cancellation apply as to a real one). The login-shell snapshot is answered by
the fake itself. Every command started is in ``FakeBackend.launches``.

A fake runs nothing, so nothing can escape it: by default it reports every guarantee a request
asks for (``isolation=`` to test how code handles a backend that lacks some).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio

from sandboxrun.api.login import SCRIPT
from sandboxrun.backends.base import SandboxView
from sandboxrun.engine.launch import Launch, Stdio
from sandboxrun.engine.request import ExecRequest, StdinStream
from sandboxrun.engine.results import NotStarted, Verdict, spawn_exit_code
from sandboxrun.engine.supervise import RunHandle, Supervision, Termination
from sandboxrun.errors import BackendError
from sandboxrun.models import BackendName, required_guarantees

__all__ = ["FakeBackend", "Reply", "Responder"]


@dataclass(frozen=True)
class Reply:
    """What a command does, as a fake runs it."""

    stdout: bytes | str = b""
    stderr: bytes | str = b""
    exit_code: int = 0
    signal: int | None = None
    """Killed by this signal (``signal.SIGTERM``) instead of exiting."""
    duration_s: float = 0.0
    """How long it runs: a timeout, an idle timeout or a cancellation can end it first (then
    it dies of SIGTERM and keeps the output it wrote)."""
    spawn_errno: int | None = None
    """It cannot be executed: ``errno.ENOENT`` (exit code 127), ``errno.EACCES`` (126)."""


Responder = Callable[[Launch], Reply]


def _encode(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


class FakeRun:
    """The ``RunHandle`` of one scripted command."""

    def __init__(self, reply: Reply, stdio: Stdio) -> None:
        self._reply = reply
        self._stdio = stdio
        stdin = stdio.request.stdin
        if isinstance(stdin, StdinStream):  # it reads none: as if it had closed its stdin
            stdin.abort()
        self._status: int | None = None
        self._ended = anyio.Event()
        self._written = False

    async def wait_exit(self) -> int | None:
        if self._status is None:
            with anyio.move_on_after(self._reply.duration_s):
                await self._ended.wait()
        if self._status is None:
            reply = self._reply
            self._status = reply.signal if reply.signal else (reply.exit_code & 0xFF) << 8
        return self._status

    async def terminate(self, grace_s: float) -> Termination:
        if self._status is None:  # still "running": it dies of the TERM
            self._status = int(signal.SIGTERM)
            self._ended.set()
        return Termination()

    async def pump(self) -> None:
        if not self._written:  # written at once, so that a deadline keeps it
            self._written = True
            self._stdio.stdout.feed(_encode(self._reply.stdout))
            self._stdio.stderr.feed(_encode(self._reply.stderr))


def _snapshot_reply(request: ExecRequest) -> Reply | None:
    """The login script's answer (``api.login.SCRIPT``): the shell, and with mode ``env`` the
    environment it was given, as a login shell that sets nothing would print it."""
    argv = request.argv or []
    if request.login != "raw" or argv[:3] != ["/bin/sh", "-c", SCRIPT] or len(argv) < 8:
        return None
    marker, shell, prepend, mode = argv[4:8]
    out = b"\0%s\0%s\0" % (os.fsencode(marker), os.fsencode(shell or "/bin/sh"))
    if mode == "env":
        env = dict(request.env)
        if prepend:
            env["PATH"] = f"{prepend}:{env['PATH']}" if env.get("PATH") else prepend
        items = b"\0".join(os.fsencode(f"{k}={v}") for k, v in env.items())
        out += b"\0%s-env\0%s" % (os.fsencode(marker), items)
    return Reply(stdout=out)


class FakeBackend:
    """``sandboxrun.backends.base.Backend``, scripted by ``respond`` (default: every command
    exits 0 and prints nothing)."""

    name: BackendName = "fake"

    def __init__(
        self, respond: Responder | None = None, *, isolation: Sequence[str] | None = None
    ) -> None:
        self.respond: Responder = respond or (lambda launch: Reply())
        self.isolation = None if isolation is None else list(isolation)
        self.launches: list[Launch] = []
        """Every command started (not the login snapshot), in order."""
        self.opened = False
        self.closed = False

    async def open(self) -> None:
        self.opened, self.closed = True, False

    async def revive(self) -> None:
        if not self.opened or self.closed:
            raise BackendError("the fake sandbox is not open")

    def plan(self, request: ExecRequest) -> Launch:
        if request.argv is not None:
            argv = list(request.argv)
        else:
            argv = [request.login_shell or "/bin/sh", "-c", request.script or ""]
        isolation = self.isolation
        if isolation is None:
            isolation = required_guarantees(request.policy, request.limits)
        return Launch(
            request=request,
            argv=argv,
            env=dict(request.env),
            cwd=str(request.workdir),
            isolation=list(isolation),
            via="fake",
            describe=lambda: list(argv),
        )

    async def start(self, launch: Launch, stdio: Stdio) -> RunHandle:
        reply = _snapshot_reply(launch.request)
        if reply is None:
            reply = self.respond(launch)
            self.launches.append(launch)
        if reply.spawn_errno is not None:
            why = os.strerror(reply.spawn_errno)
            code = spawn_exit_code(reply.spawn_errno)
            raise NotStarted("spawn_error", f"{launch.argv[0]}: {why}", exit_code=code)
        return FakeRun(reply, stdio)

    async def finalize(self, handle: RunHandle, sup: Supervision) -> Verdict:
        return Verdict()

    def view(self) -> SandboxView:
        """The files API sees the host, as over an unconfined local sandbox."""
        return SandboxView(home=None, supervisor=None)

    async def close(self) -> list[str]:
        self.closed = True
        return []
