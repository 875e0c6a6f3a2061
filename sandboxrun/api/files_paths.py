"""Paths and fds for ``sandboxrun.api.files``: classifying a sandbox path (pure), mapping errors,
the I/O on an open fd (worker threads), and the host-side safety checks: ``open_host`` (an
absolute host path, the workspace opened beneath as soon as the walk reaches it) and
``refuse_kernel_fs`` (never procfs, sysfs... from this host)."""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import posixpath
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sandboxrun.errors import (
    ConfigError,
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    SandboxIsADirectoryError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
    SandboxrunError,
    WorkspaceError,
)
from sandboxrun.supervisor.runner import special
from sandboxrun.supervisor.safeopen import open_beneath

DEFAULT_MAX_BYTES = 16 << 20
"""``read_file``'s default cap: 16 MiB."""
DEFAULT_MAX_ENTRIES = 10_000
"""``list_dir``'s default cap: more entries raise ``SandboxFileError`` (nothing partial)."""
CHUNK = 1 << 20
MAX_MODE = 0o1777
"""No setuid/setgid bits: the sandbox's seccomp filter refuses them to commands too."""
KERNEL_FS = frozenset({
    0x9FA0, 0x62656572, 0x64626720, 0x74726163, 0x73636673, 0x0027E0EB, 0x63677270,
    0xCAFE4A11, 0x62656570, 0xDE5E81E4, 0x6165676C, 0x42494E4D, 0xF97CFF8C, 0x43415D53,
    0x65735543, 0x6E736673, 0x1CD1,
})  # fmt: skip
"""``statfs`` types never read, written or listed from this host (their files are the kernel's
view of this process, its environment and its secrets): proc, sysfs, debugfs, tracefs,
securityfs, cgroup, cgroup2, bpf, configfs, efivarfs, pstore, binfmt_misc, selinuxfs, smackfs,
fusectl, nsfs, devpts."""

EntryKind = Literal["file", "dir", "symlink", "other"]


@dataclass(frozen=True)
class DirEntry:
    """One entry of ``list_dir``; a symlink is described, not followed."""

    name: str
    kind: EntryKind
    size: int | None
    """Bytes (a symlink: the length of its target); None when it could not be read."""
    mode: int | None
    """Permission bits (``stat.S_IMODE``); None when they could not be read."""


@dataclass(frozen=True)
class Target:
    """A path of the sandbox, resolved lexically."""

    shown: str
    """As the caller gave it (messages name it)."""
    path: str
    """Absolute, normalized, in the sandbox's view."""
    rel: str | None
    """In the workspace: relative to its root (``"."`` is the root itself); else None."""


PATH_MAX = 4096
"""Bytes of a path at most (Linux's ``PATH_MAX``, with its NUL): a longer one is refused before
anything opens it."""


def resolve(
    path: str | os.PathLike[str], *, root: str, home: str, alias: str | None = None
) -> Target:
    """Classify ``path`` (pure): relative -> workspace-relative; ``~`` -> ``home``; absolute ->
    the workspace when under ``root`` (the workspace in the sandbox's view) or ``alias`` (its
    other path there: a local sandbox's host path), else outside. ``..`` may not climb out of
    the workspace (``WorkspaceError``); symlinks are judged when the path is opened."""
    shown = os.fspath(path)
    if not isinstance(shown, str):
        raise ConfigError(f"path {shown!r} must be a str (or os.PathLike[str])")
    if not shown or "\0" in shown:
        raise ConfigError(f"invalid path {shown!r}: expected a non-empty path without NUL")
    size = len(os.fsencode(shown))
    if size > PATH_MAX:  # refused here: never sent on, never quoted whole in an error
        preview = f"{shown[:60]!r}\u2026"
        raise SandboxFileError(
            f"path {preview} is {size} bytes: longer than the {PATH_MAX} a path may have",
            preview,
            errno.ENAMETOOLONG,
        )
    text = home + shown[1:] if shown == "~" or shown.startswith("~/") else shown
    if not text.startswith("/"):
        rel = posixpath.normpath(text)
        if rel == ".." or rel.startswith("../"):
            raise WorkspaceError(f"path {shown!r} escapes the workspace (by '..')")
        return Target(shown, root if rel == "." else posixpath.join(root, rel), rel)
    norm = "/" + posixpath.normpath(text).lstrip("/")
    for base in (root, alias):
        if base is not None and (norm == base or norm.startswith(base.rstrip("/") + "/")):
            rel = posixpath.relpath(norm, base)
            return Target(shown, root if rel == "." else posixpath.join(root, rel), rel)
    return Target(shown, norm, None)


ERRORS: dict[int, type[SandboxFileError]] = {
    errno.ENOENT: SandboxFileNotFoundError,
    errno.EISDIR: SandboxIsADirectoryError,
    errno.ENOTDIR: SandboxNotADirectoryError,
    errno.EACCES: SandboxPermissionError,
    errno.EPERM: SandboxPermissionError,
    errno.EROFS: SandboxPermissionError,
}


def file_error(exc: OSError, target: Target, doing: str) -> SandboxrunError:
    """The sandboxrun error for an ``OSError`` met while ``doing`` (``"read"``...) ``target``.
    EXDEV is ``open_beneath``'s (and ``open_host``'s) refusal of a step out of the workspace."""
    code = exc.errno or None
    why = exc.strerror or str(exc)
    if code == errno.EXDEV:
        return WorkspaceError(
            f"path {target.shown!r} resolves outside the workspace (through a symlink or "
            "'..'): refused"
        )
    if code == errno.ENXIO:  # opened for writing: a FIFO without a reader, or a socket
        why = "it is a FIFO or a socket, not a regular file"
    return ERRORS.get(code or 0, SandboxFileError)(
        f"cannot {doing} {target.shown!r}: {why}", target.shown, code
    )


