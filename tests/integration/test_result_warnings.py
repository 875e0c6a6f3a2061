"""Trouble that does not change what happened to the command (a spill file that could not be
written, a live sink that failed) lands in ``ExecResult.warnings``; ``error`` stays reserved for
spawn/sandbox/survivor errors, as docs/api.md says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxrun import Limits, Sandbox

CLI = [sys.executable, "-m", "sandboxrun"]


@pytest.fixture
def unusable_spill_dir(tmp_path: Path) -> Path:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    return blocker / "spill"  # its parent is a file: it cannot be created


@pytest.mark.anyio
async def test_failed_spill_is_a_warning_not_an_error(
    workspace: Path, unusable_spill_dir: Path
) -> None:
    limits = Limits(max_output=100, spill_dir=unusable_spill_dir)
    async with Sandbox(workspace, backend="process-group", limits=limits) as sb:
        result = await sb.exec(["seq", "1", "1000"])
    assert result.status == "completed"
    assert result.error is None
    assert len(result.warnings) == 1
    assert "cannot open spill file for stdout" in result.warnings[0]
    assert result.stdout_truncated
    assert result.stdout_spill is None
    assert result.stdout_spill_complete is False


@pytest.mark.anyio
async def test_failing_sink_is_a_warning(workspace: Path) -> None:
    def sink(name: str, chunk: bytes) -> None:
        raise RuntimeError("sink broke")

    async with Sandbox(workspace, backend="process-group") as sb:
        result = await sb.exec(["echo", "hi"], sink=sink)
    assert result.status == "completed"
    assert result.stdout == "hi\n"
    assert result.error is None
    assert any("sink broke" in w for w in result.warnings)


def test_cli_prints_warnings_in_text_mode_and_json(
    workspace: Path, unusable_spill_dir: Path
) -> None:
    env = {**os.environ, "SANDBOXRUN_SPILL_DIR": str(unusable_spill_dir)}
    args = ["run", "-w", str(workspace), "-b", "process-group", "--max-output", "100"]
    text = subprocess.run(
        [*CLI, *args, "--", "seq", "1", "1000"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert text.returncode == 0
    lines = [ln for ln in text.stderr.splitlines() if "cannot open spill file" in ln]
    assert len(lines) == 1, text.stderr
    assert lines[0].startswith("sandboxrun: warning: ")
    js = subprocess.run(
        [*CLI, *args, "--json", "--", "seq", "1", "1000"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    data = json.loads(js.stdout)
    assert data.get("status") == "completed", (js.stdout, js.stderr)  # (an error object: why)
    assert data["error"] is None
    assert any("cannot open spill file" in w for w in data["warnings"])
