"""Reading a run's terminal into its capture and feeding it input (``engine.pty``): one master,
both ways. The terminal merges the command's output streams into one, the ``stdout`` capture.
EIO on the master is its end (no process holds the slave any more)."""

from __future__ import annotations

import os
from contextlib import suppress

import anyio

from sandboxrun.engine.capture.pipes import read_to_end
from sandboxrun.engine.capture.stream import StreamCapture
from sandboxrun.engine.request import STDIN_GONE, StdinStream

TERMINAL_GONE = "the terminal is gone (its command has ended)"


class PtyPump:
    """Reads the master ``fd`` (non-blocking, owned by the caller) into ``capture`` until the
    terminal's end, and writes what ``stdin`` is sent, with a bounded wait of the sender's
    choosing (a program that never reads fills the terminal's input queue: ``write`` then
    waits, it never blocks the loop). ``pump`` may be called again (the drain after a
    cancellation): it reads on where it stopped; the input writer runs once."""

    def __init__(self, fd: int, capture: StreamCapture, stdin: StdinStream | None) -> None:
        self.fd = fd
        self._capture = capture
        self._stdin = stdin
        self._writing = stdin is not None
        self._eof = False

    def close_stdin(self) -> None:
        if self._stdin is not None:
            self._stdin.abort(STDIN_GONE)
            self._stdin = None

    async def pump(self) -> None:
        if self._eof:
            return
        async with anyio.create_task_group() as tg:
            if self._writing:
                self._writing = False
                tg.start_soon(self._write_stdin)
            await self._read()
            tg.cancel_scope.cancel()  # the terminal is gone: nothing more can be written
        self.close_stdin()

    async def _read(self) -> None:
        with suppress(OSError):  # EIO: no process holds the slave any more (the terminal's end)
            await read_to_end(self.fd, self._capture)
        self._eof = True

    async def _write_stdin(self) -> None:
        stream = self._stdin
        assert stream is not None
        try:
            while (chunk := await stream.receive()) is not None:
                view = memoryview(chunk)
                while view:
                    try:
                        view = view[os.write(self.fd, view) :]
                    except BlockingIOError:
                        await anyio.wait_writable(self.fd)
                stream.written()
        except OSError:  # EIO: the terminal was hung up
            pass
        finally:
            with suppress(Exception):
                stream.abort(TERMINAL_GONE)
