"""The login-shell environment snapshot, the same on every backend: the login profile runs once
per sandbox (per path prepends), every command sees what it set, argv and shell mode alike;
explicit variables and PATH prepends win over it; ``login="each"`` runs it per command.

The profile lives in a ``HOME`` given explicitly inside the workspace (so the test can write it
before the sandbox opens: the snapshot is taken by the first command)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandboxrun import Limits, Policy, Sandbox
from sandboxrun.engine.paths import CONTAINER_ROOT

pytestmark = pytest.mark.anyio

FAST = Limits(grace_s=0.5, drain_s=0.5)
PROFILE_PATH = "/usr/bin:/bin:/profile-dir"
PROFILE = f"""echo ran >> "$HOME/count"
echo "profile noise on stdout"
LOGIN_VAR=from-profile; export LOGIN_VAR
PATH="{PROFILE_PATH}"; export PATH
"""


def home(workspace: Path, backend: str, profile: str = PROFILE) -> str:
    """Write the profile (``.profile``, and ``.zprofile`` for a zsh user) into ``ws/home``;
    the ``HOME`` to give the sandbox for it."""
    (workspace / "home").mkdir(exist_ok=True)
    (workspace / "home" / ".profile").write_text(profile)
    (workspace / "home" / ".zprofile").write_text('. "$HOME/.profile"\n')
    if backend == "docker":
        return str(CONTAINER_ROOT / "home")
    return str(workspace / "home")


def runs(workspace: Path) -> int:
    count = workspace / "home" / "count"
    return len(count.read_text().splitlines()) if count.exists() else 0


def sandbox(
    workspace: Path,
    backend: str,
    profile: str = PROFILE,
    *,
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> Sandbox:
    env = {"HOME": home(workspace, backend, profile), **(env or {})}
    return Sandbox(workspace, backend=backend, limits=FAST, env=env, **kwargs)


async def test_profile_runs_once_for_argv_and_shell_mode(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend) as sb:
        results = []
        for _ in range(3):
            results.append(await sb.exec(["sh", "-c", 'echo "$LOGIN_VAR|$PATH"']))
            results.append(await sb.exec(shell='echo "$LOGIN_VAR|$PATH"'))
    for result in results:
        assert result.status == "completed", result
        assert result.stdout == f"from-profile|{PROFILE_PATH}\n"
        assert result.warnings == []
    assert results[0].argv == ["sh", "-c", 'echo "$LOGIN_VAR|$PATH"']  # no wrapper: as is
    assert results[1].argv[1:] == ["-c", 'echo "$LOGIN_VAR|$PATH"']  # <shell> -c, no login
    assert runs(workspace) == 1


async def test_concurrent_first_commands_share_one_snapshot(workspace: Path, backend: str) -> None:
    outputs: list[str] = []
    async with sandbox(workspace, backend) as sb:

        async def one() -> None:
            outputs.append((await sb.exec(["sh", "-c", 'echo "$LOGIN_VAR"'])).stdout)

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(one)
    assert outputs == ["from-profile\n"] * 4
    assert runs(workspace) == 1


async def test_path_prepend_comes_first_after_the_profile(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend, path_prepend=["/opt/tools"]) as sb:
        argv = await sb.exec(["sh", "-c", 'echo "$PATH"'], path_prepend=["/opt/venv"])
        script = await sb.exec(shell='echo "$PATH"')
    assert argv.stdout == f"/opt/tools:/opt/venv:{PROFILE_PATH}\n"
    assert script.stdout == f"/opt/tools:{PROFILE_PATH}\n"
    assert runs(workspace) == 2  # one snapshot per set of prepends (the profile sees them)


async def test_explicit_env_beats_the_profile(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend, env={"LOGIN_VAR": "sandbox-level"}) as sb:
        first = await sb.exec(["sh", "-c", 'echo "$LOGIN_VAR"'])
        second = await sb.exec(shell='echo "$LOGIN_VAR"', env={"LOGIN_VAR": "exec-level"})
    assert first.stdout == "sandbox-level\n"
    assert second.stdout == "exec-level\n"


async def test_explicit_path_wins_over_the_profile(workspace: Path, backend: str) -> None:
    explicit = "/usr/bin:/bin:/explicit"
    async with sandbox(workspace, backend) as sb:
        plain = await sb.exec(["sh", "-c", 'echo "$PATH"'], env={"PATH": explicit})
        prepended = await sb.exec(
            shell='echo "$PATH"', env={"PATH": explicit}, path_prepend=["/opt/x"]
        )
    assert plain.stdout == f"{explicit}\n"
    assert prepended.stdout == f"/opt/x:{explicit}\n"


async def test_internal_and_shell_bookkeeping_variables_are_not_in_the_snapshot(
    workspace: Path, backend: str
) -> None:
    async with sandbox(workspace, backend) as sb:
        result = await sb.exec(["env"], workdir="sub")
    names = dict(line.partition("=")[::2] for line in result.stdout.splitlines())
    assert names["SANDBOXRUN_RUN_ID"] == result.run_id
    assert [n for n in names if n.startswith("SANDBOXRUN_")] == ["SANDBOXRUN_RUN_ID"]
    assert not {"SHLVL", "OLDPWD", "_"} & set(names)
    assert names["PWD"].endswith("/sub")  # never the snapshot's directory
    assert names["LOGIN_VAR"] == "from-profile"


async def test_login_each_runs_the_profile_per_command(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend, login="each") as sb:
        argv = await sb.exec(["sh", "-c", 'echo "$LOGIN_VAR|$PATH"'], path_prepend=["/opt/x"])
        script = await sb.exec(shell='echo "$LOGIN_VAR"')
        again = await sb.exec(["true"])
    noise = "profile noise on stdout\n"  # a login shell per command: its profile's output too
    assert argv.stdout == f"{noise}from-profile|/opt/x:{PROFILE_PATH}\n"
    assert script.stdout == f"{noise}from-profile\n"
    assert again.status == "completed"
    assert "-lc" in argv.argv and "-lc" in script.argv
    assert runs(workspace) == 3


async def test_login_shell_is_honoured(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend, login_shell="/bin/sh") as sb:
        result = await sb.exec(shell='echo "$0|$LOGIN_VAR"')
    assert result.stdout == "/bin/sh|from-profile\n"
    assert runs(workspace) == 1


async def test_a_failed_snapshot_falls_back_to_each_with_one_warning(
    workspace: Path, backend: str
) -> None:
    once = 'if [ ! -e "$HOME/failed" ]; then : > "$HOME/failed"; exit 3; fi\n'
    async with sandbox(workspace, backend, once + PROFILE) as sb:
        first = await sb.exec(["sh", "-c", 'echo "$LOGIN_VAR"'])
        second = await sb.exec(shell='echo "$LOGIN_VAR"')
    assert first.status == "completed"
    assert first.stdout.splitlines()[-1] == "from-profile"  # each: the profile's noise first
    assert len(first.warnings) == 1
    assert "snapshot failed" in first.warnings[0] and "status 3" in first.warnings[0]
    assert (second.stdout.splitlines()[-1], second.warnings) == ("from-profile", [])
    assert "-lc" in first.argv
    assert runs(workspace) == 2  # per command, after the failed snapshot


@pytest.mark.parametrize("login_shell", ["/usr/bin/fish", "/usr/sbin/nologin"])
async def test_a_non_posix_login_shell_gets_bash_or_sh(
    workspace: Path, backend: str, login_shell: str
) -> None:
    """Docker: a user whose passwd entry says nologin (``nobody``; the image has no fish, and
    fish is as unusable as a missing shell). Local backends cannot change the host user's
    entry: a ``getent`` first on the explicit PATH answers with one instead."""
    options: dict[str, Any] = {}
    if backend == "docker":
        if login_shell != "/usr/sbin/nologin":
            pytest.skip("the image has no fish user (the selection is unit-tested)")
        options["user"] = "65534"
    else:
        fake = workspace / "bin"
        fake.mkdir()
        getent = fake / "getent"
        getent.write_text(f"#!/bin/sh\necho 'u:x:{os.getuid()}:0::/nonexistent:{login_shell}'\n")
        getent.chmod(0o755)
        options["env"] = {"PATH": f"{fake}:/usr/bin:/bin"}
    async with sandbox(workspace, backend, **options) as sb:
        result = await sb.exec(shell='echo "$0"')
    assert result.status == "completed", result
    assert os.path.basename(result.stdout.strip()) in ("bash", "sh")


def sandbox_dir(workspace: Path, backend: str, rel: str) -> str:
    """``rel`` in the workspace as the command sees it."""
    if backend != "fake":  # on every backend (the local ones bind it there too)
        return str(CONTAINER_ROOT / rel)
    return os.path.realpath(workspace / rel)


async def test_pwd_is_the_commands_directory_unless_given(workspace: Path, backend: str) -> None:
    """An argv runs with no shell to set PWD: sandboxrun sets it, on every backend."""
    async with sandbox(workspace, backend) as sb:
        plain = await sb.exec(["printenv", "PWD"], workdir="sub/dir")
        given = await sb.exec(["printenv", "PWD"], env={"PWD": "/given"})
    assert plain.stdout == sandbox_dir(workspace, backend, "sub/dir") + "\n"
    assert given.stdout == "/given\n"


SECRET = "s3cr3t-token-value-42"


async def test_a_failed_snapshot_warning_masks_the_secrets(
    workspace: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The snapshot's output is not masked (it carries the environment), but its stderr line in
    the warning (result and log) is."""
    profile = 'echo "tok=$API_TOKEN" >&2\nexit 1\n'
    with caplog.at_level(logging.WARNING, logger="sandboxrun"):
        async with sandbox(workspace, backend, profile, env={"API_TOKEN": SECRET}) as sb:
            result = await sb.exec(["true"])
    assert len(result.warnings) == 1, result
    assert "tok=[masked:API_TOKEN]" in result.warnings[0]
    assert SECRET not in result.model_dump_json()
    assert "snapshot failed" in caplog.text and SECRET not in caplog.text


