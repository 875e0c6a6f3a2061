"""Bytes that are not UTF-8 in argv, scripts, variables, workspace and workdir paths.

The local backends pass them through exactly (Python holds them as lone surrogates, PEP 383);
the docker backend cannot (the Engine API is JSON: UTF-8 only) and refuses them cleanly, before
anything runs. ``--json`` stays one valid JSON object: lone surrogates become ``\\udcXX``
escapes, so ``json.loads`` + ``os.fsencode`` give the exact bytes back.

Real processes and the real engine; the docker tests are skipped (with the probe's reason)
where docker is unavailable, failed where it is required.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import require_backend

from sandboxrun import ConfigError, EnvError, Sandbox, WorkspaceError

CLI = [sys.executable, "-m", "sandboxrun"]
FF = b"\xff"
ODD = os.fsdecode(b"\xff\xfe")  # '\udcff\udcfe'


def cli(*args: str | bytes, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, timeout=timeout, check=False, env=dict(os.environ)
    )


def one_json(proc: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, (proc.stdout, proc.stderr)
    data = json.loads(lines[0])  # bytes: must be valid UTF-8 JSON
    assert isinstance(data, dict)
    return data


@pytest.fixture
def docker_ok() -> None:
    require_backend("docker")


def odd_dir(parent: Path) -> Path:
    path = Path(os.fsdecode(os.fsencode(parent) + b"/odd-" + FF))
    path.mkdir()
    return path


# -- process-group: exact bytes, valid JSON ------------------------------------------------------
def test_pgroup_argv_bytes_arrive_exactly(workspace: Path) -> None:
    proc = cli(
        "run", "-b", "process-group", "-w", str(workspace), "--", "printf", "%s", b"\xff\xfe"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"\xff\xfe"


def test_pgroup_json_is_one_valid_object_with_exact_argv(workspace: Path) -> None:
    proc = cli(
        "run", "-b", "process-group", "-w", str(workspace), "--json",
        "--", "printf", "%s", b"\xff\xfe",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert b"Traceback" not in proc.stderr
    data = one_json(proc)
    assert data["status"] == "completed"
    assert [os.fsencode(a) for a in data["argv"]] == [b"printf", b"%s", b"\xff\xfe"]
    assert data["argv"][2] == ODD
    assert data["stdout_total_bytes"] == 2
    assert data["stdout"] == "\ufffd\ufffd"  # the text field stays UTF-8 (invalid bytes replaced)
    assert b"\\udcff\\udcfe" in proc.stdout  # the documented escape, literally


def test_pgroup_json_spawn_error_names_the_odd_program(workspace: Path) -> None:
    proc = cli("run", "-b", "process-group", "-w", str(workspace), "--json", "--", b"no-such-\xff")
    assert proc.returncode == 127, proc.stderr
    data = one_json(proc)
    assert data["status"] == "spawn_error"
    assert os.fsencode(data["argv"][0]) == b"no-such-\xff"
    assert data["error"] is not None


def test_pgroup_env_and_script_bytes_arrive_exactly(workspace: Path) -> None:
    proc = cli(
        "run", "-b", "process-group", "-w", str(workspace), "--json", "-e", b"X=\xfe",
        "--shell", "--", b'printf %s "$X" \xff',
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = one_json(proc)
    assert data["stdout_total_bytes"] == 2
    plain = cli(
        "run", "-b", "process-group", "-w", str(workspace), "-e", b"X=\xfe",
        "--shell", "--", b'printf %s "$X" \xff',
    )  # fmt: skip
    assert plain.stdout == b"\xfe\xff"


def test_pgroup_dry_run_prints_the_exact_bytes(workspace: Path) -> None:
    proc = cli("run", "-b", "process-group", "-w", str(workspace), "--dry-run", "--", "echo", FF)
    assert proc.returncode == 0, proc.stderr
    # the per-command login-shell form (the login-shell snapshot is only taken by a real run)
    assert b" -lc " in proc.stdout
    assert proc.stdout.endswith(b" sandboxrun echo '\xff'\n")


def test_pgroup_odd_workspace_and_workdir(tmp_path: Path) -> None:
    ws = odd_dir(tmp_path)
    sub = odd_dir(ws)
    at_host = ("run", "-b", "process-group", "--workspace-at", "host", "-w", os.fsencode(ws))
    proc = cli(*at_host, "--json", "--", "pwd")
    assert proc.returncode == 0, proc.stderr
    assert one_json(proc)["stdout_total_bytes"] == len(os.fsencode(ws)) + 1
    plain = cli(*at_host, "--", "pwd")
    assert plain.stdout == os.fsencode(ws) + b"\n"
    rel = os.fsencode(sub.name)
    proc = cli(*at_host, "-C", rel, "--", "pwd")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == os.fsencode(sub) + b"\n"
    inside = cli("run", "-b", "process-group", "-w", os.fsencode(ws), "-C", rel, "--", "pwd")
    assert inside.stdout == b"/workspace/" + rel + b"\n", inside.stderr  # (the default)


# -- docker: refused cleanly (exit 2, the argument named), nothing runs ------------------------
@pytest.mark.usefixtures("docker_ok")
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--", "sh", "-c", "touch ran", b"x\xff"], b"argv[3]"),
        (["--", b"sh\xff", "-c", "touch ran"], b"argv[0]"),
        (["--shell", "--", b"touch ran # \xff"], b"script"),
        (["-e", b"ODD=\xff", "--", "touch", "ran"], b"'ODD'"),
        (["-e", b"ODD\xff=1", "--", "touch", "ran"], b"ODD\\xff"),
    ],
)
def test_docker_refuses_non_utf8_before_running(
    workspace: Path, args: list[str | bytes], named: bytes
) -> None:
    proc = cli("run", "-b", "docker", "-w", str(workspace), "--json", *args)
    assert proc.returncode == 125, proc.stderr
    assert b"Traceback" not in proc.stderr
    assert named in proc.stderr
    assert b"UTF-8" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert b"\xff" not in proc.stderr  # shown escaped, never raw; a value is never shown
    error = json.loads(proc.stdout)["error"]  # --json: one error object
    assert error["type"] in ("ConfigError", "EnvError") and error["exit_status"] == 125
    assert b"\xff" not in proc.stdout
    assert not (workspace / "ran").exists()


@pytest.mark.usefixtures("docker_ok")
def test_docker_dry_run_refuses_too(workspace: Path) -> None:
    proc = cli("run", "-b", "docker", "-w", str(workspace), "--dry-run", "--", "echo", FF)
    assert proc.returncode == 125, proc.stderr
    assert b"argv[1]" in proc.stderr
    assert proc.stdout == b""


@pytest.mark.usefixtures("docker_ok")
def test_docker_refuses_a_non_utf8_workspace(tmp_path: Path) -> None:
    ws = odd_dir(tmp_path)
    proc = cli("run", "-b", "docker", "-w", os.fsencode(ws), "--json", "--", "touch", "ran")
    assert proc.returncode == 125, proc.stderr
    assert b"Traceback" not in proc.stderr
    assert b"odd-\\xff" in proc.stderr
    assert json.loads(proc.stdout)["error"]["exit_status"] == 125  # --json: one error object
    assert not (ws / "ran").exists()


@pytest.mark.usefixtures("docker_ok")
def test_docker_refuses_a_non_utf8_workdir(workspace: Path) -> None:
    sub = odd_dir(workspace)
    proc = cli(
        "run", "-b", "docker", "-w", str(workspace), "-C", os.fsencode(sub.name), "--json",
        "--", "touch", "ran",
    )  # fmt: skip
    assert proc.returncode == 125, proc.stderr  # not a fake 126 from the OCI runtime's chdir
    assert b"workdir" in proc.stderr
    assert b"odd-\\xff" in proc.stderr
    assert json.loads(proc.stdout)["error"]["exit_status"] == 125  # --json: one error object
    assert not (sub / "ran").exists()


@pytest.mark.anyio
@pytest.mark.usefixtures("docker_ok")
async def test_docker_api_refuses_and_the_sandbox_stays_usable(workspace: Path) -> None:
    async with Sandbox(workspace, backend="docker") as sb:
        with pytest.raises(ConfigError, match=r"argv\[1\]"):
            await sb.exec(["echo", ODD])
        with pytest.raises(ConfigError, match="script"):
            await sb.exec(shell=f"echo {ODD}")
        with pytest.raises(EnvError, match="'X'"):
            await sb.exec(["true"], env={"X": ODD})
        result = await sb.exec(["echo", "ünï ✓"])
    assert result.status == "completed"
    assert result.stdout == "ünï ✓\n"


@pytest.mark.anyio
@pytest.mark.usefixtures("docker_ok")
async def test_docker_api_refuses_a_non_utf8_workspace_before_any_container(
    tmp_path: Path,
) -> None:
    sb = Sandbox(odd_dir(tmp_path), backend="docker")
    with pytest.raises(WorkspaceError, match="UTF-8"):
        async with sb:
            pass  # pragma: no cover
