"""What the CLI prints about a result: exit statuses, summary lines, stdout/stderr writers.
Pure formatting, no engine."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import suppress
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from sandboxrun.models import ExecResult
    from sandboxrun.terminal import StreamStats

EXIT_USAGE = 2
EXIT_SANDBOX = 125


def exit_status(result: ExecResult) -> int:
    """The CLI exit status for a result (documented contract)."""
    if result.status == "timed_out":
        return 124
    if result.status == "cancelled":
        return 130
    if result.status == "sandbox_error":
        return EXIT_SANDBOX
    if result.status == "oom_killed":
        return 137
    if result.status == "spawn_error":
        return result.exit_code or 127
    if result.signal is not None:
        known = signal.Signals.__members__.get(result.signal)
        return 128 + (int(known) if known is not None else 0)
    return result.exit_code if result.exit_code is not None else EXIT_SANDBOX


def write_out(text: str | bytes) -> None:
    """Write to stdout as bytes, whatever the locale: lone surrogates of a ``str`` (bytes of an
    argv or a path that are not UTF-8) go out as the original bytes."""
    sys.stdout.flush()
    sys.stdout.buffer.write(text if isinstance(text, bytes) else os.fsencode(text))
    sys.stdout.flush()


def say(line: str) -> None:
    """One line to stderr; a reader that closed it must not turn the run's exit status into a
    traceback (nor the interpreter's final flush into exit 120)."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (BrokenPipeError, OSError):
        with suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)


def fail(code: int, message: str) -> typer.Exit:
    say(f"sandboxrun: error: {message}")
    return typer.Exit(code)


def _where(result: ExecResult, name: str) -> str:
    """Where the full stream ``name`` can be found, as a summary clause."""
    spill = getattr(result, f"{name}_spill")
    if spill and getattr(result, f"{name}_spill_complete"):
        return f"full stream in {spill}"
    if spill:
        return f"first part in {spill}"
    return "the full stream was not kept"


def live_notes(result: ExecResult, stats: dict[str, StreamStats]) -> list[str]:
    """What live output did not reach its reader, and why (slow terminal, closed pipe)."""
    parts: list[str] = []
    for name, s in stats.items():
        if s.dropped:
            parts.append(
                f"{s.dropped} bytes of {name} not shown on the terminal "
                f"(too slow; {_where(result, name)})"
            )
        if s.lost and s.failure == "closed":
            parts.append(
                f"the reader of {name} closed the pipe: {s.lost} bytes not shown "
                f"({_where(result, name)})"
            )
        elif s.lost:
            parts.append(
                f"writing {name} failed ({s.failure}): {s.lost} bytes not shown "
                f"({_where(result, name)})"
            )
    return parts


def summary(result: ExecResult, live: dict[str, StreamStats] | None = None) -> str | None:
    """One line on what the user should know: live output not shown, truncation, timeout,
    survivors."""
    parts = live_notes(result, live or {})
    if result.timed_out:
        parts.append(f"timed out after {result.duration_s:.1f}s")
        if result.timeout_kind == "idle":
            idle = [p for p in (result.error or "").split("; ") if p.endswith("(idle timeout)")]
            parts[-1] += f": {idle[0] if idle else 'no output (idle timeout)'}"
    for name in ("stdout", "stderr"):
        if getattr(result, f"{name}_truncated"):
            dropped = getattr(result, f"{name}_dropped_bytes")
            spill = getattr(result, f"{name}_spill")
            where = f", full stream in {spill}" if spill else ""
            if spill and not getattr(result, f"{name}_spill_complete"):
                where = f", first part in {spill}"
            parts.append(f"{name} truncated ({dropped} bytes omitted{where})")
    if result.survivors:
        parts.append(f"{result.survivors} process(es) survived termination")
    if result.error and result.status in ("spawn_error", "sandbox_error"):
        parts.append(result.error)
    return "sandboxrun: " + "; ".join(parts) if parts else None


def denial_line(result: ExecResult) -> str | None:
    """The line saying the sandbox, not the program, refused something (text mode)."""
    found = result.denial
    return None if found is None else f"sandboxrun: denied: {found.message} ({found.evidence})"
