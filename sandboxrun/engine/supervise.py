"""Supervision of one running command, shared by every backend.

A backend starts the command and hands back a ``RunHandle``; ``supervise`` then applies the
deadline (and the idle timeout: no output for a while), drains output with a bounded drain
period, terminates the whole managed range (TERM -> grace -> KILL, done by the backend), and
turns cancellation into a shielded, bounded cleanup. ``build_result`` turns the outcome into
the public ``ExecResult``.
"""

from __future__ import annotations

import os
import signal
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import anyio

from sandboxrun.engine.capture.spill import SpillDir, default_spill_root
from sandboxrun.engine.capture.stream import Activity, LiveSink, StreamCapture
from sandboxrun.engine.request import ExecRequest
from sandboxrun.models import BackendName, ExecResult, Status, TimeoutKind

KILL_BUDGET_S = 5.0
"""How long after the grace period SIGKILL is repeated before survivors are reported."""


@dataclass
class Termination:
    """What the backend reports once the managed range is (as far as it can tell) empty."""

    survivors: int = 0
    cpu_s: float | None = None
    peak_rss_bytes: int | None = None
    error: str | None = None


class RunHandle(Protocol):
    """One started command, as a backend exposes it to ``supervise``."""

    async def wait_exit(self) -> int | None:
        """Wait for the main process; return its raw wait status (None: backend lost it)."""

    async def terminate(self, grace_s: float) -> Termination:
        """TERM the whole managed range, wait ``grace_s``, KILL what is left, until empty."""

    async def pump(self) -> None:
        """Read every output stream into its capture until EOF. May be called again."""


Reason = Literal["exited", "timeout", "cancel", "lost"]


@dataclass
class Supervision:
    reason: Reason = "exited"
    timeout_kind: TimeoutKind | None = None
    """With ``reason == "timeout"``: which deadline fired."""
    idle_s: float | None = None
    wait_status: int | None = None
    termination: Termination = field(default_factory=Termination)
    duration_s: float = 0.0
    cancel_exc: BaseException | None = None


async def _quiet_for(activity: Activity, idle_s: float, since: float) -> None:
    """Return once the run has shown no sign of life (``Activity``) for ``idle_s`` seconds,
    counting from ``since`` at the earliest. Wakes about once per ``idle_s``, not per chunk."""
    while True:
        now = time.monotonic()
        quiet = now - max(activity.latest(now), since)
        if quiet >= idle_s:
            return
        await anyio.sleep(idle_s - quiet)


async def _wait_exit(
    handle: RunHandle, sup: Supervision, idle_s: float | None, activity: Activity | None
) -> bool:
    """Wait for the main process into ``sup.wait_status``; True when it exited (or the backend
    lost it), False when the idle watchdog fired first (``sup.timeout_kind == "idle"``)."""
    if idle_s is None or activity is None:
        sup.wait_status = await handle.wait_exit()
        return True
    exited = False

    async def watchdog(scope: anyio.CancelScope) -> None:
        await _quiet_for(activity, idle_s, time.monotonic())
        if not exited:
            sup.timeout_kind = "idle"
            scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watchdog, tg.cancel_scope)
        sup.wait_status = await handle.wait_exit()
        exited = True
        tg.cancel_scope.cancel()
    return exited


async def _drain(handle: RunHandle, drain_s: float) -> None:
    with anyio.move_on_after(drain_s):
        await handle.pump()


async def _deliver_rest(output_done: anyio.Event, drain_s: float, flow: LiveSink) -> None:
    """Nothing of the run is alive, so what is left in the pipes is finite: read it to the end
    while the live sink holds the read loop back (a slow reader, however slow: like ``cat``
    into a pipe), and give up only after ``drain_s`` with neither congestion nor progress."""
    while not output_done.is_set():
        before = flow.progress()
        with anyio.move_on_after(max(drain_s, 0.05)):
            await output_done.wait()
        waiting_on_reader = flow.congested("stdout") or flow.congested("stderr")
        if not waiting_on_reader and flow.progress() == before:
            return


async def uninterruptible(
    action: Callable[[], Awaitable[None]], deadline: float
) -> BaseException | None:
    """Run a cleanup ``action`` to its end (or until ``deadline``), shielded from anyio
    cancellation and restarted on a native one (``task.cancel()`` pierces anyio shields):
    cleanup steps are idempotent, so a restart only finishes what was interrupted. Returns the
    native cancellation that arrived meanwhile, for the caller to re-raise."""
    caught: BaseException | None = None
    while True:
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_at(deadline):
                await action()
            return caught
        except anyio.get_cancelled_exc_class() as exc:
            caught = exc
            if anyio.current_time() >= deadline:
                return caught


