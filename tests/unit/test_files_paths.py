"""The pure parts of ``sandboxrun.api.files``: path classification, error mapping, ``open_beneath``
(the symlink-safe open the supervisor and the host use), fd I/O checks, stray open replies."""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import anyio
import anyio.lowlevel
import pytest

from sandboxrun import (
    ConfigError,
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    SandboxIsADirectoryError,
    SandboxPermissionError,
    WorkspaceError,
)
from sandboxrun.api.files import SandboxFiles
from sandboxrun.api.files_archive import ChunkReader
from sandboxrun.api.files_paths import (
    DirEntry,
    Target,
    check_max_bytes,
    check_max_entries,
    check_write,
    file_error,
    list_fd,
    open_host,
    read_fd,
    refuse_kernel_fs,
    resolve,
    write_fd,
)
from sandboxrun.backends.base import SandboxView
from sandboxrun.backends.client import RunnerClient
from sandboxrun.models import Policy
from sandboxrun.supervisor.safeopen import open_beneath

ROOT = "/workspace"
HOME = "/home/sandbox"


@pytest.mark.parametrize(
    ("given", "path", "rel"),
    [
        ("a.txt", "/workspace/a.txt", "a.txt"),
        ("./sub//b/", "/workspace/sub/b", "sub/b"),
        ("sub/../a", "/workspace/a", "a"),
        (".", "/workspace", "."),
        ("/workspace", "/workspace", "."),
        ("/workspace/x/../y", "/workspace/y", "y"),
        ("//workspace/z", "/workspace/z", "z"),
        ("/tmp/x", "/tmp/x", None),
        ("/workspace2/x", "/workspace2/x", None),
        ("/workspace/../etc/passwd", "/etc/passwd", None),
        ("~", HOME, None),
        ("~/notes.txt", "/home/sandbox/notes.txt", None),
        ("~user", "/workspace/~user", "~user"),
    ],
)
def test_resolve(given: str, path: str, rel: str | None) -> None:
    assert resolve(given, root=ROOT, home=HOME) == Target(given, path, rel)


def test_resolve_local_workspace_and_pathlike() -> None:
    target = resolve(Path("/srv/ws/a"), root="/srv/ws", home="/tmp/sandboxrun-home")
    assert (target.path, target.rel) == ("/srv/ws/a", "a")
    assert resolve("~/x", root="/srv/ws", home="/srv/ws").rel == "x"  # HOME in the workspace


@pytest.mark.parametrize("given", ["..", "../x", "a/../../x", "./.."])
def test_resolve_refuses_climbing_out(given: str) -> None:
    with pytest.raises(WorkspaceError, match="escapes the workspace"):
        resolve(given, root=ROOT, home=HOME)


@pytest.mark.parametrize("given", ["", "a\0b"])
def test_resolve_refuses_malformed(given: str) -> None:
    with pytest.raises(ConfigError):
        resolve(given, root=ROOT, home=HOME)


def test_checks_of_arguments() -> None:
    check_max_bytes(0)
    for bad in (-1, True, 1.5, "10"):
        with pytest.raises(ConfigError):
            check_max_bytes(bad)  # type: ignore[arg-type]
    check_max_entries(0)
    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigError):
            check_max_entries(bad)  # type: ignore[arg-type]
    check_write(b"x", 0o755)
    check_write(memoryview(b"x"), 0o1777)
    with pytest.raises(ConfigError, match="bytes"):
        check_write("text", 0o644)
    for mode in (0o4755, 0o2755, -1, True):
        with pytest.raises(ConfigError):
            check_write(b"x", mode)


def test_error_mapping() -> None:
    inside, outside = Target("a", "/workspace/a", "a"), Target("/t", "/t", None)
    cases: list[tuple[int, type[Exception]]] = [
        (errno.ENOENT, SandboxFileNotFoundError),
        (errno.EISDIR, SandboxIsADirectoryError),
        (errno.EACCES, SandboxPermissionError),
        (errno.EROFS, SandboxPermissionError),
        (errno.ENOSPC, SandboxFileError),
    ]
    for code, kind in cases:
        error = file_error(OSError(code, os.strerror(code)), outside, "read")
        assert type(error) is kind
        assert "'/t'" in str(error)
        assert isinstance(error, SandboxFileError)
        assert error.errno == code
    assert isinstance(file_error(OSError(errno.EXDEV, "x"), inside, "read"), WorkspaceError)
    assert isinstance(file_error(OSError(errno.EXDEV, "x"), outside, "read"), WorkspaceError)
    assert "FIFO" in str(file_error(OSError(errno.ENXIO, "x"), outside, "write"))
    assert isinstance(file_error(OSError(0, "it is a FIFO"), outside, "read"), SandboxFileError)


