"""Spill files: the full (capped) stream on disk when it outgrows the in-memory buffer.

Layout: ``<root>/sandbox-<id>/<run_id>/<stream>``: each open ``Sandbox`` has its own directory
(``SpillSession``) holding a ``.lock`` file it keeps ``flock``-ed while open, so pruning
(``sandboxrun.engine.capture.prune``) never touches a live sandbox's files; it is removed when the
sandbox closes unless kept. ``root`` and every directory are mode 0700, files 0600, everything
is created exclusively and without following symlinks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import sys
import threading
from pathlib import Path

from sandboxrun.errors import ConfigError

_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
UNLIMITED = sys.maxsize
"""The default ``SpillFile`` limit: keep everything."""
LOCK_NAME = ".lock"
"""In a sandbox's spill directory: ``flock``-ed (exclusive) while the sandbox is open."""
SESSION_PREFIX = "sandbox-"
PENDING_PREFIX = ".new-"
"""A sandbox's spill directory while it is being made (renamed once its lock is held)."""


def default_spill_root() -> Path:
    """``$SANDBOXRUN_SPILL_DIR``, else ``$XDG_CACHE_HOME/sandboxrun/spill``, else ``~/.cache/…``."""
    explicit = os.environ.get("SANDBOXRUN_SPILL_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "sandboxrun" / "spill"
    return Path.home() / ".cache" / "sandboxrun" / "spill"


def _check_component(value: str, what: str) -> None:
    if not value or value in {".", ".."} or "/" in value or "\0" in value:
        raise ConfigError(f"invalid spill {what} {value!r}: must be a single path component")


def ensure_root(root: Path) -> None:
    """Create the spill root (mode 0700, and its parents) or check it: a directory of ours, not
    a symlink, mode 0700 (narrowed if wider). ``ConfigError`` when it cannot be used."""
    if not (root.is_symlink() or root.exists()):
        root.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # lost a race: the checks below decide
            root.mkdir(0o700)
    if root.is_symlink():
        raise ConfigError(f"spill root {root} is a symlink; refusing to use it")
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise ConfigError(f"spill root {root} is not a usable directory: {exc}") from exc
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise ConfigError(f"spill root {root} is not owned by the current user")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


class SpillFile:
    """A write-only file that keeps the first ``limit`` bytes written and ignores the rest."""

    def __init__(self, fd: int, path: Path, limit: int) -> None:
        self.path = path
        self.limit = limit
        self.written = 0
        self._fd: int | None = fd

    @property
    def closed(self) -> bool:
        return self._fd is None

    @property
    def full(self) -> bool:
        """Whether ``limit`` bytes have been written (further writes are ignored)."""
        return self.written >= self.limit

    def write(self, data: bytes) -> None:
        """Write ``data`` up to the limit, looping on short writes. Raises ``OSError``."""
        if self._fd is None:
            raise ValueError(f"write to closed spill file {self.path}")
        take = min(len(data), self.limit - self.written)
        if take <= 0:
            return
        view = memoryview(data)[:take]
        while view:
            n = os.write(self._fd, view)
            self.written += n
            view = view[n:]

    def close(self) -> None:
        """Close the file; calling it again does nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class SpillDir:
    """The per-run spill directory ``root/run_id``, created on the first ``open_file``."""

    def __init__(self, root: Path, run_id: str) -> None:
        _check_component(run_id, "run id")
        self.root = root
        self.run_id = run_id
        self.path = root / run_id
        self._created = False
        self._lock = threading.Lock()

    def _ensure_run_dir(self) -> None:
        with self._lock:
            if self._created:
                return
            ensure_root(self.root)
            self.path.mkdir(0o700)  # exclusive: a second run with the same id fails
            fd = os.open(self.path, _DIR_FLAGS)
            try:
                os.fchmod(fd, 0o700)  # the umask may have narrowed the mode
            finally:
                os.close(fd)
            self._created = True

    def open_file(self, name: str, limit: int = UNLIMITED) -> SpillFile:
        """Create ``root/run_id/name`` (0600, exclusive, no symlinks) keeping ``limit`` bytes."""
        _check_component(name, "file name")
        self._ensure_run_dir()
        path = self.path / name
        fd = os.open(path, _FILE_FLAGS, 0o600)
        try:
            os.fchmod(fd, 0o600)
        except OSError:
            os.close(fd)
            raise
        return SpillFile(fd, path, limit)


class SpillSession:
    """One open sandbox's spill directory ``root/sandbox-<id>``: the runs' spill directories
    are made in it. Its ``.lock`` is held (``flock``, exclusive) from ``create`` to ``close``,
    which tells every process's pruning that the directory is in use.

    The directory is made as ``root/.new-<id>``, locked, then renamed: no other process ever
    sees it under its final name unlocked while it is open.
    """

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._fd: int | None = lock_fd

    @property
    def closed(self) -> bool:
        return self._fd is None

    @classmethod
    def create(cls, root: Path) -> SpillSession:
        """Make and lock a new sandbox directory under ``root`` (``ensure_root`` first).
        ``ConfigError`` for an unusable root, ``OSError`` when the directory cannot be made."""
        ensure_root(root)
        name = secrets.token_hex(8)
        pending = root / f"{PENDING_PREFIX}{name}"
        pending.mkdir(0o700)
        fd: int | None = None
        try:
            dfd = os.open(pending, _DIR_FLAGS)
            try:
                os.fchmod(dfd, 0o700)  # the umask may have narrowed the mode
                fd = os.open(LOCK_NAME, _LOCK_FLAGS, 0o600, dir_fd=dfd)
            finally:
                os.close(dfd)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, f"{os.getpid()}\n".encode())  # for a human reading the directory
            path = root / f"{SESSION_PREFIX}{name}"
            pending.rename(path)
        except BaseException:
            if fd is not None:
                os.close(fd)
            shutil.rmtree(pending, ignore_errors=True)
            raise
        return cls(path, fd)

    def close(self, *, keep: bool = False) -> None:
        """Remove the directory and everything in it (``keep``: leave what the runs spilled,
        for pruning to remove later; a directory that holds nothing else is removed anyway),
        then release the lock. Never raises (what cannot be removed stays for pruning);
        calling it again does nothing."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError):
                if not keep or [p.name for p in self.path.iterdir()] == [LOCK_NAME]:
                    shutil.rmtree(self.path, ignore_errors=True)
        finally:
            os.close(fd)  # unlocks: from now on pruning may remove what is left
