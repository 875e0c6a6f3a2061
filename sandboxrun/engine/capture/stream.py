"""Capture of one output stream: bounded head/tail in memory, the full stream spilled to disk.

``StreamCapture.feed`` runs in the hot read loop: it does O(len(chunk)) work with no per-byte
Python loops, and it never raises because of the spill file (errors land in ``spill_error``).
A live sink that implements ``LiveSink`` gets backpressure: the read loops call ``wait_sink``
after each feed, and stop reading (so the command blocks on its own write) while it is congested.

With a ``Redactor`` (``redact.redactor_for``) secret values are masked where the bytes come in,
so the head/tail buffer, the spill file and the live sink all see the same masked stream, and
the byte accounting (``total_bytes``, ``dropped_bytes``, the spill's size) counts the stream as
delivered: masked, markers included. The few bytes the redactor holds back (the start of what
may be a value) are let out when the stream ends (``finish``): ``report``, ``keep_if_lossy``
and ``close`` call it, so a timed-out or cancelled run keeps its last bytes too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import anyio

from sandboxrun.engine.capture.buffer import HeadTailBuffer
from sandboxrun.engine.capture.spill import SpillDir, SpillFile
from sandboxrun.errors import ConfigError

if TYPE_CHECKING:  # (redact rewrites results: engine.results imports this module)
    from sandboxrun.engine.capture.redact import Redactor

StreamName = Literal["stdout", "stderr"]
Sink = Callable[[str, bytes], None]
SINK_POLL_S = 0.002
"""How often a read loop held back by a congested sink looks again."""


@runtime_checkable
class LiveSink(Protocol):
    """A live sink with flow control (``terminal.LiveWriter`` is one)."""

    def __call__(self, name: str, chunk: bytes) -> None: ...

    def congested(self, name: str) -> bool:
        """True while the read loop should not feed ``name`` more (its reader is behind)."""
        ...

    def progress(self) -> int:
        """A counter that grows whenever the sink's reader takes output."""
        ...

    def lossy(self, name: str) -> bool:
        """Whether part of ``name`` was (or may yet be) not delivered: keep it on disk."""
        ...


def live_sink(sink: object) -> LiveSink | None:
    """``sink`` when it is a flow-controlled ``LiveSink``, else None (no sink is asked
    without the Protocol's attribute walk: the common case costs nothing)."""
    return sink if sink is not None and isinstance(sink, LiveSink) else None


class Activity:
    """Signs of life of one run, shared by its two captures, for the idle timeout: when the
    last output byte arrived on either stream (``last``, ``time.monotonic``; 0.0: none yet),
    and how many read loops a congested live sink holds back right now (``held``): then the
    reader is slow, not the command, and the run is not idle."""

    __slots__ = ("__weakref__", "held", "last")

    def __init__(self) -> None:
        self.last = 0.0
        self.held = 0

    def latest(self, now: float) -> float:
        """The last sign of life as of ``now`` (``now`` itself while a read loop is held)."""
        return now if self.held else self.last


@dataclass(frozen=True, slots=True)
class StreamReport:
    """What a run produced on one stream; maps onto the ``stdout_*`` / ``stderr_*`` fields."""

    text: str
    total_bytes: int
    dropped_bytes: int
    truncated: bool
    spill: str | None
    spill_complete: bool


