"""A remote docker engine's files: through its archive API (``backends.base.Archive``), for a
sandbox without a supervisor whose container's root this host cannot reach (``api.files``).

Each symlink is resolved here, one component at a time (the engine says where a link leads, in
the container's scope), so a workspace path that leads out of the workspace is refused as
``open_beneath`` does. The API cannot see the container's tmpfs mounts (``/tmp``, ``HOME``).
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import stat
import tarfile
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from sandboxrun.api.files_paths import DirEntry, EntryKind, Target, file_error, too_many
from sandboxrun.errors import (
    BackendError,
    SandboxFileError,
    SandboxFileTooLargeError,
    SandboxIsADirectoryError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
)
from sandboxrun.supervisor.safeopen import MAX_HOPS

if TYPE_CHECKING:
    from sandboxrun.backends.base import Archive, ContainerAccess

ARCHIVE_LIST_CAP = 64 << 20
"""The most a directory's archive may weigh to be listed through a remote engine."""


class ArchiveFiles:
    """Read, write and list one container's files through the engine's archive API.
    ``access``: the container as the backend shows it now (``BackendError`` once closed);
    ``root``: the workspace in the container; ``home``: its ``HOME``."""

    def __init__(self, access: Callable[[], ContainerAccess], root: str, home: str) -> None:
        self.access = access
        self.root = root
        self.home = home

    def _archive(self) -> Archive:
        access = self.access()
        if access.archive is None:
            raise BackendError("docker: the sandbox container is gone (the sandbox was closed)")
        return access.archive

    def _reachable(self, target: Target, path: str) -> None:
        for mount in ("/tmp", self.home):  # noqa: S108 - the container's tmpfs mounts
            if path == mount or path.startswith(mount + "/"):
                raise SandboxFileError(
                    f"cannot reach {target.shown!r}: the engine's archive API does not see the "
                    f"container's tmpfs mount {mount} (the image needs python3 for the "
                    "in-container supervisor)",
                    target.shown,
                )

    @staticmethod
    def _archive_head(archive: Archive, path: str, target: Target) -> dict[str, Any]:
        """The engine's stat of ``path`` (a last symlink not followed); {} when missing."""
        try:
            return archive.stat(path) or {}
        except BackendError as exc:
            raise SandboxFileError(f"cannot reach {target.shown!r}: {exc}", target.shown) from None

    @staticmethod
    def _archive_get(archive: Archive, path: str, target: Target, doing: str) -> Any:
        try:
            stream = archive.get(path)
        except BackendError as exc:
            raise SandboxFileError(f"cannot reach {target.shown!r}: {exc}", target.shown) from None
        if stream is None:  # gone since its stat (or its container is)
            raise file_error(OSError(errno.ENOENT, os.strerror(errno.ENOENT)), target, doing)
        return stream

    def _archive_resolve(
        self, target: Target, doing: str, *, may_miss: bool = False
    ) -> tuple[Archive, str, dict[str, Any]]:
        """``(archive, path, stat)``: ``target`` with every symlink resolved, one component
        at a time (the engine says where each link leads, in the container's scope), so that
        a workspace path leading out of the workspace is refused as ``open_beneath`` does.
        ``may_miss``: a missing last component is fine (its stat is {}: a file to create)."""
        archive = self._archive()
        done, todo, hops = "/", [p for p in target.path.split("/") if p], 0
        info: dict[str, Any] = {}
        while todo:
            path = posixpath.join(done, todo.pop(0))
            self._reachable(target, path)
            info = self._archive_head(archive, path, target)
            if not info:
                if may_miss and not todo:
                    return archive, path, info
                raise file_error(OSError(errno.ENOENT, os.strerror(errno.ENOENT)), target, doing)
            mode, link = int(info.get("mode", 0)), str(info.get("linkTarget") or "")
            if mode & GO_SYMLINK and link:
                hops += 1
                leads = posixpath.normpath(posixpath.join(done, link))
                inside = leads == self.root or leads.startswith(self.root + "/")
                if hops > MAX_HOPS or (target.rel is not None and not inside):
                    code = errno.ELOOP if hops > MAX_HOPS else errno.EXDEV
                    raise file_error(OSError(code, os.strerror(code)), target, doing)
                done, todo = "/", [p for p in leads.split("/") if p] + todo
                continue
            if todo and not mode & GO_DIR:
                raise file_error(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)), target, doing)
            done = path
        return archive, done, info

    def read(self, target: Target, max_bytes: int) -> bytes:
        archive, path, info = self._archive_resolve(target, "read")
        mode, size = int(info.get("mode", 0)), int(info.get("size", 0))
        if mode & GO_DIR or path == "/":
            raise SandboxIsADirectoryError(
                f"cannot read {target.shown!r}: it is a directory", target.shown, errno.EISDIR
            )
        if mode & GO_SPECIAL:
            raise SandboxFileError(
                f"cannot read {target.shown!r}: it is not a regular file", target.shown
            )
        if size > max_bytes:
            raise SandboxFileTooLargeError(target.shown, size, max_bytes)
        stream = self._archive_get(archive, path, target, "read")
        try:
            reader = ChunkReader(stream, size + (1 << 20))  # the tar's headers and padding
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                member = tar.next()
                data = tar.extractfile(member) if member and member.isfile() else None
                content = b"" if data is None else data.read(max_bytes + 1)
        except (OverflowError, tarfile.TarError) as exc:  # it grew meanwhile, or garbage
            raise SandboxFileError(
                f"cannot read {target.shown!r}: the engine's archive is unusable ({exc})",
                target.shown,
            ) from None
        finally:
            stream.close()
        if data is None:
            raise SandboxFileError(
                f"cannot read {target.shown!r}: the engine sent no file", target.shown
            )
        if len(content) > max_bytes:
            raise SandboxFileTooLargeError(target.shown, len(content), max_bytes)
        return content

    def write(self, target: Target, data: bytes | bytearray | memoryview, mode: int) -> None:
        archive, path, found = self._archive_resolve(target, "write", may_miss=True)
        if int(found.get("mode", 0)) & GO_DIR or path == "/":
            raise SandboxIsADirectoryError(
                f"cannot write {target.shown!r}: it is a directory", target.shown, errno.EISDIR
            )
        if int(found.get("mode", 0)) & GO_SPECIAL:
            raise SandboxFileError(
                f"cannot write {target.shown!r}: it is not a regular file", target.shown
            )
        parent, name = posixpath.split(path)
        uid, _, gid = self.access().user.partition(":")
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, int(time.time())
        info.uid, info.gid = int(uid), int(gid or uid)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.addfile(info, io.BytesIO(bytes(data)))
        try:
            archive.put(parent, buffer.getvalue())
        except BackendError as exc:
            cls = SandboxPermissionError if "read-only" in str(exc) else SandboxFileError
            raise cls(f"cannot write {target.shown!r}: {exc}", target.shown) from None

    def list(self, target: Target, max_entries: int) -> list[DirEntry]:
        archive, path, info = self._archive_resolve(target, "list")
        if not int(info.get("mode", 0)) & GO_DIR and path != "/":
            raise SandboxNotADirectoryError(
                f"cannot list {target.shown!r}: not a directory", target.shown, errno.ENOTDIR
            )
        stream = self._archive_get(archive, path, target, "list")
        entries: list[DirEntry] = []
        try:
            with tarfile.open(fileobj=ChunkReader(stream, ARCHIVE_LIST_CAP), mode="r|") as tar:
                for member in tar:
                    parts = member.name.rstrip("/").split("/")
                    if len(parts) != 2:
                        continue
                    if len(entries) == max_entries:
                        raise too_many(target, max_entries)
                    kind: EntryKind = (
                        "file"
                        if member.isfile()
                        else "dir"
                        if member.isdir()
                        else "symlink"
                        if member.issym()
                        else "other"
                    )
                    size = len(member.linkname) if member.issym() else member.size
                    entries.append(DirEntry(parts[1], kind, size, stat.S_IMODE(member.mode)))
        except (OverflowError, tarfile.TarError):
            raise SandboxFileError(
                f"cannot list {target.shown!r}: its archive is over {ARCHIVE_LIST_CAP} bytes "
                "(the engine sends the whole tree) or unusable",
                target.shown,
            ) from None
        finally:
            stream.close()
        return sorted(entries, key=lambda e: e.name)


GO_DIR = 1 << 31
GO_SYMLINK = 1 << 27
GO_SPECIAL = (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)
"""Go's ``os.FileMode`` bits in the engine's stat header: device, named pipe, socket, char
device, irregular."""


class ChunkReader(io.RawIOBase):
    """A file over the engine's chunk iterator, refusing (OverflowError) past ``limit``."""

    def __init__(self, chunks: Iterator[bytes], limit: int) -> None:
        self._chunks = iter(chunks)
        self._left = b""
        self._seen = 0
        self._limit = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            chunk = next(self._chunks, b"")
            if not chunk:
                return 0
            self._seen += len(chunk)
            if self._seen > self._limit:
                raise OverflowError("the archive is larger than expected")
            self._left = chunk
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size