def check_max_bytes(max_bytes: int) -> None:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ConfigError(f"invalid max_bytes {max_bytes!r}: expected an int >= 0")


def check_max_entries(max_entries: int) -> None:
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
        raise ConfigError(f"invalid max_entries {max_entries!r}: expected an int >= 0")


def check_write(data: object, mode: int) -> None:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ConfigError(f"write_file takes bytes, not {type(data).__name__} (encode text first)")
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= MAX_MODE:
        raise ConfigError(f"invalid mode {mode!r}: expected permission bits 0..0o1777")


# -- I/O on an open fd (worker threads) -------------------------------------------------------
def read_fd(fd: int, target: Target, max_bytes: int) -> bytes:
    """Read a whole regular file, at most ``max_bytes``; closes ``fd``."""
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise SandboxIsADirectoryError(
                f"cannot read {target.shown!r}: it is a directory", target.shown, errno.EISDIR
            )
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(target, "read", st.st_mode)
        if st.st_size > max_bytes:
            raise SandboxFileTooLargeError(target.shown, st.st_size, max_bytes)
        chunks, total = [], 0
        while chunk := os.read(fd, min(CHUNK, max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:  # it grew meanwhile, or its size lies (procfs)
                raise SandboxFileTooLargeError(target.shown, total, max_bytes)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_fd(fd: int, target: Target, data: bytes | bytearray | memoryview) -> None:
    """Replace a regular file's content with ``data``; closes ``fd``."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(target, "write", st.st_mode)
        if st.st_size:  # opened without O_TRUNC here (host-side routes check first)
            os.ftruncate(fd, 0)
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def list_fd(fd: int, target: Target, max_entries: int = DEFAULT_MAX_ENTRIES) -> list[DirEntry]:
    """The entries of a directory, by name (symlinks not followed); closes ``fd``. More than
    ``max_entries`` raise ``SandboxFileError`` (scanning stops there)."""
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise SandboxNotADirectoryError(
                f"cannot list {target.shown!r}: not a directory", target.shown, errno.ENOTDIR
            )
        entries: list[DirEntry] = []
        with os.scandir(fd) as found:
            for entry in found:
                if len(entries) == max_entries:
                    raise too_many(target, max_entries)
                entries.append(describe(entry))
        return sorted(entries, key=lambda e: e.name)
    finally:
        os.close(fd)


def too_many(target: Target, max_entries: int) -> SandboxFileError:
    return SandboxFileError(
        f"cannot list {target.shown!r}: it has more than max_entries={max_entries} entries",
        target.shown,
    )


def describe(entry: os.DirEntry[str]) -> DirEntry:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:  # this process may not search the directory (another uid): its type only
        if entry.is_symlink():
            return DirEntry(entry.name, "symlink", None, None)
        if entry.is_dir(follow_symlinks=False):
            return DirEntry(entry.name, "dir", None, None)
        kind: EntryKind = "file" if entry.is_file(follow_symlinks=False) else "other"
        return DirEntry(entry.name, kind, None, None)
    return DirEntry(entry.name, kind_of(st.st_mode), st.st_size, stat.S_IMODE(st.st_mode))


def kind_of(mode: int) -> EntryKind:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "symlink" if stat.S_ISLNK(mode) else "other"


def not_regular(target: Target, doing: str, mode: int) -> SandboxFileError:
    return SandboxFileError(
        f"cannot {doing} {target.shown!r}: it is {special(mode)}, not a regular file",
        target.shown,
    )


# -- host-side opens ----------------------------------------------------------------------------
@functools.cache
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def fs_type(fd: int) -> int:
    """``fstatfs(fd).f_type`` (the first field of ``struct statfs``, a C long)."""
    buf = ctypes.create_string_buffer(512)  # struct statfs: 120 bytes on 64-bit Linux
    if libc().fstatfs(fd, buf) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def refuse_kernel_fs(fd: int) -> None:
    """Close ``fd`` and raise EACCES when it is on a kernel file system (``KERNEL_FS``):
    opened from this host, ``/proc/self`` is this process (its environment, its fds)."""
    try:
        kernel = fs_type(fd) in KERNEL_FS
    except BaseException:
        os.close(fd)
        raise
    if kernel:
        os.close(fd)
        raise OSError(errno.EACCES, "/proc, /sys and the kernel's file systems are not reachable")


def open_host(
    path: str, flags: int, mode: int, workspace: str, enter: Callable[[str], tuple[int, bool]]
) -> tuple[int, bool]:
    """Open the absolute host ``path`` as ``open(2)`` would, but resolving each symlink here
    (``supervisor.safeopen``: ``O_NOFOLLOW`` on every component, so no magic link of /proc is
    followed by the kernel). When the walk reaches the ``workspace`` directory (by its device
    and inode: through a symlink, ``/proc/<pid>/cwd``...), the rest of the path is handed to
    ``enter`` (relative to the workspace, ``"."`` for itself): the sandbox writes there, so its
    symlinks are judged beneath it. Returns ``(fd, created)``."""
    ws = os.stat(workspace)  # noqa: PTH116 - its device and inode
    return open_beneath(
        "/", path, flags, mode, in_root=True, stop_at=(ws.st_dev, ws.st_ino), enter=enter
    )
