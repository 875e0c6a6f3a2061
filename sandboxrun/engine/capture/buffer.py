"""Bounded in-memory capture of one output stream: keep the head and the tail, count the rest.

Pure: no I/O. ``HeadTailBuffer`` holds at most ``max_output`` bytes however much is fed, and
``render()`` turns what it holds into text with an exact ``[... N bytes omitted ...]`` marker,
never splitting a UTF-8 code point at either side of the cut.
"""

from __future__ import annotations

import codecs
from collections import deque
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
    exactly the stream. The tail is a deque of the most recent chunks, trimmed from the left as
    soon as the chunks after the first one cover ``tail_cap``: ``feed`` is O(1) and copies nothing
    in the steady state (the per-chunk cost decides flood throughput). Memory stays below
    ``max_output`` plus one chunk; runs of tiny chunks are joined so their count stays bounded.
    """

    __slots__ = ("_chunks", "_head", "_tail_bytes", "_total", "head_cap", "max_output", "tail_cap")

    _COMPACT_AT = 256

    def __init__(self, max_output: int) -> None:
        if max_output < 1:
            raise ValueError(f"max_output must be at least 1, got {max_output}")
        self.max_output = max_output
        self.head_cap = max_output // 2
        self.tail_cap = max_output - self.head_cap
        self._head = bytearray()
        self._chunks: deque[bytes] = deque()
        self._tail_bytes = 0  # bytes held in _chunks (may exceed tail_cap by < one chunk)
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
        """How many stream bytes are represented (never more than ``max_output``)."""
        return len(self._head) + min(self._tail_bytes, self.tail_cap)

    def feed(self, chunk: bytes | bytearray) -> None:
        """Append ``chunk`` (any size, possibly empty) to the stream; a bytearray is copied."""
        n = len(chunk)
        if n == 0:
            return
        self._total += n
        room = self.head_cap - len(self._head)
        if room > 0:
            if n <= room:
                self._head += chunk
                return
            self._head += memoryview(chunk)[:room]
            chunk = chunk[room:]
            n -= room
        cap = self.tail_cap
        if n >= cap:  # this chunk alone is the whole tail
            self._chunks.clear()
            self._chunks.append(bytes(chunk[n - cap :]) if n > 2 * cap else bytes(chunk))
            self._tail_bytes = len(self._chunks[0])
            return
        chunks = self._chunks
        chunks.append(bytes(chunk))
        held = self._tail_bytes + n
        while held - len(chunks[0]) >= cap:
            held -= len(chunks.popleft())
        self._tail_bytes = held
        if len(chunks) > self._COMPACT_AT:
            joined = self._tail()
            chunks.clear()
            chunks.append(joined)
            self._tail_bytes = len(joined)

    def _tail(self) -> bytes:
        """The last ``tail_cap`` bytes held (fewer before that many were fed)."""
        joined = b"".join(self._chunks)
        return joined[len(joined) - self.tail_cap :] if len(joined) > self.tail_cap else joined

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
