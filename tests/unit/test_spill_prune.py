"""Pruning of the spill root (``sandboxrun.engine.capture.prune``) on real directories and real
locks:
the caps, what is never touched (open sandboxes, symlinks, other roots), the throttle."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxrun.engine.capture import prune as spill_prune
from sandboxrun.engine.capture.prune import (
    DEFAULT_MAX_AGE_S,
    DEFAULT_MAX_TOTAL,
    LOCKLESS_GRACE_S,
    STAMP_NAME,
    SpillCaps,
    auto_prune,
    caps_from_env,
    parse_age,
    parse_total,
    prune,
)
from sandboxrun.engine.capture.spill import LOCK_NAME, SpillDir, SpillSession
from sandboxrun.errors import ConfigError

NOW = 2_000_000_000.0
HOUR = 3600.0
NO_SIZE_CAP = SpillCaps(max_age_s=24 * HOUR, max_total=None)
NO_AGE_CAP = SpillCaps(max_age_s=None, max_total=None)


def age_tree(path: Path, mtime: float) -> None:
    """Set the mtime of ``path`` and of everything under it (symlinks themselves)."""
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in [*dirnames, *filenames]:
            os.utime(Path(dirpath) / name, (mtime, mtime), follow_symlinks=False)
    os.utime(path, (mtime, mtime), follow_symlinks=False)


def closed_session(root: Path, size: int, mtime: float) -> Path:
    """A sandbox directory left after its sandbox closed with ``keep_spill``: ``size`` bytes
    in one run's stdout, everything last modified at ``mtime``."""
    session = SpillSession.create(root)
    spill = SpillDir(session.path, "run1").open_file("stdout")
    spill.write(b"x" * size)
    spill.close()
    session.close(keep=True)
    age_tree(session.path, mtime)
    return session.path


def lockless(root: Path, name: str, size: int, mtime: float) -> Path:
    """A per-run directory of the older layout (no lock)."""
    spill = SpillDir(root, name).open_file("stdout")
    spill.write(b"y" * size)
    spill.close()
    age_tree(root / name, mtime)
    return root / name


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "spill"


@pytest.fixture
def open_session(root: Path) -> Iterator[SpillSession]:
    session = SpillSession.create(root)
    yield session
    session.close()


# --- caps ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("1.5", 1.5), ("90m", 5400.0), ("36h", 129600.0), ("0", 0.0),
     ("45s", 45.0), ("off", None), (" None ", None), ("never", None)],
)  # fmt: skip
def test_parse_age(text: str, seconds: float | None) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "-1", "1d", "abc", "nan", "1h30"])
def test_parse_age_refuses(text: str) -> None:
    with pytest.raises(ConfigError, match="SANDBOXRUN_SPILL_MAX_AGE"):
        parse_age(text)


def test_parse_total() -> None:
    assert parse_total("1g") == 1 << 30
    assert parse_total("512m") == 512 << 20
    assert parse_total("0") == 0
    assert parse_total("off") is None
    with pytest.raises(ConfigError, match="--max-total"):
        parse_total("lots", what="--max-total")


def test_caps_from_env() -> None:
    assert caps_from_env({}) == SpillCaps(DEFAULT_MAX_AGE_S, DEFAULT_MAX_TOTAL)
    assert DEFAULT_MAX_AGE_S == 24 * HOUR and DEFAULT_MAX_TOTAL == 1 << 30
    env = {"SANDBOXRUN_SPILL_MAX_AGE": "2h", "SANDBOXRUN_SPILL_MAX_TOTAL": "10m"}
    assert caps_from_env(env) == SpillCaps(2 * HOUR, 10 << 20)
    off = {"SANDBOXRUN_SPILL_MAX_AGE": "off", "SANDBOXRUN_SPILL_MAX_TOTAL": " "}
    assert caps_from_env(off) == SpillCaps(None, DEFAULT_MAX_TOTAL)
    with pytest.raises(ConfigError):
        caps_from_env({"SANDBOXRUN_SPILL_MAX_TOTAL": "big"})


