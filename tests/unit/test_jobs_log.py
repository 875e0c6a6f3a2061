"""Unit tests of a job's per-stream log (``sandboxrun.api.joblog.JobLog``): offsets, what is held
(memory ring + rotating spill segments), ``lossy``, line paging and its byte cap, and the
descriptors an ended log gives back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxrun.api import joblog
from sandboxrun.api.joblog import BLOCK, MIN_SEGMENT, JobLog
from sandboxrun.engine.capture.spill import SpillDir

PATTERN = bytes(i % 251 for i in range(300_000))


def spill_dir(tmp_path: Path, name: str = "run.log") -> SpillDir:
    return SpillDir(tmp_path / "spill", name)


def feed(log: JobLog, data: bytes, size: int) -> None:
    for at in range(0, len(data), size):
        log.feed(data[at : at + size])


def files(directory: SpillDir) -> dict[str, int]:
    if not directory.path.exists():
        return {}
    return {p.name: p.stat().st_size for p in directory.path.iterdir()}


def test_small_stream_reads_by_offset_and_ends() -> None:
    log = JobLog("stdout", 1024, 0, None)
    assert log.read() == joblog.JobChunk(b"", 0, 0, lossy=False, eof=False)
    log.feed(b"hello ")
    log.feed(b"")
    log.feed(b"world\n")
    first = log.read(0, limit=4)
    assert (first.data, first.offset, first.next_offset, first.lossy) == (b"hell", 0, 4, False)
    rest = log.read(first.next_offset)
    assert rest.data == b"o world\n" and rest.next_offset == 12 and not rest.eof
    assert log.read(12).data == b""
    log.end()
    assert log.read(12).eof and log.read(5).eof
    assert not log.read(0, limit=3).eof


def test_bad_offsets_and_limits_are_refused() -> None:
    log = JobLog("stdout", 1024, 0, None)
    log.feed(b"abc")
    for offset in (-1, 4):
        with pytest.raises(ValueError, match="outside stdout"):
            log.read(offset)
        with pytest.raises(ValueError, match="outside stdout"):
            log.read_lines(offset)
    with pytest.raises(ValueError, match="limit"):
        log.read(0, limit=0)
    with pytest.raises(ValueError, match="limit"):
        log.read_lines(limit=0)


def test_memory_only_keeps_the_newest_max_output_bytes() -> None:
    log = JobLog("stdout", 100, 0, None)
    feed(log, PATTERN[:1000], 7)
    assert log.total == 1000 and log.oldest == 900
    chunk = log.read(0, limit=1000)
    assert chunk.lossy and chunk.offset == 900 and chunk.data == PATTERN[900:1000]
    assert chunk.next_offset == 1000
    exact = log.read(950, limit=10)
    assert not exact.lossy and exact.data == PATTERN[950:960]


def test_spill_keeps_a_bounded_window_of_the_newest_bytes(tmp_path: Path) -> None:
    directory = spill_dir(tmp_path)
    spill_max = 4 * MIN_SEGMENT
    log = JobLog("stdout", 1000, spill_max, directory)
    feed(log, PATTERN[:500], 100)
    assert files(directory) == {}  # in memory while it fits
    feed(log, PATTERN[500:200_000], 999)
    on_disk = files(directory)
    assert 1 <= len(on_disk) <= 2 and sum(on_disk.values()) <= spill_max
    held = log.total - log.oldest
    assert spill_max // 2 <= held <= spill_max
    chunk = log.read(0, limit=1 << 20)
    assert chunk.lossy and chunk.offset == log.oldest
    assert chunk.data == PATTERN[log.oldest : 200_000]
    for offset in (log.oldest, log.oldest + 1, 200_000 - 1000 - 1, 200_000 - 5):
        got = log.read(offset, limit=3000)
        assert not got.lossy and got.data == PATTERN[offset : min(offset + 3000, 200_000)]
    log.end()
    assert log.read(log.oldest, limit=1 << 20).eof
    log.discard()
    assert not directory.path.exists()
    after = log.read(0, limit=1 << 20)
    assert after.offset == 199_000 and after.data == PATTERN[199_000:200_000] and after.lossy


def test_a_chunk_larger_than_the_window(tmp_path: Path) -> None:
    directory = spill_dir(tmp_path)
    log = JobLog("stderr", 256, 2 * MIN_SEGMENT, directory)
    log.feed(PATTERN[:100])
    log.feed(PATTERN[100:50_100])
    assert log.total == 50_100
    assert log.oldest == 50_100 - 2 * MIN_SEGMENT
    assert log.read(0, limit=1 << 20).data == PATTERN[log.oldest : 50_100]
    assert sum(files(directory).values()) <= 2 * MIN_SEGMENT


def test_a_spill_that_cannot_be_made_leaves_memory_only(tmp_path: Path) -> None:
    root = tmp_path / "not-a-dir"
    root.write_text("")
    log = JobLog("stdout", 100, 4 * MIN_SEGMENT, SpillDir(root, "x.log"))
    feed(log, PATTERN[:1000], 64)
    assert log.error is not None and "memory only" in log.error
    assert log.oldest == 900 and log.read(0).data == PATTERN[900:1000]


def test_a_tiny_spill_max_keeps_memory_only(tmp_path: Path) -> None:
    directory = spill_dir(tmp_path)
    log = JobLog("stdout", 100, 2 * MIN_SEGMENT - 1, directory)
    feed(log, PATTERN[:10_000], 500)
    assert files(directory) == {} and log.oldest == 9900


def test_lines_forward_and_tail() -> None:
    log = JobLog("stdout", 1 << 16, 0, None)
    log.feed(b"one\ntwo\nthr")
    page = log.read_lines(0, limit=10)
    assert page.lines == ["one", "two"] and page.next_offset == 8 and not page.eof
    assert log.read_lines(8).lines == []  # "thr" is not a line yet
    assert log.read_lines().lines == ["one", "two"]
    assert log.read_lines(limit=1).lines == ["two"] and log.read_lines(limit=1).offset == 4
    log.feed(b"ee\nfour")
    assert log.read_lines(8).lines == ["three"]
    log.end()  # now the unterminated last line is a line
    tail = log.read_lines(limit=2)
    assert tail.lines == ["three", "four"] and tail.eof and tail.next_offset == log.total
    page = log.read_lines(page.next_offset, limit=1)
    assert page.lines == ["three"] and page.next_offset == 14
    page = log.read_lines(page.next_offset, limit=1)
    assert page.lines == ["four"] and page.eof


def test_tail_of_an_empty_or_unfinished_stream() -> None:
    log = JobLog("stdout", 1024, 0, None)
    empty = log.read_lines()
    assert (empty.lines, empty.offset, empty.next_offset, empty.eof) == ([], 0, 0, False)
    log.feed(b"partial")
    assert log.read_lines().lines == []
    log.end()
    assert log.read_lines().lines == ["partial"]
    done = JobLog("stdout", 1024, 0, None)
    done.end()
    assert done.read_lines().eof


def test_lines_are_decoded_with_replacement() -> None:
    log = JobLog("stdout", 1024, 0, None)
    log.feed(b"caf\xc3\xa9 \xff\n")
    assert log.read_lines().lines == ["café \ufffd"]


def test_tail_after_loss_is_marked_lossy() -> None:
    log = JobLog("stdout", 64, 0, None)
    log.feed(b"x" * 100 + b"\nshort\n")
    tail = log.read_lines(limit=5)
    assert tail.lossy and tail.offset == log.oldest
    assert tail.lines[-1] == "short" and tail.lines[0] == "x" * (64 - len("\nshort\n"))
    fwd = log.read_lines(0, limit=5)
    assert fwd.lossy and fwd.offset == log.oldest


def test_overlong_lines_come_in_pieces() -> None:
    log = JobLog("stdout", 1024, 0, None)
    log.feed(b"a" * 25 + b"\nb\n")
    pages = []
    offset = 0
    while not (page := log.read_lines(offset, limit=10, max_bytes=10)).eof and page.lines:
        pages.append(page.lines)
        offset = page.next_offset
    assert pages == [["a" * 10], ["a" * 10], ["a" * 5, "b"]]
    assert log.read_lines(limit=10, max_bytes=10).lines == ["b"]  # the newest lines that fit
    assert log.read_lines(limit=10, max_bytes=30).lines == ["a" * 25, "b"]
    assert log.read_lines(limit=10, max_bytes=3).lines == ["b"]
    log.feed(b"c" * 30)  # the stream runs on: an unfinished overlong line's newest bytes
    tail = log.read_lines(max_bytes=10)
    assert tail.lines == ["c" * 10] and tail.next_offset == log.total and not tail.eof
    assert log.read_lines(offset, max_bytes=10).lines == ["c" * 10]


def test_lines_read_back_from_the_spill(tmp_path: Path) -> None:
    log = JobLog("stdout", 512, 4 * MIN_SEGMENT, spill_dir(tmp_path))
    text = b"".join(b"%06d\n" % i for i in range(5000))
    feed(log, text, 4096)
    start = log.oldest + (-log.oldest % 7)  # a line start inside the held range
    page = log.read_lines(start, limit=1000)
    assert not page.lossy and len(page.lines) == 1000
    first = int(page.lines[0])
    assert page.lines == [f"{i:06d}" for i in range(first, first + 1000)]
    assert log.read_lines(limit=2).lines == ["004998", "004999"]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 20_000), min_size=1, max_size=40),
    max_output=st.integers(64, 5000),
    spill_max=st.sampled_from([0, 2 * MIN_SEGMENT, 3 * MIN_SEGMENT + 1, 40_000]),
    reads=st.lists(st.tuples(st.integers(0, 300_000), st.integers(1, 70_000)), max_size=10),
)
def test_any_read_returns_exactly_the_stream_bytes(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    max_output: int,
    spill_max: int,
    reads: list[tuple[int, int]],
) -> None:
    directory = SpillDir(tmp_path_factory.mktemp("spill"), "p.log")
    log = JobLog("stdout", max_output, spill_max, directory)
    total = 0
    for size in sizes:
        size = min(size, len(PATTERN) - total)
        log.feed(PATTERN[total : total + size])
        total += size
    assert log.total == total
    held = total - log.oldest
    assert min(total, max_output) <= held <= max(max_output, spill_max)
    for offset, limit in reads:
        offset = min(offset, total)
        chunk = log.read(offset, limit)
        assert chunk.offset == max(offset, log.oldest)
        assert chunk.lossy == (offset < log.oldest)
        assert chunk.data == PATTERN[chunk.offset : min(total, chunk.offset + limit)]
        assert chunk.next_offset == chunk.offset + len(chunk.data)
    assert sum(files(directory).values()) <= spill_max
    log.discard()
    assert not directory.path.exists() or not os.listdir(directory.path)


@settings(max_examples=80, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=60),
    last_newline=st.booleans(),
    chunk=st.integers(1, 50),
    page=st.integers(1, 8),
    ended=st.booleans(),
)
def test_paging_and_tail_match_the_lines(
    lines: list[bytes], last_newline: bool, chunk: int, page: int, ended: bool
) -> None:
    text = b"\n".join(lines) + (b"\n" if lines and last_newline else b"")
    log = JobLog("stdout", 1 << 16, 0, None)
    feed(log, text, chunk)
    if ended:
        log.end()
    complete = text.split(b"\n")
    if complete[-1] == b"" or not ended:
        complete = complete[:-1]  # no line after the last newline (yet)
    expected = [line.decode("utf-8", errors="replace") for line in complete]
    got: list[str] = []
    offset = 0
    for _ in range(1000):
        result = log.read_lines(offset, limit=page)
        got += result.lines
        if result.next_offset == offset:
            break
        offset = result.next_offset
    assert got == expected
    tail = log.read_lines(limit=page)
    assert tail.lines == expected[-page:]
    assert tail.next_offset == result.next_offset


def test_max_bytes_caps_what_a_call_returns_and_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """One short line, then megabytes without a newline: every read_lines returns (and
    scans) about max_bytes, not the whole window."""
    log = JobLog("stdout", 8 << 20, 0, None)
    log.feed(b"short\n")
    for _ in range(6):
        log.feed(b"y" * (1 << 20))
    scanned: list[int] = []
    real = JobLog._bytes

    def counting(self: JobLog, start: int, end: int) -> bytes:
        scanned.append(max(0, end - start))
        return real(self, start, end)

    monkeypatch.setattr(JobLog, "_bytes", counting)
    cap = 1 << 20
    budget = cap + 100 + 2 * BLOCK + 2  # max_bytes + limit + a block either side

    def check(result: joblog.JobLines, max_bytes: int = cap) -> joblog.JobLines:
        assert sum(len(line) for line in result.lines) <= max_bytes
        assert sum(scanned) <= budget + max_bytes, sum(scanned)
        scanned.clear()
        return result

    tail = check(log.read_lines())  # running: the unfinished line's newest max_bytes
    assert tail.lines == ["y" * cap] and tail.offset == log.total - cap
    first = check(log.read_lines(0))
    assert first.lines == ["short"] and first.next_offset == 6
    piece = check(log.read_lines(6))
    assert piece.lines == ["y" * cap] and piece.next_offset == 6 + cap
    small = check(log.read_lines(6, max_bytes=1000), 1000)
    assert small.lines == ["y" * 1000]
    log.end()
    assert check(log.read_lines(limit=5)).lines == ["y" * cap]
    with pytest.raises(ValueError, match="max_bytes"):
        log.read_lines(max_bytes=0)


def test_many_short_lines_stop_at_max_bytes() -> None:
    log = JobLog("stdout", 1 << 16, 0, None)
    log.feed(b"".join(b"%04d\n" % i for i in range(1000)))
    page = log.read_lines(0, limit=1000, max_bytes=40)
    assert page.lines == [f"{i:04d}" for i in range(10)] and page.next_offset == 50
    tail = log.read_lines(limit=1000, max_bytes=42)
    assert tail.lines == [f"{i:04d}" for i in range(990, 1000)]
    assert tail.offset == 4950 and tail.next_offset == 5000


def test_an_ended_log_holds_no_descriptor_and_reads_its_spill(tmp_path: Path) -> None:
    directory = spill_dir(tmp_path)
    log = JobLog("stdout", 1000, 4 * MIN_SEGMENT, directory)
    feed(log, PATTERN[:100_000], 3000)
    assert log.open_fds == 3  # two segments read, the newer one written
    before = len(os.listdir("/proc/self/fd"))
    log.end()
    assert log.open_fds == 0 and len(os.listdir("/proc/self/fd")) == before - 3
    assert files(directory)  # the spill stays, for reads
    held = log.read(0, limit=1 << 20)
    assert held.lossy and held.offset < 100_000 - 1000 and held.eof
    assert held.data == PATTERN[held.offset : 100_000]
    assert len(os.listdir("/proc/self/fd")) == before - 3  # opened for the read only
    log.feed(b"more")  # nothing is fed once ended
    assert log.total == 100_000
    log.discard()
    assert not directory.path.exists()
    assert log.read(0, limit=1 << 20).data == PATTERN[99_000:100_000]


def test_a_spill_file_gone_after_the_end_leaves_memory(tmp_path: Path) -> None:
    directory = spill_dir(tmp_path)
    log = JobLog("stdout", 1000, 4 * MIN_SEGMENT, directory)
    feed(log, PATTERN[:50_000], 5000)
    log.end()
    for path in directory.path.iterdir():
        path.unlink()
    chunk = log.read(0, limit=1 << 20)
    assert chunk.offset == 49_000 and chunk.data == PATTERN[49_000:50_000]
    assert log.error is not None and "reading the spill failed" in log.error


def pieces(line: bytes, size: int) -> list[bytes]:
    return [line[at : at + size] for at in range(0, len(line), size)] or [b""]


def expected_tail(lines: list[bytes], limit: int, size: int) -> list[bytes]:
    out: list[bytes] = []
    used = 0
    for line in reversed(lines):
        if len(out) == limit:
            break
        if used + len(line) <= size:
            out.append(line)
            used += len(line)
        else:
            if not out:
                out.append(line[-size:])
            break
    return out[::-1]


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=40),
    last_newline=st.booleans(),
    chunk=st.integers(1, 50),
    page=st.integers(1, 8),
    max_bytes=st.integers(1, 60),
    ended=st.booleans(),
)
def test_paging_and_tail_under_max_bytes(
    lines: list[bytes], last_newline: bool, chunk: int, page: int, max_bytes: int, ended: bool
) -> None:
    """Paging returns every line once, overlong ones in max_bytes pieces (an unfinished one's
    last piece only once it can no longer grow); a tail returns the newest lines that fit."""
    text = b"\n".join(lines) + (b"\n" if lines and last_newline else b"")
    log = JobLog("stdout", 1 << 16, 0, None)
    feed(log, text, chunk)
    if ended:
        log.end()
    split = text.split(b"\n")
    complete, partial = split[:-1], split[-1]
    expected = [p for line in complete for p in pieces(line, max_bytes)]
    if ended and partial:
        expected += pieces(partial, max_bytes)
    elif partial:
        expected += pieces(partial, max_bytes)[:-1]
    decoded = [p.decode("utf-8", errors="replace") for p in expected]
    paged: list[str] = []
    offset = 0
    while (result := log.read_lines(offset, limit=page, max_bytes=max_bytes)).lines:
        paged += result.lines
        offset = result.next_offset
    assert paged == decoded
    tail = log.read_lines(limit=page, max_bytes=max_bytes)
    if not ended and len(partial) > max_bytes:
        want = [partial[-max_bytes:]]
    else:
        want = expected_tail(complete + ([partial] if ended and partial else []), page, max_bytes)
    assert tail.lines == [w.decode("utf-8", errors="replace") for w in want]
    assert sum(len(w) for w in want) <= max_bytes
    joined = b"\n".join(want)
    assert text[tail.offset : tail.next_offset] in (joined, joined + b"\n")
    assert tail.eof == (ended and tail.next_offset == len(text))
