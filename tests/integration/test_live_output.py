"""Live output of ``sandboxrun run`` against hostile readers: slow pipes, closed pipes, stalled
terminals. To a pipe or a file every byte arrives, in order (backpressure: the command waits);
to a terminal bytes may be dropped, and the summary says so and where the full stream is."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxrun import backends

CLI = [sys.executable, "-m", "sandboxrun"]


@pytest.fixture(params=["process-group", "docker"])
def live_backend(request: pytest.FixtureRequest) -> str:
    name = backends.check_name(str(request.param))
    probe = backends.probe(name)
    if not probe.available:
        pytest.skip(f"{name} unavailable here: {probe.reason}")
    return name


def seq_bytes(n: int) -> bytes:
    return "".join(f"{i}\n" for i in range(1, n + 1)).encode()


class Reader(threading.Thread):
    """Reads a pipe after ``delay`` seconds, ``chunk`` bytes at a time with ``pause`` between
    reads (a slow consumer); ``limit`` bytes then closes it (a consumer that quits)."""

    def __init__(
        self, fd: int, delay: float = 0.0, chunk: int = 1 << 16, pause: float = 0.0, limit: int = -1
    ) -> None:
        super().__init__(daemon=True)
        self.fd, self.delay, self.chunk, self.pause, self.limit = fd, delay, chunk, pause, limit
        self.data = bytearray()

    def run(self) -> None:
        time.sleep(self.delay)
        while True:
            want = self.chunk if self.limit < 0 else min(self.chunk, self.limit - len(self.data))
            if want == 0:
                break
            block = os.read(self.fd, want)
            if not block:
                break
            self.data += block
            if self.pause:
                time.sleep(self.pause)
        os.close(self.fd)


def run_with_readers(
    args: list[str],
    out: Callable[[int], Reader],
    err: Callable[[int], Reader],
    timeout: float = 120,
) -> tuple[int, bytes, bytes, float]:
    """Run the CLI with stdout and stderr pipes read by the given readers."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    start = time.monotonic()
    proc = subprocess.Popen([*CLI, "run", *args], stdout=out_w, stderr=err_w)
    os.close(out_w)
    os.close(err_w)
    readers = [out(out_r), err(err_r)]
    for reader in readers:
        reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        proc.kill()
    elapsed = time.monotonic() - start
    for reader in readers:
        reader.join(10)
    return rc, bytes(readers[0].data), bytes(readers[1].data), elapsed


def split_own_lines(stderr: bytes) -> tuple[bytes, list[str]]:
    """The command's stderr and sandboxrun's own lines (warnings, summary) after it."""
    own: list[str] = []
    body = stderr
    while body:
        head, _, last = body.rstrip(b"\n").rpartition(b"\n")
        if not last.startswith(b"sandboxrun: "):
            break
        own.insert(0, last.decode())
        body = head + b"\n" if head else b""
    return body, own


def test_slow_pipes_get_every_byte_in_order(workspace: Path, live_backend: str) -> None:
    """stdout trickles out at ~0.6 MB/s (slower than the command, and still busy long after it
    exited); stderr's reader starts 3 s late. Nothing may be lost, reordered or duplicated."""
    n = 800_000  # ~5.3 MB per stream: more than the live queue plus the pipe
    rc, out, err, _ = run_with_readers(
        ["-w", str(workspace), "-b", live_backend, "--shell", "--",
         f"seq 1 {n} >&2 & seq 1 {n}; wait"],
        out=lambda fd: Reader(fd, chunk=32 << 10, pause=0.05),
        err=lambda fd: Reader(fd, delay=3.0),
    )  # fmt: skip
    body, own = split_own_lines(err)
    assert rc == 0, own
    expected = seq_bytes(n)
    assert len(out) == len(expected)
    assert out == expected
    assert body == expected
    assert not any("not shown" in line for line in own), own