# -- open_beneath ------------------------------------------------------------------------------
@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "d" / "e").mkdir(parents=True)
    (root / "f").write_text("f")
    (root / "d" / "g").write_text("g")
    (tmp_path / "outside").write_text("outside")
    links = {
        "in": "d/g",
        "dirlink": "d",
        "d/up": "../f",
        "d/e/top": "../../f",
        "abs": str(root / "f"),
        "out": "../outside",
        "loop": "loop",
        "dangling": "d/new",
        "slash": "/",
    }
    for name, target in links.items():
        (root / name).symlink_to(target)
    return root


def read_beneath(root: Path, path: str, *, in_root: bool = False) -> str:
    fd, created = open_beneath(str(root), path, os.O_RDONLY, in_root=in_root)
    assert not created
    try:
        return os.read(fd, 100).decode()
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("path", "content"),
    [("f", "f"), ("in", "g"), ("dirlink/g", "g"), ("d/up", "f"), ("dirlink/up", "f"),
     ("d/e/top", "f"), ("d/../f", "f"), ("d/e/../../in", "g")],
)  # fmt: skip
def test_open_beneath_follows_links_that_stay(tree: Path, path: str, content: str) -> None:
    assert read_beneath(tree, path) == content


@pytest.mark.parametrize("path", ["abs", "out", "slash/etc/passwd", "..", "d/../../outside"])
def test_open_beneath_refuses_a_step_out(tree: Path, path: str) -> None:
    with pytest.raises(OSError) as refused:
        read_beneath(tree, path)
    assert refused.value.errno == errno.EXDEV


def test_open_beneath_errors(tree: Path) -> None:
    with pytest.raises(OSError) as loop:
        read_beneath(tree, "loop")
    assert loop.value.errno == errno.ELOOP
    with pytest.raises(NotADirectoryError):
        read_beneath(tree, "f/x")
    with pytest.raises(FileNotFoundError):
        read_beneath(tree, "d/missing")
    with pytest.raises(NotADirectoryError):
        open_beneath(str(tree), "f", os.O_RDONLY | os.O_DIRECTORY)


