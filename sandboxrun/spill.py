"""Spill files: the full (capped) stream on disk when it outgrows the in-memory buffer.

Layout: ``<root>/<run_id>/<stream>``; ``root`` and the per-run directory are mode 0700, files
0600, everything is created exclusively and without following symlinks.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import stat
import sys
import threading
import time
from pathlib import Path

from sandboxrun.errors import ConfigError

_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
UNLIMITED = sys.maxsize
"""The default ``SpillFile`` limit: keep everything."""


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

    def _ensure_root(self) -> None:
        root = self.root
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

    def _ensure_run_dir(self) -> None:
        with self._lock:
            if self._created:
                return
            self._ensure_root()
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


def prune(root: Path, older_than_s: float, now: float | None = None) -> list[Path]:
    """Remove per-run directories directly under ``root`` last modified over ``older_than_s`` ago.

    Symlinks and non-directories are ignored; nothing outside ``root`` is touched. A directory
    that cannot be removed is skipped. Returns the directories removed.
    """
    if not math.isfinite(older_than_s) or older_than_s < 0:
        raise ConfigError(f"age must be a non-negative number of seconds, got {older_than_s}")
    cutoff = (time.time() if now is None else now) - older_than_s
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return []
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    removed: list[Path] = []
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                continue
            shutil.rmtree(entry.path)
        except OSError:
            continue
        removed.append(root / entry.name)
    return removed
