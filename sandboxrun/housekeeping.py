"""``sandboxrun ps`` and ``sandboxrun clean``: managed containers whose owner is gone.

Only containers labelled ``sandboxrun.managed=true`` are ever listed or touched. A container's
owner is alive when it was created on this host and its ``owner_pid`` is a live process that
started before the container was created (so a reused pid does not count).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import psutil
from docker import DockerClient

from sandboxrun import dockerapi
from sandboxrun.backends.docker_config import LABEL


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
    found = dockerapi.retrying(
        lambda: client.api.containers(all=True, filters={"label": f"{LABEL}=true"}),
        what="list managed containers",
    )
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
    dockerapi.retrying(
        lambda: client.api.remove_container(container_id, force=True, v=True),
        what=f"remove container {container_id[:12]}",
    )