def test_open_beneath_creates(tree: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd, created = open_beneath(str(tree), "dangling", flags, 0o600)  # through the link
    os.close(fd)
    assert created
    assert (tree / "d" / "new").exists()
    assert (tree / "d" / "new").stat().st_mode & 0o777 == 0o600 & ~_umask()
    fd, created = open_beneath(str(tree), "d/new", flags)
    os.close(fd)
    assert not created
    with pytest.raises(IsADirectoryError):
        open_beneath(str(tree), "d", flags)
    with pytest.raises(OSError) as refused:
        open_beneath(str(tree), "out", flags)
    assert refused.value.errno == errno.EXDEV
    assert (tree.parent / "outside").read_text() == "outside"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_open_beneath_in_root_keeps_links_inside(tree: Path) -> None:
    """``in_root``: a container's root; its absolute links and ``..`` stay in it."""
    (tree / "etc").mkdir()
    (tree / "etc" / "passwd").write_text("the container's")
    assert read_beneath(tree, "slash/etc/passwd", in_root=True) == "the container's"
    assert read_beneath(tree, "../../etc/passwd", in_root=True) == "the container's"
    (tree / "abs2").symlink_to("/etc/passwd")
    assert read_beneath(tree, "abs2", in_root=True) == "the container's"


# -- fd I/O -------------------------------------------------------------------------------------
def test_read_fd_bounds_and_types(tmp_path: Path) -> None:
    target = Target("x", "/x", None)
    (tmp_path / "f").write_bytes(b"12345")
    assert read_fd(os.open(tmp_path / "f", os.O_RDONLY), target, 5) == b"12345"
    with pytest.raises(SandboxFileTooLargeError, match="5 bytes, more than max_bytes=4"):
        read_fd(os.open(tmp_path / "f", os.O_RDONLY), target, 4)
    with pytest.raises(SandboxIsADirectoryError):
        read_fd(os.open(tmp_path, os.O_RDONLY), target, 4)
    os.mkfifo(tmp_path / "fifo")
    fifo = os.open(tmp_path / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    with pytest.raises(SandboxFileError, match="a FIFO"):
        read_fd(fifo, target, 4)
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fifo)  # closed by read_fd whatever happened


def test_read_fd_refuses_a_file_whose_size_lies() -> None:
    """procfs files say 0 bytes: the cap holds on what is really read."""
    with pytest.raises(SandboxFileTooLargeError):
        read_fd(os.open("/proc/self/status", os.O_RDONLY), Target("s", "/s", None), 10)


def test_write_fd_replaces(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"a longer old content")
    write_fd(os.open(tmp_path / "f", os.O_WRONLY), Target("f", "/f", None), b"new")
    assert (tmp_path / "f").read_bytes() == b"new"


def test_list_fd(tmp_path: Path) -> None:
    (tmp_path / "b").write_bytes(b"123")
    (tmp_path / "a").mkdir()
    (tmp_path / "c").symlink_to("b")
    os.mkfifo(tmp_path / "d")
    entries = list_fd(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY), Target("t", "/t", None))
    assert [(e.name, e.kind) for e in entries] == [
        ("a", "dir"),
        ("b", "file"),
        ("c", "symlink"),
        ("d", "other"),
    ]
    assert entries[1] == DirEntry("b", "file", 3, (tmp_path / "b").stat().st_mode & 0o7777)


def test_list_fd_caps_the_entries(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}").touch()
    target = Target("t", "/t", None)
    assert len(list_fd(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY), target, 5)) == 5
    with pytest.raises(SandboxFileError, match=r"more than max_entries=4 entries"):
        list_fd(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY), target, 4)


def test_chunk_reader_caps() -> None:
    reader = ChunkReader(iter([b"abc", b"def"]), 4)
    assert reader.read(2) == b"ab"
    assert reader.read(1) == b"c"
    with pytest.raises(OverflowError):
        reader.read(1)


def test_an_open_reply_nobody_waits_for_has_its_fd_closed() -> None:
    client = RunnerClient()
    r, w = os.pipe()
    os.close(w)
    client._dispatch({"op": "opened", "id": "open-9", "kind": "file", "size": 0, "_fds": [r]})
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(r)
    client._opens["open-1"] = None
    r2, w2 = os.pipe()
    os.close(w2)
    client._dispatch({"op": "opened", "id": "open-1", "kind": "file", "size": 0, "_fds": [r2]})
    assert client._opens["open-1"] is not None  # its waiter takes it (and the fd)
    os.close(r2)


@pytest.mark.parametrize("path", ["/proc/self/environ", "/proc/self", "/sys/kernel"])
def test_refuse_kernel_fs(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    with pytest.raises(PermissionError):
        refuse_kernel_fs(fd)
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)  # closed


# -- the host route of a local sandbox without namespaces (systemd-scope without bubblewrap) ----
@pytest.fixture
def host_files(tmp_path: Path) -> SandboxFiles:
    """systemd-scope without a namespace holder: absolute paths are this host's own."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "hello.txt").write_text("hello\n")
    (tmp_path / "secret").write_text("host secret")
    (tmp_path / "public").write_text("public")
    plan = SimpleNamespace(namespaces=False, off=False, run_as=None, inside_root=None)
    view = SandboxView(home=None, supervisor=None, host_plan=plan)  # type: ignore[arg-type]
    backend = SimpleNamespace(name="systemd-scope", view=lambda: view)
    return SandboxFiles(
        backend,
        SimpleNamespace(root=ws),  # type: ignore[arg-type]
        Policy(),
        host_home=str(tmp_path),
    )


@pytest.mark.anyio
async def test_host_route_never_opens_procfs(host_files: SandboxFiles, tmp_path: Path) -> None:
    """A command plants ``/tmp/out -> /proc/self/environ``: read from this host, that would be
    this process's environment (its secrets)."""
    (tmp_path / "out").symlink_to("/proc/self/environ")
    for path in [str(tmp_path / "out"), "/proc/self/environ", "/proc/self/status"]:
        with pytest.raises(SandboxPermissionError, match="kernel"):
            await host_files.read_file(path, 1 << 20)
    with pytest.raises(SandboxPermissionError):
        await host_files.list_dir("/proc/self/fd")
    with pytest.raises(SandboxPermissionError):
        await host_files.read_file("/sys/kernel/mm/transparent_hugepage/enabled", 1 << 20)
    (tmp_path / "link").symlink_to("public")
    assert await host_files.read_file(str(tmp_path / "link"), 100) == b"public"
    assert await host_files.read_file("~/public", 100) == b"public"


