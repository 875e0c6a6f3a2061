"""``run -i``: the CLI's stdin forwarded to the command while it runs, chunk by chunk as it
arrives (never read whole first), with the command's pace: ``StdinStream.send`` returns once
the chunk is in the command's stdin."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandboxrun.engine.request import StdinStream

CHUNK = 64 * 1024


async def forward_stdin(stream: StdinStream, fd: int = 0) -> None:
    """Forward what ``fd`` gives to ``stream`` until its end (then EOF: ``stream.close()``) or
    until the command's stdin is gone (it closed it, or ended). ``fd`` keeps its blocking
    mode: a pipe or terminal is waited on until readable, then read once (a read of what is
    there never blocks); a regular file or ``/dev/null``, which cannot be polled, is read
    straight away. A closed or unreadable ``fd`` is an empty stdin."""
    import anyio
    import anyio.lowlevel

    pollable = True
    while True:
        if pollable:
            try:
                await anyio.wait_readable(fd)
            except OSError:  # epoll refuses regular files and /dev/null: their reads never block
                pollable = False
        else:
            await anyio.lowlevel.checkpoint()
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:  # someone else set O_NONBLOCK on it: wait again
            continue
        except OSError:  # closed (EBADF), or a terminal we may not read (EIO): the end
            data = b""
        if not data:
            stream.close()
            return
        try:
            await stream.send(data)
        except BrokenPipeError:  # the command closed its stdin or ended: the rest is not read
            return
