"""Pruning of the spill root: closed sandboxes' spill directories past an age cap, then the
oldest of them until the root is under a total-size cap.

What is under the root (``sandboxrun.engine.capture.spill``):

- ``sandbox-<id>/``: a sandbox's directory. Its ``.lock`` is ``flock``-ed while the sandbox is
  open, in this process or another: such a directory is never removed. Once unlocked (closed
  with ``keep_spill``, or its process died) it goes past the age cap, or oldest first while the
  root is over the size cap.
- ``.new-<id>/``: a sandbox directory being made (or left by a crash then): the age cap only.
- ``<run id>/`` and ``<run id>.log/`` (16 hex digits; the per-run layout of older versions,
  no lock): the age and size caps, only once untouched for ``LOCKLESS_GRACE_S``.
- anything else (files, symlinks, directories with other names: a root given by mistake such as
  ``--spill-dir ~``) is never touched nor counted; nothing is followed.

A directory's age is that of the newest thing in it (``lstat`` mtimes). Entries not owned by
the current user are skipped, and a root that is a symlink or not ours is left alone.
``auto_prune`` is what ``Sandbox`` runs when it opens: at most once per ``AUTO_INTERVAL_S`` per
process and per root (a ``.pruned`` stamp in the root spans processes), within a time budget,
and it never raises.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sandboxrun.engine.capture.spill import (
    LOCK_NAME,
    PENDING_PREFIX,
    SESSION_PREFIX,
    default_spill_root,
)
from sandboxrun.errors import ConfigError
from sandboxrun.units import parse_duration, parse_size

log = logging.getLogger("sandboxrun")

ENV_MAX_AGE = "SANDBOXRUN_SPILL_MAX_AGE"
ENV_MAX_TOTAL = "SANDBOXRUN_SPILL_MAX_TOTAL"
DEFAULT_MAX_AGE_S = 24 * 3600.0
DEFAULT_MAX_TOTAL = 1 << 30
AUTO_INTERVAL_S = 600.0
"""``auto_prune`` scans a root at most once per this many seconds."""
AUTO_BUDGET_S = 1.0
"""``auto_prune`` stops after this many seconds; the rest waits for the next scan."""
LOCKLESS_GRACE_S = 3600.0
"""A directory without a lock (an older version's) counts for the size cap only once nothing
in it changed for this long: it may belong to a run still going on."""
STAMP_NAME = ".pruned"
OFF = frozenset({"off", "none", "never"})
_OURS = re.compile(
    rf"(?:{re.escape(SESSION_PREFIX)}|{re.escape(PENDING_PREFIX)})[0-9a-f]{{16}}"
    r"|[0-9a-f]{16}(?:\.log)?"
)
"""The names sandboxrun gives what it makes under the root (nothing else is ever removed)."""
_LOCK_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_STAMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class SpillCaps:
    """``max_age_s``: closed sandboxes' directories older than this go (None: no age cap);
    ``max_total``: then the oldest go until the root holds at most this many bytes (None: no
    size cap)."""

    max_age_s: float | None = DEFAULT_MAX_AGE_S
    max_total: int | None = DEFAULT_MAX_TOTAL


def parse_age(text: str, *, what: str = ENV_MAX_AGE) -> float | None:
    """An age cap in seconds: a duration (``90m``, ``36h``, ``0``; a bare number is seconds,
    as for every duration); ``off``/``none``/``never``: no cap (None). ``ConfigError``
    otherwise."""
    if text.strip().lower() in OFF:
        return None
    return parse_duration(text, what=what, allow_zero=True)


def parse_total(text: str, *, what: str = ENV_MAX_TOTAL) -> int | None:
    """A size cap in bytes (``1g``, ``500m``); ``off``/``none``/``never``: no cap (None)."""
    if text.strip().lower() in OFF:
        return None
    return parse_size(text, what=what)


def caps_from_env(environ: Mapping[str, str] | None = None) -> SpillCaps:
    """The caps from ``SANDBOXRUN_SPILL_MAX_AGE`` / ``SANDBOXRUN_SPILL_MAX_TOTAL`` (unset or
    empty: the defaults, 24 h and 1 GiB). ``ConfigError`` for a value that does not parse."""
    env = os.environ if environ is None else environ
    age, total = env.get(ENV_MAX_AGE, "").strip(), env.get(ENV_MAX_TOTAL, "").strip()
    return SpillCaps(
        max_age_s=parse_age(age) if age else DEFAULT_MAX_AGE_S,
        max_total=parse_total(total) if total else DEFAULT_MAX_TOTAL,
    )


@dataclass(frozen=True)
class PruneReport:
    removed: tuple[Path, ...] = ()
    """The directories removed, in that order."""
    freed_bytes: int = 0
    in_use: int = 0
    """Directories skipped because their sandbox is open."""
    left_bytes: int = 0
    """What the root's directories hold after pruning (those in use too)."""
    complete: bool = True
    """False when the time budget ran out before the end (the rest waits for the next scan)."""


@dataclass
class _Dir:
    path: Path
    size: int
    newest: float
    locked: bool  # has a .lock
    pending: bool
    in_use: bool = False
    removed: bool = False


class _OutOfTime(Exception):
    pass


def _check_time(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise _OutOfTime


def _measure(path: str, top: os.stat_result, deadline: float | None) -> tuple[int, float]:
    """Bytes of the regular files under ``path`` (locks aside) and the newest mtime (``path``
    included); nothing is followed."""
    size, newest = 0, top.st_mtime
    stack = [path]
    while stack:
        _check_time(deadline)
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                newest = max(newest, st.st_mtime)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
                elif stat.S_ISREG(st.st_mode) and entry.name != LOCK_NAME:
                    size += st.st_size
    return size, newest


def _lock(path: Path) -> int | None:
    """The directory's lock, taken (exclusive, non-blocking): its fd, or None when it is held
    by an open sandbox (or cannot be opened)."""
    try:
        fd = os.open(path / LOCK_NAME, _LOCK_FLAGS)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _scan(root: Path, deadline: float | None) -> list[_Dir]:
    uid = os.getuid()
    found = []
    with os.scandir(root) as entries:
        listed = sorted(entries, key=lambda e: e.name)
    for entry in listed:
        _check_time(deadline)
        if _OURS.fullmatch(entry.name) is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue
        size, newest = _measure(entry.path, st, deadline)
        try:
            locked = stat.S_ISREG((root / entry.name / LOCK_NAME).lstat().st_mode)
        except OSError:
            locked = False
        item = _Dir(
            path=root / entry.name,
            size=size,
            newest=newest,
            locked=locked,
            pending=entry.name.startswith(PENDING_PREFIX),
        )
        if item.locked:
            fd = _lock(item.path)
            item.in_use = fd is None
            if fd is not None:
                os.close(fd)
        found.append(item)
    return found


def _remove(item: _Dir, dry_run: bool = False) -> bool:
    """Remove ``item`` (holding its lock, if it has one, meanwhile); False when it is in use
    now or could not be removed entirely. ``dry_run``: only count it as removed."""
    fd = _lock(item.path) if item.locked else None
    if item.locked and fd is None:
        item.in_use = True
        return False
    try:
        if not dry_run:
            shutil.rmtree(item.path, ignore_errors=True)  # fd-based: never follows a symlink
    finally:
        if fd is not None:
            os.close(fd)
    item.removed = dry_run or not os.path.lexists(item.path)
    return item.removed


def prune(
    root: Path | None = None,
    caps: SpillCaps | None = None,
    *,
    now: float | None = None,
    deadline: float | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Prune ``root`` (default: ``default_spill_root()``) to ``caps`` (default:
    ``caps_from_env()``), as the module says. ``deadline`` (``time.monotonic()``): stop there
    (``complete`` False). A missing root, a symlink or a root not owned by the user: nothing.
    ``dry_run``: remove nothing; the report says what would have gone."""
    root = default_spill_root() if root is None else root
    caps = caps_from_env() if caps is None else caps
    now = time.time() if now is None else now
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return PruneReport()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return PruneReport()
    items: list[_Dir] = []
    removed: list[_Dir] = []  # in the order of removal
    complete = True
    try:
        items = _scan(root, deadline)
        if caps.max_age_s is not None:
            for item in items:
                # no lock (a directory being created, or an older version's): it may be a
                # live run's, so never younger than LOCKLESS_GRACE_S, whatever the cap
                floor = 0.0 if item.locked else LOCKLESS_GRACE_S
                if not item.in_use and now - item.newest > max(caps.max_age_s, floor):
                    _check_time(deadline)
                    if _remove(item, dry_run):
                        removed.append(item)
        total = sum(item.size for item in items if not item.removed)
        if caps.max_total is not None and total > caps.max_total:
            candidates = [
                item
                for item in items
                if not (item.removed or item.in_use or item.pending)
                and (item.locked or now - item.newest > LOCKLESS_GRACE_S)
            ]
            for item in sorted(candidates, key=lambda i: (i.newest, i.path.name)):
                if total <= caps.max_total:
                    break
                _check_time(deadline)
                if _remove(item, dry_run):
                    removed.append(item)
                    total -= item.size
    except _OutOfTime:
        complete = False
    return PruneReport(
        removed=tuple(item.path for item in removed),
        freed_bytes=sum(item.size for item in removed),
        in_use=sum(item.in_use for item in items),
        left_bytes=sum(item.size for item in items if not item.removed),
        complete=complete,
    )


_last_scan: dict[str, float] = {}
_last_lock = threading.Lock()


def _claim_stamp(root: Path, interval_s: float) -> bool:
    """True when no process pruned ``root`` in the last ``interval_s`` (the ``.pruned``
    stamp's mtime), and the stamp now says this one does; False for a root not there."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    stamp = root / STAMP_NAME
    try:
        fd = os.open(stamp, _STAMP_FLAGS | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = os.open(stamp, _STAMP_FLAGS, 0o600)
        try:
            if time.time() - os.fstat(fd).st_mtime < interval_s:
                return False
            os.utime(fd)
        finally:
            os.close(fd)
        return True
    os.close(fd)
    return True


def auto_prune(
    root: Path | None = None,
    caps: SpillCaps | None = None,
    *,
    interval_s: float = AUTO_INTERVAL_S,
    budget_s: float = AUTO_BUDGET_S,
) -> PruneReport | None:
    """``prune`` unless ``root`` was scanned less than ``interval_s`` ago (by this process, or
    by any: the stamp), within ``budget_s`` seconds. None when it did not scan. Never raises:
    trouble (a bad ``SANDBOXRUN_SPILL_MAX_*`` value too: then nothing is pruned) is logged
    as a warning on the ``sandboxrun`` logger."""
    try:
        root = default_spill_root() if root is None else root
        key = str(root.absolute())
        with _last_lock:
            last = _last_scan.get(key)
            if last is not None and time.monotonic() - last < interval_s:
                return None
            _last_scan[key] = time.monotonic()
        caps = caps_from_env() if caps is None else caps
        if not _claim_stamp(root, interval_s):
            return None
        return prune(root, caps, deadline=time.monotonic() + budget_s)
    except (ConfigError, OSError) as exc:
        log.warning("sandboxrun: spill files not pruned: %s", exc)
    except Exception:  # pruning is housekeeping: a run never fails for it
        log.warning("sandboxrun: spill files not pruned", exc_info=True)
    return None