@pytest.mark.anyio
async def test_host_route_walks_the_workspace_beneath(
    host_files: SandboxFiles, tmp_path: Path
) -> None:
    """An absolute path that reaches the workspace some other way (a symlink to it, a magic
    link of /proc) still cannot follow the sandbox's symlinks out of it."""
    ws = tmp_path / "ws"
    (ws / "leak").symlink_to(tmp_path / "secret")
    (ws / "sub" / "up").symlink_to("../hello.txt")
    (tmp_path / "alias").symlink_to(ws)
    dirfd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for path in [f"{tmp_path}/alias/leak", f"/proc/self/fd/{dirfd}/leak"]:
            with pytest.raises(WorkspaceError, match="resolves outside the workspace"):
                await host_files.read_file(path, 100)
        assert await host_files.read_file(f"{tmp_path}/alias/sub/up", 100) == b"hello\n"
        assert await host_files.read_file(f"/proc/self/fd/{dirfd}/hello.txt", 100) == b"hello\n"
        names = [e.name for e in await host_files.list_dir(f"{tmp_path}/alias/sub")]
        assert names == ["up"]
    finally:
        os.close(dirfd)
    with pytest.raises(SandboxPermissionError, match="only its workspace"):
        await host_files.write_file(f"{tmp_path}/alias/new", b"x", 0o644)


@pytest.mark.anyio
async def test_host_route_writes_with_full_access(host_files: SandboxFiles, tmp_path: Path) -> None:
    host_files.plan = SimpleNamespace(namespaces=False, off=True, run_as=None, inside_root=None)  # type: ignore[assignment]
    await host_files.write_file(f"{tmp_path}/made", b"made", 0o600)
    assert (tmp_path / "made").read_bytes() == b"made"
    (tmp_path / "dangling").symlink_to("made-through-link")
    await host_files.write_file(f"{tmp_path}/dangling", b"linked", 0o600)
    assert (tmp_path / "made-through-link").read_bytes() == b"linked"
    (tmp_path / "ws" / "out").symlink_to(tmp_path / "victim")
    (tmp_path / "alias").symlink_to("ws")
    with pytest.raises(WorkspaceError):
        await host_files.write_file(f"{tmp_path}/alias/out", b"x", 0o644)
    assert not (tmp_path / "victim").exists()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.anyio
async def test_cancelled_calls_leak_no_fd(host_files: SandboxFiles) -> None:
    """A cancellation between the open and the I/O (a cancelled ``run_sync`` never runs its
    function) must not leave the fd open."""
    await host_files.read_file("hello.txt", 100)
    before = open_fds()
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: host_files.read_file("hello.txt", 100),
        lambda: host_files.write_file("sub/w.txt", b"w", 0o644),
        lambda: host_files.list_dir("sub"),
    ]
    for i in range(300):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_after(n: int, scope: anyio.CancelScope = scope) -> None:
                    for _ in range(n):
                        await anyio.lowlevel.checkpoint()
                    scope.cancel()

                tg.start_soon(cancel_after, i % 10)
                await calls[i % 3]()
    assert open_fds() - before <= 2