class StreamCapture:
    """Captures one stream: keeps ``max_output`` bytes in memory, spills up to ``spill_max``.

    The spill file is opened the first time the stream outgrows ``max_output`` (when
    ``spill_max > 0`` and ``spill_dir`` is given) and is seeded with everything seen so far, so
    it always holds a prefix of the stream. ``sink``, if given, sees every non-empty chunk
    before it is buffered; its exceptions propagate. ``redactor``, if given, masks the stream
    before any of them sees it. ``activity`` (shared by a run's two captures) is touched by
    every chunk fed and every wait on a congested sink.
    """

    def __init__(
        self,
        name: StreamName,
        max_output: int,
        spill_max: int,
        spill_dir: SpillDir | None,
        sink: Sink | None = None,
        redactor: Redactor | None = None,
        activity: Activity | None = None,
    ) -> None:
        self.name: StreamName = name
        self.activity = activity if activity is not None else Activity()
        self.spill_max = spill_max
        self.spill_dir = spill_dir
        self.spill_error: str | None = None
        self.sink_error: str | None = None
        self._buffer = HeadTailBuffer(max_output)
        self._max_output = max_output
        self._sink = sink
        self._flow = live_sink(sink)
        self.flow_controlled = self._flow is not None
        """Whether ``wait_sink`` can ever wait (a flow-controlled live sink): readers skip
        the call per chunk otherwise."""
        self._spill: SpillFile | None = None
        self._spilling = False  # a spill file is open and not yet full
        self._overflowed = False
        self._closed = False
        self._redactor = redactor

    @property
    def total_bytes(self) -> int:
        return self._buffer.total_bytes

    def feed(self, chunk: bytes) -> None:
        """Record ``chunk``; empty chunks are ignored (and not passed to the sink)."""
        if chunk:
            self.activity.last = time.monotonic()
        if self._redactor is not None:
            chunk = self._redactor.feed(chunk)
        self._record(chunk)

    def finish(self) -> None:
        """The stream ended: let out what the redactor holds back (idempotent; a later ``feed``
        is still masked)."""
        if self._redactor is not None and self._redactor.held:
            self._record(self._redactor.flush())

    def _record(self, chunk: bytes) -> None:
        if not chunk:
            return
        if self._sink is not None:
            try:
                self._sink(self.name, chunk)
            except Exception as exc:  # a failing sink must not lose output or leak the run
                self.sink_error = f"live sink for {self.name} failed and was dropped: {exc!r}"
                self._sink = None
        if self._spilling:
            self._buffer.feed(chunk)
            self._spill_write(chunk)
        elif self._overflowed or self._buffer.total_bytes + len(chunk) <= self._max_output:
            self._buffer.feed(chunk)
        else:
            self._overflowed = True
            seed = self._buffer.snapshot_bytes()
            self._buffer.feed(chunk)
            self._start_spill(seed, chunk)

    async def wait_sink(self) -> None:
        """Backpressure: return once the live sink can take more of this stream (at once when
        it is not congested). Cancellable: a deadline still fires while the reader is slow."""
        flow = self._flow
        if flow is None or self._sink is None or not flow.congested(self.name):
            return
        self.activity.held += 1  # held back by the reader: the run is not idle meanwhile
        try:
            # Polled: the sink drains in a thread, which cannot set an anyio.Event without a
            # portal; a 2 ms poll costs nothing next to a reader that is behind by megabytes.
            while self._sink is not None and flow.congested(self.name):  # noqa: ASYNC110
                await anyio.sleep(SINK_POLL_S)
        finally:
            self.activity.held -= 1
            self.activity.last = time.monotonic()  # the idle clock starts again from here

    def keep_if_lossy(self) -> None:
        """If the live sink did not (or may not) deliver all of the stream and the stream is
        only in memory, write it to a spill file so it can be found in full."""
        self.finish()
        flow = self._flow
        if flow is None or self._spill is not None or self._buffer.truncated:
            return
        if not self._buffer.total_bytes or not flow.lossy(self.name):
            return
        if self.spill_max <= 0 or self.spill_dir is None:
            return
        was_closed, self._closed = self._closed, False
        self._start_spill(self._buffer.snapshot_bytes(), b"")
        self._spilling = False
        self._close_spill()
        self._closed = was_closed

    def _start_spill(self, seed: bytes, chunk: bytes) -> None:
        if self.spill_max <= 0 or self.spill_dir is None or self._closed:
            return
        try:
            self._spill = self.spill_dir.open_file(self.name, self.spill_max)
        except (OSError, ConfigError) as exc:
            self.spill_error = f"cannot open spill file for {self.name}: {exc}"
            return
        self._spilling = True
        self._spill_write(seed)
        self._spill_write(chunk)

    def _spill_write(self, data: bytes) -> None:
        spill = self._spill
        assert spill is not None
        if not self._spilling:
            return
        try:
            spill.write(data)
        except OSError as exc:
            self.spill_error = f"writing spill file {spill.path} failed: {exc}"
            self._spilling = False
            self._close_spill()
            return
        if spill.full:  # capped: nothing more will be written, release the descriptor now
            self._spilling = False
            self._close_spill()

    def _close_spill(self) -> None:
        if self._spill is None:
            return
        try:
            self._spill.close()
        except OSError as exc:
            self.spill_error = self.spill_error or f"closing spill file failed: {exc}"

    def close(self) -> None:
        """Close the spill file (idempotent). Later chunks are still kept in memory."""
        self.finish()
        self._closed = True
        self._spilling = False
        self._close_spill()

    def report(self) -> StreamReport:
        """The rendered text, byte accounting and where the full stream can be found."""
        self.finish()
        rendered = self._buffer.render()
        spill = self._spill
        complete = not rendered.truncated or (
            spill is not None and self.spill_error is None and spill.written == rendered.total_bytes
        )
        return StreamReport(
            text=rendered.text,
            total_bytes=rendered.total_bytes,
            dropped_bytes=rendered.dropped_bytes,
            truncated=rendered.truncated,
            spill=str(spill.path) if spill is not None else None,
            spill_complete=complete,
        )
