"""What the CLI prints: exit statuses, the final line of a run, error lines and the ``--json``
error object, stdout/stderr writers. Pure formatting, no engine.

Every byte the CLI writes itself goes through one of the writers here, which apply the one
masking and sanitizing pass (issue 17): ``say`` (every stderr line: masked, control characters
neutralized, to a terminal or not), ``json_line`` (``--json``: every string masked, DEL and C1
escaped), ``show_argv`` (``--dry-run``). The values masked are those of ``use_secrets``: the
secret-shaped ``-e`` variables of the command line (none with ``--no-mask``)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import TYPE_CHECKING

import typer

from sandboxrun.engine.capture.redact import Redactor, redactor_of, secret_pairs
from sandboxrun.engine.sanitize import clean_text, escape_json_controls
from sandboxrun.units import format_duration, format_size

if TYPE_CHECKING:
    from sandboxrun.cli.terminal import StreamStats
    from sandboxrun.models import ExecResult

EXIT_SANDBOX = 125
EXIT_USAGE = EXIT_SANDBOX
"""sandboxrun's own errors, its command line's included, exit 125 as ``docker run``'s and GNU
``timeout``'s do: 1 and 2 stay the command's own (``make``, ``pytest``), 126/127 a command
that cannot run."""
EXIT_CANCELLED = 130
KEEP_SPILL_HINT = "full stream not kept; --keep-spill keeps it"


def exit_status(result: ExecResult) -> int:
    """The CLI exit status for a result (documented contract)."""
    if result.status == "timed_out":
        return 124
    if result.status == "cancelled":
        return EXIT_CANCELLED
    if result.status == "sandbox_error":
        return EXIT_SANDBOX
    from sandboxrun.models import KILLED_BY_LIMIT  # (loaded with the result: no start-up cost)

    if result.status in KILLED_BY_LIMIT:
        return 137
    if result.status == "spawn_error":
        return result.exit_code or 127
    if result.signal is not None:
        known = signal.Signals.__members__.get(result.signal)
        return 128 + (int(known) if known is not None else 0)
    return result.exit_code if result.exit_code is not None else EXIT_SANDBOX


_command_line: list[str] = []
"""The words after ``sandboxrun`` (set by ``cli.main``), for hints about how they were meant."""


def use_command_line(argv: Iterable[str]) -> None:
    _command_line[:] = list(argv)


def command_line() -> list[str]:
    """The words after ``sandboxrun`` of this process's command line (``cli.main``'s)."""
    return list(_command_line)


_masking: list[Redactor | None] = [None]
"""What ``mask`` masks with (set by ``use_secrets``; one run per process)."""


def use_secrets(env: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> None:
    """Mask the values of ``env``'s secret-shaped variables (a mapping or ``(name, value)``
    pairs) in everything written from now on; None or empty: nothing (``--no-mask``)."""
    pairs = env.items() if isinstance(env, Mapping) else env or ()
    _masking[0] = redactor_of(secret_pairs(pairs))


def mask(text: str) -> str:
    """``text`` with the secret values replaced by ``[masked:NAME]``."""
    redactor = _masking[0]
    return text if redactor is None else redactor.mask_text(text)


def shown_line(line: str) -> str:
    """A line as sandboxrun writes it: masked, its control characters neutralized."""
    return clean_text(mask(line))


def json_line(data: object) -> str:
    """One compact JSON line of ``data`` (a result's ``model_dump``, an error object) with every
    string masked, bytes that are not UTF-8 as ``\\udcNN`` escapes (``ExecResult.to_json``) and
    DEL and C1 escaped: valid UTF-8, and inert on a terminal."""
    redactor = _masking[0]
    if redactor is not None:
        data = _mask_data(data, redactor)
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return escape_json_controls(text.encode("utf-8", "backslashreplace").decode("utf-8"))


def _mask_data(data: object, redactor: Redactor) -> object:
    if isinstance(data, str):
        return redactor.mask_text(data)
    if isinstance(data, list | tuple):
        return [_mask_data(item, redactor) for item in data]
    if isinstance(data, dict):
        return {_mask_data(k, redactor): _mask_data(v, redactor) for k, v in data.items()}
    return data


def result_json(result: ExecResult) -> str:
    """``--json``'s result line: ``ExecResult.to_json``'s object through ``json_line`` (every
    string masked, the policies' too: here they are only shown)."""
    return json_line(result.model_dump(mode="json"))


def show_argv(text: str, *, terminal: bool) -> bytes:
    """``--dry-run``'s line (``text``: the quoted argv) masked; to a ``terminal`` its control
    characters are neutralized too (and bytes that are not UTF-8 shown as ``\\udcNN``), else
    it is the exact bytes."""
    masked = mask(text)
    if terminal:
        return (clean_text(masked) + "\n").encode("utf-8", "backslashreplace")
    return os.fsencode(masked + "\n")


def write_out(text: str | bytes) -> None:
    """Write to stdout as bytes, whatever the locale: lone surrogates of a ``str`` (bytes of an
    argv or a path that are not UTF-8) go out as the original bytes."""
    sys.stdout.flush()
    sys.stdout.buffer.write(text if isinstance(text, bytes) else os.fsencode(text))
    sys.stdout.flush()


def say(line: str, *, end: str = "\n") -> None:
    """One line to stderr, as ``shown_line`` (masked, control characters neutralized); a reader
    that closed it must not turn the run's exit status into a traceback (nor the interpreter's
    final flush into exit 120)."""
    try:
        sys.stderr.write(shown_line(line) + end)
        sys.stderr.flush()
    except (BrokenPipeError, OSError):
        with suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)


def error_json(kind: str, message: str, status: int, **extra: object) -> str:
    """The ``--json`` output of a run that has no result: ``{"error": {"type", "message",
    "exit_status", ...}}`` on one line (bytes that are not UTF-8 escaped as in a result);
    ``extra`` entries that are None are left out."""
    known = {name: value for name, value in extra.items() if value is not None}
    body = {"type": kind, "message": message, "exit_status": status, **known}
    return json_line({"error": body})


def fail(
    code: int,
    message: str,
    *,
    json_out: bool = False,
    kind: str = "error",
    hint: str | None = None,
    **extra: object,
) -> typer.Exit:
    """Say ``sandboxrun: error: message`` (and ``hint``, one more line) on stderr, and with
    ``json_out`` print the error object on stdout; return the ``typer.Exit`` to raise."""
    say(f"sandboxrun: error: {message}")
    if hint:
        say(hint)
    if json_out:
        write_out(error_json(kind, message, code, **extra) + "\n")
    return typer.Exit(code)


def _where(result: ExecResult, name: str, kept: bool) -> str:
    """Where the full stream ``name`` can be found, as a summary clause."""
    spill = getattr(result, f"{name}_spill")
    if spill and not kept:
        return KEEP_SPILL_HINT
    if spill and getattr(result, f"{name}_spill_complete"):
        return f"full stream in {spill}"
    if spill:
        return f"first part in {spill}"
    return "the full stream was not kept"


def live_notes(
    result: ExecResult, stats: dict[str, StreamStats], *, spill_kept: bool = True
) -> list[str]:
    """What live output did not reach its reader, and why (slow terminal, closed pipe)."""
    parts: list[str] = []
    for name, s in stats.items():
        where = _where(result, name, spill_kept)
        if s.dropped:
            parts.append(
                f"{s.dropped} bytes of {name} not shown on the terminal (too slow; {where})"
            )
        if s.lost and s.failure == "closed":
            parts.append(
                f"the reader of {name} closed the pipe: {s.lost} bytes not shown ({where})"
            )
        elif s.lost:
            parts.append(f"writing {name} failed ({s.failure}): {s.lost} bytes not shown ({where})")
    return parts


def headline(
    result: ExecResult, *, timeout_s: float | None = None, memory_bytes: int | None = None
) -> str | None:
    """How the run ended when it did not end by itself (None when it did: an exit code, even a
    non-zero one, is the command's own answer): timed out, killed, cancelled, not started."""
    if result.timed_out and result.timeout_kind == "idle":
        idle = [p for p in (result.error or "").split("; ") if p.endswith("(idle timeout)")]
        return f"timed out: {idle[0] if idle else 'no output (idle timeout)'}"
    if result.timed_out:
        after = f"{result.duration_s:.1f}s" if timeout_s is None else format_duration(timeout_s)
        return f"timed out after {after}"
    if result.status == "oom_killed":
        limit = f" (limit {format_size(memory_bytes)})" if memory_bytes else ""
        return f"killed: out of memory{limit}; a larger --memory allows more"
    if result.status == "cancelled":
        return "cancelled"
    if result.status == "disk_exceeded":
        return f"killed: {result.error or 'past --disk'}; a larger --disk allows more"
    if result.status in ("spawn_error", "sandbox_error"):
        return result.error or result.status.replace("_", " ")
    if result.signal is not None:
        return f"killed by {result.signal}"
    return None


def summary(
    result: ExecResult,
    live: dict[str, StreamStats] | None = None,
    *,
    shown_live: bool = False,
    spill_kept: bool = True,
    timeout_s: float | None = None,
    memory_bytes: int | None = None,
    denial_shown: bool = False,
) -> str | None:
    """The one line that ends a run's stderr when there is something to know: how it ended
    (``headline``) or the sandbox's denial, then what output was not shown (``live_notes``),
    truncation (only when the output was not ``shown_live``: ``--json``), where kept spill
    files are, and survivors. None when there is nothing to say.

    ``spill_kept``: the spill files outlive the run (``--keep-spill``); ``timeout_s``: the
    timeout given (the line names it, not the duration); ``memory_bytes``: the memory limit;
    ``denial_shown``: the denial was already printed (``--ask``)."""
    head = headline(result, timeout_s=timeout_s, memory_bytes=memory_bytes)
    from sandboxrun.models import KILLED_BY_LIMIT

    oom = result.status in KILLED_BY_LIMIT  # the headline says it
    denied = None if denial_shown or oom else denial_line(result, prefix="")
    parts = [p for p in (head, denied) if p]
    stats = live or {}
    parts += live_notes(result, stats, spill_kept=spill_kept)
    noted = {name for name, s in stats.items() if s.dropped or s.lost}
    for name in ("stdout", "stderr"):
        spill = getattr(result, f"{name}_spill")
        if getattr(result, f"{name}_truncated") and not shown_live:
            dropped = getattr(result, f"{name}_dropped_bytes")
            where = _where(result, name, spill_kept)
            parts.append(f"{name} truncated ({dropped} bytes omitted, {where})")
        elif shown_live and spill and spill_kept and name not in noted:
            whole = getattr(result, f"{name}_spill_complete")
            parts.append(f"{name} {'kept' if whole else 'first part kept'} in {spill}")
    if result.survivors:
        parts.append(f"{result.survivors} process(es) survived termination")
    return "sandboxrun: " + "; ".join(parts) if parts else None


def denial_line(result: ExecResult, *, prefix: str = "sandboxrun: ") -> str | None:
    """The line saying the sandbox, not the program, refused something (text mode)."""
    found = result.denial
    return None if found is None else f"{prefix}denied: {found.message} ({found.evidence})"
