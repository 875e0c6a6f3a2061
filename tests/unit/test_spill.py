"""Unit tests of spill files (``sandboxrun.engine.capture.spill``) and stream capture
(``sandboxrun.engine.capture.stream``)."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxrun.engine.capture.buffer import HeadTailBuffer
from sandboxrun.engine.capture.spill import LOCK_NAME, SpillDir, SpillSession, default_spill_root
from sandboxrun.engine.capture.stream import StreamCapture, StreamReport
from sandboxrun.errors import ConfigError

STREAM = bytes(i % 251 for i in range(5000))


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def capture(
    tmp_path: Path, *, max_output: int = 64, spill_max: int = 1 << 20, chunk: int = 10
) -> tuple[StreamCapture, StreamReport]:
    cap = StreamCapture("stdout", max_output, spill_max, SpillDir(tmp_path / "root", "run1"))
    for i in range(0, len(STREAM), chunk):
        cap.feed(STREAM[i : i + chunk])
    cap.close()
    return cap, cap.report()


# --- default_spill_root -------------------------------------------------------------------


def test_default_root_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SANDBOXRUN_SPILL_DIR", str(tmp_path / "x"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_spill_root() == tmp_path / "x"


def test_default_root_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SANDBOXRUN_SPILL_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_spill_root() == tmp_path / "xdg" / "sandboxrun" / "spill"


def test_default_root_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SANDBOXRUN_SPILL_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_spill_root() == tmp_path / ".cache" / "sandboxrun" / "spill"


# --- SpillDir / SpillFile -----------------------------------------------------------------


@pytest.mark.usefixtures("umask_022")
def test_lazy_creation_and_modes(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "spill"
    sd = SpillDir(root, "run1")
    assert not root.exists()  # nothing until the first file
    f = sd.open_file("stdout")
    g = sd.open_file("stderr", limit=5)
    try:
        assert f.path == root / "run1" / "stdout"
        assert g.path.parent == f.path.parent == sd.path
        assert mode(root) == 0o700
        assert mode(root / "run1") == 0o700
        assert mode(f.path) == mode(g.path) == 0o600
    finally:
        f.close()
        g.close()


def test_modes_enforced_despite_umask_and_existing_root(tmp_path: Path) -> None:
    root = tmp_path / "spill"
    root.mkdir(mode=0o755)
    old = os.umask(0o277)
    try:
        f = SpillDir(root, "r").open_file("stdout")
    finally:
        os.umask(old)
    f.close()
    assert mode(root) == 0o700
    assert mode(root / "r") == 0o700
    assert mode(f.path) == 0o600


def test_exclusive_creation(tmp_path: Path) -> None:
    sd = SpillDir(tmp_path / "spill", "run1")
    sd.open_file("stdout").close()
    with pytest.raises(FileExistsError):
        sd.open_file("stdout")
    with pytest.raises(FileExistsError):
        SpillDir(tmp_path / "spill", "run1").open_file("stderr")


def test_symlinked_root_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match=str(link)):
        SpillDir(link, "run1").open_file("stdout")
    assert list(real.iterdir()) == []


def test_root_that_is_a_file_refused(tmp_path: Path) -> None:
    root = tmp_path / "file"
    root.write_text("x")
    with pytest.raises(ConfigError, match=str(root)):
        SpillDir(root, "run1").open_file("stdout")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to chown")
def test_root_owned_by_someone_else_refused(tmp_path: Path) -> None:
    root = tmp_path / "other"
    root.mkdir(mode=0o700)
    os.chown(root, 12345, 12345)
    with pytest.raises(ConfigError, match=str(root)):
        SpillDir(root, "run1").open_file("stdout")


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\0b"])
def test_bad_names_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError):
        SpillDir(tmp_path, bad)
    with pytest.raises(ConfigError):
        SpillDir(tmp_path / "spill", "ok").open_file(bad)


def test_spill_file_keeps_first_bytes(tmp_path: Path) -> None:
    f = SpillDir(tmp_path / "spill", "r").open_file("stdout", limit=10)
    f.write(b"0123")
    f.write(b"")
    f.write(b"4567")
    assert not f.full
    f.write(b"89abcdef")
    f.write(b"more")
    assert f.full
    assert f.written == 10
    f.close()
    f.close()  # idempotent
    assert f.closed
    assert f.path.read_bytes() == b"0123456789"
    with pytest.raises(ValueError, match="closed"):
        f.write(b"x")


def test_spill_file_loops_on_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    calls: list[int] = []

    def short_write(fd: int, data: bytes | memoryview) -> int:
        calls.append(len(data))
        return real_write(fd, bytes(data[:3]))

    monkeypatch.setattr(os, "write", short_write)
    f = SpillDir(tmp_path / "spill", "r").open_file("stdout", limit=100)
    f.write(b"abcdefghij")
    f.close()
    assert f.path.read_bytes() == b"abcdefghij"
    assert f.written == 10
    assert len(calls) == 4


# --- StreamCapture ------------------------------------------------------------------------


def test_capture_small_stream_never_spills(tmp_path: Path) -> None:
    cap = StreamCapture("stdout", 64, 1 << 20, SpillDir(tmp_path / "root", "run1"))
    cap.feed(b"hello\n")
    cap.feed(b"")
    cap.close()
    assert cap.report() == StreamReport("hello\n", 6, 0, False, None, True)
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("chunk", [1, 10, 63, 64, 65, 5000])
def test_capture_spills_whole_stream(tmp_path: Path, chunk: int) -> None:
    cap, report = capture(tmp_path, chunk=chunk)
    expected = HeadTailBuffer(64)
    expected.feed(STREAM)
    rendered = expected.render()
    assert (report.text, report.total_bytes, report.dropped_bytes, report.truncated) == (
        rendered.text,
        len(STREAM),
        rendered.dropped_bytes,
        True,
    )
    assert report.spill == str(tmp_path / "root" / "run1" / "stdout")
    assert Path(report.spill).read_bytes() == STREAM
    assert report.spill_complete
    assert cap.spill_error is None


@pytest.mark.parametrize("chunk", [1, 64, 65, 5000])
def test_capture_spill_capped(tmp_path: Path, chunk: int) -> None:
    _, report = capture(tmp_path, spill_max=100, chunk=chunk)
    assert report.spill is not None
    assert Path(report.spill).read_bytes() == STREAM[:100]
    assert not report.spill_complete


def test_capture_spill_exactly_full_is_complete(tmp_path: Path) -> None:
    _, report = capture(tmp_path, spill_max=len(STREAM))
    assert report.spill is not None
    assert Path(report.spill).read_bytes() == STREAM
    assert report.spill_complete


def test_capture_overflow_by_one_byte(tmp_path: Path) -> None:
    cap = StreamCapture("stderr", 64, 1 << 20, SpillDir(tmp_path / "root", "run1"))
    cap.feed(b"a" * 64)
    assert not (tmp_path / "root").exists()
    cap.feed(b"b")
    cap.close()
    report = cap.report()
    assert report.truncated
    assert report.dropped_bytes == 1
    assert report.spill == str(tmp_path / "root" / "run1" / "stderr")
    assert Path(report.spill).read_bytes() == b"a" * 64 + b"b"
    assert report.spill_complete


@pytest.mark.parametrize("spill_max", [0, None])
def test_capture_spill_disabled(tmp_path: Path, spill_max: int | None) -> None:
    spill_dir = SpillDir(tmp_path / "root", "run1") if spill_max is not None else None
    cap = StreamCapture("stdout", 64, spill_max or 0, spill_dir)
    cap.feed(STREAM)
    cap.close()
    report = cap.report()
    assert report.truncated
    assert report.spill is None
    assert not report.spill_complete
    assert cap.spill_error is None
    assert not (tmp_path / "root").exists()


def test_capture_open_failure_is_recorded(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    cap = StreamCapture("stdout", 64, 1 << 20, SpillDir(tmp_path / "link", "run1"))
    cap.feed(STREAM)  # must not raise
    cap.feed(STREAM)
    report = cap.report()
    assert cap.spill_error is not None
    assert "link" in cap.spill_error
    assert report.spill is None
    assert not report.spill_complete
    assert report.total_bytes == 2 * len(STREAM)


def test_capture_oserror_on_open_is_recorded(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    cap = StreamCapture("stdout", 64, 1 << 20, SpillDir(tmp_path / "file" / "root", "run1"))
    cap.feed(STREAM)
    assert cap.spill_error is not None
    assert cap.report().spill is None


def test_capture_write_failure_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", no_space)
    cap = StreamCapture("stdout", 64, 1 << 20, SpillDir(tmp_path / "root", "run1"))
    cap.feed(STREAM)
    cap.feed(STREAM)
    cap.close()
    report = cap.report()
    assert cap.spill_error is not None
    assert "No space" in cap.spill_error
    assert report.spill is not None
    assert not report.spill_complete


def test_capture_feed_after_close_is_not_spilled(tmp_path: Path) -> None:
    cap = StreamCapture("stdout", 64, 1 << 20, SpillDir(tmp_path / "root", "run1"))
    cap.feed(STREAM)
    cap.close()
    cap.feed(b"late")
    cap.close()
    report = cap.report()
    assert report.total_bytes == len(STREAM) + 4
    assert report.text.endswith("late")
    assert report.spill is not None
    assert Path(report.spill).read_bytes() == STREAM
    assert not report.spill_complete


def test_capture_sink_sees_every_chunk_first(tmp_path: Path) -> None:
    seen: list[tuple[str, bytes]] = []
    cap = StreamCapture("stderr", 64, 0, None, sink=lambda name, b: seen.append((name, b)))
    cap.feed(b"ab")
    cap.feed(b"")
    cap.feed(b"cd")
    assert seen == [("stderr", b"ab"), ("stderr", b"cd")]

    def boom(name: str, chunk: bytes) -> None:
        raise RuntimeError("sink failed")

    failing = StreamCapture("stdout", 64, 0, None, sink=boom)
    failing.feed(b"x")
    failing.feed(b"y")
    assert failing.total_bytes == 2
    assert failing.report().text == "xy"
    assert failing.sink_error is not None
    assert "sink failed" in failing.sink_error


# --- SpillSession -------------------------------------------------------------------------


def lock_is_held(path: Path) -> bool:
    """Whether another open file description holds the flock of ``path`` (as pruning asks)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.mark.usefixtures("umask_022")
