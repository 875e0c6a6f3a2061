"""The one symlink-safe walk: open a path below a directory without the kernel ever following a
symlink for us. The runner opens workspace paths with it inside the sandbox; the host's files
API opens workspace paths, container roots and host paths with the very same function.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False  # not from typing: the supervisor imports this module (cheaply)
if TYPE_CHECKING:
    from collections.abc import Callable

MAX_HOPS = 40
"""Symlinks one walk follows at most (the kernel's own bound)."""


def open_beneath(
    root: str,
    path: str,
    flags: int,
    mode: int = 0o644,
    *,
    in_root: bool = False,
    stop_at: tuple[int, int] | None = None,
    enter: Callable[[str], tuple[int, bool]] | None = None,
) -> tuple[int, bool]:
    """Open ``path`` (relative) below the directory ``root`` without ever leaving it: each
    component is opened with O_NOFOLLOW relative to its parent's fd, symlinks are resolved
    here (at most ``MAX_HOPS``) and ``..`` pops back to an fd already held, so the kernel never
    follows a link for us. A step out (an absolute symlink, ``..`` above ``root``) fails with
    EXDEV, like openat2's RESOLVE_BENEATH; ``in_root`` keeps it at ``root`` instead (an
    absolute symlink restarts there, ``..`` stays), like RESOLVE_IN_ROOT for a container's
    root directory or this host's ``/``. When the walk stands in the directory ``stop_at``
    (its device and inode, however it got there), the rest of the path is handed to ``enter``
    (``"."`` for the directory itself) and its answer returned. ``flags`` get O_CLOEXEC,
    O_NOCTTY and O_NONBLOCK. Returns ``(fd, created)``."""
    flags |= os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    stack = [os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
    todo = [p for p in path.split("/") if p not in ("", ".")]
    hops = 0
    try:
        while True:
            if stop_at is not None and enter is not None:
                here = os.fstat(stack[-1])
                if (here.st_dev, here.st_ino) == stop_at:
                    return enter("/".join(todo) or ".")
            if not todo:  # the path ends at a directory already held (``.``, ``a/..``)
                return os.open(".", flags & ~os.O_CREAT, mode, dir_fd=stack[-1]), False
            name = todo.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                elif not in_root:
                    raise OSError(errno.EXDEV, "the path climbs out of its root directory")
                continue
            if todo:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stack[-1])
                kind = os.fstat(fd).st_mode
                if stat.S_ISDIR(kind):
                    stack.append(fd)
                    continue
                os.close(fd)
                if not stat.S_ISLNK(kind):
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
                link = os.readlink(name, dir_fd=stack[-1])
            else:
                opened = open_last(name, flags, mode, stack[-1])
                if isinstance(opened, tuple):
                    if stop_at is not None and enter is not None:
                        found = os.fstat(opened[0])
                        if (found.st_dev, found.st_ino) == stop_at:  # it ends at the stop
                            os.close(opened[0])
                            return enter(".")
                    return opened
                link = opened
            hops += 1
            if hops > MAX_HOPS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
            if link.startswith("/"):
                if not in_root:
                    raise OSError(errno.EXDEV, "a symlink points out of its root directory")
                while len(stack) > 1:
                    os.close(stack.pop())
            todo[:0] = [p for p in link.split("/") if p not in ("", ".")]
    finally:
        for held in stack:
            os.close(held)


def open_last(name: str, flags: int, mode: int, dir_fd: int) -> tuple[int, bool] | str:
    """The last component of a walk: ``(fd, created)``, or the target of the symlink found
    there (to walk on; a file another made meanwhile is walked again, bounded by the hops)."""
    plain = flags & ~(os.O_CREAT | os.O_EXCL) | os.O_NOFOLLOW
    try:
        return os.open(name, plain, mode, dir_fd=dir_fd), False
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
        try:
            return os.open(name, flags | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd), True
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
            return name  # it appeared meanwhile: open it again
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:  # O_NOFOLLOW met a symlink (ELOOP; ENOTDIR under O_DIRECTORY)
            return os.readlink(name, dir_fd=dir_fd)
        except OSError:
            raise exc from None