async def supervise(
    handle: RunHandle,
    *,
    timeout_s: float,
    grace_s: float,
    drain_s: float,
    started: float,
    flow: LiveSink | None = None,
    idle_s: float | None = None,
    activity: Activity | None = None,
) -> Supervision:
    """Run ``handle`` to its end. Never raises the caller's cancellation: it is returned in
    ``Supervision.cancel_exc`` after the cleanup, for the caller to re-raise.

    With ``idle_s`` (and the captures' shared ``activity``), a run that shows no sign of life
    for ``idle_s`` seconds ends like a timeout (``timeout_kind == "idle"``); the wall-clock
    ``timeout_s`` still applies, whichever fires first.

    With a flow-controlled live sink (``flow``), after a normal exit whose termination left
    nothing alive, the output is read to its end however slow the sink's reader is; the
    duration is taken before that wait. After a timeout or a cancellation, draining stays
    bounded by ``drain_s``: the deadline wins over a slow reader."""
    sup = Supervision(idle_s=idle_s)
    bound = 2 * grace_s + KILL_BUDGET_S + 2 * drain_s + 15.0  # backends' own fallbacks fit
    output_done = anyio.Event()

    async def pump() -> None:
        await handle.pump()
        output_done.set()

    async def after_exit() -> None:
        if sup.reason == "exited":  # let late writers finish, bounded, then sweep the rest
            with anyio.move_on_after(drain_s):
                await output_done.wait()
        sup.termination = await handle.terminate(grace_s)
        if sup.reason == "timeout":
            sup.wait_status = await handle.wait_exit()
        with anyio.move_on_after(drain_s):
            await output_done.wait()

    async def after_cancel() -> None:
        if sup.wait_status is None:
            sup.reason = "cancel"
        sup.termination = await handle.terminate(grace_s)
        if sup.wait_status is None:
            sup.wait_status = await handle.wait_exit()
        await _drain(handle, drain_s)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            exited = False
            with anyio.move_on_after(timeout_s) as deadline:
                exited = await _wait_exit(handle, sup, idle_s, activity)
            if exited:
                sup.timeout_kind = None
                if sup.wait_status is None:
                    sup.reason = "lost"
            elif deadline.cancelled_caught or sup.timeout_kind is not None:
                sup.reason = "timeout"
                sup.timeout_kind = sup.timeout_kind or "wall"
            sup.cancel_exc = await uninterruptible(after_exit, anyio.current_time() + bound)
            sup.duration_s = time.monotonic() - started
            everything_gone = sup.reason == "exited" and not sup.termination.survivors
            if flow is not None and sup.cancel_exc is None and everything_gone:
                await _deliver_rest(output_done, drain_s, flow)
            tg.cancel_scope.cancel()
    except anyio.get_cancelled_exc_class() as exc:
        sup.cancel_exc = exc
        await uninterruptible(after_cancel, anyio.current_time() + bound)
    if not sup.duration_s:
        sup.duration_s = time.monotonic() - started
    return sup


def decode_wait_status(status: int | None) -> tuple[int | None, str | None]:
    """``(exit_code, signal_name)`` from a raw wait status."""
    if status is None:
        return None, None
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    if os.WIFSIGNALED(status):
        return None, signal_name(os.WTERMSIG(status))
    return None, None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


@dataclass
class RunFacts:
    """Everything about a run besides its supervision outcome."""

    backend: BackendName
    argv: list[str]
    run_id: str
    isolation: list[str]
    missing: list[str]
    fallback_reason: str | None
    via: str | None = None
    """How the backend started the command (``ExecResult.via``); set by the backend."""


def build_result(
    facts: RunFacts,
    sup: Supervision,
    stdout: StreamCapture,
    stderr: StreamCapture,
) -> ExecResult:
    exit_code, sig = decode_wait_status(sup.wait_status)
    status: Status
    error = sup.termination.error
    if sup.reason == "timeout":
        status = "timed_out"
        if sup.timeout_kind == "idle" and sup.idle_s is not None:
            note = f"no output for {sup.idle_s:g}s (idle timeout)"
            error = f"{note}; {error}" if error else note
    elif sup.reason == "cancel":
        status = "cancelled"
    elif sup.reason == "lost":
        status = "sandbox_error"
        error = error or "the backend lost the command before it exited"
    elif exit_code == 0:
        status = "completed"
    else:
        status = "failed"
    if sup.termination.survivors:
        note = f"{sup.termination.survivors} process(es) of the run could not be killed"
        error = f"{error}; {note}" if error else note
    return finish_result(
        facts,
        status=status,
        exit_code=exit_code,
        signal=sig,
        duration_s=sup.duration_s,
        stdout=stdout,
        stderr=stderr,
        termination=sup.termination,
        error=error,
        timeout_kind=sup.timeout_kind,
    )


