"""Denials on real processes: what the sandbox refused carries ``denial``; an ordinary failure
never does."""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from helpers import require_backend

from sandboxrun import Limits, Policy, Sandbox
from sandboxrun.errors import PolicyRefusedError
from sandboxrun.models import ExecResult

PY = sys.executable
LIMITS = Limits(timeout_s=60, grace_s=0.5)
CONNECT = "import socket; socket.create_connection(('192.0.2.1', 80), timeout=5)"
"""TEST-NET-1: unreachable from a network namespace with only loopback."""


def run(
    ws: Path,
    backend: str,
    policy: Policy,
    *,
    shell: str | None = None,
    argv: list[str] | None = None,
) -> ExecResult:
    """One command; skip (not fail) when this host cannot give the policy's guarantees."""

    async def go() -> ExecResult:
        async with Sandbox(ws, backend=backend, policy=policy, limits=LIMITS) as sb:
            return await sb.exec(argv, shell=shell)

    try:
        return anyio.run(go)
    except PolicyRefusedError as exc:
        pytest.skip(f"{backend} cannot confine here: {exc}")


def degraded(ws: Path, shell: str) -> ExecResult:
    """On process-group, whatever this host can isolate (nothing refused)."""
    return run(ws, "process-group", Policy(allow_degraded=True), shell=shell)


@pytest.fixture
def outside_dir() -> Iterator[Path]:
    """A directory outside the workspace that the invoking user can write on the host (not
    under /tmp: local backends give the command a private one)."""
    path = Path.home() / f".sandboxrun-denial-{secrets.token_hex(4)}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- what the sandbox refused ----------------------------------------------------------------


def test_write_to_a_read_only_workspace_is_a_filesystem_denial(
    workspace: Path, backend: str
) -> None:
    policy = Policy(access="read-only")
    result = run(workspace, backend, policy, shell="touch new.txt")
    assert result.status == "failed"
    assert not (workspace / "new.txt").exists()
    assert result.denial is not None, result.stderr
    assert result.denial.kind == "filesystem"
    assert "new.txt" in result.denial.evidence
    assert result.denial.escalate_to == policy.model_copy(update={"access": "workspace-write"})


def test_write_outside_the_workspace_is_a_filesystem_denial(
    workspace: Path, outside_dir: Path
) -> None:
    target = outside_dir / "x"
    result = run(workspace, "process-group", Policy(), shell=f"touch '{target}'")
    assert result.status == "failed"
    assert not target.exists()
    assert result.denial is not None, result.stderr
    assert result.denial.kind == "filesystem"
    # never offered on the word of the command's own output (it could print the line itself)
    assert result.denial.escalate_to is None
    assert "outside the workspace" in result.denial.message
    assert "danger-full-access" in result.denial.message


@pytest.mark.skipif(os.geteuid() != 0, reason="only root could write /etc on the host")
def test_touch_etc_is_a_filesystem_denial(workspace: Path) -> None:
    name = f"/etc/sandboxrun-denial-{secrets.token_hex(4)}"
    try:  # Policy() refuses to run unconfined: /etc on the host is never touched
        result = run(workspace, "process-group", Policy(), shell=f"touch {name}")
    finally:
        if os.path.exists(name):
            os.unlink(name)
            pytest.fail(f"the sandbox let the command create {name}")
    assert result.denial is not None and result.denial.kind == "filesystem", result.stderr
    assert result.denial.evidence.endswith(f"{name}': Read-only file system") or (
        "Permission denied" in result.denial.evidence
    )


