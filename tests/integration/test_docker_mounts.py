"""The docker workspace mount: any directory name (``:``, ``,``, ``=``) works, through the
Engine API's ``Mounts`` (no ``src:dst:mode`` string to split); and an unavailable engine is
reported in one plain sentence. Real engine; skipped with the probe's reason without one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest
from helpers import require_backend

from sandboxrun import Policy, Sandbox
from sandboxrun.backends.docker.backend import DockerBackend

pytestmark = pytest.mark.anyio

CLI = [sys.executable, "-m", "sandboxrun"]
NAMES = ["a:b", "a,b", "x:/y:ro", "k=v,readonly,type=volume", "a:b,c:d"]


@pytest.fixture
def docker_ok() -> None:
    require_backend("docker")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=120, check=False, env=env
    )


@pytest.mark.usefixtures("docker_ok")
@pytest.mark.parametrize("dirname", NAMES)
def test_cli_workspace_with_odd_name(tmp_path: Path, dirname: str) -> None:
    ws = tmp_path / dirname
    ws.mkdir(parents=True)
    proc = cli("run", "-b", "docker", "-w", str(ws), "--", "sh", "-c", "pwd; echo hi > out")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "/workspace\n"
    assert (ws / "out").read_text() == "hi\n"


@pytest.mark.usefixtures("docker_ok")
@pytest.mark.parametrize("access", ["read-only", "workspace-write"])
async def test_mount_is_a_bind_of_the_canonical_root(tmp_path: Path, access: str) -> None:
    ws = tmp_path / "a:b,c"
    ws.mkdir()
    (ws / "f").write_text("x\n")
    policy = Policy.model_validate({"access": access})
    async with Sandbox(ws, backend="docker", policy=policy) as sb:
        backend = sb.backend
        assert isinstance(backend, DockerBackend)
        assert backend.session.container_id is not None
        client = docker.from_env(timeout=30)
        try:
            info = client.api.inspect_container(backend.session.container_id)
        finally:
            client.close()
        result = await sb.exec(["sh", "-c", "cat f; echo y > g"])
    binds = [m for m in info["Mounts"] if m["Type"] == "bind"]
    binds = [m for m in binds if m["Destination"] != "/run/sandboxrun"]  # the supervisor's
    assert len(binds) == 1, info["Mounts"]
    assert binds[0]["Source"] == str(ws.resolve())
    assert binds[0]["Destination"] == "/workspace"
    assert binds[0]["RW"] is (access == "workspace-write")
    assert result.stdout == "x\n"
    assert (ws / "g").exists() is (access == "workspace-write")


def test_unavailable_engine_is_said_once(workspace: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent"}
    proc = cli("run", "-b", "docker", "-w", str(workspace), "--", "true", env=env)
    assert proc.returncode == 125
    assert proc.stderr.count("is unavailable") == 1, proc.stderr
    assert "backend 'docker' is unavailable: no Docker engine socket" in proc.stderr
    doctor = cli("doctor", env=env)
    assert "is unavailable" not in doctor.stdout


@pytest.mark.usefixtures("docker_ok")
async def test_mask_inside_the_workspace_hides_it_in_the_container(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "creds").mkdir(parents=True)
    (ws / "creds" / "key").write_text("PRIVATE-KEY")
    (ws / "token.txt").write_text("TOKEN-VALUE")
    (ws / "open.txt").write_text("VISIBLE")
    masks = (str(ws / "creds"), str(ws / "token.txt"), str(tmp_path / "elsewhere"))
    script = "ls -A creds; cat creds/key token.txt open.txt 2>&1; touch creds/new; echo end"
    async with Sandbox(ws, backend="docker", policy=Policy(mask=masks)) as sb:
        result = await sb.exec(shell=script)
    assert "PRIVATE-KEY" not in result.stdout and "TOKEN-VALUE" not in result.stdout
    assert "VISIBLE" in result.stdout and "end" in result.stdout
    assert not (ws / "creds" / "new").exists()  # the mask is read-only, not a way in
    assert (ws / "creds" / "key").read_text() == "PRIVATE-KEY"  # the host copy is untouched
