"""One behaviour on every backend (issue 20): what a command can see of the host does not depend
on which backend runs it.

A workspace that is a home directory (``cd ~ && sandboxrun run -- cat .ssh/id_rsa``): the
local backends masked its secret paths, docker printed the key."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandboxrun import ConfigError, Limits, Mount, Policy, Sandbox, SandboxFileError

pytestmark = pytest.mark.anyio

KEY = "-----BEGIN OPENSSH PRIVATE KEY----- not-a-real-key-4f1c"
FAST = Limits(grace_s=0.5, drain_s=0.5)


async def test_secrets_of_a_home_workspace_are_masked(
    workspace: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / ".ssh").mkdir()
    (workspace / ".ssh" / "id_rsa").write_text(KEY)
    (workspace / ".netrc").write_text(f"machine example.org password {KEY}\n")
    (workspace / "notes.txt").write_text("not a secret\n")
    monkeypatch.setenv("HOME", str(workspace))  # the workspace is the invoker's home
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        seen = await sb.exec(
            shell="cat .ssh/id_rsa; cat .netrc; ls -A .ssh; echo ---; cat notes.txt"
        )
        for secret in (".ssh/id_rsa", ".netrc"):
            with pytest.raises(SandboxFileError):
                got = await sb.read_file(secret)
                assert KEY.encode() not in got
    assert KEY not in seen.stdout + seen.stderr, seen
    assert seen.stdout.endswith("---\nnot a secret\n"), seen  # the rest stays readable
    assert "secrets-masked" in seen.isolation
    assert (workspace / ".ssh" / "id_rsa").read_text() == KEY  # the host's own stays


async def test_mounts_show_the_same_on_every_backend(
    workspace: Path, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--mount SRC:DST[:ro|rw]`` (issue 20): read-only by default, for commands and the files
    API alike; ``:rw`` writes reach the host; a home directory mounted anywhere keeps its
    secret paths hidden; a refusal comes before anything starts."""
    data, out, home = tmp_path / "data", tmp_path / "out", tmp_path / "home"
    (data / "sub").mkdir(parents=True)
    (data / "f.txt").write_text("from the host\n")
    out.mkdir()
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(KEY)
    (home / "notes.txt").write_text("not a secret\n")
    monkeypatch.setenv("HOME", str(home))
    rw = Mount(source=str(out), target="/var/tmp/rw", read_only=False)
    policy = Policy(
        mounts=(Mount.parse(f"{data}:/var/tmp/ro"), rw, Mount.parse(f"{home}:/var/tmp/h"))
    )
    async with Sandbox(workspace, backend=backend, limits=FAST, policy=policy) as sb:
        seen = await sb.exec(
            shell="cat /var/tmp/ro/f.txt; touch /var/tmp/ro/new 2>&1 | grep -c 'Read-only'; "
            "echo made > /var/tmp/rw/made.txt; cat /var/tmp/h/notes.txt; "
            "cat /var/tmp/h/.ssh/id_rsa; ls -A /var/tmp/h/.ssh | wc -l"
        )
        assert await sb.read_file("/var/tmp/ro/f.txt") == b"from the host\n"
        with pytest.raises(SandboxFileError):
            await sb.write_file("/var/tmp/ro/other.txt", b"x")
    assert seen.stdout == "from the host\n1\nnot a secret\n0\n", seen
    assert KEY not in seen.stdout + seen.stderr
    assert (out / "made.txt").read_text() == "made\n"
    assert sorted(p.name for p in data.iterdir()) == ["f.txt", "sub"]  # nothing written there
    with pytest.raises(ConfigError, match="the target is at, in or around the workspace"):
        Sandbox(
            workspace, backend=backend, policy=Policy(mounts=(Mount.parse(f"{data}:/workspace/d"),))
        )


async def test_a_mount_source_swapped_after_its_check_is_never_mounted(
    workspace: Path, backend: str, tmp_path: Path
) -> None:
    """Hostile: whoever can write a mount source's directory swaps the checked source for a
    symlink to a daemon's socket directory between ``Sandbox()`` and ``open()``. The local
    backends bind the source by fd, checked again when opened; docker checks it again just
    before the engine resolves it. Either way the open is refused and leaves nothing."""
    source, doors = tmp_path / "src", tmp_path / "doors"
    source.mkdir()
    doors.mkdir()
    daemon = socket.socket(socket.AF_UNIX)
    daemon.bind(str(doors / "daemon.sock"))
    daemon.listen(1)
    try:
        mount = Mount.parse(f"{source}:/var/tmp/m")
        sb = Sandbox(workspace, backend=backend, limits=FAST, policy=Policy(mounts=(mount,)))
        source.rmdir()
        source.symlink_to(doors)
        with pytest.raises(ConfigError, match="its source changed since it was checked"):
            await sb.open()
        source.unlink()
        source.mkdir()
        async with sb:  # the same Sandbox, its source back: it opens (a failed open is retried)
            seen = await sb.exec(shell="ls -A /var/tmp/m | wc -l")
        assert seen.stdout == "0\n", seen
    finally:
        daemon.close()


