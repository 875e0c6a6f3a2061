"""Reading a command's output pipes and feeding its stdin, shared by the local backends."""

from __future__ import annotations

import fcntl
import os
from contextlib import suppress

import anyio
import anyio.lowlevel

from sandboxrun.capture import StreamCapture

CHUNK = 64 * 1024
"""Read size: reads above glibc's mmap threshold (128 KiB) cost an mmap+munmap each (4x slower)."""
PIPE_SIZE = 1 << 20
YIELD_EVERY = 16


def output_pipe() -> tuple[int, int]:
    """A close-on-exec pipe with a non-blocking, enlarged read end."""
    r, w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(r, False)
    with suppress(OSError):
        fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    return r, w


class FdPump:
    """Reads every output fd into its capture until EOF and writes stdin, then closes it."""

    def __init__(
        self, streams: list[tuple[int, StreamCapture]], stdin: tuple[int, bytes] | None
    ) -> None:
        self._open = list(streams)
        self._stdin = stdin

    def close_stdin(self) -> None:
        """Close the stdin fd if the writer has not (idempotent: the pump owns the fd)."""
        if self._stdin is not None:
            with suppress(OSError):
                os.close(self._stdin[0])
            self._stdin = None

    async def pump(self) -> None:
        async with anyio.create_task_group() as tg:
            for stream in list(self._open):
                tg.start_soon(self._read, stream)
            if self._stdin is not None:
                tg.start_soon(self._write_stdin)

    async def _read(self, stream: tuple[int, StreamCapture]) -> None:
        """Read first, wait only when the pipe is empty (a wait per chunk halves throughput);
        yield to the event loop every few chunks so a flood cannot starve other tasks; while
        the live sink is congested, stop reading (the command then blocks on its write)."""
        fd, capture = stream
        reads = 0
        while True:
            try:
                data = os.read(fd, CHUNK)
            except BlockingIOError:
                await anyio.wait_readable(fd)
                continue
            if not data:
                self._open.remove(stream)
                return
            capture.feed(data)
            await capture.wait_sink()  # backpressure: a slow live reader holds the command back
            reads += 1
            if reads % YIELD_EVERY == 0:
                await anyio.lowlevel.checkpoint()

    async def _write_stdin(self) -> None:
        assert self._stdin is not None
        fd, data = self._stdin
        view = memoryview(data)
        try:
            while view:
                await anyio.wait_writable(fd)
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    continue
        except OSError:  # the command closed its stdin: what it did not read is dropped
            pass
        os.close(fd)
        self._stdin = None
