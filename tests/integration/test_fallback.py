"""The ``auto`` chain docker -> systemd-scope -> process-group, for real: with an unreachable
engine it lands on systemd-scope inside the systemd test host and on process-group outside it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import require_backend

from sandboxrun import Sandbox
from sandboxrun.backends.registry import probe
from sandboxrun.errors import SandboxUnavailableError

pytestmark = pytest.mark.anyio

NO_ENGINE = "unix:///nonexistent/docker.sock"
CLI = [sys.executable, "-m", "sandboxrun"]


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)


def cli_no_engine(
    workspace: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``sandboxrun run -w WORKSPACE ARGS`` with the engine unreachable."""
    return subprocess.run(
        [*CLI, "run", "-w", str(workspace), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "DOCKER_HOST": NO_ENGINE, **(env or {})},
        timeout=30,
        check=False,
    )


def expected_fallback() -> str:
    return "systemd-scope" if probe("systemd-scope").available else "process-group"


@pytest.mark.usefixtures("no_engine")
async def test_fallback_chain_lands_on_the_best_available_backend(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = expected_fallback()
    with caplog.at_level(logging.WARNING, logger="sandboxrun"):
        async with Sandbox(workspace) as sb:
            first = await sb.exec(["echo", "one"])
            second = await sb.exec(["echo", "two"])
    assert (first.backend, second.backend) == (expected, expected)
    assert first.stdout == "one\n"
    assert first.fallback_reason is not None
    assert first.fallback_reason.startswith("docker: ")
    if expected == "process-group":
        assert "systemd-scope: " in first.fallback_reason
    else:
        assert "systemd-scope" not in first.fallback_reason
    falling = [r for r in caplog.records if "falling back" in r.getMessage()]
    assert len(falling) == 1
    assert expected in falling[0].getMessage()


@pytest.mark.usefixtures("no_engine")
async def test_fallback_never_happens_for_an_explicit_backend(workspace: Path) -> None:
    start = time.monotonic()
    with pytest.raises(SandboxUnavailableError) as info:
        async with Sandbox(workspace, backend="docker"):
            pass
    assert "docker" in str(info.value)
    assert time.monotonic() - start < 5


def test_fallback_cli_strict_refuses_what_the_fallback_cannot_honour(workspace: Path) -> None:
    marker = workspace / "ran"
    no_bwrap = {"SANDBOXRUN_BWRAP": "/nonexistent/bwrap"}  # no local namespaces either
    for extra in ([], ["--allow-degraded"]):
        proc = cli_no_engine(
            workspace, "--strict", *extra, "--json", "--", "touch", str(marker), env=no_bwrap
        )
        assert proc.returncode == 125, proc.stderr
        assert expected_fallback() in proc.stderr
        assert "network-none" in proc.stderr
        assert not marker.exists()


def test_fallback_cli_json_says_which_backend_and_why(workspace: Path) -> None:
    proc = cli_no_engine(workspace, "--json", "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["backend"] == expected_fallback()
    assert result["fallback_reason"].startswith("docker: ")
    assert result["stdout"] == "hi\n"
    assert sum("falling back" in line for line in proc.stderr.splitlines()) == 1


async def test_a_failed_open_can_be_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that opens its sandbox before docker is up retries the same ``Sandbox``: the
    failed ``open()`` released everything and did not mark it opened; a closed one stays
    closed."""
    require_backend("docker")
    sb = Sandbox(tmp_path, backend="docker")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(SandboxUnavailableError, match="no Docker engine socket"):
        await sb.open()
    monkeypatch.delenv("DOCKER_HOST")
    await sb.open()  # the engine is there now
    try:
        assert (await sb.exec(["echo", "up"])).stdout == "up\n"
    finally:
        await sb.aclose()
    with pytest.raises(RuntimeError, match=r"opened already|was closed"):
        await sb.open()
    never = Sandbox(tmp_path, backend="process-group")
    await never.aclose()
    with pytest.raises(RuntimeError, match="was closed"):
        await never.open()
