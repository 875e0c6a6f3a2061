"""Docker's multiplexed exec stream, demultiplexed by sandboxrun. Pure.

Each frame is an 8-byte header ``[stream, 0, 0, 0, size (big-endian uint32)]`` followed by
``size`` payload bytes; stream 1 is stdout and 2 is stderr (0, stdin, is never sent by the
engine). docker-py's own ``demux=True`` is quadratic on large outputs, so sandboxrun parses the
raw socket stream itself, in O(n), copying each payload at most once.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

HEADER = struct.Struct(">BxxxI")
STREAMS = {1: "stdout", 2: "stderr"}

Emit = Callable[[str, bytes], None]


class FrameError(ValueError):
    """The stream is not a valid multiplexed stream (unknown stream id)."""


class FrameDecoder:
    """Feed raw socket bytes in any chunking; complete payload pieces go to ``emit``.

    A frame's payload is emitted as soon as any part of it has arrived (so a large frame is
    not held back), always in order."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._header = b""
        self._stream = ""
        self._left = 0  # payload bytes still to come for the current frame

    @property
    def mid_frame(self) -> bool:
        """Whether the stream ended (if it ends now) inside a header or a payload."""
        return bool(self._header) or self._left > 0

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        pos, end = 0, len(data)
        while pos < end:
            if self._left:
                take = min(self._left, end - pos)
                self._emit(self._stream, bytes(view[pos : pos + take]))
                self._left -= take
                pos += take
                continue
            need = HEADER.size - len(self._header)
            if self._header or end - pos < HEADER.size:
                self._header += bytes(view[pos : pos + need])
                pos += min(need, end - pos)
                if len(self._header) < HEADER.size:
                    return
                kind, size = HEADER.unpack(self._header)
                self._header = b""
            else:
                kind, size = HEADER.unpack_from(view, pos)
                pos += HEADER.size
            name = STREAMS.get(kind)
            if name is None:
                raise FrameError(f"unknown stream id {kind} in the docker exec stream")
            self._stream, self._left = name, size
