"""Live output to the terminal without ever blocking the run.

Writing to a slow or stalled reader (a pager, `| sleep`, Ctrl-S) must not stall the event loop:
the deadline would stop being enforced. Chunks go through a bounded queue to a writer thread;
when the queue is full, live output is dropped and counted (it is still in the result and the
spill file), and the CLI says so.
"""

from __future__ import annotations

import os
import queue
import threading

from sandboxrun.sanitize import TerminalSanitizer

QUEUE_BYTES = 4 << 20


class LiveWriter:
    """``sink(name, chunk)`` for ``Sandbox.exec``; ``close()`` flushes (bounded)."""

    def __init__(self, fds: dict[str, int] | None = None) -> None:
        # Raw fds, not sys.stdout: a thread blocked in a buffered write would hold the buffer's
        # lock, and the interpreter's final flush would wait for it forever.
        self.fds = fds or {"stdout": 1, "stderr": 2}
        self.sanitizers = {
            name: TerminalSanitizer() if os.isatty(fd) else None for name, fd in self.fds.items()
        }
        self.dropped = 0
        self._queued = 0
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[str, bytes] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="sandboxrun-live", daemon=True)
        self._thread.start()

    def __call__(self, name: str, chunk: bytes) -> None:
        with self._lock:
            if self._queued + len(chunk) > QUEUE_BYTES:
                self.dropped += len(chunk)
                return
            self._queued += len(chunk)
        self._queue.put((name, chunk))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            name, chunk = item
            with self._lock:
                self._queued -= len(chunk)
            cleaner = self.sanitizers[name]
            data = cleaner.feed(chunk) if cleaner else chunk
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self.fds[name], view) :]
            except OSError:  # reader gone: keep draining, show nothing more
                with self._lock:
                    self.dropped += len(chunk)

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued (at most ``timeout_s``); what did not make it counts as dropped."""
        self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            with self._lock:
                self.dropped += self._queued
