"""Bounded in-memory capture of one output stream: keep the head and the tail, count the rest.

Pure: no I/O. ``HeadTailBuffer`` holds at most ``max_output`` bytes however much is fed, and
``render()`` turns what it holds into text with an exact ``[... N bytes omitted ...]`` marker,
never splitting a UTF-8 code point at either side of the cut.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

_CONTINUATION_MIN = 0x80
_CONTINUATION_MAX = 0xBF
_MAX_CONTINUATION = 3


def omission_marker(n: int) -> str:
    """The marker that stands for ``n`` bytes cut out of the middle of a stream."""
    return f"[... {n} bytes omitted ...]"


@dataclass(frozen=True, slots=True)
class Rendered:
    """A stream as text: ``dropped_bytes`` stream bytes are not represented in ``text``."""

    text: str
    total_bytes: int
    dropped_bytes: int
    truncated: bool


class HeadTailBuffer:
    """Keeps the first ``max_output // 2`` and the last ``max_output - max_output // 2`` bytes.

    Until more than ``max_output`` bytes have been fed nothing is dropped and head + tail are
    exactly the stream. The tail lives in a fixed ring allocated on first use, so ``feed`` never
    allocates on the hot path and copies at most ``min(len(chunk), tail_cap)`` bytes. A ``bytes``
    chunk of ``tail_cap`` to ``2 * tail_cap`` bytes is kept by reference instead of copied (it is
    immutable): the common 64 KiB-read case then costs no copy at all, and memory stays below
    ``max_output`` plus that one chunk.
    """

    __slots__ = (
        "_head",
        "_pos",
        "_ref",
        "_ring",
        "_tail_len",
        "_total",
        "head_cap",
        "max_output",
        "tail_cap",
    )

    def __init__(self, max_output: int) -> None:
        if max_output < 1:
            raise ValueError(f"max_output must be at least 1, got {max_output}")
        self.max_output = max_output
        self.head_cap = max_output // 2
        self.tail_cap = max_output - self.head_cap
        self._head = bytearray()
        self._ring = bytearray()  # becomes exactly tail_cap bytes on first use
        self._pos = 0  # where the next tail byte goes in the ring (= the oldest byte once full)
        self._tail_len = 0  # valid tail bytes (< tail_cap only before the ring first fills)
        self._ref: bytes | None = None  # when set, the tail is the last tail_cap bytes of it
        self._total = 0

    @property
    def total_bytes(self) -> int:
        """Every byte ever fed."""
        return self._total

    @property
    def truncated(self) -> bool:
        """Whether bytes have been dropped (more than ``max_output`` bytes fed)."""
        return self._total > self.max_output

    @property
    def buffered_bytes(self) -> int:
        """How many stream bytes are represented in memory (never more than ``max_output``)."""
        return len(self._head) + self._tail_len

    def feed(self, chunk: bytes | bytearray) -> None:
        """Append ``chunk`` (any size, possibly empty) to the stream; a bytearray is copied."""
        n = len(chunk)
        if n == 0:
            return
        self._total += n
        data: bytes | bytearray | memoryview = chunk
        room = self.head_cap - len(self._head)
        if room > 0:
            if n <= room:
                self._head += chunk
                return
            view = memoryview(chunk)
            self._head += view[:room]
            data = view[room:]
            n -= room
        cap = self.tail_cap
        if n >= cap:
            self._tail_len = cap
            if type(chunk) is bytes and len(chunk) <= 2 * cap:
                self._ref = chunk
                return
            self._ref = None
            self._ring_ready()[:] = memoryview(data)[n - cap :]
            self._pos = 0
            return
        if self._ref is not None:
            self._unref()
        ring = self._ring_ready()
        pos = self._pos
        first = cap - pos
        if n < first:
            ring[pos : pos + n] = data
            self._pos = pos + n
        else:
            view = memoryview(data)
            ring[pos:] = view[:first]
            ring[: n - first] = view[first:]
            self._pos = n - first
        if self._tail_len < cap:
            self._tail_len = min(cap, self._tail_len + n)

    def _ring_ready(self) -> bytearray:
        if not self._ring:
            self._ring = bytearray(self.tail_cap)
        return self._ring

    def _unref(self) -> None:
        ref = self._ref
        assert ref is not None
        self._ring_ready()[:] = memoryview(ref)[len(ref) - self.tail_cap :]
        self._pos = 0
        self._ref = None

    def _tail(self) -> bytes:
        if self._ref is not None:
            return self._ref[len(self._ref) - self.tail_cap :]
        ring = self._ring
        if self._tail_len < self.tail_cap:
            return bytes(ring[: self._tail_len])
        return bytes(ring[self._pos :]) + bytes(ring[: self._pos])

    def snapshot_bytes(self) -> bytes:
        """The whole stream so far; only valid while nothing has been dropped."""
        if self.truncated:
            raise RuntimeError("snapshot_bytes() after bytes were dropped")
        return bytes(self._head) + self._tail()

    def render(self) -> Rendered:
        """The stream as text, with an exact omission marker when bytes were dropped."""
        if not self.truncated:
            text = (bytes(self._head) + self._tail()).decode("utf-8", errors="replace")
            return Rendered(text=text, total_bytes=self._total, dropped_bytes=0, truncated=False)
        # The codec itself says which trailing bytes are an incomplete (but valid so far) sequence.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        head_text = decoder.decode(self._head, False)
        h = len(self._head) - len(decoder.getstate()[0])
        tail = self._tail()
        t = 0
        limit = min(_MAX_CONTINUATION, len(tail))
        while t < limit and _CONTINUATION_MIN <= tail[t] <= _CONTINUATION_MAX:
            t += 1
        tail_text = tail[t:].decode("utf-8", errors="replace")
        dropped = self._total - h - (len(tail) - t)
        return Rendered(
            text=head_text + omission_marker(dropped) + tail_text,
            total_bytes=self._total,
            dropped_bytes=dropped,
            truncated=True,
        )
