"""Handing a pooled sandbox to its next holder in place (``SandboxPool(reset=True)``).

A released sandbox is reset only when nothing of its last holder can reach the next one, and
only when that can be checked; any doubt discards it (closed and replaced, as without
``reset``). It is discarded when:

- its holder did anything beyond plain commands that ended on their own: a job or a terminal,
  a command that was cancelled, timed out, hit a limit, was denied, left survivors or ended
  in a sandbox or spawn error (``taint_of``), or one still running at the release;
- its backend cannot see every process of the sandbox (``backends.base.Resettable``: today
  docker with a local engine and its supervisor), or its root is writable (the container's
  own layer cannot be compared);
- a process of it is still alive after it was killed, or the file systems it may write
  differ from what they were when the sandbox was made (below).

The reset itself: every process of the sandbox beyond its own is killed (from the host, by
its cgroup); then one command, as the sandbox's user, empties its scratch directories
(``/tmp``, ``/var/tmp``, ``HOME``, ``/dev/shm``, ``/dev/mqueue``), removes its System V IPC
objects and lists every other writable mount of the sandbox (each entry's type, mode and
owner; a file's size and ctime too, which no user can set back) with the mount table
(``LISTING``); that listing must equal the one taken when the sandbox was made (``Baseline``).
No process may be left after it. Last, the workspace is emptied on the host and filled again
from the template (``restore_workspace``). The pool then hands a new ``Sandbox`` object on
the same backend to the next holder: the old object is closed for the old holder.

The reset's own commands run with a fixed environment (``FIXED_ENV``): no login snapshot,
no path prepend, nothing the holder could have written decides what they run. The login
snapshots the next holder gets are the ones taken when the sandbox was made (a holder may
write a profile in ``$HOME`` and have a new one taken).

Not compared: extended attributes of the scratch directories themselves (the workspace
root's are removed), and read-write mounts of the host (``Policy.mounts`` with ``:rw``),
which no reset or discard restores.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread

from sandboxrun.api.login import Saved
from sandboxrun.backends.base import Resettable
from sandboxrun.engine.paths import CONTAINER_ROOT
from sandboxrun.models import ExecResult

if TYPE_CHECKING:
    from sandboxrun.api.sandbox import Sandbox

RESET_TIMEOUT_S = 30.0
"""The longest the listing command may take."""

UNLISTED_TYPES = frozenset({"proc", "sysfs", "devpts", "cgroup", "cgroup2"})
"""Mounts whose entries are the kernel's, not files a command leaves (processes, terminals,
cgroups): not listed."""

CLEAN_STATUSES = frozenset({"completed", "failed"})
"""How a command may have ended for its sandbox to be handed on in place."""

LISTING = r"""
set -f
PATH=/usr/sbin:/usr/bin:/sbin:/bin; export PATH
scratch=$1; shift
chmod -R u+rwX -- $scratch 2>/dev/null
find $scratch -xdev -mindepth 1 -delete 2>/dev/null
touch -c -- $scratch 2>/dev/null
find $scratch -xdev -printf 'scratch %d %p %y %m %U %G\n' 2>&1
if [ "$#" -gt 0 ]; then
  find "$@" -xdev \( -type d -printf 'dir %p %m %U %G\n' \) \
    -o -printf 'file %p %y %m %U %G %s %C@\n' 2>&1
fi
if command -v ipcrm >/dev/null 2>&1; then
  ipcrm --all 2>/dev/null
  ipcs -m -q -s 2>&1
else
  echo "no ipcrm"
