"""One stream of a background job (``sandboxrun.api.jobs``): every byte has an offset; the newest
ones are held. Pure bookkeeping: no task, no process, only the spill files it writes.

A ``JobLog`` is bounded like ``exec``'s capture: the newest ``max_output`` bytes in memory and,
once the stream outgrows that, the newest ``spill_max / 2`` to ``spill_max`` bytes on disk in
two rotating segment files (``<spill root>/<run id>.log/<stream>.<n>``). Offsets count every
byte the stream produced; an offset older than what is held reads from the oldest held byte
with ``lossy=True``.

Descriptors: while the stream runs, each segment has a write and a read descriptor; once it has
ended (``end``) they are closed and a read opens the segment it needs for the call only, so an
ended job costs no descriptor. Its segment files stay on disk until ``discard``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Literal

from sandboxrun.engine.capture.spill import SpillDir, SpillFile
from sandboxrun.errors import ConfigError

StreamName = Literal["stdout", "stderr"]
BLOCK = 64 * 1024
"""Read size when scanning the log for lines."""
MAX_LINES_BYTES = 1 << 20
"""``read_lines``' default ``max_bytes``: the most line bytes one call returns (and about the
most it scans)."""
MIN_SEGMENT = 4096
"""Below ``2 * MIN_SEGMENT`` bytes of ``spill_max`` a job log keeps its stream in memory only."""
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class JobChunk:
    """Bytes of one stream of a job, from ``Job.read``."""

    data: bytes
    offset: int
    """Stream offset of ``data[0]``: the offset asked for, or the oldest held one (``lossy``)."""
    next_offset: int
    """``offset + len(data)``: pass it to the next ``read`` to continue exactly."""
    lossy: bool
    """The offset asked for is no longer held: the bytes before ``offset`` are gone."""
    eof: bool
    """The stream has ended and ``next_offset`` is its end: nothing more will come."""


@dataclass(frozen=True, slots=True)
class JobLines:
    """Lines of one stream of a job, from ``Job.read_lines``."""

    lines: list[str]
    """Complete lines without their ``\\n``, decoded as UTF-8 (invalid bytes replaced); the
    last, unterminated line only once the stream has ended. A line longer than ``max_bytes``
    comes in pieces of ``max_bytes`` bytes (each counts as a line)."""
    offset: int
    """Stream offset where the first line starts."""
    next_offset: int
    """Where the line after the last one starts: pass it to ``read_lines`` to page on."""
    lossy: bool
    """Bytes before ``offset`` are gone: the first line may be missing its beginning."""
    eof: bool
    """The stream has ended and ``next_offset`` is its end."""


class _Segment:
    """One spill segment: stream bytes ``[start, start + written)`` of a job log."""

    def __init__(self, start: int, file: SpillFile) -> None:
        self.start = start
        self.file = file
        self.rfd: int | None = os.open(file.path, _READ_FLAGS)

    @property
    def end(self) -> int:
        return self.start + self.file.written

    def pread(self, start: int, end: int) -> bytes:
        rfd = self.rfd
        own = rfd is None  # closed (the stream ended): opened for this read only
        if rfd is None:
            rfd = os.open(self.file.path, _READ_FLAGS)
        try:
            parts: list[bytes] = []
            pos = start
            while pos < end:
                data = os.pread(rfd, end - pos, pos - self.start)
                if not data:
                    raise OSError(f"spill segment {self.file.path} is shorter than written")
                parts.append(data)
                pos += len(data)
            return b"".join(parts)
        finally:
            if own:
                os.close(rfd)

    def close(self) -> None:
        """Close both descriptors; the file stays (``pread`` opens it when needed)."""
        with contextlib.suppress(OSError):
            self.file.close()
        rfd, self.rfd = self.rfd, None
        if rfd is not None:
            with contextlib.suppress(OSError):
                os.close(rfd)

    def drop(self) -> None:
        """Close both descriptors and remove the file."""
        self.close()
        with contextlib.suppress(OSError):
            self.file.path.unlink()


class JobLog:
    """One stream of a job: every byte has an offset; the newest ones are held (see module).

    ``feed`` is called with the stream's chunks as they come (it never raises: a spill error
    turns the log into memory-only and is kept in ``error``); ``end`` marks the stream over.
    Reads are synchronous and see the log as it is at the call; call them from the event loop
    that runs the job (the one feeding it).
    """

    def __init__(
        self, name: str, max_output: int, spill_max: int, spill_dir: SpillDir | None
    ) -> None:
        self.name = name
        self.max_output = max_output
        segment = spill_max // 2
        self.segment_max = segment if spill_dir is not None and segment >= MIN_SEGMENT else 0
        self.total = 0
        """Bytes the stream produced so far (the offset of the next byte)."""
        self.ended = False
        self.error: str | None = None
        """Why the log stopped spilling (then it holds only its memory part), or None."""
        self._spill_dir = spill_dir
        self._ring = bytearray()
        self._ring_start = 0  # stream offset of _ring[0]; _ring ends at total
        self._segments: list[_Segment] = []  # oldest first; contiguous, the last ends at total
        self._spilling = False
        self._next_index = 0

    # -- writing --------------------------------------------------------------------------
    def feed(self, chunk: bytes) -> None:
        if not chunk or self.ended:
            return
        at = self.total
        spillable = self.segment_max and self.error is None
        if spillable and not self._spilling and at + len(chunk) > self.max_output:
            self._spilling = True  # it outgrows memory: spill from byte 0 on
            self._spill(bytes(self._ring), self._ring_start)
        if self._spilling:
            self._spill(chunk, at)
        self._ring += chunk
        self.total = at + len(chunk)
        if len(self._ring) > 2 * self.max_output:  # trimmed in bulk: amortised O(1) per byte
            self._trim()

    def _trim(self) -> None:
        cut = len(self._ring) - self.max_output
        if cut > 0:
            self._ring = self._ring[cut:]  # a new buffer: the old one's memory is freed
            self._ring_start += cut

    def _spill(self, chunk: bytes, at: int) -> None:
        """Write stream bytes ``[at, at + len(chunk))`` to the segments."""
        if not self._spilling:
            return
        seg = self.segment_max
        if len(chunk) > 2 * seg:  # only the newest 2 segments' worth could be kept anyway
            self._drop_segments()
            at += len(chunk) - 2 * seg
            chunk = chunk[-2 * seg :]
        view = memoryview(chunk)
        try:
            while view:
                current = self._segments[-1] if self._segments else None
                if current is None or current.file.full:
                    current = self._open_segment(at)
                take = seg - current.file.written
                current.file.write(bytes(view[:take]))
                at += min(take, len(view))
                view = view[take:]
        except (OSError, ConfigError) as exc:
            self._stop_spilling(f"spilling failed, memory only from now: {exc}")

    def _open_segment(self, at: int) -> _Segment:
        assert self._spill_dir is not None
        name = f"{self.name}.{self._next_index}"
        self._next_index += 1
        if self._segments:
            self._segments[-1].file.close()  # full: only read from now on
        segment = _Segment(at, self._spill_dir.open_file(name, self.segment_max))
        self._segments.append(segment)
        while len(self._segments) > 2:
            self._segments.pop(0).drop()
        return segment

    def _drop_segments(self) -> None:
        for segment in self._segments:
            segment.drop()
        self._segments = []

    def _stop_spilling(self, why: str) -> None:
        self.error = f"job log {self.name}: {why}"
        self._spilling = False
        self._drop_segments()

    def end(self) -> None:
        """The stream is over: nothing more is fed. Every descriptor is closed and the memory
        part cut to ``max_output``; the spill files stay for reads until ``discard``."""
        self.ended = True
        self._trim()
        for segment in self._segments:
            segment.close()

    def discard(self) -> None:
        """Remove the spill files (the job was released): only the memory part stays."""
        self.end()
        self._spilling = False
        self._drop_segments()
        self.segment_max = 0
        if self._spill_dir is not None:
            with contextlib.suppress(OSError):
                self._spill_dir.path.rmdir()  # only once the other stream's files are gone

    @property
    def open_fds(self) -> int:
        """How many descriptors the log holds (0 once it has ended)."""
        return sum((s.rfd is not None) + (not s.file.closed) for s in self._segments)

    # -- reading --------------------------------------------------------------------------
    @property
    def oldest(self) -> int:
        """The oldest offset still held."""
        in_memory = max(0, self.total - self.max_output)
        if self._segments:
            return min(in_memory, self._segments[0].start)
        return in_memory

    def _bytes(self, start: int, end: int) -> bytes:
        """Stream bytes ``[start, end)``, all held (``oldest <= start <= end <= total``)."""
        if start >= end:
            return b""
        if start >= self._ring_start:
            return bytes(self._ring[start - self._ring_start : end - self._ring_start])
        parts = []
        for segment in self._segments:
            lo, hi = max(start, segment.start), min(end, segment.end)
            if lo < hi:
                parts.append(segment.pread(lo, hi))
        return b"".join(parts)

    def _check_offset(self, offset: int) -> None:
        if offset < 0 or offset > self.total:
            raise ValueError(
                f"offset {offset} is outside {self.name} (0 to {self.total}, the bytes so far)"
            )

    def read(self, offset: int = 0, limit: int = 65536) -> JobChunk:
        """Up to ``limit`` bytes from ``offset`` (from the oldest held byte, ``lossy``, when
        ``offset`` is no longer held). ``ValueError`` for an offset past the end."""
        self._check_offset(offset)
        if limit <= 0:
            raise ValueError(f"limit must be positive, got {limit}")
        oldest = self.oldest
        start = max(offset, oldest)
        end = min(self.total, start + limit)
        try:
            data = self._bytes(start, end)
        except OSError as exc:  # a spill file went away under us: fall back to memory
            self._stop_spilling(f"reading the spill failed: {exc}")
            return self.read(offset, limit)
        return JobChunk(
            data=data,
            offset=start,
            next_offset=end,
            lossy=offset < oldest,
            eof=self.ended and end == self.total,
        )

    def read_lines(
        self, offset: int | None = None, limit: int = 100, max_bytes: int = MAX_LINES_BYTES
    ) -> JobLines:
        """``offset`` None: the last lines held (tail); else the lines from ``offset`` (from the
        oldest held byte, ``lossy``, when it is no longer held). At most ``limit`` lines and
        ``max_bytes`` bytes of them (newlines not counted): a line longer than that comes as
        a piece of ``max_bytes`` bytes (in a tail: its last ``max_bytes`` bytes). A call scans
        about ``max_bytes + limit`` bytes of the log at most."""
        if limit <= 0:
            raise ValueError(f"limit must be positive, got {limit}")
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        try:
            if offset is None:
                return self._tail(limit, max_bytes)
            self._check_offset(offset)
            return self._lines_from(offset, limit, max_bytes)
        except OSError as exc:
            self._stop_spilling(f"reading the spill failed: {exc}")
            return self.read_lines(offset, limit, max_bytes)

    def _lines_from(self, offset: int, limit: int, max_bytes: int) -> JobLines:
        oldest, total = self.oldest, self.total
        lossy = offset < oldest
        start = pos = max(offset, oldest)
        lines: list[bytes] = []
        used = 0  # bytes of the lines taken (newlines not counted)
        buf = b""  # stream bytes [read_to - len(buf), read_to); the next line starts at buf[at]
        at = 0
        read_to = pos
        while len(lines) < limit:
            budget = max_bytes - used
            newline = buf.find(b"\n", at, at + budget + 1)
            if newline >= 0:
                lines.append(buf[at:newline])
                used += newline - at
                pos += newline + 1 - at
                at = newline + 1
                continue
            have = len(buf) - at
            if have > budget:  # the next line is longer than what is left of max_bytes
                if not lines:  # an overlong line: a piece of it, so that paging moves on
                    lines.append(buf[at : at + max_bytes])
                    pos += max_bytes
                break
            if read_to < total:  # no further than this line could reach (bounded scan)
                upto = min(total, read_to + BLOCK, pos + budget + 1)
                buf, at = buf[at:] + self._bytes(read_to, upto), 0
                read_to = upto
                continue
            if self.ended and have:  # the last line has no newline, and never will
                lines.append(buf[at:])
                pos += have
            break
        return JobLines(
            lines=[line.decode("utf-8", errors="replace") for line in lines],
            offset=start,
            next_offset=pos,
            lossy=lossy,
            eof=self.ended and pos == total,
        )

    def _tail(self, limit: int, max_bytes: int) -> JobLines:
        """The newest lines, found backwards from the end: each byte scanned at most once,
        no further back than ``max_bytes + limit + 1`` bytes (two more blocks at most)."""
        oldest, total = self.oldest, self.total
        scan = _Backwards(self, oldest)
        end = total  # where the tail ends: after the newest complete line
        if not self.ended:
            newline = scan.rfind(max(oldest, total - max_bytes - 1), total)
            if newline >= 0:
                end = newline + 1
            elif total - oldest > max_bytes:  # an unfinished line beyond max_bytes: its end
                start = total - max_bytes
                return self._lines_result([self._bytes(start, total)], start, total)
            else:
                end = oldest  # no complete line held yet
        if end == oldest:
            return self._lines_result([], oldest, oldest)
        # the newest line ends at `last` (its newline, or the end of an unterminated last line)
        last = end - 1 if scan.rfind(end - 1, end) == end - 1 else end
        lines: list[bytes] = []  # newest first
        used = 0
        first = end
        while len(lines) < limit:
            budget = max_bytes - used
            newline = scan.rfind(max(oldest, last - budget - 1), last)
            if newline >= 0:
                begin = newline + 1
            elif last - oldest <= budget:
                begin = oldest  # the oldest held line (its beginning may be gone)
            elif not lines:  # the newest line alone is longer than max_bytes: its end
                begin = last - max_bytes
            else:
                break
            lines.append(self._bytes(begin, last))
            used += last - begin
            first = begin
            if newline < 0:
                break
            last = newline
        lines.reverse()
        return self._lines_result(lines, first, end)

    def _lines_result(self, lines: list[bytes], start: int, end: int) -> JobLines:
        oldest = self.oldest
        return JobLines(
            lines=[line.decode("utf-8", errors="replace") for line in lines],
            offset=start,
            next_offset=end,
            lossy=start == oldest and oldest > 0,
            eof=self.ended and end == self.total,
        )


class _Backwards:
    """Newline search from the end of a log towards its start, one block cached: as the
    searches move back, each byte is read once."""

    def __init__(self, log: JobLog, floor: int) -> None:
        self._log = log
        self._floor = floor
        self._lo = self._hi = 0
        self._block = b""

    def rfind(self, lo: int, hi: int) -> int:
        """The offset of the last newline in ``[lo, hi)``, or -1."""
        while hi > lo:
            if not self._lo < hi <= self._hi:
                self._lo, self._hi = max(self._floor, hi - BLOCK), hi
                self._block = self._log._bytes(self._lo, self._hi)
            at = self._block.rfind(b"\n", max(lo, self._lo) - self._lo, hi - self._lo)
            if at >= 0:
                return self._lo + at
            hi = max(lo, self._lo)
        return -1
