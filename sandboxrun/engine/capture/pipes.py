"""Reading a command's output pipes and feeding its stdin, shared by the local backends."""

from __future__ import annotations

import fcntl
import os
from contextlib import suppress

import anyio
import anyio.lowlevel

from sandboxrun.engine.capture.stream import StreamCapture
from sandboxrun.engine.request import StdinStream

CHUNK = 64 * 1024
"""Read size: reads above glibc's mmap threshold (128 KiB) cost an mmap+munmap each (4x slower)."""
PIPE_SIZE = 1 << 20
YIELD_EVERY = 32
StdinFeed = tuple[int, bytes | StdinStream]
"""A command's stdin: the write end of its pipe and what to write (bytes then EOF, or a stream)."""


def output_pipe() -> tuple[int, int]:
    """A close-on-exec pipe with a non-blocking, enlarged read end."""
    r, w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(r, False)
    with suppress(OSError):
        fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    return r, w


class FdPump:
    """Reads every output fd into its capture until EOF and writes stdin, then closes it.

    Fixed stdin bytes are written, then EOF. A streamed stdin (``StdinStream``) is forwarded
    until the caller closes it (EOF after what was sent), the command's end of the pipe is
    gone (no process holds it any more: the command closed its stdin or has ended), or the
    pump is cancelled (the run is over); the output ending does not stop it. Whenever the
    writer stops, the fd is closed and the stream aborted: a waiting ``send`` raises
    ``BrokenPipeError`` at once. ``pump`` returns once the outputs are at EOF and the writer
    is done."""

    def __init__(self, streams: list[tuple[int, StreamCapture]], stdin: StdinFeed | None) -> None:
        self._open = list(streams)
        self._stdin = stdin

    def close_stdin(self) -> None:
        """Close the stdin fd if the writer has not (idempotent: the pump owns the fd)."""
        if self._stdin is not None:
            fd, source = self._stdin
            self._stdin = None
            with suppress(OSError):
                os.close(fd)
            if isinstance(source, StdinStream):
                source.abort()

    async def pump(self) -> None:
        streams = list(self._open)
        async with anyio.create_task_group() as tg:
            if self._stdin is not None:
                tg.start_soon(self._write_stdin)
            for stream in streams[1:]:
                tg.start_soon(self._read, stream)
            if streams:  # the first in this task: a task less to start per run
                await self._read(streams[0])

    async def _read(self, stream: tuple[int, StreamCapture]) -> None:
        await read_to_end(*stream)
        self._open.remove(stream)

    async def _write_stdin(self) -> None:
        """Write or forward stdin; however it stops (done, the pipe gone, cancelled), the fd is
        closed: a later ``pump`` (the drain after a cancellation) does not write again."""
        assert self._stdin is not None
        fd, source = self._stdin
        try:
            if isinstance(source, StdinStream):
                await _forward(fd, source)
            else:
                await _write_all(fd, source)
        except OSError:  # the command closed its stdin: what it did not read is dropped
            pass
        finally:
            self.close_stdin()


async def read_to_end(fd: int, capture: StreamCapture) -> None:
    """Read the non-blocking ``fd`` into ``capture`` until EOF (a pipe's, a terminal's master).
    Read first, wait only when it is empty (a wait per chunk halves throughput); yield to the
    event loop every few chunks so a flood cannot starve other tasks; while the live sink is
    congested, stop reading (the command then blocks on its write). A read error is raised."""
    reads = 0
    while True:
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            await anyio.wait_readable(fd)
            continue
        if not data:
            return
        capture.feed(data)
        if capture.flow_controlled:  # backpressure: a slow live reader holds it back
            await capture.wait_sink()
        reads += 1
        if reads % YIELD_EVERY == 0:
            await anyio.lowlevel.checkpoint()


async def _forward(fd: int, stream: StdinStream) -> None:
    """Write ``stream``'s chunks to the pipe ``fd`` until its EOF or until no process holds the
    pipe's read end any more (then the write end polls readable: ``EPOLLERR``)."""
    async with anyio.create_task_group() as tg:

        async def reader_gone() -> None:
            await anyio.wait_readable(fd)
            tg.cancel_scope.cancel()

        tg.start_soon(reader_gone)
        with suppress(OSError):  # EPIPE: the command closed its stdin
            while (chunk := await stream.receive()) is not None:
                await _write_all(fd, chunk)
                stream.written()
        tg.cancel_scope.cancel()


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        await anyio.wait_writable(fd)
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue
