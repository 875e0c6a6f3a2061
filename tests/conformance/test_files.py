"""``read_file`` / ``write_file`` / ``list_dir`` on every backend: the same semantics wherever
the file is (workspace, /tmp, HOME), the same errors, and no way for a command to turn them
against the host (symlinks out of the workspace, a FIFO that would block)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from helpers import require_backend

from sandboxrun import (
    DirEntry,
    Limits,
    Policy,
    Sandbox,
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    SandboxIsADirectoryError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
    WorkspaceError,
)

pytestmark = pytest.mark.anyio

FAST = Limits(grace_s=0.5, drain_s=0.5)
BINARY = bytes(range(256)) * 3 + b"\n\x00end"


@asynccontextmanager
async def sandbox(workspace: Path, backend: str, **kwargs: object) -> AsyncIterator[Sandbox]:
    async with Sandbox(workspace, backend=backend, limits=FAST, **kwargs) as sb:  # type: ignore[arg-type]
        yield sb


async def sh(sb: Sandbox, script: str) -> str:
    result = await sb.exec(shell=script)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def private_tmp(sb: Sandbox) -> bool:
    """Whether the sandbox has its own /tmp and HOME, which the API may write (without
    namespaces a local sandbox can write only its workspace)."""
    return (
        sb.backend.name == "docker"
        or "private-tmp" in sb.backend.plan(sb._prepare(["true"])).isolation
    )


def workspace_in_view(sb: Sandbox) -> str:
    return str(sb.workspace.root) if sb.backend.name == "fake" else "/workspace"


async def test_workspace_round_trip(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend) as sb:
        await sb.write_file("sub/api.bin", BINARY)
        assert (workspace / "sub" / "api.bin").read_bytes() == BINARY
        assert await sh(sb, "od -An -tx1 sub/api.bin | tr -d ' \\n' | head -c 32") == (
            "000102030405060708090a0b0c0d0e0f"
        )
        await sh(sb, "printf 'from the command\\n' > sub/cmd.txt")
        assert await sb.read_file("sub/cmd.txt") == b"from the command\n"
        absolute = f"{workspace_in_view(sb)}/sub/cmd.txt"
        assert await sb.read_file(absolute) == b"from the command\n"
        assert await sb.read_file(Path("sub") / "api.bin") == BINARY
        await sb.write_file("hello.txt", b"short")  # replaced, not appended or left longer
        assert await sb.read_file("hello.txt") == b"short"
        await sb.write_file("sub/empty", b"")
        assert await sb.read_file("sub/empty") == b""


@pytest.mark.parametrize("where", ["/tmp", "~"])
async def test_private_dirs_round_trip(workspace: Path, backend: str, where: str) -> None:
    async with sandbox(workspace, backend) as sb:
        if not private_tmp(sb):
            with pytest.raises(SandboxPermissionError):
                await sb.write_file(f"{where}/sandboxrun-api.txt", b"x")
            pytest.skip("no private /tmp or HOME without namespaces: writes there are refused")
        await sb.write_file(f"{where}/api.txt", b"written by the API\n", mode=0o600)
        shell_where = "$HOME" if where == "~" else where
        assert await sh(sb, f"cat {shell_where}/api.txt") == "written by the API\n"
        assert await sh(sb, f"stat -c %a {shell_where}/api.txt") == "600\n"
        await sh(sb, f"printf 'by the command' > {shell_where}/cmd.txt")
        assert await sb.read_file(f"{where}/cmd.txt") == b"by the command"
        names = [e.name for e in await sb.list_dir(where)]
        assert {"api.txt", "cmd.txt"} <= set(names)
        home = (await sh(sb, 'printf %s "$HOME"')) if where == "~" else "/tmp"
        assert await sb.read_file(f"{home}/cmd.txt") == b"by the command"
    assert not (workspace / "api.txt").exists()


async def test_list_dir(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend) as sb:
        await sh(sb, "printf 12345 > sub/five; chmod 640 sub/five; ln -s five sub/link")
        entries = await sb.list_dir("sub")
        assert [e.name for e in entries] == ["dir", "five", "link"]
        by_name = {e.name: e for e in entries}
        assert by_name["five"] == DirEntry("five", "file", 5, 0o640)
        assert by_name["dir"].kind == "dir"
        assert by_name["link"].kind == "symlink"
        assert by_name["link"].size == len("five")
        assert [e.name for e in await sb.list_dir()] == ["hello.txt", "sub"]
        assert await sb.list_dir("sub/dir") == []


async def test_clear_errors(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend) as sb:
        with pytest.raises(SandboxFileNotFoundError, match=r"'nope\.txt'") as found:
            await sb.read_file("nope.txt")
        assert isinstance(found.value, FileNotFoundError)
        assert found.value.path == "nope.txt"
        with pytest.raises(SandboxFileNotFoundError):
            await sb.read_file("/no/such/dir/file")
        with pytest.raises(SandboxFileNotFoundError):
            await sb.write_file("no-dir/file", b"x")
        with pytest.raises(SandboxIsADirectoryError, match="'sub'"):
            await sb.read_file("sub")
        with pytest.raises(SandboxIsADirectoryError):
            await sb.write_file("sub/dir", b"x")
        with pytest.raises(SandboxNotADirectoryError, match=r"'hello\.txt'"):
            await sb.list_dir("hello.txt")
        with pytest.raises(SandboxFileNotFoundError):
            await sb.list_dir("/tmp/no-such-dir")
        with pytest.raises(WorkspaceError, match="escapes the workspace"):
            await sb.read_file("../outside")


async def test_write_file_makes_parents_when_asked(workspace: Path, backend: str) -> None:
    # issue 20: write_file could not create parents (inspect's write_file must)
    async with sandbox(workspace, backend) as sb:
        await sb.write_file("a/b/c.txt", b"deep", parents=True)
        assert await sb.read_file("a/b/c.txt") == b"deep"
        assert (workspace / "a" / "b" / "c.txt").read_bytes() == b"deep"
        await sb.write_file("/tmp/x/y/z", b"tmp", parents=True)
        assert await sb.read_file("/tmp/x/y/z") == b"tmp"
        with pytest.raises(SandboxNotADirectoryError):
            await sb.write_file("hello.txt/under/f", b"x", parents=True)
    policy = Policy(access="read-only", allow_degraded=True)
    async with sandbox(workspace, backend, policy=policy) as sb:
        with pytest.raises(SandboxPermissionError):
            await sb.write_file("ro/new.txt", b"x", parents=True)
    assert not (workspace / "ro").exists()


async def test_too_large(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend) as sb:
        await sb.write_file("big", b"x" * 2000)
        with pytest.raises(SandboxFileTooLargeError, match=r"2000 bytes.*max_bytes=1000") as big:
            await sb.read_file("big", max_bytes=1000)
        assert (big.value.size, big.value.limit) == (2000, 1000)
        assert await sb.read_file("big", max_bytes=2000) == b"x" * 2000


async def test_permission(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend) as sb:
        await sh(sb, "printf secret > locked; chmod 000 locked")
        if (await sb.exec(shell="cat locked")).ok:
            pytest.skip("the sandbox's user can read a mode-000 file here (capabilities)")
        if os.geteuid() == 0 and sb._files().supervisor is None:
            pytest.skip("without a supervisor, root here reads what the sandbox may not")
        with pytest.raises(SandboxPermissionError, match="'locked'") as denied:
            await sb.read_file("locked")
        assert isinstance(denied.value, PermissionError)
        with pytest.raises(SandboxPermissionError):
            await sb.write_file("locked", b"overwritten")
        await sh(sb, "chmod 600 locked")
        assert await sb.read_file("locked") == b"secret"


async def test_read_only_policy(workspace: Path, backend: str) -> None:
    policy = Policy(access="read-only", allow_degraded=True)
    async with sandbox(workspace, backend, policy=policy) as sb:
        with pytest.raises(SandboxPermissionError):
            await sb.write_file("hello.txt", b"changed")
        assert await sb.read_file("hello.txt") == b"hello\n"
    assert (workspace / "hello.txt").read_text() == "hello\n"


async def test_symlinks_planted_by_a_command(workspace: Path, backend: str) -> None:
    """A symlink out of the workspace is never followed out (read, write or list); one that
    stays inside is followed."""
    async with sandbox(workspace, backend) as sb:
        await sh(
            sb,
            "ln -s /etc/shadow shadow; ln -s / hostroot; ln -s ../.. up; "
            "ln -s sub/dir inner; printf inside > sub/dir/f; ln -s ../../hello.txt sub/dir/back",
        )
        for path in ["shadow", "hostroot/etc/passwd", "up/etc/passwd", "hostroot/tmp"]:
            with pytest.raises(WorkspaceError, match="resolves outside the workspace"):
                await sb.read_file(path)
        with pytest.raises(WorkspaceError):
            await sb.write_file("hostroot/tmp/sandboxrun-planted", b"x")
        with pytest.raises(WorkspaceError):
            await sb.write_file("shadow", b"x")
        with pytest.raises(WorkspaceError):
            await sb.list_dir("hostroot")
        with pytest.raises(WorkspaceError):
            await sb.read_file(f"{workspace_in_view(sb)}/hostroot/etc/passwd")
        if sb.backend.name != "docker":  # a local sandbox's workspace at its host path too
            with pytest.raises(WorkspaceError):
                await sb.read_file(f"{sb.workspace.root}/hostroot/etc/passwd")
        assert not Path("/tmp/sandboxrun-planted").exists()
        assert await sb.read_file("inner/f") == b"inside"
        assert await sb.read_file("inner/back") == b"hello\n"
        await sb.write_file("inner/new", b"new")
        assert (workspace / "sub" / "dir" / "new").read_bytes() == b"new"


async def test_fifo_is_refused_not_waited_on(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend) as sb:
        await sh(sb, "mkfifo fifo")
        places = ["fifo"]
        if private_tmp(sb):
            await sh(sb, "mkfifo /tmp/fifo")
            places.append("/tmp/fifo")
        for path in places:
            with anyio.fail_after(10):
                with pytest.raises(SandboxFileError, match="FIFO"):
                    await sb.read_file(path)
                with pytest.raises(SandboxFileError, match="FIFO"):
                    await sb.write_file(path, b"x")
                with pytest.raises(SandboxNotADirectoryError):
                    await sb.list_dir(path)


# -- docker without its in-container supervisor ---------------------------------------------------
@pytest.fixture(params=["host", "archive"])
def docker_fallback(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Docker with no supervisor (an image without python3): through this host (a local
    engine) or through the engine's archive API (as for a remote engine)."""
    require_backend("docker")
    monkeypatch.setenv("SANDBOXRUN_DOCKER_SUPERVISOR", "0")
    return str(request.param)


async def test_docker_without_supervisor(workspace: Path, docker_fallback: str) -> None:
    async with sandbox(workspace, "docker") as sb:
        assert sb._files().supervisor is None
        await sh(
            sb,
            "printf tmp > /tmp/t; printf home > ~/h; mkfifo /tmp/fifo; ln -s /etc/shadow shadow; "
            "ln -s /etc/hostname /tmp/host; ln -s /proc/1/environ /tmp/env",
        )
        hostname = (await sh(sb, "cat /etc/hostname")).encode()
        backend = sb.backend
        if docker_fallback == "archive":
            backend.session.local = False  # type: ignore[attr-defined]
        try:
            await sb.write_file("api.txt", b"api")
            assert await sb.read_file("/workspace/api.txt") == b"api"
            with pytest.raises(WorkspaceError):
                await sb.read_file("shadow")
            assert await sb.read_file("/etc/hostname") == hostname
            assert "hello.txt" in [e.name for e in await sb.list_dir("/workspace")]
            with pytest.raises(SandboxFileError, match="max_entries=1 "):
                await sb._files().list_dir("/workspace", max_entries=1)
            if docker_fallback == "archive":
                with pytest.raises(SandboxFileError, match="tmpfs"):
                    await sb.read_file("/tmp/t")
                with pytest.raises(SandboxPermissionError, match="read-only"):
                    await sb.write_file("/etc/api", b"x")
                return
            assert await sb.read_file("/tmp/t") == b"tmp"
            assert await sb.read_file("~/h") == b"home"
            assert await sb.read_file("/tmp/host") == hostname  # the container's, not ours
            await sb.write_file("/tmp/api", b"to tmp")
            with anyio.fail_after(10), pytest.raises(SandboxFileError, match="FIFO"):
                await sb.read_file("/tmp/fifo")
            with pytest.raises(SandboxPermissionError):
                await sb.read_file("/tmp/env")  # the container's /proc: never from here
            with pytest.raises(SandboxPermissionError):
                await sb.write_file("/etc/api", b"x")
        finally:
            backend.session.local = True  # type: ignore[attr-defined]
        assert await sh(sb, "cat /tmp/api; stat -c %u /workspace/api.txt") == (
            f"to tmp{backend.user.split(':')[0]}\n"  # type: ignore[attr-defined]
        )