def test_touch_etc_in_a_container_is_a_filesystem_denial(workspace: Path) -> None:
    require_backend("docker")
    if os.geteuid() != 0:
        pytest.skip("/etc is judged by the host's: only root could write it there")
    result = run(workspace, "docker", Policy(), shell="touch /etc/x")
    assert result.denial is not None
    assert result.denial.evidence == "touch: cannot touch '/etc/x': Read-only file system"
    assert result.denial.escalate_to is None
    # issue 20: it proposed --policy danger-full-access, under which the root is still read-only
    assert "danger-full-access" not in result.denial.message
    assert "read-only under every policy" in result.denial.message
    again = run(workspace, "docker", Policy(access="danger-full-access"), shell="touch /etc/x")
    assert again.status == "failed" and again.denial is not None
    assert "read-only under every policy" in again.denial.message


def test_network_under_network_none_is_a_network_denial(workspace: Path, backend: str) -> None:
    py = PY if backend != "docker" else "python3"
    result = run(workspace, backend, Policy(), shell=f'{py} -c "{CONNECT}"')
    assert result.status == "failed"
    assert result.denial is not None, result.stderr
    assert result.denial.kind == "network"
    assert result.denial.escalate_to == Policy(network="on")


def test_a_full_tmpfs_is_diagnosed_as_disk_full(workspace: Path) -> None:
    require_backend("docker")
    result = run(workspace, "docker", Policy(), shell="head -c 400M /dev/zero > /tmp/big")
    assert result.denial is not None, result.stderr
    assert result.denial.kind == "disk-full"
    assert "No space left on device" in result.denial.evidence
    assert result.denial.escalate_to is None


def test_printed_enospc_line_proves_the_pipeline_not_the_sandbox(workspace: Path) -> None:
    """The command *prints* the evidence: this proves diagnosis runs on every result of a real
    run (on any host, confined or not), not that anything was refused."""
    line = "cp: error writing 'big': No space left on device"
    result = degraded(workspace, f'echo "{line}" >&2; exit 1')
    assert result.denial is not None
    assert (result.denial.kind, result.denial.evidence) == ("disk-full", line)


def test_silent_failure_on_a_full_workspace_is_disk_full(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real silent failure; the full filesystem is simulated (``statvfs`` says 0 free)."""
    full = os.statvfs_result((4096, 4096, 1000, 0, 0, 100, 50, 50, 0, 255))
    real = os.statvfs
    monkeypatch.setattr(
        os, "statvfs", lambda p: full if Path(p) == workspace.resolve() else real(p)
    )
    # argv, not a shell: a login shell's profile may print something
    result = run(workspace, "process-group", Policy(allow_degraded=True), argv=["false"])
    assert result.stderr_total_bytes == result.stdout_total_bytes == 0
    assert result.denial is not None and result.denial.kind == "disk-full"
    assert "printed nothing" in result.denial.evidence


# -- what the program did on its own ---------------------------------------------------------


@pytest.mark.parametrize(
    "shell",
    [
        "cat /nonexistent",
        "sh -c 'exit 3'",
        f"{PY} -c 'assert 1 == 2, \"Permission denied is not what we expected\"'",
        f"{PY} -c 'raise PermissionError(\"you lack permission to deploy\")'",
        "echo 'FAILED tests/test_io.py::test_write - AssertionError' ; exit 1",
    ],
)
def test_ordinary_failures_are_not_denials(workspace: Path, shell: str) -> None:
    result = run(workspace, "process-group", Policy(), shell=shell)
    assert result.status == "failed"
    assert result.denial is None, result.denial


def test_a_files_own_permissions_are_not_a_denial(workspace: Path) -> None:
    """``chmod 000`` by the program itself: the host user (unless root) could not read it
    either. As root nothing is refused: the test then only checks that success is no denial."""
    result = run(workspace, "process-group", Policy(), shell="touch f && chmod 000 f && cat f")
    assert result.denial is None, result.denial


def test_a_closed_local_port_is_not_a_denial(workspace: Path) -> None:
    connect = "import socket; socket.create_connection(('127.0.0.1', 9), timeout=5)"
    result = run(workspace, "process-group", Policy(network="on"), shell=f'{PY} -c "{connect}"')
    assert result.status == "failed"
    assert "Connection refused" in result.stderr
    assert result.denial is None
