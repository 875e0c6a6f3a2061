"""The uid rule of a root invoker, one on every backend: its commands run as the workspace's
owner when that is not root (a uid-0 command, every capability dropped, could not write a
workspace it does not own, and could leave root-owned files in one it could). Docker gives the
container that user (``owner_of``); a local sandbox starts as it (``run_as``), or the result
says in one line why it cannot (and it runs as root, nothing else dropped).

``reaches``, ``closed_above`` and ``masks_for`` are pure over the ``lstat`` they are given;
``owner_start`` tries a start as that uid (a passed trial is kept for the process): its Python
must be reachable for it, and its bubblewrap must get a user namespace.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sandboxrun import supervisor

MAX_ID = 2**31 - 1
"""The largest uid or gid used (the docker engine refuses larger ids)."""
ACL_XATTR = "system.posix_acl_access"

Stat = Callable[[str], os.stat_result]


def owner_of(workspace: Path) -> tuple[int, int] | None:
    """``(uid, gid)`` the commands run as under a root invoker: the workspace root's owner
    and group, or None (not root here, or the workspace is root's, or its ids cannot be used).
    A workspace of group 0 gives the owner's own primary group (its passwd entry's, else the
    uid's number): never root's group."""
    if os.geteuid() != 0:
        return None
    try:
        st = workspace.stat()
    except OSError:
        return None
    if not 0 < st.st_uid <= MAX_ID:
        return None
    gid = st.st_gid
    if gid == 0 or gid > MAX_ID:
        try:
            gid = pwd.getpwuid(st.st_uid).pw_gid
        except KeyError:
            gid = st.st_uid
        if not 0 < gid <= MAX_ID:
            gid = st.st_uid
    return st.st_uid, gid


def own_home(uid: int) -> Path | None:
    """The uid's home directory (its passwd entry), whose secrets are masked too."""
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None
    return Path(home) if home.startswith("/") and home != "/" else None


def may_search(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` (no other groups) may search the directory ``st``, by its
    mode bits: the owner's, else the group's, else the others' (as the kernel picks one)."""
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def has_acl(path: str) -> bool:
    try:
        return ACL_XATTR in os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False


def reaches(
    path: Path,
    uid: int,
    gid: int,
    lstat: Stat = os.lstat,
    acl: Callable[[str], bool] = has_acl,
) -> bool:
    """Whether ``uid``/``gid`` can resolve ``path`` (search every directory above it, ``path``
    taken as real): what bubblewrap as that uid needs to bind it. A directory with an access
    ACL counts as searchable (it may grant more than its bits): a path wrongly taken as
    reachable fails the sandbox's start loudly."""
    return closed_above(path, uid, gid, lstat, acl, optimistic=True) is None


def closed_above(
    path: Path,
    uid: int,
    gid: int,
    lstat: Stat = os.lstat,
    acl: Callable[[str], bool] = has_acl,
    *,
    optimistic: bool = False,
    known: tuple[Path, ...] = (),
) -> Path | None:
    """The highest directory above ``path`` that ``uid``/``gid`` may not search (by its bits;
    ``optimistic``: one with an ACL counts as searchable, else as closed), or None. A missing
    or non-directory parent counts as closed (``path`` is real: no symlink above it).
    ``known``: paths already known reachable (their directories are open)."""
    for parent in reversed(path.parents):
        if parent == Path("/") or any(parent == k or parent in k.parents for k in known):
            continue  # (``/`` is searchable, or nothing would run: never masked whole)
        where = str(parent)
        try:
            st = lstat(where)
        except OSError:
            return parent
        if not stat.S_ISDIR(st.st_mode):
            return parent
        if acl(where):
            if optimistic:
                continue
            return parent
        if not may_search(st, uid, gid):
            return parent
    return None


def masks_for(
    secrets: list[Path],
    uid: int,
    gid: int,
    known: tuple[Path, ...],
    lstat: Stat = os.lstat,
    acl: Callable[[str], bool] = has_acl,
) -> list[Path]:
    """What to mask for a sandbox of ``uid``: each secret path itself where that uid can
    resolve it, else the highest directory above it that it cannot search (by its bits, or
    with an ACL that may grant it: masked whole, an empty directory: never left open because
    of a guess, never a mount bubblewrap as that uid could not make). ``known``: the paths the
    sandbox binds (checked reachable: what is above them stays open)."""
    out: list[Path] = []
    for secret in secrets:
        real = Path(os.path.realpath(secret))
        closed = closed_above(real, uid, gid, lstat, acl, known=known)
        out.append(real if closed is None else closed)
    return list(dict.fromkeys(out))


def owner_argv(
    bwrap: str | None, runtime: tuple[str, ...], root: tuple[str, ...] = ("--ro-bind", "/", "/")
) -> list[str]:
    """The trial: this Python reading the runner (in a user namespace of bubblewrap's, where
    the sandbox has one, with its ``root``'s arguments, and ``runtime``, where sandboxrun runs
    from, shown as it is there)."""
    runner = str(Path(supervisor.HERE, "runner.py"))
    python = [sys.executable, "-I", "-S", "-c", f"open({runner!r}, 'rb').close()"]
    if bwrap is None:
        return python
    trial = [bwrap, "--die-with-parent", "--unshare-user", "--unshare-pid", "--as-pid-1"]
    trial += [*root, "--dev", "/dev", "--proc", "/proc"]
    trial += ["--tmpfs", "/tmp"]  # noqa: S108 - private inside, as the sandbox's
    for own in runtime:
        trial += ["--ro-bind", own, own]
    return [*trial, "--", *python]


Trial = tuple[int, int, str | None, tuple[str, ...], tuple[str, ...]]
STARTS: dict[Trial, None] = {}
"""The trials that passed."""
FAILS: dict[Trial, tuple[float, str]] = {}
"""The trials that failed (when, why), believed for ``FAIL_TTL_S``: a root invoker whose
Python the owner cannot run does not pay a trial at every open. One that timed out is not
kept (a busy host)."""
FAIL_TTL_S = 60.0


def owner_start(
    uid: int,
    gid: int,
    bwrap: str | None,
    runtime: tuple[str, ...],
    root: tuple[str, ...] = ("--ro-bind", "/", "/"),
) -> str | None:
    """None when a sandbox can start as ``uid``/``gid`` here, else why not (one line)."""
    key = (uid, gid, bwrap, runtime, root)
    if key in STARTS:
        return None
    failed = FAILS.get(key)
    if failed is not None and time.monotonic() - failed[0] < FAIL_TTL_S:
        return failed[1]
    try:
        done = subprocess.run(
            owner_argv(bwrap, runtime, root),
            capture_output=True,
            timeout=10,
            check=False,
            user=uid,
            group=gid,
            extra_groups=[],
            env={},
        )
    except subprocess.TimeoutExpired as exc:  # a busy host: tried again next time
        return f"uid {uid} cannot start it: {exc}"
    except OSError as exc:  # (this Python not executable by that uid, without bubblewrap)
        FAILS[key] = (time.monotonic(), f"uid {uid} cannot start it: {exc}")
        return FAILS[key][1]
    if done.returncode == 0:
        STARTS[key] = None
        return None
    said = done.stderr.decode(errors="replace").strip().splitlines()
    why = said[-1] if said else f"exit status {done.returncode}"
    if bwrap is not None and "namespace" in why.lower():
        why += f" (uid {uid} gets no user namespace here)"
    FAILS[key] = (time.monotonic(), f"uid {uid} cannot run sandboxrun's Python here: {why}")
    return FAILS[key][1]


def run_as(
    workspace: Path,
    bwrap: str | None,
    runtime: tuple[str, ...],
    shown: tuple[str, ...] = (),
    root: tuple[str, ...] = ("--ro-bind", "/", "/"),
) -> tuple[tuple[int, int] | None, str | None]:
    """``(ids, None)``: commands run as the workspace owner; ``(None, why)``: they run as
    root and ``why`` says so; ``(None, None)``: no rule applies (not root, or root's own
    workspace). ``shown``: paths the sandbox binds from the host (its mounts), which that
    uid must reach too; ``runtime``: where sandboxrun runs from (``isolation.runtime_dirs``)."""
    ids = owner_of(workspace)
    if ids is None:
        return None, None
    uid, gid = ids
    for path in (workspace, *map(Path, shown)):
        real = Path(os.path.realpath(path))
        if not reaches(real, uid, gid):
            return None, (
                f"commands run as root, not as the workspace's owner (uid {uid}): uid {uid} "
                f"cannot reach {real}"
            )
    why = owner_start(uid, gid, bwrap, runtime, root)
    if why is not None:
        return None, f"commands run as root, not as the workspace's owner (uid {uid}): {why}"
    return ids, None