def test_session_is_private_locked_and_removed_on_close(tmp_path: Path) -> None:
    root = tmp_path / "spill"
    session = SpillSession.create(root)
    assert session.path.parent == root and session.path.name.startswith("sandbox-")
    assert [p.name for p in root.iterdir()] == [session.path.name]  # the .new- name is gone
    assert mode(root) == mode(session.path) == 0o700
    lock = session.path / LOCK_NAME
    assert mode(lock) == 0o600 and lock.read_text() == f"{os.getpid()}\n"
    assert lock_is_held(lock)
    spilled = SpillDir(session.path, "run1").open_file("stdout")
    spilled.write(b"data")
    spilled.close()
    session.close()
    assert session.closed and not session.path.exists()
    session.close()  # idempotent


def test_kept_session_keeps_its_files_unlocked(tmp_path: Path) -> None:
    session = SpillSession.create(tmp_path / "spill")
    spilled = SpillDir(session.path, "run1").open_file("stdout")
    spilled.write(b"data")
    spilled.close()
    session.close(keep=True)
    assert (session.path / "run1" / "stdout").read_bytes() == b"data"
    assert not lock_is_held(session.path / LOCK_NAME)  # pruning may take it from now on


def test_kept_session_without_spill_leaves_nothing(tmp_path: Path) -> None:
    session = SpillSession.create(tmp_path / "spill")
    session.close(keep=True)
    assert list((tmp_path / "spill").iterdir()) == []


def test_sessions_are_distinct(tmp_path: Path) -> None:
    one, two = SpillSession.create(tmp_path), SpillSession.create(tmp_path)
    try:
        assert one.path != two.path
    finally:
        one.close()
        two.close()


def test_session_refuses_a_symlinked_root(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError, match="symlink"):
        SpillSession.create(tmp_path / "link")
    assert list((tmp_path / "real").iterdir()) == []
