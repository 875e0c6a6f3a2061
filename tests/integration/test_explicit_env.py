"""An explicitly given variable (``-e NAME=VALUE``, ``env=``) always wins, on every backend.

``HOME``, ``TMPDIR``, ``SHELL`` and ``PATH`` are the names a backend sets on its own (the docker
backend drops the host's and puts its ``HOME``); an explicit value must still arrive. ``PATH`` is
also assigned by the login profile (``bash -l``): an explicit one is re-applied after it, and
``--path-prepend`` directories still come first. Real processes and the real engine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import require_backend

from sandboxrun import Sandbox

pytestmark = pytest.mark.anyio

CLI = [sys.executable, "-m", "sandboxrun"]
SHOW = 'printf "%s|%s|%s|%s|" "$PATH" "$HOME" "$TMPDIR" "$SHELL"; foo; env'


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(params=["process-group", "docker"])
def name(request: pytest.FixtureRequest) -> str:
    return require_backend(str(request.param))


def tools(workspace: Path) -> Path:
    """A directory with a ``foo`` that only an explicit PATH finds."""
    directory = workspace / "tools"
    directory.mkdir()
    foo = directory / "foo"
    foo.write_text("#!/bin/sh\necho found-foo\n")
    foo.chmod(0o755)
    return directory


def explicit_env(name: str, workspace: Path) -> dict[str, str]:
    root = "/workspace" if name == "docker" else str(workspace)
    return {
        "PATH": f"{root}/tools:/usr/bin:/bin",
        "HOME": f"{root}/home",
        "TMPDIR": root,
        "SHELL": "/bin/sh",
    }


@pytest.mark.parametrize("mode", ["argv", "shell"])
async def test_explicit_variables_win(name: str, workspace: Path, mode: str) -> None:
    tools(workspace)
    (workspace / "home").mkdir()
    wanted = explicit_env(name, workspace)
    host = {"PATH": "/host/bin:/usr/bin:/bin", "HOME": "/host/home", "TMPDIR": "/host/tmp"}
    async with Sandbox(workspace, backend=name, env=wanted, host_env=host) as sb:
        if mode == "argv":
            result = await sb.exec(["sh", "-c", SHOW])
        else:
            result = await sb.exec(shell=SHOW)
    assert result.status == "completed", result.stderr
    shown, _, rest = result.stdout.rpartition("|")
    assert shown.split("|") == [wanted[n] for n in ("PATH", "HOME", "TMPDIR", "SHELL")]
    assert rest.startswith("found-foo\n")
    assert "SANDBOXRUN_EXPLICIT_PATH" not in rest  # a wrapper variable never reaches the command


@pytest.mark.parametrize("mode", ["argv", "shell"])
async def test_prepend_goes_before_an_explicit_path(name: str, workspace: Path, mode: str) -> None:
    wanted = explicit_env(name, workspace)["PATH"]
    async with Sandbox(workspace, backend=name, env={"PATH": wanted}) as sb:
        if mode == "argv":
            result = await sb.exec(["printenv", "PATH"], path_prepend=["/opt/x"])
        else:
            result = await sb.exec(shell='echo "$PATH"', path_prepend=["/opt/x"])
    assert result.status == "completed", result.stderr
    assert result.stdout == f"/opt/x:{wanted}\n"


@pytest.mark.parametrize("mode", ["argv", "shell"])
def test_cli_explicit_tmpdir_home_and_path(name: str, workspace: Path, mode: str) -> None:
    tools(workspace)
    wanted = explicit_env(name, workspace)
    flags = [x for n, v in wanted.items() for x in ("-e", f"{n}={v}")]
    script = 'printf "%s|%s|%s|" "$TMPDIR" "$HOME" "$PATH"; foo'
    command = ["--", "sh", "-c", script] if mode == "argv" else ["--shell", "--", script]
    proc = cli("run", "-b", name, "-w", str(workspace), *flags, *command)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{wanted['TMPDIR']}|{wanted['HOME']}|{wanted['PATH']}|found-foo\n"
