"""The private workspaces of the ``sandboxrun`` inspect_ai sandbox, and finding leftovers.

Each sample gets ``<tmp>/sandboxrun-inspect-<uid>/<pid>-<created>-<random>``: the parent is
private to the invoking user (0700, checked to be a real directory of theirs), the name says
which process made it and when, so ``inspect sandbox cleanup sandboxrun`` can tell the
workspaces of a live eval from those of one that is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from sandboxrun.errors import WorkspaceError

if TYPE_CHECKING:
    from sandboxrun.backends.docker.api import Client as DockerClient


def parent_dir() -> Path:
    """The invoker's private parent of every such workspace (created 0700 when missing)."""
    parent = Path(tempfile.gettempdir()) / f"sandboxrun-inspect-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        parent.mkdir(mode=0o700)
    info = parent.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise WorkspaceError(
            f"{parent} is not a private directory of this user (mode 0700): refusing to keep "
            "sandbox workspaces there"
        )
    return parent


def create(template: Path | None = None, owner: tuple[int, int] | None = None) -> Path:
    """A new private workspace, a copy of ``template`` when given (symlinks copied as
    symlinks). ``owner``: uid and gid to give it all (a root invoker's sandbox that runs as
    another user must be able to use its workspace)."""
    name = f"{os.getpid()}-{int(time.time())}-"
    path = Path(tempfile.mkdtemp(prefix=name, dir=parent_dir()))
    try:
        if template is not None:
            if not template.is_dir():
                raise WorkspaceError(f"workspace {str(template)!r} is not a directory")
            shutil.copytree(template, path, symlinks=True, dirs_exist_ok=True)
        if owner is not None:
            for entry in [path, *path.rglob("*")]:
                os.chown(entry, *owner, follow_symlinks=False)
    except BaseException:
        remove(path)
        raise
    return path


def remove(path: Path) -> None:
    """Remove a workspace whatever modes a command left in it (a directory without ``w``)."""
    if not path.exists() and not path.is_symlink():
        return
    try:
        shutil.rmtree(path)
    except OSError:
        _make_removable(path)
        shutil.rmtree(path, ignore_errors=True)


def _make_removable(path: Path) -> None:
    """``u+rwx`` on every directory below ``path`` (symlinks are never followed)."""
    try:
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode):
            return
        path.chmod(stat.S_IMODE(info.st_mode) | stat.S_IRWXU)
        children = list(path.iterdir())
    except OSError:
        return
    for child in children:
        _make_removable(child)


@dataclass(frozen=True)
class Leftover:
    """A workspace in ``parent_dir()``: ``owner_alive`` says whether its process still runs."""

    path: Path
    pid: int | None
    created: int
    owner_alive: bool


def owner_alive(pid: int | None, created: int) -> bool:
    """The process ``pid`` runs and started before ``created`` (a reused pid does not count)."""
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        return proc.create_time() <= created + 1 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def parse_name(name: str) -> tuple[int | None, int]:
    """``<pid>-<created>-<random>`` -> ``(pid, created)``; ``(None, 0)`` for another name."""
    parts = name.split("-", 2)
    if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
        return int(parts[0]), int(parts[1])
    return None, 0


def leftovers() -> list[Leftover]:
    """Every workspace the sandbox made for this user, oldest first."""
    found = []
    for path in parent_dir().iterdir():
        pid, created = parse_name(path.name)
        if pid is None:
            continue
        found.append(Leftover(path, pid, created, owner_alive(pid, created)))
    return sorted(found, key=lambda item: (item.created, item.path.name))


def workspace_label(path: Path) -> str:
    """The ``sandboxrun.workspace`` label docker containers on ``path`` carry."""
    from sandboxrun.backends.docker.config import labels

    return labels(path.resolve())["sandboxrun.workspace"]


def cleanup(target: str | None) -> tuple[int, int, int]:
    """Remove leftovers; returns (containers removed, workspaces removed, workspaces kept).

    ``target`` None: every workspace whose eval process is gone, and the sandboxrun containers
    on it (a docker sandbox removes itself when its owner dies; one without a supervisor stays
    until now). ``target``: the workspace of that name, or the one the container whose id
    starts with it is on, even while its eval runs."""
    items = leftovers()
    by_label = {workspace_label(item.path): item for item in items}
    client = _docker()
    try:
        ours = [c for c in _containers(client) if c[1] in by_label]
        if target is None:
            chosen = {item.path: item for item in items if not item.owner_alive}
        else:
            chosen = {item.path: item for item in items if item.path.name == target}
            for cid, label in ours:
                if cid.startswith(target):
                    chosen[by_label[label].path] = by_label[label]
        wanted = {workspace_label(path) for path in chosen}
        removed = 0
        for cid, label in ours:
            if label in wanted and client is not None and _remove_container(client, cid):
                removed += 1
    finally:
        if client is not None:
            client.close()
    for path in chosen:
        remove(path)
    kept = sum(1 for item in items if item.path not in chosen and item.owner_alive)
    return removed, len(chosen), kept


def _remove_container(client: DockerClient, cid: str) -> bool:
    """Remove a container; False when it is already gone (it removes itself once its
    supervisor sees its owner die)."""
    from sandboxrun.backends.docker import api as dockerapi

    try:
        dockerapi.remove_now(client, cid)
    except dockerapi.NotFoundError:
        return False
    return True


def _containers(client: DockerClient | None) -> list[tuple[str, str]]:
    """``(id, workspace label)`` of every sandboxrun container (none without an engine)."""
    from sandboxrun.backends.docker import api as dockerapi

    if client is None:
        return []
    try:
        found = dockerapi.list_labelled(client, "sandboxrun.managed=true", budget_s=10)
    except Exception:  # the engine went away: the workspaces are still ours to remove
        return []
    rows = []
    for item in found:
        labels = item.get("Labels") or {}
        rows.append((str(item.get("Id", "")), str(labels.get("sandboxrun.workspace", ""))))
    return rows


def _docker() -> DockerClient | None:
    """A client of the local engine, or None when there is none (local backends only)."""
    from sandboxrun.backends.docker import api as dockerapi

    try:
        return dockerapi.connect(10)
    except Exception:
        return None