def finish_result(
    facts: RunFacts,
    *,
    status: Status,
    stdout: StreamCapture,
    stderr: StreamCapture,
    duration_s: float,
    exit_code: int | None = None,
    signal: str | None = None,
    termination: Termination | None = None,
    error: str | None = None,
    timeout_kind: TimeoutKind | None = None,
) -> ExecResult:
    """Assemble an ``ExecResult`` (also for runs that never started). A ``timed_out`` one
    without ``timeout_kind`` hit the wall-clock deadline."""
    term = termination or Termination()
    for capture in (stdout, stderr):
        capture.keep_if_lossy()
    out, err = stdout.report(), stderr.report()
    warnings = [n for c in (stdout, stderr) for n in (c.spill_error, c.sink_error) if n]
    return ExecResult(
        status=status,
        exit_code=exit_code,
        signal=signal,
        timed_out=status == "timed_out",
        timeout_kind=(timeout_kind or "wall") if status == "timed_out" else None,
        duration_s=round(duration_s, 6),
        cpu_s=term.cpu_s,
        peak_rss_bytes=term.peak_rss_bytes,
        stdout=out.text,
        stdout_total_bytes=out.total_bytes,
        stdout_dropped_bytes=out.dropped_bytes,
        stdout_truncated=out.truncated,
        stdout_spill=out.spill,
        stdout_spill_complete=out.spill_complete,
        stderr=err.text,
        stderr_total_bytes=err.total_bytes,
        stderr_dropped_bytes=err.dropped_bytes,
        stderr_truncated=err.truncated,
        stderr_spill=err.spill,
        stderr_spill_complete=err.spill_complete,
        backend=facts.backend,
        isolation=facts.isolation,
        missing_guarantees=facts.missing,
        fallback_reason=facts.fallback_reason,
        via=facts.via,
        survivors=term.survivors,
        argv=facts.argv,
        run_id=facts.run_id,
        error=error,
        warnings=warnings,
    )


_ACTIVITY: weakref.WeakValueDictionary[str, Activity] = weakref.WeakValueDictionary()
"""Each live run's ``Activity`` by run id (``captures`` makes it, ``supervise_request`` finds
it): no backend has to hand it over; it goes with the run's captures."""


def captures(request: ExecRequest) -> tuple[StreamCapture, StreamCapture]:
    """The stdout and stderr captures of one run (spilling under the run's own directory),
    each masking the run's secret values (``redact.redactor_for``; none: no masking at all)."""
    from sandboxrun.engine.capture.redact import redactor_for

    limits = request.limits
    spill = SpillDir(limits.spill_dir or default_spill_root(), request.run_id)
    args = (limits.max_output, limits.spill_max, spill, request.sink)
    activity = Activity()  # one for both streams: the idle timeout watches the run as a whole
    _ACTIVITY[request.run_id] = activity
    return (
        StreamCapture("stdout", *args, redactor=redactor_for(request), activity=activity),
        StreamCapture("stderr", *args, redactor=redactor_for(request), activity=activity),
    )


def sandbox_error_result(
    facts: RunFacts, out: StreamCapture, err: StreamCapture, started: float, exc: BaseException
) -> ExecResult:
    """The result of a run the backend could not start or lost."""
    duration = time.monotonic() - started
    return finish_result(
        facts, status="sandbox_error", stdout=out, stderr=err, duration_s=duration, error=str(exc)
    )


async def supervise_request(
    handle: RunHandle, request: ExecRequest, started: float, activity: Activity | None = None
) -> Supervision:
    """``supervise`` with the request's limits. The idle timeout (``Limits.idle_timeout_s``)
    watches ``activity``: by default the one ``captures(request)`` made for the run."""
    limits = request.limits
    if activity is None:
        activity = _ACTIVITY.get(request.run_id)
    return await supervise(
        handle,
        timeout_s=request.timeout_s,
        grace_s=limits.grace_s,
        drain_s=limits.drain_s,
        started=started,
        flow=request.sink if isinstance(request.sink, LiveSink) else None,
        idle_s=limits.idle_timeout_s,
        activity=activity,
    )
