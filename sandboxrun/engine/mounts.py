"""``--mount SRC:DST[:ro|rw]``: what may be shown to a command beside its workspace.

``checked`` resolves each source (symlinks followed: what is mounted is where they lead) and
refuses, naming the mount and why: a missing source; a socket (a daemon's door), the engine
socket or a directory holding it, the other sockets the host environment names (an agent's),
any socket in a mounted directory (a read-only mount does not stop ``connect``: the tree is
searched, up to ``MAX_SCANNED`` entries); kernel interfaces and the directories of daemon
sockets (``/proc``, ``/sys``, ``/dev``, ``/run``, ``/var/run``, at or around them); a target
that is not absolute and normal, ``/``, kernel or sandboxrun paths inside (``/proc``, ``/sys``,
``/dev``, ``/run/sandboxrun``), or at, inside or around the workspace (either as the container
sees it, ``/workspace``, or at its host path), and two mounts at one target. ``masked_inside``
maps the secret paths under a source to where the command sees them, so a home directory
mounted anywhere keeps its ``~/.ssh`` hidden. Pure but for ``realpath``, ``stat`` and the walk.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from sandboxrun.errors import ConfigError
from sandboxrun.models import Mount

KERNEL_ROOTS = ("/proc", "/sys", "/dev", "/run", "/var/run")
"""Sources at or around these would hand the command kernel interfaces or daemon sockets."""
RESERVED_TARGETS = ("/proc", "/sys", "/dev", "/run", "/var/run", "/var/lock", "/etc")
"""Targets at or inside these would replace what the sandbox itself needs (kernel interfaces,
the supervisor's ``/run/sandboxrun``, also through an image's ``/var/run -> /run``, the
engine's ``/etc/hostname`` and ``resolv.conf``)."""
OWN_DIRS = ("/tmp", "/var/tmp", "/home/sandbox", "/tmp/sandboxrun-home")  # noqa: S108
"""The sandbox's private directories (tmpfs): a target at one, or holding one, would hide it
or be hidden by it (a target inside one is fine)."""
MAX_SCANNED = 200_000
"""The most entries of a mounted directory searched for sockets (more is refused)."""


def around(path: str, root: str) -> bool:
    """``path`` is ``root``, inside it, or holds it."""
    return (
        path == root
        or path.startswith(root.rstrip("/") + "/")
        or root.startswith(path.rstrip("/") + "/")
    )


def checked(
    mounts: Sequence[Mount],
    *,
    workspace: Path,
    inside: str,
    sockets: Iterable[Path] = (),
    secrets: Iterable[Path] = (),
) -> tuple[Mount, ...]:
    """``mounts`` with each source resolved to the real path it names; ``ConfigError`` for the
    first that may not be mounted. ``workspace``: its host path; ``inside``: where the
    container sees it; ``sockets``: the engine socket and the others to keep out;
    ``secrets``: paths never mounted themselves (one under a source is masked instead)."""
    out: list[Mount] = []
    targets: list[str] = []
    doors = [os.path.realpath(s) for s in sockets]
    hidden = [os.path.realpath(s) for s in secrets]
    for mount in mounts:
        what = f"invalid --mount {mount.shown()!r}"
        target = _target(mount.target, what, workspace=str(workspace), inside=inside)
        for other in targets:
            if around(target, other):
                raise ConfigError(
                    f"{what}: another mount is at {other}; mounts may not be at, in or around "
                    "one another"
                )
        targets.append(target)
        source = check_source(mount.source, what, doors)
        for secret in hidden:
            if source == secret or source.startswith(secret.rstrip("/") + "/"):  # at or in
                raise ConfigError(f"{what}: {source} is a secret path ({secret}), never mounted")
        out.append(Mount(source=source, target=target, read_only=mount.read_only))
    return tuple(out)


def _target(target: str, what: str, *, workspace: str, inside: str) -> str:
    if "\0" in target or not target.startswith("/"):
        raise ConfigError(f"{what}: the target must be an absolute path in the sandbox")
    if target.strip("/") == "":
        raise ConfigError(f"{what}: the target cannot be / (the sandbox's own root)")
    normal = posixpath.normpath(target)
    if ".." in PurePosixPath(target).parts or normal != target.rstrip("/") or normal[:2] == "//":
        raise ConfigError(f"{what}: the target must be a normal path (no '.', '..' or '//')")
    target = normal
    for reserved in RESERVED_TARGETS:
        if target == reserved or target.startswith(reserved + "/"):
            raise ConfigError(f"{what}: {reserved} is the sandbox's own, not a place to mount")
    for own in OWN_DIRS:
        if own == target or own.startswith(target + "/"):
            raise ConfigError(
                f"{what}: {own} is the sandbox's own private directory (mount in /tmp or "
                "/var/tmp, or beside them)"  # noqa: S108
            )
    for root in {inside, workspace}:
        if around(target, root):
            raise ConfigError(
                f"{what}: the target is at, in or around the workspace ({root}); mount beside "
                "it (the workspace is mounted there already)"
            )
    return target


def check_source(source: str, what: str, doors: list[str], *, scan: bool = True) -> str:
    """``source`` resolved, once it is checked (``checked``'s rules for a source); ``scan``:
    search a directory's tree for sockets too."""
    if "\0" in source or not source:
        raise ConfigError(f"{what}: expected a host path")
    real = os.path.realpath(Path(source).expanduser())
    try:
        mode = Path(real).stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{what}: {source}: {exc.strerror or 'cannot be read'}") from None
    if stat.S_ISSOCK(mode):
        raise ConfigError(f"{what}: {real} is a socket (a daemon's door), never mounted")
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise ConfigError(f"{what}: {real} is not a directory or a regular file")
    for root in KERNEL_ROOTS:
        if around(real, root):
            raise ConfigError(f"{what}: {real} exposes {root} (kernel interfaces, daemon sockets)")
    for door in doors:
        if door == real or door.startswith(real.rstrip("/") + "/"):
            raise ConfigError(f"{what}: {real} holds {door}, which no sandbox may reach")
    if scan and stat.S_ISDIR(mode):
        _no_socket_in(real, what)
    return real


def rechecked(mount: Mount, now: str, doors: list[str], *, link: bool = False) -> None:
    """Just before ``mount`` is made: its source must still lead to the path that was checked
    (``now``: where it leads now; ``link``: it is a symlink now) and pass a source's checks
    again, but for the tree's search (that ran at the check: a socket made since would be
    reachable either way, as docs/cli.md says)."""
    what = f"invalid --mount {mount.shown()!r}"
    if now != mount.source or link:
        raise ConfigError(
            f"{what}: its source changed since it was checked (it now leads to {now})"
        )
    check_source(now, what, doors, scan=False)


def _no_socket_in(root: str, what: str) -> None:
    """A unix socket anywhere under ``root`` would let the command talk to its daemon (a
    read-only mount does not stop ``connect``): refused, as is a tree too large to search."""
    seen, max_entries = 0, MAX_SCANNED

    def unreadable(exc: OSError) -> None:
        raise ConfigError(
            f"{what}: {exc.filename} cannot be searched for sockets ({exc.strerror}): "
            "mount what this user can read"
        )

    for directory, dirs, files in os.walk(root, onerror=unreadable):  # never follows symlinks
        for name in (*dirs, *files):
            seen += 1
            path = os.path.join(directory, name)  # noqa: PTH118
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    raise ConfigError(
                        f"{what}: {path} is a socket (a daemon's door), never mounted"
                    )
            except OSError:
                continue
        if seen > max_entries:
            raise ConfigError(
                f"{what}: {root} has more than {max_entries} entries, too many to search for "
                "sockets (a daemon's door): mount a smaller directory"
            )


def masked_inside(mount: Mount, secrets: Iterable[Path]) -> list[tuple[Path, str]]:
    """``(host secret path, where the command sees it)`` for each secret under the source
    (``mount.source`` resolved); a secret holding the whole source is the source itself."""
    source = Path(mount.source)
    found = []
    for secret in secrets:
        real = Path(os.path.realpath(secret))
        if real.is_relative_to(source) and real != source and os.path.lexists(real):
            found.append((real, posixpath.join(mount.target, real.relative_to(source).as_posix())))
    return found
