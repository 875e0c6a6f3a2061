"""The final line of a run and the ``--json`` error object (pure formatting)."""

from __future__ import annotations

import json

import pytest
import typer

from sandboxrun.cli.report import error_json, fail, summary
from sandboxrun.cli.terminal import StreamStats
from sandboxrun.models import Denial, ExecResult


def result(**fields: object) -> ExecResult:
    base: dict[str, object] = {
        "status": "completed",
        "exit_code": 0,
        "duration_s": 12.34,
        "backend": "process-group",
        "argv": ["cmd"],
        "run_id": "r",
    }
    return ExecResult.model_validate({**base, **fields})


TIMED_OUT = {"status": "timed_out", "timed_out": True, "timeout_kind": "wall", "exit_code": None}
OOM_DENIAL = Denial(kind="memory-limit", evidence="status oom_killed", message="exceeded")
WRITE_DENIAL = Denial(kind="filesystem", evidence="x: Read-only", message="refused a write")
TRUNCATED = {"stdout_truncated": True, "stdout_dropped_bytes": 900, "stdout_spill": "/s/out"}


@pytest.mark.parametrize(
    ("fields", "kwargs", "line"),
    [
        ({}, {}, None),
        ({"status": "failed", "exit_code": 3}, {}, None),  # the command's own answer
        (TIMED_OUT, {"timeout_s": 10}, "timed out after 10s"),
        (TIMED_OUT, {"timeout_s": 0.5}, "timed out after 500ms"),
        (TIMED_OUT, {"timeout_s": 600}, "timed out after 10m"),
        (TIMED_OUT, {}, "timed out after 12.3s"),  # no timeout given: the duration
        (
            {**TIMED_OUT, "timeout_kind": "idle", "error": "no output for 5s (idle timeout)"},
            {"timeout_s": 10},
            "timed out: no output for 5s (idle timeout)",
        ),
        (
            {"status": "oom_killed", "exit_code": None, "signal": "SIGKILL", "denial": OOM_DENIAL},
            {"memory_bytes": 64 << 20},
            "killed: out of memory (limit 64m); a larger --memory allows more",
        ),
        (
            {"status": "oom_killed", "exit_code": None},
            {},
            "killed: out of memory; a larger --memory allows more",
        ),
        ({"status": "cancelled", "exit_code": None, "signal": "SIGTERM"}, {}, "cancelled"),
        ({"status": "failed", "exit_code": None, "signal": "SIGSEGV"}, {}, "killed by SIGSEGV"),
        (
            {"status": "spawn_error", "exit_code": 127, "error": "not found: cmd"},
            {},
            "not found: cmd",
        ),
        (
            {"status": "failed", "exit_code": 1, "denial": WRITE_DENIAL},
            {},
            "denied: refused a write (x: Read-only)",
        ),
        ({"status": "failed", "exit_code": 1, "denial": WRITE_DENIAL}, {"denial_shown": 1}, None),
        ({**TIMED_OUT, "survivors": 2}, {"timeout_s": 1}, "timed out after 1s; 2 process(es) "
         "survived termination"),
    ],
)  # fmt: skip
def test_final_line(fields: dict[str, object], kwargs: dict[str, object], line: str | None) -> None:
    found = summary(result(**fields), **kwargs)  # type: ignore[arg-type]
    assert found == (None if line is None else f"sandboxrun: {line}")


def test_truncation_is_said_only_when_output_was_not_shown_live() -> None:
    truncated = result(**TRUNCATED)
    assert summary(truncated, shown_live=True, spill_kept=False) is None  # the user saw it all
    assert summary(truncated, shown_live=False, spill_kept=True) == (
        "sandboxrun: stdout truncated (900 bytes omitted, full stream in /s/out)"
    )
    assert summary(truncated, shown_live=False, spill_kept=False) == (
        "sandboxrun: stdout truncated (900 bytes omitted, full stream not kept; "
        "--keep-spill keeps it)"
    )
    partial = result(**TRUNCATED, stdout_spill_complete=False)
    assert "first part in /s/out" in str(summary(partial, spill_kept=True))
    unspilled = result(**{**TRUNCATED, "stdout_spill": None})
    assert "the full stream was not kept" in str(summary(unspilled, spill_kept=False))


def test_kept_spill_is_named_in_text_mode() -> None:
    truncated = result(**TRUNCATED)
    assert (
        summary(truncated, shown_live=True, spill_kept=True) == "sandboxrun: stdout kept in /s/out"
    )


def test_live_notes_do_not_point_at_a_removed_spill() -> None:
    stats = {"stdout": StreamStats(tty=True, dropped=70)}
    timed_out = result(**TIMED_OUT, **TRUNCATED)
    line = summary(timed_out, stats, shown_live=True, spill_kept=False, timeout_s=2)
    assert line == (
        "sandboxrun: timed out after 2s; 70 bytes of stdout not shown on the terminal "
        "(too slow; full stream not kept; --keep-spill keeps it)"
    )
    kept = summary(timed_out, stats, shown_live=True, spill_kept=True, timeout_s=2)
    assert kept is not None and kept.endswith("(too slow; full stream in /s/out)")
    assert "kept in" not in kept  # named once
    closed = {"stdout": StreamStats(tty=False, lost=5, failure="closed")}
    line = summary(result(**TRUNCATED), closed, shown_live=True, spill_kept=False)
    assert line == (
        "sandboxrun: the reader of stdout closed the pipe: 5 bytes not shown "
        "(full stream not kept; --keep-spill keeps it)"
    )


def test_error_object_is_one_json_line() -> None:
    text = error_json("PolicyRefusedError", "refusing \udcff", 125, backend="docker")
    assert "\n" not in text
    body = json.loads(text)
    assert body == {
        "error": {
            "type": "PolicyRefusedError",
            "message": "refusing \udcff",
            "exit_status": 125,
            "backend": "docker",
        }
    }


def test_fail_says_one_line_and_prints_json_only_when_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exit_ = fail(2, "--memory must be at least 6m", kind="ConfigError", option="--memory")
    assert isinstance(exit_, typer.Exit) and exit_.exit_code == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "sandboxrun: error: --memory must be at least 6m\n")
    fail(2, "bad", json_out=True, kind="UsageError", hint="Try 'sandboxrun run --help' for help.")
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": {"type": "UsageError", "message": "bad", "exit_status": 2}}
    assert err.splitlines() == ["sandboxrun: error: bad", "Try 'sandboxrun run --help' for help."]