def test_open_beneath_in_root_stays_at_its_root(tree: Path) -> None:
    assert read_beneath(tree, "../f", in_root=True) == "f"  # ``..`` at the root stays there
    assert read_beneath(tree, "slash/d/g", in_root=True) == "g"  # "/" is the root
    assert read_beneath(tree, "d/../../../in", in_root=True) == "g"
    with pytest.raises(FileNotFoundError):  # an absolute link restarts at the root: not found
        read_beneath(tree, "abs", in_root=True)


def test_open_beneath_hands_the_rest_over_where_it_stops(tree: Path) -> None:
    d = (tree / "d").stat()
    seen: list[str] = []

    def enter(rest: str) -> tuple[int, bool]:
        seen.append(rest)
        return os.open(os.devnull, os.O_RDONLY), False

    stop = (d.st_dev, d.st_ino)
    for path in ("dirlink/e/x", "d/e/..", "in", "d"):  # "in" -> d/g: it stops in d
        fd, _ = open_beneath(str(tree), path, os.O_RDONLY, stop_at=stop, enter=enter)
        os.close(fd)
    assert seen == ["e/x", "e/..", "g", "."]
    with pytest.raises(NotADirectoryError):  # f is no directory: the walk never gets to d
        open_beneath(str(tree), "f/../d/g", os.O_RDONLY, stop_at=stop, enter=enter)
    assert read_beneath(tree, "d/g") == "g"  # no stop asked: the walk goes on
    fd, _ = open_host(str(tree / "in"), os.O_RDONLY, 0, str(tree / "d"), enter)
    os.close(fd)
    assert seen[-1] == "g"  # the host walk is the same walk, from /


# -- the archive strategy's handling of the engine's answers ------------------------------------
class VanishingArchive:
    """An engine whose file is gone between its stat and its read (a command removed it)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def stat(self, path: str) -> dict[str, object] | None:
        self.asked.append(path)
        return {"mode": 1 << 31} if path in ("/workspace",) else {"mode": 0o644, "size": 3}

    def get(self, path: str) -> object | None:
        self.asked.append(f"get {path}")
        return None  # the engine's 404

    def put(self, directory: str, tar: bytes) -> None:
        raise AssertionError("not written")


def test_a_file_gone_between_stat_and_read_is_not_found() -> None:
    from sandboxrun.api.files_archive import ArchiveFiles
    from sandboxrun.backends.base import ContainerAccess
    from sandboxrun.errors import SandboxFileNotFoundError

    archive = VanishingArchive()
    access = ContainerAccess("c0ffee", None, False, archive, "1000:1000")
    files = ArchiveFiles(lambda: access, "/workspace", "/home/sandbox")
    target = Target("f.txt", "/workspace/f.txt", "f.txt")
    with pytest.raises(SandboxFileNotFoundError, match=r"f\.txt"):
        files.read(target, 100)
    assert archive.asked == ["/workspace", "/workspace/f.txt", "get /workspace/f.txt"]


def test_a_local_sandboxs_host_path_is_the_workspace_too() -> None:
    """Bound at ``/workspace`` and at its host path: both name the workspace (its checks: a
    symlink out of it is refused, not followed in the sandbox's view)."""
    got = resolve("/host/ws/a/b", root="/workspace", home="/h", alias="/host/ws")
    assert (got.path, got.rel) == ("/workspace/a/b", "a/b")
    top = resolve("/host/ws", root="/workspace", home="/h", alias="/host/ws")
    assert (top.path, top.rel) == ("/workspace", ".")
    assert resolve("/host/wsx/a", root="/workspace", home="/h", alias="/host/ws").rel is None
    assert resolve("/workspace/a", root="/workspace", home="/h", alias="/host/ws").rel == "a"


def test_a_mask_named_at_slash_workspace_is_the_workspaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandboxrun.api.request import mapped_masks
    from sandboxrun.engine.paths import Workspace

    ws = Workspace(tmp_path)
    got = mapped_masks(("/workspace/.env", "/workspace/a/../b", "/etc/x", "rel"), ws)
    assert got == (str(tmp_path / ".env"), str(tmp_path / "b"), "/etc/x", "rel")
    real = os.path.lexists
    monkeypatch.setattr(os.path, "lexists", lambda p: str(p) == "/workspace" or real(p))
    assert mapped_masks(("/workspace/.env",), ws) == ("/workspace/.env",)  # the host's own