# -- cancellation, kernel file systems, big directories -------------------------------------------
def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def cancel_many(sb: Sandbox, times: int = 600) -> None:
    """Cancel ``times`` file calls after 0..11 checkpoints: a cancellation may land anywhere,
    between the open and the I/O too; no fd may stay open."""
    for _ in range(3):  # warm up (worker threads, the engine's connection pool...)
        await sb.read_file("hello.txt")
        await sb.list_dir("sub")
    before = open_fds()
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: sb.read_file("hello.txt"),
        lambda: sb.write_file("sub/cancelled.txt", b"x"),
        lambda: sb.list_dir("sub"),
    ]
    for i in range(times):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_after(n: int, scope: anyio.CancelScope = scope) -> None:
                    for _ in range(n):
                        await anyio.lowlevel.checkpoint()
                    scope.cancel()

                tg.start_soon(cancel_after, i % 12)
                await calls[i % 3]()
    await anyio.sleep(0.2)  # late replies of the supervisor are closed as they arrive
    assert open_fds() - before <= 3


async def test_cancelled_calls_leak_no_fd(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend) as sb:
        await cancel_many(sb)


async def test_cancelled_calls_leak_no_fd_without_supervisor(
    workspace: Path, docker_fallback: str
) -> None:
    async with sandbox(workspace, "docker") as sb:
        if docker_fallback == "archive":
            pytest.skip("no fd is held by the archive route")
        await cancel_many(sb, 300)


async def test_proc_self_is_never_this_process(
    workspace: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/proc/self`` opened from this host would be this process: its environment (secrets)."""
    monkeypatch.setenv("SANDBOXRUN_TEST_HOST_SECRET", "host-only-s3cret")
    async with sandbox(workspace, backend) as sb:
        try:
            data = await sb.read_file("/proc/self/environ")
        except SandboxPermissionError:  # a host-side route: procfs is refused
            return
        except SandboxFileError as exc:  # the archive route and its limits
            pytest.skip(str(exc))
        assert b"host-only-s3cret" not in data


async def test_list_dir_max_entries(workspace: Path, backend: str) -> None:
    async with sandbox(workspace, backend) as sb:
        await sh(sb, "for i in 1 2 3 4 5; do : > sub/dir/f$i; done")
        files = sb._files()
        assert len(await files.list_dir("sub/dir", max_entries=5)) == 5
        with pytest.raises(SandboxFileError, match="more than max_entries=4 entries"):
            await files.list_dir("sub/dir", max_entries=4)
