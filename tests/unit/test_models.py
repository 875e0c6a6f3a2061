"""Pure logic: models, sizes, status decoding, CLI exit mapping, terminal sanitizing."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sandboxrun import ExecError, ExecResult, Limits, Policy
from sandboxrun.cli.report import exit_status
from sandboxrun.engine.results import amend, decode_wait_status
from sandboxrun.engine.sanitize import TerminalSanitizer
from sandboxrun.errors import ConfigError
from sandboxrun.models import replaced, required_guarantees
from sandboxrun.units import parse_size


def result(**fields: object) -> ExecResult:
    base: dict[str, object] = {
        "status": "completed",
        "duration_s": 0.1,
        "backend": "process-group",
        "argv": ["true"],
        "run_id": "r",
        "exit_code": 0,
    }
    base.update(fields)
    return ExecResult.model_validate(base)


def test_check_returns_completed_and_raises_with_the_result_otherwise() -> None:
    ok = result()
    assert ok.check() is ok
    bad = result(status="failed", exit_code=3)
    with pytest.raises(ExecError) as info:
        bad.check()
    assert info.value.result is bad
    assert "exit code 3" in str(info.value)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"status": "completed", "exit_code": 0}, 0),
        ({"status": "failed", "exit_code": 3}, 3),
        ({"status": "failed", "exit_code": None, "signal": "SIGSEGV"}, 139),
        ({"status": "failed", "exit_code": None, "signal": "SIGTERM"}, 143),
        ({"status": "timed_out", "exit_code": None, "signal": "SIGKILL"}, 124),
        ({"status": "cancelled", "exit_code": None, "signal": "SIGTERM"}, 130),
        ({"status": "spawn_error", "exit_code": 127}, 127),
        ({"status": "spawn_error", "exit_code": 126}, 126),
        ({"status": "sandbox_error", "exit_code": None}, 125),
        ({"status": "oom_killed", "exit_code": None, "signal": "SIGKILL"}, 137),
    ],
)
def test_cli_exit_status(fields: dict[str, object], code: int) -> None:
    assert exit_status(result(**fields)) == code


def test_decode_wait_status() -> None:
    assert decode_wait_status(None) == (None, None)
    assert decode_wait_status(3 << 8) == (3, None)
    assert decode_wait_status(0) == (0, None)
    assert decode_wait_status(9) == (None, "SIGKILL")
    assert os.WIFSIGNALED(15)
    assert decode_wait_status(15) == (None, "SIGTERM")


def test_timeout_above_the_cap_is_refused_not_clamped() -> None:
    limits = Limits(max_timeout_s=600)
    assert limits.effective_timeout(None) == 120
    assert limits.effective_timeout(5) == 5
    assert limits.effective_timeout(600) == 600
    with pytest.raises(ValueError, match="timeout=10000 is above max_timeout_s=600"):
        limits.effective_timeout(10_000)
    assert Limits(max_timeout_s=20_000).effective_timeout(10_000) == 10_000
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError, match="timeout"):
            limits.effective_timeout(bad)
    with pytest.raises(ValidationError, match="timeout_s=900 is above max_timeout_s=600"):
        Limits(timeout_s=900, max_timeout_s=600)


def test_no_ceiling_unless_one_is_set() -> None:
    # issue 20: a ceiling applies only where an operator configured one
    assert Limits().max_timeout_s is None
    assert Limits(timeout_s=86400).effective_timeout(None) == 86400
    assert Limits().effective_timeout(10**7) == 10**7


@pytest.mark.parametrize(
    "fields",
    [{"timeout_s": 0}, {"grace_s": -1}, {"max_output": 10}, {"spill_max": -1}, {"cpus": 0},
     {"timeout_s": math.inf}, {"unknown": 1}],
)  # fmt: skip
def test_invalid_limits_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Limits.model_validate(fields)


def test_required_guarantees() -> None:
    assert required_guarantees(Policy(), Limits()) == ["read-only-root", "seccomp", "network-none"]
    assert required_guarantees(Policy(access="read-only", network="on"), Limits()) == [
        "read-only-workspace",
        "read-only-root",
        "seccomp",
    ]
    assert required_guarantees(Policy(access="danger-full-access", network="on"), Limits()) == []
    limited = Limits(memory_bytes=1 << 20, cpus=1.5, pids=64)
    assert required_guarantees(Policy(access="danger-full-access", network="on"), limited) == [
        "memory-limit",
        "cpu-limit",
        "pids-limit",
    ]


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("512", 512), ("64k", 65536), ("64K", 65536), ("512m", 512 << 20),
     ("2g", 2 << 30), ("1GiB", 1 << 30), ("1.5k", 1536), (" 3 mb ", 3 << 20), ("1t", 1 << 40)],
)  # fmt: skip
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "k", "-1", "1.3", "12x", "1 2", "0x10", "1e3"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid size"):
        parse_size(text)


def test_sanitizer_neutralizes_controls_keeps_text() -> None:
    clean = TerminalSanitizer()
    assert clean.feed(b"a\tb\nc") == b"a\tb\nc"
    assert clean.feed(b"\x1b[2J\x07\r\x00\x7f") == b"^[[2J^G^M^@^?"
    assert clean.feed("é→ü".encode()) == "é→ü".encode()
    assert clean.feed(b"\xc2\x9b31m") == b"<U+9B>31m"


def test_sanitizer_c1_split_across_chunks() -> None:
    clean = TerminalSanitizer()
    assert clean.feed(b"x\xc2") == b"x"
    assert clean.feed(b"\x9dtitle") == b"<U+9D>title"
    assert clean.feed(b"\xc2") == b""
    assert clean.feed(b"\xa9") == "©".encode()
    assert clean.feed(b"end\xc2") == b"end"
    assert clean.flush() == b"\xc2"


@given(st.lists(st.binary(max_size=40), max_size=20))
def test_sanitizer_output_has_no_escape_and_is_chunking_independent(chunks: list[bytes]) -> None:
    whole = TerminalSanitizer()
    expected = whole.feed(b"".join(chunks)) + whole.flush()
    pieces = TerminalSanitizer()
    got = b"".join(pieces.feed(c) for c in chunks) + pieces.flush()
    assert got == expected
    assert b"\x1b" not in got
    assert not any(b < 0x20 and b not in (0x09, 0x0A) for b in got)


def test_replaced_validates_what_model_copy_would_let_through() -> None:
    limits = Limits(timeout_s=5, max_timeout_s=10)
    assert replaced(limits, max_output=128).max_output == 128
    assert limits.max_output != 128  # the original is untouched
    with pytest.raises(ValidationError, match="timeout_s"):
        replaced(limits, timeout_s=60)  # above the cap: refused as a new Limits would be
    with pytest.raises(ValidationError):
        replaced(limits, max_output=-1)
    with pytest.raises(ValidationError):
        replaced(Policy(), no_such_field=True)
    assert replaced(Policy(), mask_output=False).mask_output is False


def test_amend_rewrites_only_what_it_is_given() -> None:
    ok = result(warnings=["w1"], stdout_spill="/s/out", stderr_spill="/s/err")
    assert amend(ok) is ok  # nothing to say: the same object
    assert amend(ok, warnings=[]) is ok
    told = amend(ok, error="killed", warnings=["w2"], escalated_from=Policy(), drop_spill=True)
    assert told.error == "killed"
    assert told.warnings == ["w1", "w2"]
    assert told.escalated_from == Policy()
    assert told.stdout_spill is None and told.stderr_spill is None
    assert (told.status, told.exit_code, told.stdout) == (ok.status, ok.exit_code, ok.stdout)
    assert ok.error is None and ok.warnings == ["w1"] and ok.stdout_spill == "/s/out"


def _failed(stderr: str = "") -> ExecResult:
    return ExecResult(
        status="failed", exit_code=2, stderr=stderr, duration_s=0.1, backend="process-group",
        argv=["make"], run_id="0" * 16,
    )  # fmt: skip


def test_exec_error_ends_with_the_stderr_tail() -> None:
    # issue 20: ExecError omitted stderr, which usually says why
    failed = _failed("boom: no such target\n")
    text = str(ExecError(failed))
    assert text.endswith("stderr:\nboom: no such target") and "exit code 2" in text
    flood = _failed("x" * 5000 + "END")
    text = str(ExecError(flood))
    assert text.endswith("x" * 797 + "END") and "stderr (its end):\n…" in text
    assert len(text) < 1000
    quiet = str(ExecError(_failed()))
    assert "stderr" not in quiet
