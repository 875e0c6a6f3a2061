"""``ContainerSession``: what the docker backend and its engine-path runs share of one sandbox
container. The backend owns it (opens, recycles and closes the container); a run
(``engine_exec.DockerRun``) reads it and marks it, and never reaches into the backend."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from sandboxrun.backends.docker import api as dockerapi
from sandboxrun.errors import BackendError
from sandboxrun.supervisor import procfs as proctree

FORWARDED_DEATHS = proctree.signal_bits(
    signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2
)
"""Signals the engine's init (tini) passes on to its child."""


class ContainerSession:
    """The sandbox container as this process knows it, kept across recycles (a recycle
    refills it: ``reset``)."""

    def __init__(self, user: str) -> None:
        self.user = user
        """``uid:gid`` every exec runs as."""
        self.client: dockerapi.Client | None = None
        """The engine client (None before open and once closed)."""
        self.container_id: str | None = None
        self.local = False
        """The engine runs on this host: its processes are in our /proc."""
        self.init_pid: int | None = None
        """The container's PID 1 on this host (local engines)."""
        self.keep: frozenset[int] = frozenset()
        """The container's own processes below its init (its main process, an entrypoint's
        chain above the supervisor): never a run's to kill."""
        self.supervisor_pid: int | None = None
        """The in-container supervisor's host pid (local engines), once it connected."""
        self.cgroup_procs: str | None = None
        """The container cgroup's ``cgroup.procs`` (local engines)."""
        self.run_cgroup_base: Path | None = None
        """The container's cgroup v2 directory, when each exec gets a child cgroup there."""
        self.active: set[str] = set()
        """The runs in progress (a recycle waits for them)."""
        self.recycle_needed = False
        """Set when the container was seen dying: the next command gets a new one."""
        self.disk_exceeded: str | None = None
        """Why the container was killed: its writable root passed ``--disk`` (the runs it
        ended say so, ``disk_exceeded``)."""

    def reset(self) -> None:
        """Forget the processes of a container that is being replaced."""
        self.keep, self.init_pid, self.supervisor_pid = frozenset(), None, None
        self.disk_exceeded = None

    def api(self) -> dockerapi.Client:
        """The client, or ``BackendError`` once the sandbox was closed."""
        if self.client is None:
            raise BackendError("docker: the sandbox was closed")
        return self.client

    def require(self) -> tuple[dockerapi.Client, str]:
        """``(client, container id)``, or ``BackendError`` once the sandbox was closed (a run
        may still be ending then: its caller turns that into "gone", never a crash)."""
        client, cid = self.client, self.container_id
        if client is None or cid is None:
            raise BackendError("docker: the sandbox container is gone (the sandbox was closed)")
        return client, cid

    def dying(self) -> bool:
        """Whether the container's own processes (init, main) are gone: read from /proc, so it
        shows at once what the engine reports a moment later (local engines only). One that
        holds a death it has not acted on yet counts as gone (a loaded CPU may not have run it
        to its end when the exec that sent it has exited): a SIGKILL (``kill -9 -1``), or, for
        the engine's init (no supervisor), a signal it forwards to its one child that the
        child does not handle (``kill 1``: the ``sleep`` dies of it, the init follows). The
        supervisor, PID 1 otherwise, outlives every signal."""
        if not self.init_pid:
            return False
        init_deaths = proctree.SIGKILL_BIT
        if self.supervisor_pid is None and len(self.keep) == 1:
            init_deaths |= proctree.default_deaths(next(iter(self.keep)), FORWARDED_DEATHS)
        if not proctree.living(self.init_pid, init_deaths):
            return True
        rest = (*self.keep, *([self.supervisor_pid] if self.supervisor_pid else []))
        return not all(proctree.living(pid) for pid in rest)

    def state(self) -> dict[str, Any]:
        """The engine's ``State`` of the container."""
        client, cid = self.require()
        return dict(dockerapi.inspect_container(client, cid).get("State") or {})