# --- the age cap --------------------------------------------------------------------------


def test_age_cap_removes_only_old_closed_sandboxes(root: Path, open_session: SpillSession) -> None:
    old = closed_session(root, 100, NOW - 25 * HOUR)
    young = closed_session(root, 100, NOW - 23 * HOUR)
    age_tree(open_session.path, NOW - 100 * HOUR)  # open: never, however old
    report = prune(root, NO_SIZE_CAP, now=NOW)
    assert report.removed == (old,)
    assert report.freed_bytes == 100 and report.in_use == 1 and report.complete
    assert not old.exists() and young.exists() and open_session.path.exists()
    assert (open_session.path / LOCK_NAME).exists()


def test_dry_run_removes_nothing_and_reports_what_would_go(
    root: Path, open_session: SpillSession
) -> None:
    old = closed_session(root, 100, NOW - 25 * HOUR)
    older = closed_session(root, 300, NOW - 30 * HOUR)
    young = closed_session(root, 50, NOW - HOUR)
    age_tree(open_session.path, NOW - 100 * HOUR)  # open: not even in a dry run
    caps = SpillCaps(max_age_s=24 * HOUR, max_total=10)
    report = prune(root, caps, now=NOW, dry_run=True)
    assert set(report.removed) == {old, older, young}  # the size cap then takes the young one
    assert report.freed_bytes == 450 and report.in_use == 1
    assert old.exists() and older.exists() and young.exists() and open_session.path.exists()
    assert prune(root, caps, now=NOW).removed == report.removed  # what a real run removes


def test_age_is_the_newest_thing_inside(root: Path) -> None:
    path = closed_session(root, 10, NOW - 30 * HOUR)
    stdout = path / "run1" / "stdout"
    os.utime(stdout, (NOW - HOUR, NOW - HOUR))  # written an hour ago: the directory is young
    assert prune(root, NO_SIZE_CAP, now=NOW).removed == ()
    assert stdout.exists()


def test_lockless_and_pending_directories_go_by_age(root: Path) -> None:
    legacy_old = lockless(root, "0123456789abcdef", 10, NOW - 25 * HOUR)
    legacy_new = lockless(root, "fedcba9876543210", 10, NOW - HOUR)
    pending = root / ".new-0000000000000000"  # a crash while a sandbox opened
    pending.mkdir()
    (pending / LOCK_NAME).write_text("1\n")
    age_tree(pending, NOW - 25 * HOUR)
    report = prune(root, NO_SIZE_CAP, now=NOW)
    assert set(report.removed) == {legacy_old, pending}
    assert legacy_new.exists()


def test_age_zero_removes_every_closed_sandbox(root: Path, open_session: SpillSession) -> None:
    closed = closed_session(root, 10, time.time())
    report = prune(root, SpillCaps(max_age_s=0, max_total=None))
    assert report.removed == (closed,) and open_session.path.exists()


# --- the size cap -------------------------------------------------------------------------


def test_size_cap_removes_the_oldest_closed_first(root: Path, open_session: SpillSession) -> None:
    oldest = closed_session(root, 400, NOW - 3 * HOUR)
    middle = closed_session(root, 400, NOW - 2 * HOUR)
    newest = closed_session(root, 400, NOW - 1 * HOUR)
    big = SpillDir(open_session.path, "run9").open_file("stdout")
    big.write(b"z" * 1000)  # in use: counts for the total, never removed
    big.close()
    age_tree(open_session.path, NOW - 10 * HOUR)
    report = prune(root, SpillCaps(max_age_s=None, max_total=1700), now=NOW)
    assert report.removed == (oldest, middle)  # 2200 -> 1800 -> 1400: under 1700
    assert report.left_bytes == 1400 and report.freed_bytes == 800 and report.in_use == 1
    assert newest.exists() and (open_session.path / "run9" / "stdout").exists()
    # already under the cap: nothing more
    assert prune(root, SpillCaps(max_age_s=None, max_total=1400), now=NOW).removed == ()