SLOW = 'echo ran >> "$HOME/count"\nsleep 3\nLOGIN_VAR=from-profile; export LOGIN_VAR\n'


async def test_the_snapshot_counts_against_the_first_commands_timeout(
    workspace: Path, backend: str
) -> None:
    """A profile slower than the command's timeout: the command times out on time (not after
    the profile and then its own timeout), and the cut snapshot is not kept as a failure."""
    async with sandbox(workspace, backend, SLOW) as sb:
        began = time.monotonic()
        first = await sb.exec(["sleep", "10"], timeout=1)
        took = time.monotonic() - began
        second = await sb.exec(["sh", "-c", 'echo "$LOGIN_VAR"'], timeout=20)
    assert (first.status, first.timed_out, first.warnings) == ("timed_out", True, []), first
    assert first.duration_s >= 1.0 and took < 3.0
    assert (second.status, second.stdout, second.warnings) == ("completed", "from-profile\n", [])
    assert second.duration_s >= 3.0  # its own snapshot's time included
    assert runs(workspace) == 2  # taken again by the second command


async def test_closing_during_the_first_snapshot_cancels_the_command(
    workspace: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    results = []
    with caplog.at_level(logging.WARNING, logger="sandboxrun"):
        async with sandbox(workspace, backend, SLOW) as sb:

            async def one() -> None:
                results.append(await sb.exec(["true"]))

            async with anyio.create_task_group() as tg:
                tg.start_soon(one)
                await anyio.sleep(1.0)
                await sb.aclose()
    (result,) = results
    assert result.status == "cancelled", result
    assert result.error == "cancelled: the sandbox was closed during the command"
    assert result.warnings == [] and "snapshot failed" not in caplog.text


async def test_no_login_shell_under_a_tiny_pids_limit(workspace: Path, backend: str) -> None:
    """A profile forks (``id -u``, ``tput``): under ``pids=1`` neither a snapshot nor a login
    shell per command could run. None is attempted: an argv runs directly on the local
    backends (as it always did there), with its path prepends applied."""
    if backend == "docker":
        pytest.skip("a container needs more than 8 pids for its init and supervisor")
    tools = workspace / "tools"
    tools.mkdir()
    limits = Limits(pids=1, grace_s=0.5)
    policy = Policy(allow_degraded=True)  # process-group cannot limit pids
    async with Sandbox(
        workspace, backend=backend, limits=limits, policy=policy, path_prepend=[str(tools)]
    ) as sb:
        result = await sb.exec(["sh", "-c", 'echo "$PATH"'])
    assert result.status == "completed", result
    assert result.stdout.startswith(f"{tools}:")
    assert result.argv[0] == "sh" and result.warnings == []