def test_timed_out_flood_into_slow_pipe_is_on_time_and_exact(
    workspace: Path, live_backend: str
) -> None:
    """Backpressure must not stall the deadline; what the reader got is what the result holds."""
    rc, out, err, elapsed = run_with_readers(
        ["-w", str(workspace), "-b", live_backend, "-t", "2", "--grace", "0.5", "--keep-spill",
         "--", "seq", "1", "100000000"],
        out=lambda fd: Reader(fd, chunk=64 << 10, pause=0.02),
        err=lambda fd: Reader(fd),
    )  # fmt: skip
    _, own = split_own_lines(err)
    assert rc == 124, own
    summary = own[-1]
    assert summary.startswith("sandboxrun: timed out after 2s;"), summary  # the timeout given
    spill = re.search(r"stdout kept in (\S+)", summary)  # shown live: no truncation notice
    assert spill is not None, summary
    counted = Path(spill.group(1)).read_bytes()
    assert out == counted  # every byte the result counted reached the reader, nothing else
    assert out == seq_bytes(out.count(b"\n"))[: len(out)]  # in order, no gap
    assert elapsed < 30


def test_reader_that_closes_the_pipe_is_reported_truthfully(workspace: Path) -> None:
    """``| head -c1``: the run goes on to its end, the CLI does not die of EPIPE, and the
    summary does not blame a slow terminal."""
    rc, out, err, _ = run_with_readers(
        ["-w", str(workspace), "-b", "process-group", "--shell", "--",
         "seq 1 300000; touch done"],
        out=lambda fd: Reader(fd, limit=1),
        err=lambda fd: Reader(fd),
    )  # fmt: skip
    _, own = split_own_lines(err)
    assert rc == 0, own
    assert out == b"1"
    assert (workspace / "done").exists()
    assert not any("too slow" in line for line in own), own
    assert any(re.search(r"the reader of stdout closed the pipe: \d+ bytes not shown", line)
               for line in own), own  # fmt: skip


def test_both_readers_gone_the_run_still_completes(workspace: Path) -> None:
    rc, _, _, _ = run_with_readers(
        ["-w", str(workspace), "-b", "process-group", "--shell", "--",
         "seq 1 300000; seq 1 300000 >&2; touch done"],
        out=lambda fd: Reader(fd, limit=1),
        err=lambda fd: Reader(fd, limit=1),
    )  # fmt: skip
    assert rc == 0  # not 120 (interpreter exit on a broken stderr) nor a SIGPIPE death
    assert (workspace / "done").exists()


def run_on_stalled_tty(args: list[str], timeout: float = 60) -> tuple[int, str, float]:
    """The CLI with a terminal as stdout that nobody reads during the run (Ctrl-S, a stuck
    terminal); stderr is a pipe. The terminal is drained only after the CLI exited."""
    master, slave = pty.openpty()
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [*CLI, "run", *args],
            stdout=slave,
            stderr=subprocess.PIPE,
            timeout=timeout,
            check=False,
        )
    finally:
        os.close(slave)
        os.close(master)
    return proc.returncode, proc.stderr.decode(), time.monotonic() - start


def test_stalled_terminal_drops_and_names_the_full_stream(workspace: Path) -> None:
    """The stream fits in memory (no spill file would exist): the dropped part must still be
    findable, so it is written to one and named."""
    size = 8_000_000
    rc, err, elapsed = run_on_stalled_tty(
        ["-w", str(workspace), "-b", "process-group", "--max-output", "16m", "--keep-spill",
         "--", "head", "-c", str(size), "/dev/zero"],
    )  # fmt: skip
    assert rc == 0, err
    pattern = r"(\d+) bytes of stdout not shown on the terminal.*?full stream in (\S+?)[;)\s]"
    found = re.search(pattern, err)
    assert found is not None, err
    assert int(found.group(1)) > 0
    assert Path(found.group(2)).read_bytes() == bytes(size)
    assert elapsed < 20  # the flush to a stuck terminal is bounded


def test_ctrl_c_stops_waiting_for_a_reader_that_never_reads(workspace: Path) -> None:
    """A pipe nobody reads holds the CLI (as it holds ``cat``); Ctrl-C cancels the run, a second
    one stops the flush, and the summary says what was not delivered."""
    out_r, out_w = os.pipe()
    proc = subprocess.Popen(
        [*CLI, "run", "-w", str(workspace), "-b", "process-group", "--",
         "head", "-c", "100000000", "/dev/zero"],
        stdout=out_w, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(out_w)
    try:
        time.sleep(3)
        assert proc.poll() is None  # held back, not dropping
        proc.send_signal(signal.SIGINT)  # cancels the run
        time.sleep(4)
        proc.send_signal(signal.SIGINT)  # stops waiting for the reader
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        os.close(out_r)
    assert proc.returncode == 130, err
    assert re.search(rb"writing stdout failed \(interrupted\): \d+ bytes not shown", err), err
