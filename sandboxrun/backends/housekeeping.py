"""``sandboxrun ps`` and ``sandboxrun clean``: managed containers and scopes whose owner is gone.

Only containers labelled ``sandboxrun.managed=true`` and units named ``sandboxrun-*.scope`` are
ever listed or touched. A container's owner is alive when it was created on this host and its
``owner_pid`` is a live process that started before the container was created (so a reused pid
does not count); a scope's owner (pid and start time) is in its Description.
"""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass

import psutil

from sandboxrun.backends.docker import api as dockerapi
from sandboxrun.backends.docker.api import Client as DockerClient
from sandboxrun.backends.docker.config import LABEL
from sandboxrun.backends.systemd import config as systemd_config
from sandboxrun.errors import BackendError


@dataclass(frozen=True)
class Managed:
    id: str
    name: str
    status: str
    owner_pid: int | None
    owner_host: str
    created: int
    owner_alive: bool


def owner_alive(labels: dict[str, str], *, host: str | None = None) -> bool:
    if labels.get("sandboxrun.owner_host") != (host or socket.gethostname()):
        return True  # another host's owner: we cannot tell, so it is never ours to remove
    try:
        pid = int(labels.get("sandboxrun.owner_pid", ""))
        created = int(labels.get("sandboxrun.created", "0"))
        proc = psutil.Process(pid)
        return proc.create_time() <= created + 1 and proc.status() != psutil.STATUS_ZOMBIE
    except (ValueError, psutil.Error):
        return False


def list_managed(client: DockerClient) -> list[Managed]:
    found = dockerapi.list_labelled(client, f"{LABEL}=true")
    rows = []
    for item in found:
        labels = dict(item.get("Labels") or {})
        pid = labels.get("sandboxrun.owner_pid", "")
        rows.append(
            Managed(
                id=str(item["Id"]),
                name=str((item.get("Names") or ["?"])[0]).lstrip("/"),
                status=str(item.get("Status", "")),
                owner_pid=int(pid) if pid.isdigit() else None,
                owner_host=labels.get("sandboxrun.owner_host", ""),
                created=int(labels.get("sandboxrun.created", "0") or 0),
                owner_alive=owner_alive(labels),
            )
        )
    return rows


def remove(client: DockerClient, container_id: str) -> None:
    """Force-remove a managed container (``dockerapi.NotFoundError``: gone already)."""
    dockerapi.remove_now(client, container_id)


@dataclass(frozen=True)
class ManagedScope:
    unit: str
    state: str
    owner_pid: int | None
    owner_alive: bool


def scope_owner_alive(owner: tuple[int, int] | None) -> bool:
    """The process that started a scope still runs (same pid and start time)."""
    if owner is None:
        return False
    pid, started = owner
    try:
        proc = psutil.Process(pid)
        return abs(int(proc.create_time()) - started) <= 1 and proc.status() != "zombie"
    except psutil.Error:
        return False


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    from sandboxrun.backends.systemd.backend import systemctl

    try:
        return systemctl(*args)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BackendError(f"systemctl {' '.join(args)}: {exc}") from exc


def list_scopes() -> list[ManagedScope]:
    """sandboxrun's transient scopes known to this user's (or, as root, the system) manager."""
    pattern = f"{systemd_config.UNIT_PREFIX}*{systemd_config.UNIT_SUFFIX}"
    shown = _systemctl("show", "-p", "Id", "-p", "Description", "-p", "ActiveState", pattern)
    rows = []
    for unit in systemd_config.parse_units(shown.stdout):
        if not systemd_config.is_our_unit(unit["Id"]) or unit.get("ActiveState") == "inactive":
            continue
        owner = systemd_config.owner_of(unit.get("Description", ""))
        rows.append(
            ManagedScope(
                unit=unit["Id"],
                state=unit.get("ActiveState", "?"),
                owner_pid=None if owner is None else owner[0],
                owner_alive=scope_owner_alive(owner),
            )
        )
    return rows


def stop_scope(unit: str) -> None:
    """Stop a leftover scope: TERM, its grace (``TimeoutStopSec``), KILL; then it is gone."""
    if not systemd_config.is_our_unit(unit):
        raise ValueError(f"{unit} is not a sandboxrun unit")
    try:
        stopped = _systemctl("stop", unit)
    except BackendError:
        stopped = None
    if stopped is None or stopped.returncode != 0:
        _systemctl("kill", "--kill-whom=all", "--signal=SIGKILL", unit)
