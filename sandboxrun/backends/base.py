"""The backend contract: ``Backend``, what a probe says (``Probe``) and what a backend is created
for (``Context``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sandboxrun.backends.local.isolation import HostSupport

if TYPE_CHECKING:
    from sandboxrun.backends.client import RunnerClient
    from sandboxrun.backends.local.isolation import LocalPlan
from sandboxrun.engine.launch import Launch, Stdio
from sandboxrun.engine.paths import Workspace
from sandboxrun.engine.request import ExecRequest
from sandboxrun.engine.results import Verdict
from sandboxrun.engine.supervise import RunHandle, Supervision
from sandboxrun.models import BackendName, Limits, Policy

log = logging.getLogger("sandboxrun")


class Archive(Protocol):
    """A container's files through its engine's archive API (``backends.docker.api.Archive``):
    ``BackendError`` with the engine's words when it fails."""

    def stat(self, path: str) -> dict[str, Any] | None:
        """``mode``, ``size``, ``linkTarget`` of ``path`` (a last symlink not followed); None
        when missing."""
        ...

    def get(self, path: str) -> Any | None:
        """A tar stream of ``path``, with ``read`` and ``close``; None when it is missing."""
        ...

    def put(self, directory: str, tar: bytes) -> None:
        """Unpack ``tar`` into ``directory``."""
        ...


@dataclass(frozen=True)
class ContainerAccess:
    """How the files API reaches a container sandbox without its supervisor."""

    container_id: str | None
    init_pid: int | None
    """The container's PID 1 on this host (its ``/proc/<pid>/root``), when the engine is local."""
    local: bool
    """The engine runs on this host (else only the archive API reaches the files)."""
    archive: Archive | None
    """The engine's archive API on this container (None once closed)."""
    user: str
    """``uid:gid`` the sandbox's commands run as (files made for it are given to it)."""


@dataclass(frozen=True)
class SandboxView:
    """What the files API (and the inspect provider) may use of an open sandbox: no backend
    attribute is read behind this (``Backend.view``)."""

    home: str | None
    """The sandbox's default ``HOME`` (None: the host's)."""
    supervisor: RunnerClient | None
    """Opens paths in the sandbox's own view (its mounts and namespaces), when it has one."""
    host_plan: LocalPlan | None = None
    """A local sandbox: its isolation plan (what of this host it sees, and may write)."""
    container: ContainerAccess | None = None
    """A container sandbox."""


@dataclass(frozen=True)
class Probe:
    backend: BackendName
    available: bool
    reason: str | None
    """Why it is unavailable (None when available)."""
    isolation: tuple[str, ...]
    """The guarantees this backend can give, by ``ExecResult.isolation`` names."""
    support: HostSupport | None = None
    """For the local backends: what this host's isolation layer can give, and why not."""


class Backend(Protocol):
    """One sandbox: created for a ``Context``, opened once, then many runs, each driven by
    ``engine.run`` (plan -> start -> supervise -> finalize). Raises only ``SandboxrunError``."""

    name: BackendName

    def __init__(self, ctx: Context) -> None:
        """One signature for every backend (the registry creates them all alike)."""

    async def open(self) -> None:
        """Acquire what the backend needs. A failure releases whatever was acquired."""

    async def revive(self) -> None:
        """Before a call uses the sandbox: replace a supervisor (container, holder) found
        dead, stopped or tampered with. Cancellable; never half done."""

    def plan(self, request: ExecRequest) -> Launch:
        """How ``request`` would run here, computed once: argv, env, cwd, the guarantees
        really enforced, ``via``, and the whole argv for ``--dry-run``. Pure; raises an
        ``InputError`` when this backend cannot carry the request exactly (bytes that are not
        UTF-8 through docker's JSON API)."""

    async def start(self, launch: Launch, stdio: Stdio) -> RunHandle:
        """Start the command (called shielded). ``NotStarted`` for a run that ended before
        its command began (``spawn_error``, ``sandbox_error``); on any failure whatever it
        acquired is released."""

    async def finalize(self, handle: RunHandle, sup: Supervision) -> Verdict:
        """After supervision (shielded; bounded; never raises): release what the run held
        and say what really happened (an OOM kill, the sandbox's death, limits lost)."""

    def view(self) -> SandboxView:
        """What the files API may use now (after ``revive``, a fresh one)."""

    async def close(self) -> list[str]:
        """Release everything; bounded, safe to call twice. Returns what could not be
        released (a container left behind), one sentence each."""


@runtime_checkable
class Resettable(Protocol):
    """A backend whose open sandbox a pool may hand to its next holder in place
    (``api.pool_reset``): the processes of the sandbox are all visible to it, and its scratch
    directories are its own."""

    scratch: tuple[str, ...]
    """Directories private to the sandbox that its commands may write, empty at open."""

    def strays(self) -> int | None:
        """With no run in progress: kill every process of the sandbox beyond its own and say
        how many could not be; None when that cannot be known. Blocking."""
        ...


@dataclass(frozen=True)
class Context:
    """What a backend is created for: one sandbox's workspace, policy, limits and options."""

    workspace: Workspace
    policy: Policy
    limits: Limits
    image: str | None = None
    user: str | None = None
    path_prepend: tuple[str, ...] = ()
