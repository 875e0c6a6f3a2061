"""The one place an ``ExecResult`` is assembled: from a run's facts, its supervision and the
backend's verdict (``build``), or for a run that never began (``not_started``, ``unstarted``);
and the one place a finished one is rewritten (``amend``, ``rewrite``). Pure but for reading
the captures' reports."""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from sandboxrun.engine.capture.stream import StreamCapture, StreamReport
from sandboxrun.engine.supervise import Supervision, Termination
from sandboxrun.models import BackendName, Denial, ExecResult, Policy, Status, TimeoutKind

Model = TypeVar("Model", bound=BaseModel)


@dataclass(frozen=True)
class RunFacts:
    """Everything about a run besides its supervision outcome: what the caller's side knows
    before it starts (``Sandbox``), the backend's plan included."""

    backend: BackendName
    argv: list[str]
    run_id: str
    isolation: list[str]
    missing: list[str]
    fallback_reason: str | None
    via: str | None = None
    """How the backend starts the command (``ExecResult.via``: ``Launch.via``)."""
    login_s: float = 0.0
    """Time the login-shell snapshot took for this command (added to its duration)."""
    warnings: tuple[str, ...] = ()
    """Notes to report with the result (a failed snapshot, once)."""
    tty: bool = False
    """The command ran on a terminal (``ExecResult.tty``)."""


@dataclass(frozen=True)
class Verdict:
    """What the backend found after a run (``Backend.finalize``): what really happened where
    the exit status cannot tell (an OOM kill, the sandbox's death), its own accounting, and
    the guarantees the run turned out not to have."""

    status: Status | None = None
    """Instead of the status the exit gives (``oom_killed``, ``sandbox_error``)."""
    error: str | None = None
    """With ``status``: why (replaces the error the supervision gave)."""
    usage: tuple[float | None, int | None] | None = None
    """The backend's own ``(cpu_s, peak_rss_bytes)`` (a scope's cgroup), replacing the
    supervisor's; None: the supervisor's are kept."""
    lost: tuple[str, ...] = ()
    """Guarantees claimed in the plan that this run did not get (moved to ``missing``)."""
    via: str | None = None
    """How the command really started, where it differs from the plan (docker: a recycle
    between the plan and the start brought a supervisor, or took it away)."""


class NotStarted(Exception):
    """Raised by ``Backend.start`` for a run that ended before its command began: the command
    could not be executed (``spawn_error``, with the shell's exit code) or the sandbox could
    not start it (``sandbox_error``). Anything else a backend raises propagates."""

    def __init__(
        self,
        status: Status,
        error: str,
        *,
        exit_code: int | None = None,
        survivors: int = 0,
        lost: Sequence[str] = (),
    ) -> None:
        super().__init__(error)
        self.status: Status = status
        self.error = error
        self.exit_code = exit_code
        self.survivors = survivors
        self.lost = tuple(lost)


def spawn_exit_code(err: int) -> int:
    """Shell conventions: 127 not found, 126 found but not executable / not runnable."""
    return 127 if err in (errno.ENOENT, errno.ENOTDIR) else 126


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


def outcome(sup: Supervision) -> tuple[Status, int | None, str | None]:
    """``(status, exit_code, signal)`` as the supervision alone gives them."""
    exit_code, sig = decode_wait_status(sup.wait_status)
    status: Status
    if sup.reason == "timeout":
        status = "timed_out"
    elif sup.reason == "cancel":
        status = "cancelled"
    elif sup.reason == "lost":
        status = "sandbox_error"
    elif exit_code == 0:
        status = "completed"
    else:
        status = "failed"
    return status, exit_code, sig


def build(
    facts: RunFacts,
    sup: Supervision,
    stdout: StreamCapture,
    stderr: StreamCapture,
    verdict: Verdict | None = None,
) -> ExecResult:
    """The result of a run that started."""
    verdict = verdict or Verdict()
    status, exit_code, sig = outcome(sup)
    error = sup.termination.error
    if status == "timed_out":
        if sup.timeout_kind == "idle" and sup.idle_s is not None:
            note = f"no output for {sup.idle_s:g}s (idle timeout)"
            error = f"{note}; {error}" if error else note
    elif status == "sandbox_error":
        error = error or "the backend lost the command before it exited"
    if sup.termination.survivors:
        note = f"{sup.termination.survivors} process(es) of the run could not be killed"
        error = f"{error}; {note}" if error else note
    if verdict.status is not None:
        status = verdict.status
        error = verdict.error if verdict.error is not None else error
    term = sup.termination
    if verdict.usage is not None:
        term = Termination(term.survivors, *verdict.usage, term.error)
    return finish_result(
        facts,
        status=status,
        exit_code=exit_code,
        signal=sig,
        duration_s=sup.duration_s + facts.login_s,
        stdout=stdout,
        stderr=stderr,
        termination=term,
        error=error,
        timeout_kind=sup.timeout_kind,
        lost=verdict.lost,
        via=verdict.via,
    )