OWNER = 4242


def python_runs_as(uid: int) -> bool:
    """The oracle: whether ``uid`` can run this Python at all (a root invoker's own interpreter
    under ``/root`` cannot be run by another uid: then the rule cannot apply here)."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", ""], user=uid, group=uid, extra_groups=[],
            capture_output=True, timeout=30, check=False, env={},
        )  # fmt: skip
    except OSError:
        return False
    return done.returncode == 0


async def test_owner_uid_rule_of_a_root_invoker(backend: str) -> None:
    """As root, with a workspace another uid owns: the command runs as that uid on every
    backend (docker did; process-group ran as root without capabilities and got EACCES with no
    word why), and the files the command and the files API create are that uid's; where it
    cannot, the result says why in one line."""
    if os.geteuid() != 0:
        pytest.skip("the rule is a root invoker's")
    top = Path(tempfile.mkdtemp(prefix="sandboxrun-owner-", dir="/tmp"))
    try:
        top.chmod(0o755)  # (pytest's own tmp_path is root's 0700: no other uid reaches it)
        ws = top / "ws"
        ws.mkdir()
        os.chown(ws, OWNER, OWNER)
        strict = backend == "docker" or python_runs_as(OWNER)
        async with Sandbox(ws, backend=backend, limits=FAST) as sb:
            seen = await sb.exec(shell="id -u; id -g; touch made && echo made")
            if strict and backend != "docker":
                await sb.write_file("sub/by-api.txt", b"x", parents=True)
                # the sandbox's own PID 1 (runner, holder) is that uid too; what it cannot
                # search is masked whole (no mount left undone), what it can is masked as is
                inside = await sb.exec(
                    shell="awk '/^Uid:/ {print $2}' /proc/1/status; ls -A /root && echo listed;"
                    " test -c /etc/shadow && echo null"
                )
                assert inside.stdout == f"{OWNER}\nlisted\nnull\n", inside
        if strict:
            assert seen.stdout == f"{OWNER}\n{OWNER}\nmade\n", seen
            assert not [w for w in seen.warnings if "workspace's owner" in w], seen
            assert (ws / "made").stat().st_uid == OWNER
            assert "non-root" in seen.isolation or backend == "docker", seen.isolation
            if backend != "docker":
                assert (ws / "sub").stat().st_uid == OWNER
                assert (ws / "sub" / "by-api.txt").stat().st_uid == OWNER
        else:  # it says why, in one line, and runs as root (no layer dropped for it)
            said = [w for w in seen.warnings if "workspace's owner" in w]
            assert len(said) == 1 and "\n" not in said[0], seen.warnings
            assert f"uid {OWNER}" in said[0], said
            assert seen.stdout.startswith("0\n0\n"), seen
    finally:
        shutil.rmtree(top, ignore_errors=True)


async def test_the_workspace_is_at_slash_workspace_on_every_backend(
    workspace: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``auto`` falling back to process-group the workspace moved from ``/workspace`` to
    the host path (``list_dir("/workspace")``: not found). Now one path everywhere: the
    commands start there, the files API and a denial take it as the workspace's; a local
    sandbox keeps the host path too (the same files), its secrets masked in both places."""
    (workspace / ".ssh").mkdir()
    (workspace / ".ssh" / "id_rsa").write_text(KEY)
    monkeypatch.setenv("HOME", str(workspace))
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        seen = await sb.exec(
            shell="pwd; echo $PWD; cat /workspace/hello.txt; echo made > /workspace/sub/m;"
            " cat /workspace/.ssh/id_rsa; ls -A /workspace/.ssh | wc -l",
            workdir="sub",
        )
        names = [e.name for e in await sb.list_dir("/workspace")]
        assert await sb.read_file("/workspace/sub/m") == b"made\n"
        await sb.write_file("/workspace/sub/api", b"api")
        at = await sb.exec(["pwd"], workdir="/workspace/sub/dir")
        if backend != "docker":  # the host path: the same files, the same checks
            host = await sb.exec(shell=f"cat {workspace}/.ssh/id_rsa; cat {workspace}/sub/m")
            assert host.stdout == "made\n" and KEY not in host.stdout + host.stderr, host
    assert seen.stdout.startswith("/workspace/sub\n/workspace/sub\nhello\n"), seen
    assert seen.stdout.endswith("0\n"), seen  # the secret's directory shown empty
    assert KEY not in seen.stdout + seen.stderr, seen
    assert "hello.txt" in names and "sub" in names, names
    assert (workspace / "sub" / "m").read_text() == "made\n"
    assert (workspace / "sub" / "api").read_bytes() == b"api"
    assert at.stdout == "/workspace/sub/dir\n", at
    ro = Policy(access="read-only")
    async with Sandbox(workspace, backend=backend, limits=FAST, policy=ro) as sb:
        denied = await sb.exec(shell="touch /workspace/sub/new")
    assert denied.denial is not None and denied.denial.kind == "filesystem", denied
    assert denied.denial.escalate_to == ro.model_copy(update={"access": "workspace-write"})
