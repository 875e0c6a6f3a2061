"""``--disk`` on docker: the bound of a writable root (``Policy.root="writable"``).

Where the engine's storage driver takes a size (``--storage-opt size=``: overlay2 on xfs with
``pquota``, btrfs, zfs) the kernel enforces it: a write past it fails with ENOSPC. Where it does
not (here: fuse-overlayfs, "--storage-opt is not supported"), ``LayerWatch`` reads the
container's writable layer (the engine's ``GraphDriver.Data.UpperDir``) from this host: once it
holds more than the bound, every process of the container is killed with its PID 1 and the
container is discarded with its writes (the next command gets a fresh one). A watch sees a
write only after it happened: a command may pass the bound by what it writes in one look
(``WATCH_INTERVAL_S``, longer for a layer of many files), never by more before it is killed.
Neither is possible for a remote engine or a layer this host cannot read: the sandbox is then
refused (``disk-limit`` is missing).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

WATCH_INTERVAL_S = 0.05
"""The pause between two looks at the layer (at least; a look that took long makes it
longer: twice its duration, so the watch costs at most a third of a core)."""


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


def layer_bytes(top: str) -> int:
    """The bytes the files under ``top`` take on disk (``du``'s count: allocated blocks, so a
    sparse file counts what it holds), symlinks not followed. What vanishes during the walk
    is skipped; ``OSError`` when ``top`` itself cannot be read."""
    total = 0
    stack = [top]
    first = True
    while stack:
        path = stack.pop()
        try:
            entries = os.scandir(path)
        except OSError:
            if first:
                raise
            continue
        first = False
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
    return total


class LayerWatch:
    """Looks at ``upper`` (a container's writable layer) in a thread of its own until
    ``stop``; once it holds more than ``limit`` bytes, calls ``exceeded(bytes_held)`` once and
    ends. A layer that cannot be read any more (the container was removed) ends it quietly."""

    def __init__(self, upper: str, limit: int, exceeded: Callable[[int], None]) -> None:
        layer_bytes(upper)  # readable now, or OSError before anything relies on the watch
        self.upper = upper
        self.limit = limit
        self.exceeded = exceeded
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sandboxrun-disk", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                held = layer_bytes(self.upper)
            except OSError:
                return
            if held > self.limit:
                if not self._stop.is_set():
                    self.exceeded(held)
                return
            took = time.monotonic() - began
            self._stop.wait(max(WATCH_INTERVAL_S, 2 * took))

    def stop(self) -> None:
        """End the watch (it calls ``exceeded`` no more once this returns)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
