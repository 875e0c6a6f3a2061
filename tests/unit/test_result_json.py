"""``ExecResult.to_json`` (``sandboxrun run --json``): one valid JSON object whatever bytes an
argv, a path or an error message holds."""

from __future__ import annotations

import json
import os

import pytest

from sandboxrun.models import ExecResult


def result(**fields: object) -> ExecResult:
    base: dict[str, object] = {
        "status": "completed",
        "duration_s": 0.25,
        "backend": "process-group",
        "argv": ["echo"],
        "run_id": "r",
    }
    return ExecResult.model_validate({**base, **fields})


def test_plain_result_matches_model_dump_json() -> None:
    r = result(argv=["echo", "ünï ✓ 🎉", 'q"\\'], stdout="a\nb\x1b", exit_code=0)
    assert json.loads(r.to_json()) == json.loads(r.model_dump_json())
    assert "\n" not in r.to_json()
    assert "ünï ✓ 🎉" in r.to_json()  # written as itself, not escaped


@pytest.mark.parametrize("raw", [b"\xff", b"\xff\xfe", b"a\x80b", b"\xed\xa0\x80", b"\\udcff"])
def test_undecodable_bytes_round_trip(raw: bytes) -> None:
    odd = os.fsdecode(raw)
    r = result(
        argv=["printf", odd],
        stdout_spill=os.fsdecode(b"/tmp/" + raw),
        error=f"{odd}: No such file or directory",
        status="spawn_error",
    )
    if raw != b"\\udcff":  # that one is plain text: a backslash must not be taken for an escape
        with pytest.raises(ValueError, match="surrogates"):
            r.model_dump_json()  # why to_json exists
    text = r.to_json()
    text.encode("utf-8")  # valid UTF-8 text
    data = json.loads(text)
    assert os.fsencode(data["argv"][1]) == raw
    assert os.fsencode(data["stdout_spill"]) == b"/tmp/" + raw
    assert ExecResult.model_validate(data) == r


def test_escape_is_the_documented_one() -> None:
    assert result(argv=[os.fsdecode(b"\xff")]).to_json().count('"argv":["\\udcff"]') == 1