fi
echo "mounts"
cat /proc/self/mounts
"""
"""Empties the scratch directories (``$1``: their paths, one word: ``SAFE_SCRATCH``; their
times set to now: a holder's dates are not left for the next), lists
what is left in them (depth 0: each directory itself), the other mount points given, the
IPC objects left and the mount table, in a few processes. Needs GNU find (``-printf``):
where it is missing the listing fails and the sandbox is never reset. It runs with
``FIXED_ENV`` only and its tools from the image's own directories (``Sandbox._exec_fixed``):
never through the login snapshot, which the holder's profile in ``$HOME`` made, nor the
sandbox's path prepends, which may name a directory the holder wrote (``.venv/bin``)."""

FIXED_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
"""The whole environment of the reset's own commands (the root is read-only: nothing in
these directories is a holder's)."""

SAFE_SCRATCH = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-")
"""What a scratch directory's path may hold (it is split on spaces in the listing)."""


def taint_of(result: ExecResult) -> str | None:
    """Why a sandbox that ran ``result`` may not be handed on in place, or None."""
    if result.status not in CLEAN_STATUSES:
        return f"a command of it ended {result.status}"
    if result.survivors:
        return f"a command of it left {result.survivors} survivors"
    if result.denial is not None:
        return f"a command of it was denied ({result.denial.kind})"
    return None


def unescape_mount(field: str) -> str:
    """A path of ``/proc/self/mounts`` as it is (the kernel escapes space, tab, newline and
    backslash as ``\\ooo``)."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def listed_mounts(mounts: str, *, skip: Sequence[str]) -> list[str]:
    """The read-write mount points of a mount table that a reset lists: not kernel ones
    (``UNLISTED_TYPES``), not at or under a path of ``skip`` (the workspace, the scratch
    directories, the host's read-write mounts); each once, in the table's order."""

    def under(path: str, top: str) -> bool:
        top = top.rstrip("/")
        return path == (top or "/") or path.startswith(top + "/")

    found: list[str] = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point, kind, options = unescape_mount(fields[1]), fields[2], fields[3].split(",")
        if "rw" not in options or kind in UNLISTED_TYPES:
            continue
        if any(under(point, top) for top in skip) or point in found:
            continue
        found.append(point)
    return found


@dataclass(frozen=True)
class Baseline:
    """What a pooled sandbox looked like when it was made: the command that lists it and
    that command's output."""

    argv: tuple[str, ...]
    listing: str
    logins: Saved
    """Its login snapshots then (taken by the pool's first command): each next holder gets
    these, never one a holder's profile made (``Logins.restore``)."""


def listing_argv(scratch: Sequence[str], listed: Sequence[str]) -> list[str]:
    """The listing command: ``scratch`` (a backend's own paths, ``SAFE_SCRATCH``) as one
    word, each other mount point an argument of its own."""
    for path in scratch:
        if not path.startswith("/") or not set(path) <= SAFE_SCRATCH:
            raise ValueError(f"a scratch directory must be a plain absolute path: {path!r}")
    return ["/bin/sh", "-c", LISTING, "sandboxrun-reset", " ".join(scratch), *listed]


def _listing_of(result: ExecResult) -> str | None:
    if result.status != "completed" or result.exit_code != 0 or result.survivors:
        return None
    if result.stdout_truncated or result.stdout_dropped_bytes or "\nmounts\n" not in result.stdout:
        return None
    return result.stdout


async def baseline(sb: Sandbox) -> tuple[Baseline | None, str | None]:
    """The sandbox's baseline, taken right after it opened; or None and why it can never be
    reset (its backend, its root, a listing that failed)."""
    backend = sb.backend
    if not isinstance(backend, Resettable):
        return None, f"the {backend.name} backend cannot reset a sandbox in place"
    if sb.policy.root == "writable":
        return None, "a writable root cannot be reset in place"
    if await anyio.to_thread.run_sync(backend.strays) is None:
        return None, "the sandbox's processes cannot be seen from here (a remote engine?)"
    logins = sb._logins.saved()  # (before the listing, which takes none)
    table = await sb._exec_fixed(["cat", "/proc/self/mounts"], FIXED_ENV, RESET_TIMEOUT_S)
    if table.status != "completed" or table.exit_code != 0 or table.stdout_truncated:
        return None, f"its mount table could not be read ({table.status})"
    host_rw = [m.target for m in sb.policy.mounts if not m.read_only]
    skip = [str(CONTAINER_ROOT), *backend.scratch, *host_rw]
    argv = listing_argv(backend.scratch, listed_mounts(table.stdout, skip=skip))
    listed = await sb._exec_fixed(argv, FIXED_ENV, RESET_TIMEOUT_S)
    listing = _listing_of(listed)
    if listing is None:
        why = listed.stderr.strip().splitlines()[-1:] or [listed.status]
        return None, f"its file systems could not be listed: {why[0]}"
    return Baseline(tuple(argv), listing, logins), None


async def reset(sb: Sandbox, base: Baseline, refill: Callable[[Path], None]) -> str | None:
    """Reset a released sandbox for its next holder (the object that took it over from the
    holder's: ``Sandbox._adopt``; its taint was looked at then); None when done, else why it
    must be discarded (it may be half reset then: the caller closes it)."""
    backend = sb.backend
    assert isinstance(backend, Resettable)  # (a baseline was taken)
    sb._logins.restore(base.logins)  # the holder's profile may have made others
    left = await anyio.to_thread.run_sync(backend.strays)
    if left != 0:
        return f"{left} of its processes could not be killed"
    listed = await sb._exec_fixed(base.argv, FIXED_ENV, RESET_TIMEOUT_S)
    listing = _listing_of(listed)
    if listing != base.listing:
        return (
            "its file systems differ from a fresh sandbox's"
            if listing
            else (f"its file systems could not be listed ({listed.status})")
        )
    if await anyio.to_thread.run_sync(backend.strays) != 0:
        return "a process of it was left after its reset"
    try:
        await anyio.to_thread.run_sync(restore_workspace, sb.workspace.root, refill)
    except OSError as exc:
        return f"its workspace could not be restored: {exc}"
    return None


def restore_workspace(root: Path, refill: Callable[[Path], None]) -> None:
    """Empty ``root`` (a workspace no process uses any more; nothing in it is followed: a
    symlink is removed, never its target) and fill it again (``refill``). ``OSError`` when
    something in it could not be removed. The root's own extended attributes (``user.*``, a
    default ACL every later file would inherit) are removed and its times set to now."""
    os.chmod(root, 0o700)  # noqa: PTH101 - a command may have taken it away
    for name in _xattrs(root):
        if not name.startswith("security."):  # (the host's labels: SELinux, capabilities)
            os.removexattr(root, name)
    os.utime(root)
    with os.scandir(root) as entries:
        names = [e.name for e in entries]
    for name in names:
        path = root / name
        if path.is_dir() and not path.is_symlink():
            remove_tree(path)
        else:
            path.unlink()
    with os.scandir(root) as entries:
        left = [e.name for e in entries]
    if left:
        raise OSError(f"could not remove {', '.join(sorted(left)[:3])} from the workspace")
    refill(root)


def _xattrs(path: Path) -> list[str]:
    """The names of ``path``'s extended attributes; none where its file system has none."""
    try:
        return os.listxattr(path)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return []
        raise


MAX_DEPTH = 256
"""How deep ``remove_tree`` goes into directories a command made unreadable (each one it
had to open again on its own)."""


def remove_tree(path: Path, _depth: int = 0) -> None:
    """``shutil.rmtree`` (which never follows a symlink), making directories writable where
    a command took that away; what cannot be removed is left (the caller looks). A directory
    that could not be opened or listed (``chmod 000``: rmtree skips it) is made readable and
    removed on its own, at most ``MAX_DEPTH`` deep."""

    def retry(func: Callable[..., object], name: str, _: object) -> None:
        opened = False
        with suppress(OSError):
            os.chmod(os.path.dirname(name), 0o700)  # noqa: PTH101, PTH120
            if os.path.isdir(name) and not os.path.islink(name):  # noqa: PTH112, PTH114
                os.chmod(name, 0o700)  # noqa: PTH101
                opened = True
        if func in (os.unlink, os.remove, os.rmdir):
            with suppress(OSError):
                func(name)
        elif opened and _depth < MAX_DEPTH:  # (os.open, os.scandir, os.lstat: not retried by name)
            remove_tree(Path(name), _depth + 1)

    if sys.version_info >= (3, 12):  # (3.12 renamed the hook)
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)