def test_size_cap_spares_young_lockless_directories(root: Path) -> None:
    stale = lockless(root, "aaaaaaaaaaaaaaaa", 500, NOW - LOCKLESS_GRACE_S - 60)
    fresh = lockless(root, "bbbbbbbbbbbbbbbb", 500, NOW - 60)  # maybe an old version's live run
    report = prune(root, SpillCaps(max_age_s=None, max_total=0), now=NOW)
    assert report.removed == (stale,) and fresh.exists()
    assert report.left_bytes == 500


def test_size_cap_zero_with_only_open_sandboxes_removes_nothing(
    root: Path, open_session: SpillSession
) -> None:
    spill = SpillDir(open_session.path, "r").open_file("stdout")
    spill.write(b"q" * 50)
    spill.close()
    report = prune(root, SpillCaps(max_age_s=0, max_total=0))
    assert report.removed == () and report.in_use == 1 and report.left_bytes == 50


# --- never touched ------------------------------------------------------------------------


HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from sandboxrun.engine.capture.spill import SpillSession
    session = SpillSession.create(Path(sys.argv[1]))
    print(session.path, flush=True)
    sys.stdin.read()
    session.close()
    """
)


def test_a_sandbox_open_in_another_process_is_never_removed(root: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        path = Path(holder.stdout.readline().strip())
        age_tree(path, NOW - 100 * HOUR)
        report = prune(root, SpillCaps(max_age_s=0, max_total=0), now=NOW)
        assert report.removed == () and report.in_use == 1 and path.exists()
        holder.stdin.close()  # the holder closes its session: removed by itself
        assert holder.wait(timeout=30) == 0
        assert not path.exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_a_dead_owner_releases_its_directory(root: Path) -> None:
    """A process that died with its sandbox open leaves an unlocked directory: prunable."""
    code = HOLDER.replace("sys.stdin.read()\nsession.close()", "import os; os._exit(0)")
    done = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True
    )
    path = Path(done.stdout.strip())
    assert path.exists()
    assert prune(root, SpillCaps(max_age_s=0, max_total=None)).removed == (path,)


def test_symlinks_are_never_followed(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    old = closed_session(root, 10, NOW - 30 * HOUR)
    (old / "run1" / "link").symlink_to(outside)
    (old / "link-file").symlink_to(outside / "precious")
    (root / "toplink").symlink_to(outside, target_is_directory=True)
    (root / "file").write_text("not a directory")
    for path in (old, root / "toplink", root / "file"):
        age_tree(path, NOW - 30 * HOUR)
    report = prune(root, SpillCaps(max_age_s=0, max_total=0), now=NOW)
    assert report.removed == (old,)
    assert (outside / "precious").read_text() == "keep"
    assert (root / "toplink").is_symlink() and (root / "file").exists()


def test_a_symlinked_missing_or_foreign_root_is_left_alone(tmp_path: Path) -> None:
    real = tmp_path / "real"
    closed_session(real, 10, NOW - 30 * HOUR)
    (tmp_path / "link").symlink_to(real)
    assert prune(tmp_path / "link", SpillCaps(0, 0), now=NOW).removed == ()
    assert prune(tmp_path / "missing", SpillCaps(0, 0), now=NOW).removed == ()
    assert len(list(real.iterdir())) == 1


def test_the_deadline_stops_it(root: Path) -> None:
    old = closed_session(root, 10, NOW - 30 * HOUR)
    report = prune(root, SpillCaps(0, 0), now=NOW, deadline=time.monotonic() - 1)
    assert not report.complete and report.removed == () and old.exists()


# --- auto_prune ---------------------------------------------------------------------------


@pytest.fixture
def fresh_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill_prune, "_last_scan", {})


@pytest.mark.usefixtures("fresh_memo")
def test_auto_prune_scans_at_most_once_per_interval(root: Path) -> None:
    closed_session(root, 10, time.time() - 30 * HOUR)
    first = auto_prune(root, SpillCaps(24 * HOUR, None))
    assert first is not None and len(first.removed) == 1
    assert (root / STAMP_NAME).is_file()
    again = closed_session(root, 10, time.time() - 30 * HOUR)
    assert auto_prune(root, SpillCaps(24 * HOUR, None)) is None  # this process: too soon
    spill_prune._last_scan.clear()  # as another process would be: the stamp says too soon
    assert auto_prune(root, SpillCaps(24 * HOUR, None)) is None
    assert again.exists()
    spill_prune._last_scan.clear()
    past = time.time() - 700
    os.utime(root / STAMP_NAME, (past, past))  # the last scan was 700 s ago
    later = auto_prune(root, SpillCaps(24 * HOUR, None))
    assert later is not None and later.removed == (again,)


@pytest.mark.usefixtures("fresh_memo")
def test_auto_prune_never_raises(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    closed = closed_session(root, 10, time.time() - 30 * HOUR)
    monkeypatch.setenv("SANDBOXRUN_SPILL_MAX_AGE", "a week")
    with caplog.at_level(logging.WARNING, logger="sandboxrun"):
        assert auto_prune(root) is None
    assert "SANDBOXRUN_SPILL_MAX_AGE" in caplog.text and closed.exists()
    assert auto_prune(root / "missing", interval_s=0) is None  # nothing to prune, no error
    assert not (root / "missing").exists()


@pytest.mark.usefixtures("fresh_memo")
def test_auto_prune_uses_the_environment(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = closed_session(root, 10, time.time() - 2 * HOUR)
    monkeypatch.setenv("SANDBOXRUN_SPILL_MAX_AGE", "3h")
    assert auto_prune(root, interval_s=0) is not None and kept.exists()
    monkeypatch.setenv("SANDBOXRUN_SPILL_MAX_AGE", "1h")
    report = auto_prune(root, interval_s=0)
    assert report is not None and report.removed == (kept,)


def test_only_what_sandboxrun_names_is_touched(root: Path) -> None:
    """A root given by mistake (``--spill-dir ~``) loses nothing but sandboxrun's own."""
    closed_session(root, 10, time.time() - 30 * HOUR)
    mine = [root / "projects", root / "0123456789ABCDEF", root / "sandbox-x", root / ".cache"]
    for path in mine:
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "data").write_text("keep")
        age_tree(path, NOW - 1000 * HOUR)
    report = prune(root, SpillCaps(max_age_s=0, max_total=0), now=NOW)
    assert len(report.removed) == 1 and report.left_bytes == 0  # the others are not counted
    assert all((path / "sub" / "data").read_text() == "keep" for path in mine)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files of another user")
