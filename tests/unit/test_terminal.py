"""LiveWriter flow control on real pipes and terminals, and the capture's side of it."""

from __future__ import annotations

import os
import pty
import threading
import time
from pathlib import Path

import anyio
import pytest

from sandboxrun.cli import terminal
from sandboxrun.cli.terminal import QUEUE_BYTES, LiveWriter
from sandboxrun.engine.capture.spill import SpillDir
from sandboxrun.engine.capture.stream import LiveSink, StreamCapture

CHUNK = 64 * 1024


def drain(fd: int, into: bytearray) -> threading.Thread:
    def run() -> None:
        while block := os.read(fd, 1 << 16):
            into.extend(block)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_pipe_gets_congested_then_everything_in_order() -> None:
    r, w = os.pipe()
    live = LiveWriter({"stdout": w})
    assert isinstance(live, LiveSink)
    sent = bytearray()
    i = 0
    while not live.congested("stdout"):  # nobody reads: the queue fills up to its bound
        chunk = (f"{i:08d}" * (CHUNK // 8)).encode()
        live("stdout", chunk)
        sent += chunk
        i += 1
    assert QUEUE_BYTES <= len(sent) < QUEUE_BYTES + CHUNK + (1 << 20)  # + the pipe's buffer
    got = bytearray()
    reader = drain(r, got)
    live.close()
    os.close(w)
    reader.join(10)
    os.close(r)
    assert got == sent
    assert live.stats["stdout"].dropped == live.stats["stdout"].lost == 0
    assert not live.lossy("stdout")


def test_a_terminal_is_never_congested_and_drops_instead() -> None:
    master, slave = pty.openpty()
    live = LiveWriter({"stdout": slave})
    for _ in range(2 * QUEUE_BYTES // CHUNK):
        live("stdout", b"x" * CHUNK)
        assert not live.congested("stdout")
    assert live.stats["stdout"].dropped > 0
    assert live.lossy("stdout")
    start = time.monotonic()
    live.close()  # the terminal is never read: the flush gives up
    assert time.monotonic() - start < terminal.TTY_FLUSH_S + 2
    os.close(slave)
    os.close(master)


def test_a_closed_pipe_is_reported_as_closed_and_frees_the_run() -> None:
    r, w = os.pipe()
    os.close(r)
    live = LiveWriter({"stdout": w})
    for _ in range(200):
        live("stdout", b"y" * CHUNK)
    live.close()
    os.close(w)
    stats = live.stats["stdout"]
    assert stats.failure == "closed"
    assert stats.lost == 200 * CHUNK
    assert stats.dropped == 0
    assert not live.congested("stdout")
    assert live.lossy("stdout")


class Gate:
    """A LiveSink whose congestion the test controls (pure unit test of the capture side)."""

    def __init__(self) -> None:
        self.closed = True
        self.lost = False
        self.seen: list[bytes] = []

    def __call__(self, name: str, chunk: bytes) -> None:
        self.seen.append(chunk)

    def congested(self, name: str) -> bool:
        return self.closed

    def progress(self) -> int:
        return len(self.seen)

    def lossy(self, name: str) -> bool:
        return self.lost


@pytest.mark.anyio
async def test_wait_sink_waits_while_congested_and_is_cancellable() -> None:
    gate = Gate()
    cap = StreamCapture("stdout", 1024, 0, None, gate)
    cap.feed(b"a")
    with anyio.move_on_after(0.05) as scope:
        await cap.wait_sink()
    assert scope.cancelled_caught
    gate.closed = False
    with anyio.fail_after(1):
        await cap.wait_sink()


def test_a_lossy_stream_that_fit_in_memory_is_kept_on_disk(tmp_path: Path) -> None:
    gate = Gate()
    gate.closed = False
    cap = StreamCapture("stdout", 1024, 1 << 20, SpillDir(tmp_path, "run1"), gate)
    cap.feed(b"\xffhello")
    cap.close()
    cap.keep_if_lossy()
    assert cap.report().spill is None  # nothing was lost: no file
    gate.lost = True
    cap.keep_if_lossy()
    report = cap.report()
    assert report.spill is not None
    assert Path(report.spill).read_bytes() == b"\xffhello"
    assert report.spill_complete


def test_the_null_device_is_never_queued_nor_congested(tmp_path: Path) -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    regular = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        writer = LiveWriter({"stdout": null, "stderr": regular})
        for _ in range(2 * QUEUE_BYTES // CHUNK):
            writer("stdout", b"x" * CHUNK)
            assert not writer.congested("stdout")
        writer("stderr", b"y")
        writer.close()
        assert writer.stats["stdout"].null and not writer.stats["stderr"].null
        assert writer.stats["stdout"].shown == 2 * QUEUE_BYTES
        assert writer.dropped == 0
        assert (tmp_path / "out").read_bytes() == b"y"
    finally:
        os.close(null)
        os.close(regular)
