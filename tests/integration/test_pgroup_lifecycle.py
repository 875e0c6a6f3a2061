"""Process-group backend: spawn errors, workdir, environment, runner and host death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import psutil
import pytest
from helpers import assert_nothing_left, processes_with_arg, wait_until

from sandboxrun import ConfigError, Limits, Policy, Sandbox, WorkspaceError
from sandboxrun.backends.local.isolation import SANDBOX_HOME
from sandboxrun.backends.local.pgroup import ProcessGroupBackend

pytestmark = pytest.mark.anyio


async def test_not_found_is_spawn_error_127(workspace: Path) -> None:
    async with Sandbox(workspace, backend="process-group") as sb:
        result = await sb.exec(["definitely-not-a-command-xyz"])
    assert result.status == "spawn_error"
    assert result.exit_code == 127
    assert result.error is not None and "definitely-not-a-command-xyz" in result.error


async def test_not_executable_is_spawn_error_126(workspace: Path) -> None:
    script = workspace / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    async with Sandbox(workspace, backend="process-group") as sb:
        result = await sb.exec(["./script.sh"])
    assert result.status == "spawn_error"
    assert result.exit_code == 126


async def test_workdir_is_resolved_inside_workspace(workspace: Path) -> None:
    async with Sandbox(workspace, backend="process-group") as sb:
        result = await sb.exec(["pwd"], workdir="sub/dir")
        host = await sb.exec(["pwd"], workdir=str(workspace / "sub"))  # a host path: mapped
    assert result.stdout == "/workspace/sub/dir\n", result
    assert host.stdout == "/workspace/sub\n", host
    async with Sandbox(
        workspace, backend="process-group", policy=Policy(workspace_at="host")
    ) as sb:
        result = await sb.exec(["pwd"], workdir="sub/dir")
    assert Path(result.stdout.strip()) == (workspace / "sub" / "dir").resolve()


@pytest.mark.parametrize("workdir", ["../", "sub/../../x", "/etc", "missing", "hello.txt", "out"])
async def test_bad_workdir_is_refused_before_anything_runs(workspace: Path, workdir: str) -> None:
    (workspace / "out").symlink_to("/tmp")
    marker = workspace / "ran"
    async with Sandbox(workspace, backend="process-group") as sb:
        with pytest.raises(WorkspaceError):
            await sb.exec(["touch", str(marker)], workdir=workdir)
    assert not marker.exists()


async def test_environment_is_built_not_inherited(workspace: Path) -> None:
    host = {
        "PATH": os.environ["PATH"],
        "HOME": "/home/someone",
        "GITHUB_TOKEN": "ghp_secret",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "MY_PASSWORD": "hunter2",
        "SSH_AUTH_SOCK": "/tmp/agent",
        "RANDOM_HOST_VAR": "leak",
        "LANG": "C",
    }
    async with Sandbox(
        workspace,
        backend="process-group",
        host_env=host,
        env={"API_KEY": "given"},
        policy=Policy(mask_output=False),  # the value itself must arrive (masking: elsewhere)
    ) as sb:
        result = await sb.exec(["env"])
    env = dict(line.split("=", 1) for line in result.stdout.splitlines())
    for name in ("GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "MY_PASSWORD", "SSH_AUTH_SOCK"):
        assert name not in env
    assert "RANDOM_HOST_VAR" not in env
    assert env["API_KEY"] == "given"
    assert env["HOME"] == SANDBOX_HOME  # private and writable; the real home is read-only
    assert env["LANG"] == "C.UTF-8"
    assert env["NO_COLOR"] == "1"
    assert env["TERM"] == "dumb"


async def test_path_prepend_in_argv_and_shell_mode(workspace: Path, tmp_path: Path) -> None:
    tools = tmp_path / "my tools"
    tools.mkdir()
    tool = tools / "mytool"
    tool.write_text("#!/bin/sh\necho from-mytool\n")
    tool.chmod(0o755)
    async with Sandbox(workspace, backend="process-group", path_prepend=[str(tools)]) as sb:
        direct = await sb.exec(["mytool"])
        shelled = await sb.exec(shell='mytool; echo "$PATH"')
    assert direct.stdout == "from-mytool\n"
    assert shelled.stdout.splitlines()[0] == "from-mytool"
    assert shelled.stdout.splitlines()[1].startswith(f"{tools}:")


async def test_runner_killed_mid_run_gives_sandbox_error_and_no_survivors(
    workspace: Path,
) -> None:
    async with Sandbox(workspace, backend="process-group", limits=Limits(grace_s=0.5)) as sb:
        runner = sb.backend
        assert isinstance(runner, ProcessGroupBackend)
        pid = runner._client.pid
        assert pid is not None

        async def kill_runner() -> None:
            await anyio.sleep(0.5)
            os.kill(pid, signal.SIGKILL)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_runner)
            result = await sb.exec(shell="echo started; sleep 4321.5", timeout=20)
    assert result.status == "sandbox_error"
    assert result.stdout == "started\n"
    assert result.error
    assert wait_until(lambda: not processes_with_arg("4321.5"), 5)
    assert_nothing_left(result.run_id)


def test_host_killed_mid_run_leaves_nothing(workspace: Path, tmp_path: Path) -> None:
    """SIGKILL the program using sandboxrun: the runner notices and kills the run."""
    code = textwrap.dedent(
        f"""
        import anyio, sys
        from sandboxrun import Sandbox, Limits
        async def main():
            async with Sandbox({str(workspace)!r}, backend="process-group",
                               limits=Limits(grace_s=0.5)) as sb:
                await sb.exec(shell="(setsid sleep 8765.25 &); echo go; sleep 8765.5")
        anyio.run(main)
        """
    )
    host = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert wait_until(lambda: bool(processes_with_arg("8765.5")), 10)
        assert wait_until(lambda: bool(processes_with_arg("8765.25")), 5)
    finally:
        host.kill()
        host.wait()
    assert wait_until(
        lambda: not processes_with_arg("8765.5") and not processes_with_arg("8765.25"), 5
    ), "the run outlived its host"


async def test_runner_is_reaped_after_close(workspace: Path) -> None:
    async with Sandbox(workspace, backend="process-group") as sb:
        backend = sb.backend
        assert isinstance(backend, ProcessGroupBackend)
        pid = backend._client.pid
        await sb.exec(["true"])
    assert pid is not None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    assert time.monotonic() > 0


async def test_unencodable_argument_is_refused_before_spawn(workspace: Path) -> None:
    async with Sandbox(workspace, backend="process-group") as sb:
        with pytest.raises(ConfigError, match="cannot be passed"):
            await sb.exec(["echo", "\ud800"])
        assert (await sb.exec(["true"])).status == "completed"  # the runner is fine


async def test_runner_holds_no_host_secrets(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_API_TOKEN", "hunter2")
    async with Sandbox(workspace, backend="process-group") as sb:
        backend = sb.backend
        assert isinstance(backend, ProcessGroupBackend)
        pid = backend._client.pid
        assert pid is not None
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"hunter2" not in environ
