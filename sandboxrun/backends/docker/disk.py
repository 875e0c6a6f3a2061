"""``--disk`` on docker: the bound of a writable root (``Policy.root="writable"``).

Where the engine's storage driver takes a size (``--storage-opt size=``: overlay2 on xfs with
``pquota``, btrfs, zfs) the kernel enforces it: a write past it fails with ENOSPC. Where it does
not (here: fuse-overlayfs, "--storage-opt is not supported"), ``LayerWatch`` measures what the
container holds from this host (``measure``): its writable layer (the engine's
``GraphDriver.Data.UpperDir``), the files the engine keeps outside it but writable in it
(``/etc/hosts``, ``/etc/resolv.conf``, ``/etc/hostname``), and files deleted but still open in
its processes. Once that is more than the bound, every process of the container is killed with
its PID 1 and the container is discarded with its writes (the next command gets a fresh one).

A watch is a check, not a quota: it sees a write after it happened, so a command passes the
bound by what it writes between two looks (``WATCH_INTERVAL_S``), and one ``fallocate`` can
claim any amount at once. Every entry counts at least ``ENTRY_BYTES`` (an inode costs the host
too, and a flood of empty files ends as soon as one of data), which also bounds how long one
look takes. What cannot be measured counts as over the bound (fail closed): a directory of the
layer this host cannot read, a path too deep to open. Neither a quota nor a watch is possible
for a remote engine or a layer this host cannot read: the sandbox is then refused
(``disk-limit`` is missing).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

WATCH_INTERVAL_S = 0.05
"""The pause between two looks (at least; a look that took long makes it longer: twice its
duration, so the watch costs at most a third of a core)."""
ENTRY_BYTES = 4096
"""What every file, directory or link of the layer counts at least."""
ENGINE_FILES = ("HostsPath", "ResolvConfPath", "HostnamePath")
"""``docker inspect``'s keys of the files the engine bind-mounts writable into a container
whose root is writable, outside its layer."""


class Unmeasurable(OSError):
    """Part of the layer cannot be read: it counts as over the bound."""


def storage_opt_refused(said: str) -> bool:
    """Whether the engine's refusal to create a container (its text) is one of a size it
    cannot give: "--storage-opt is not supported", "--storage-opt is supported only for
    overlay over xfs with 'pquota' mount option"."""
    return "storage-opt" in said.lower()


def upper_dir(inspected: dict[str, Any]) -> str | None:
    """The container's writable layer on the engine's host (``docker inspect``'s
    ``GraphDriver.Data.UpperDir``: overlay2, fuse-overlayfs), or None for a driver that
    names none."""
    data = (inspected.get("GraphDriver") or {}).get("Data") or {}
    found = data.get("UpperDir")
    return found if isinstance(found, str) and found.startswith("/") else None


def engine_files(inspected: dict[str, Any]) -> list[str]:
    """The engine's own files of the container that a command there may write (``/etc/hosts``
    ...), as host paths."""
    return [
        str(inspected[key])
        for key in ENGINE_FILES
        if isinstance(inspected.get(key), str) and str(inspected[key]).startswith("/")
    ]


def _charge(info: os.stat_result) -> int:
    return max(info.st_blocks * 512, ENTRY_BYTES)


def layer_bytes(top: str) -> int:
    """What the tree at ``top`` takes (``du``'s count: allocated blocks, so a sparse file
    counts what it holds; every entry at least ``ENTRY_BYTES``), symlinks not followed, walked
    by directory fds (no path grows too long to open). ``FileNotFoundError`` when ``top`` is
    gone (the container was removed); ``Unmeasurable`` when a part of it cannot be read (an
    entry that vanishes during the walk is skipped)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        root = os.open(top, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Unmeasurable(exc.errno, f"the layer cannot be read: {exc.strerror}") from None
    total = 0
    stack = [root]
    try:
        while stack:
            fd = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        except OSError as exc:
                            raise Unmeasurable(exc.errno, f"{entry.name}: {exc.strerror}") from None
                        total += _charge(info)
                        if stat.S_ISDIR(info.st_mode):
                            try:
                                stack.append(os.open(entry.name, flags, dir_fd=fd))
                            except FileNotFoundError:
                                continue
                            except OSError as exc:
                                why = f"{entry.name}: {exc.strerror}"
                                raise Unmeasurable(exc.errno or errno.EACCES, why) from None
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return total


def files_bytes(paths: Iterable[str]) -> int:
    """The blocks the files at ``paths`` take (one that is gone: 0)."""
    total = 0
    for path in paths:
        try:
            total += Path(path).lstat().st_blocks * 512
        except OSError:
            continue
    return total


def deleted_open_bytes(pids: Iterable[int], devices: frozenset[int]) -> int:
    """What the files on ``devices`` (the layer's file system, and the container's root
    mounted over it: fuse-overlayfs) that ``pids`` hold open but that no name leads to any
    more take (``exec 3>f; rm f``: the layer no longer shows them), each file once: its size
    or its blocks, the larger (a sparse one counts whole: fail closed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                info = fd.stat()  # (the open file itself)
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if info.st_dev not in devices or key in seen:
                continue
            try:  # (fuse-overlayfs reports a link count of 1 for a deleted file)
                deleted = info.st_nlink == 0 or str(fd.readlink()).endswith(" (deleted)")
            except OSError:
                continue
            if deleted:  # its size: FUSE reports blocks only once the data reached its daemon
                seen.add(key)
                total += max(info.st_size, info.st_blocks * 512)
    return total


class LayerWatch:
    """Calls ``measure()`` in a thread of its own until ``stop``; once it returns more than
    ``limit`` bytes, or raises ``Unmeasurable``, calls ``exceeded(bytes_held, why)`` once and
    ends (``why``: None, or what could not be read). A ``FileNotFoundError`` (the layer is
    gone: the container was removed) ends it quietly."""

    def __init__(
        self, measure: Callable[[], int], limit: int, exceeded: Callable[[int, str | None], None]
    ) -> None:
        self.measure = measure
        self.limit = limit
        self.exceeded = exceeded
        self.held = measure()  # readable now, or OSError before anything relies on the watch
        self.gone = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sandboxrun-disk", daemon=True)
        self._thread.start()

    def look(self) -> tuple[int, str | None] | None:
        """One measure now: ``(held, why)`` when it is over the bound (or unmeasurable), else
        None (also for a layer that is gone: ``gone`` says so)."""
        try:
            held = self.measure()
        except Unmeasurable as exc:
            return self.limit + 1, str(exc)
        except OSError:
            self.gone = True
            return None
        self.held = held
        return (held, None) if held > self.limit else None

    def _watch(self) -> None:
        while not self._stop.is_set() and not self.gone:
            began = time.monotonic()
            over = self.look()
            if over is not None:
                if not self._stop.is_set():
                    self.exceeded(*over)
                return
            took = time.monotonic() - began
            self._stop.wait(max(WATCH_INTERVAL_S, 2 * took))

    def stop(self) -> None:
        """End the watch: it calls ``exceeded`` no more once this returns (at most a second's
        wait for a look under way; a later one is dropped by its caller's token)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
