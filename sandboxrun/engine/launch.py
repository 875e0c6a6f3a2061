"""What a backend plans for one run (``Launch``) and the run's standard streams (``Stdio``):
the two captures, and on demand the pipes a backend hands to the command, owned here so that
every descriptor is closed on every path (trio's two exit stacks, ``_subprocess.py``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field

from sandboxrun.engine.capture.pipes import FdPump, output_pipe
from sandboxrun.engine.capture.pty_pump import PtyPump
from sandboxrun.engine.capture.spill import SpillDir, default_spill_root
from sandboxrun.engine.capture.stream import Activity, StreamCapture
from sandboxrun.engine.request import ExecRequest, StdinStream
from sandboxrun.engine.results import NotStarted

NO_TERMINAL = (
    "this backend cannot give the command a terminal now (terminals need the sandbox's "
    "supervisor): it was not started"
)


@dataclass(frozen=True)
class Launch:
    """One run as a backend will start it, computed once (``Backend.plan``) from the request:
    pure, so ``--dry-run`` shows exactly what would run."""

    request: ExecRequest
    argv: list[str]
    """The command's own argv (``ExecResult.argv``, before masking)."""
    env: Mapping[str, str]
    cwd: str
    isolation: list[str]
    """The guarantees that would really be enforced for it."""
    via: str
    """How it is started (``ExecResult.via``): supervisor, engine, scope."""
    describe: Callable[[], list[str]] = field(repr=False, compare=False)
    """Makes ``shown`` (only ``--dry-run`` asks: not built for every command)."""
    warnings: tuple[str, ...] = ()
    """What its result says of how it runs (a root invoker's run that stays root: why)."""

    @property
    def shown(self) -> list[str]:
        """The whole argv that would run it (``--dry-run``), before masking."""
        return self.describe()


def captures(request: ExecRequest) -> tuple[StreamCapture, StreamCapture, Activity]:
    """The stdout and stderr captures of one run (spilling under the run's own directory),
    each masking the run's secret values (``redact.redactor_for``; none: no masking at all),
    and the one ``Activity`` both stamp (the idle timeout watches the run as a whole)."""
    from sandboxrun.engine.capture.redact import redactor_for

    limits = request.limits
    spill = SpillDir(limits.spill_dir or default_spill_root(), request.run_id)
    args = (limits.max_output, limits.spill_max, spill, request.sink)
    activity = Activity()
    return (
        StreamCapture("stdout", *args, redactor=redactor_for(request), activity=activity),
        StreamCapture("stderr", *args, redactor=redactor_for(request), activity=activity),
        activity,
    )


@dataclass(frozen=True)
class Pipes:
    """The command's ends (stdin, stdout, stderr: to pass at the spawn, then ``Stdio.sent``)
    and the pump that reads ours into the captures and feeds stdin."""

    child: tuple[int, int, int]
    pump: FdPump


class Stdio:
    """One run's standard streams, opened and closed by ``engine.run``. ``pipes()`` makes the
    pipes for backends that pass descriptors (the supervisor, a scope's launcher); the docker
    engine path reads its exec socket into the captures instead. ``close`` closes whatever is
    still open, whatever happened."""

    def __init__(self, request: ExecRequest) -> None:
        self.request = request
        self.stdout, self.stderr, self.activity = captures(request)
        self._fds: list[int] = []
        self._child: tuple[int, ...] = ()
        self._pump: FdPump | None = None
        self._pty: PtyPump | None = None

    def __enter__(self) -> Stdio:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pipes(self) -> Pipes:
        """The run's pipes (made once): stdout and stderr with non-blocking, enlarged read
        ends; stdin from ``/dev/null``, or a pipe whose write end the pump owns."""
        assert self._pump is None, "the pipes of a run are made once"
        request = self.request
        if request.tty is not None:  # a terminal never silently becomes pipes
            raise NotStarted("sandbox_error", NO_TERMINAL)
        out_r, out_w = output_pipe()
        self._fds += [out_r, out_w]
        err_r, err_w = output_pipe()
        self._fds += [err_r, err_w]
        stdin = None
        if request.stdin is None:
            in_r = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            self._fds.append(in_r)
        else:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            self._fds.append(in_r)
            os.set_blocking(in_w, False)
            stdin = (in_w, request.stdin)  # the pump closes it (close_stdin), never this list
        self._child = (in_r, out_w, err_w)
        self._pump = FdPump([(out_r, self.stdout), (err_r, self.stderr)], stdin)
        return Pipes((in_r, out_w, err_w), self._pump)

    def terminal(self, master: int) -> PtyPump:
        """The run's terminal: ``master`` (received from the supervisor, checked) is owned here
        from now on, read into ``stdout`` and fed from the request's stdin stream; the
        request's ``tty`` control is attached to it until ``close``."""
        assert self._pump is None and self._pty is None, "a run has one set of streams"
        self._fds.append(master)
        os.set_blocking(master, False)
        stdin = self.request.stdin if isinstance(self.request.stdin, StdinStream) else None
        self._pty = PtyPump(master, self.stdout, stdin)
        return self._pty

    def sent(self) -> None:
        """The command has its copies of our child ends (spawned): close ours, so that EOF
        comes when the command's side closes."""
        for fd in self._child:
            self._fds.remove(fd)
            os.close(fd)
        self._child = ()

    def close(self) -> None:
        if self.request.tty is not None:
            self.request.tty.detach()  # before the master closes: nothing reaches a stale fd
        if self._pump is not None:
            self._pump.close_stdin()
        elif self._pty is not None:
            self._pty.close_stdin()
        elif isinstance(self.request.stdin, StdinStream):  # no command ever read it
            self.request.stdin.abort()
        for fd in self._fds:
            with suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self.stdout.close()
        self.stderr.close()