def test_another_users_files_are_never_touched(root: Path, tmp_path: Path) -> None:
    theirs = lockless(root, "0123456789abcdef", 10, NOW - 30 * HOUR)
    os.chown(theirs, 65534, 65534)
    assert prune(root, SpillCaps(0, 0), now=NOW).removed == ()
    assert theirs.exists()
    foreign = tmp_path / "foreign"
    lockless(foreign, "fedcba9876543210", 10, NOW - 30 * HOUR)
    os.chown(foreign, 65534, 65534)  # a root of another user: nothing in it is looked at
    assert prune(foreign, SpillCaps(0, 0), now=NOW).removed == ()
    assert (foreign / "fedcba9876543210").exists()


def test_age_cap_zero_spares_a_recent_lockless_dir(root: Path) -> None:
    """``clean --older-than 0``: a directory without a lock may be a live run's (one being
    created, an older version's): it goes only once untouched for LOCKLESS_GRACE_S."""
    recent = lockless(root, "0123456789abcdef", 10, NOW - 60)
    stale = lockless(root, "fedcba9876543210", 10, NOW - 2 * HOUR)
    closed = closed_session(root, 10, NOW - 60)
    report = prune(root, SpillCaps(max_age_s=0.0, max_total=None), now=NOW)
    assert set(report.removed) == {stale, closed}
    assert recent.exists() and not stale.exists() and not closed.exists()