def not_started(
    facts: RunFacts,
    exc: NotStarted,
    stdout: StreamCapture,
    stderr: StreamCapture,
    started: float,
) -> ExecResult:
    """The result of a run ``Backend.start`` could not begin."""
    return finish_result(
        facts,
        status=exc.status,
        exit_code=exc.exit_code,
        stdout=stdout,
        stderr=stderr,
        duration_s=time.monotonic() - started + facts.login_s,
        termination=Termination(survivors=exc.survivors),
        error=exc.error,
        lost=exc.lost,
    )


def unstarted(facts: RunFacts, status: Status, error: str, started: float) -> ExecResult:
    """The result of a command that never reached a backend (``status``: why; ``started``
    before its login snapshot, so the duration has that time in it already)."""
    return finish_result(
        facts,
        status=status,
        stdout=None,
        stderr=None,
        duration_s=time.monotonic() - started,
        error=error,
    )


def finish_result(
    facts: RunFacts,
    *,
    status: Status,
    stdout: StreamCapture | None,
    stderr: StreamCapture | None,
    duration_s: float,
    exit_code: int | None = None,
    signal: str | None = None,
    termination: Termination | None = None,
    error: str | None = None,
    timeout_kind: TimeoutKind | None = None,
    lost: Sequence[str] = (),
    via: str | None = None,
) -> ExecResult:
    """Assemble an ``ExecResult``: the one constructor of every result (no captures: a command
    that never started, with no output). A ``timed_out`` one without ``timeout_kind`` hit the
    wall-clock deadline; ``lost``: guarantees of the plan the run did not get."""
    term = termination or Termination()
    isolation = [g for g in facts.isolation if g not in lost] if lost else facts.isolation
    missing = [*facts.missing, *(n for n in lost if n not in facts.missing)]
    captures = [c for c in (stdout, stderr) if c is not None]
    for capture in captures:
        capture.keep_if_lossy()
    empty = StreamReport("", 0, 0, False, None, True)
    out = empty if stdout is None else stdout.report()
    err = empty if stderr is None else stderr.report()
    warnings = [n for c in captures for n in (c.spill_error, c.sink_error) if n]
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
        isolation=isolation,
        missing_guarantees=missing,
        fallback_reason=facts.fallback_reason,
        via=via or facts.via,
        tty=facts.tty,
        survivors=term.survivors,
        argv=facts.argv,
        run_id=facts.run_id,
        error=error,
        warnings=[*warnings, *facts.warnings],
    )


def amend(
    result: ExecResult,
    *,
    error: str | None = None,
    warnings: Sequence[str] = (),
    denial: Denial | None = None,
    escalated_from: Policy | None = None,
    drop_spill: bool = False,
) -> ExecResult:
    """``result`` as what came after the run tells it: ``error`` replaced (how it was ended:
    ``Job.kill()``, ``aclose()``), ``warnings`` appended, the ``denial`` diagnosed, the policy
    it was ``escalated_from``, the spill paths dropped (``run --json`` removed the files). The
    same object when nothing changes; status, exit and output are never rewritten."""
    update: dict[str, Any] = {}
    if error is not None:
        update["error"] = error
    if warnings:
        update["warnings"] = [*result.warnings, *warnings]
    if denial is not None:
        update["denial"] = denial
    if escalated_from is not None:
        update["escalated_from"] = escalated_from
    if drop_spill:
        update["stdout_spill"] = update["stderr_spill"] = None
    return rewrite(result, update)


def rewrite(model: Model, update: dict[str, Any]) -> Model:
    """``model`` (a result, or a model in one) with fields replaced by values already checked
    (masked strings: ``sandboxrun.engine.capture.redact``); the same object when ``update`` is
    empty."""
    return model.model_copy(update=update) if update else model
