"""Live output of the CLI: complete to a pipe or a file, best effort to a terminal.

Chunks go through a bounded queue to a writer thread (one per distinct open file, so stdout and
stderr sent to the same place keep their order, and a stalled terminal on one cannot hold up a
pipe on the other); the event loop never blocks on a slow reader, so the deadline stays enforced.

- To a pipe or a file every byte arrives, in order, with bounded memory: when a stream's queue
  holds ``QUEUE_BYTES``, ``congested(name)`` turns true and the read loop waits
  (``StreamCapture.wait_sink``) — the command then blocks on its own write, as it would under
  ``cmd | reader``. ``close()`` flushes everything.
- To a terminal (a person, maybe Ctrl-S) output is dropped instead of waited for, counted, and
  ``close()`` gives up after ``TTY_FLUSH_S``; the capture then keeps the full stream on disk.
- A reader that closes the pipe (EPIPE) or a failing write stops that stream's live output; the
  run goes on and the rest is counted as lost, with the reason.
"""

from __future__ import annotations

import errno
import os
import queue
import select
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandboxrun.engine.sanitize import TerminalSanitizer

QUEUE_BYTES = 4 << 20
"""Per stream: how much live output may wait for its reader."""
TTY_FLUSH_S = 5.0
"""How long ``close()`` waits for a terminal to take what is queued."""


@dataclass
class StreamStats:
    """What became of one stream's live output."""

    tty: bool
    null: bool = False
    """The fd is the null device: nothing to write, nothing to wait for."""
    shown: int = 0
    """Bytes written to the fd (before terminal sanitizing)."""
    dropped: int = 0
    """Terminal only: bytes dropped because it did not keep up (or did not take them at close)."""
    lost: int = 0
    """Bytes not written because the reader closed the pipe or the write failed."""
    failure: str | None = None
    """Why writing stopped: ``"closed"`` (EPIPE) or the error text."""
    queued: int = field(default=0, repr=False)


def is_null_device(fd: int) -> bool:
    """Whether ``fd`` is open on the null device (``> /dev/null``)."""
    try:
        st, null = os.fstat(fd), Path(os.devnull).stat()
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev


class _Worker(threading.Thread):
    def __init__(self, writer: LiveWriter) -> None:
        super().__init__(name="sandboxrun-live", daemon=True)
        self.writer = writer
        self.items: queue.SimpleQueue[tuple[str, bytes] | None] = queue.SimpleQueue()
        self.tty = False
        self.finished = threading.Event()  # not is_alive(): an interrupted join() can spoil it

    def run(self) -> None:
        while (item := self.items.get()) is not None:
            self.writer._write(*item)
        self.finished.set()


class LiveWriter:
    """``sink(name, chunk)`` for ``Sandbox.exec`` with backpressure (``congested``); ``close()``
    flushes (bounded only for terminals)."""

    def __init__(self, fds: dict[str, int] | None = None) -> None:
        # Raw fds, not sys.stdout: a thread blocked in a buffered write would hold the buffer's
        # lock, and the interpreter's final flush would wait for it forever.
        self.fds = fds or {"stdout": 1, "stderr": 2}
        self.stats = {
            name: StreamStats(tty=os.isatty(fd), null=is_null_device(fd))
            for name, fd in self.fds.items()
        }
        self.sanitizers = {
            name: TerminalSanitizer() if self.stats[name].tty else None for name in self.fds
        }
        self._lock = threading.Lock()
        self._progress = 0
        self._abandoned = False  # close() gave up on a terminal: its stats are final
        self._workers: dict[str, _Worker] = {}
        by_file: dict[tuple[int, int], _Worker] = {}
        for name, fd in self.fds.items():
            try:
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino)
            except OSError:
                key = (-1, fd)
            if key not in by_file:
                by_file[key] = _Worker(self)
            worker = by_file[key]
            worker.tty = worker.tty or self.stats[name].tty
            self._workers[name] = worker
        for worker in by_file.values():
            worker.start()

    @property
    def dropped(self) -> int:
        """Bytes not shown, for whatever reason."""
        with self._lock:
            return sum(s.dropped + s.lost for s in self.stats.values())

    def __call__(self, name: str, chunk: bytes) -> None:
        with self._lock:
            s = self.stats[name]
            if s.failure is not None:
                s.lost += len(chunk)
                self._progress += len(chunk)
                return
            if s.null:  # `> /dev/null`: shown, at no cost (no thread hop, no backpressure)
                s.shown += len(chunk)
                self._progress += len(chunk)
                return
            if s.tty and s.queued + len(chunk) > QUEUE_BYTES:
                s.dropped += len(chunk)
                self._progress += len(chunk)
                return
            s.queued += len(chunk)  # a pipe or file: the read loop waits once it is congested
        self._workers[name].items.put((name, chunk))

    def congested(self, name: str) -> bool:
        """Whether the read loop should wait before feeding ``name`` again (never for a
        terminal, nor once the stream's reader is gone)."""
        s = self.stats[name]
        return not s.tty and s.failure is None and s.queued >= QUEUE_BYTES

    def progress(self) -> int:
        """Grows whenever queued output is written or given up: the reader is alive."""
        return self._progress

    def lossy(self, name: str) -> bool:
        """Whether some of ``name`` was, or may yet be, not shown (so keep it on disk)."""
        with self._lock:
            s = self.stats[name]
            return bool(s.dropped or s.lost or (s.tty and s.queued))

    def _write(self, name: str, chunk: bytes) -> None:
        s, fd = self.stats[name], self.fds[name]
        if self._abandoned:
            return
        if s.failure is None:
            cleaner = self.sanitizers[name]
            data = cleaner.feed(chunk) if cleaner else chunk
            view = memoryview(data)
            try:
                while view:
                    try:
                        view = view[os.write(fd, view) :]
                    except BlockingIOError:  # someone made the shared file description O_NONBLOCK
                        select.select([], [fd], [], 1.0)
            except OSError as exc:
                with self._lock:
                    if self._abandoned:
                        return
                    s.failure = (
                        "closed" if exc.errno == errno.EPIPE else os.strerror(exc.errno or 0)
                    )
                    left = len(view) if cleaner is None else len(chunk)
                    s.lost += left
                    s.shown += len(chunk) - left
                    s.queued -= len(chunk)
                    self._progress += len(chunk)
                return
        with self._lock:
            if self._abandoned:
                return
            s.queued -= len(chunk)
            self._progress += len(chunk)
            if s.failure is None:
                s.shown += len(chunk)
            else:
                s.lost += len(chunk)

    def close(self) -> None:
        """Flush: everything to a pipe or a file (however long the reader takes: like ``cat``;
        Ctrl-C stops waiting), at most ``TTY_FLUSH_S`` to a terminal. What was not written
        counts as dropped (terminal) or lost (``failure`` "interrupted")."""
        workers = list(dict.fromkeys(self._workers.values()))
        for worker in workers:
            worker.items.put(None)
        deadline = time.monotonic() + TTY_FLUSH_S
        try:
            for worker in workers:
                worker.finished.wait(max(0.0, deadline - time.monotonic()) if worker.tty else None)
        except KeyboardInterrupt:
            pass
        with self._lock:
            self._abandoned = True
            for name, s in self.stats.items():
                if self._workers[name].finished.is_set() or not s.queued:
                    continue
                if s.tty:
                    s.dropped += s.queued
                else:
                    s.lost += s.queued
                    s.failure = s.failure or "interrupted"
                s.queued = 0
