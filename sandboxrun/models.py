"""Public data models: the policy and limits a caller asks for, and the result contract.

``ExecResult`` is the public contract: ``sandboxrun run --json`` prints exactly
``ExecResult.to_json()``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandboxrun.errors import ExecError

Status = Literal[
    "completed",
    "failed",
    "timed_out",
    "cancelled",
    "spawn_error",
    "sandbox_error",
    "oom_killed",
    "disk_exceeded",
]
KILLED_BY_LIMIT: tuple[Status, ...] = ("oom_killed", "disk_exceeded")
"""The statuses of a command the sandbox killed for a limit it passed (memory, disk)."""
BackendName = Literal["docker", "systemd-scope", "process-group", "fake"]
"""``fake``: ``sandboxrun.testing.FakeBackend``, which runs nothing (for tests)."""
Access = Literal["read-only", "workspace-write", "danger-full-access"]
Network = Literal["none", "on"]
Root = Literal["read-only", "writable"]
TimeoutKind = Literal["wall", "idle"]
"""Which deadline ended a ``timed_out`` run: the wall-clock ``timeout`` or the idle timeout."""

DEFAULT_MAX_OUTPUT = 64 * 1024
DEFAULT_SPILL_MAX = 64 * 1024 * 1024
MIN_CPUS = 0.01
"""A hundredth of a CPU: docker's floor (``nano_cpus`` would round smaller values to 0, no limit
at all) and systemd's (``CPUQuota=`` is in whole percent)."""
MAX_GRACE_S = 600.0

Model = TypeVar("Model", bound=BaseModel)


def replaced(model: Model, **changes: object) -> Model:
    """``model`` with ``changes``, validated as a new one is: pydantic's ``model_copy`` checks
    nothing in its ``update``, so a bad value would reach a run (``ValidationError`` names it
    here instead). For inputs (policy, limits, configs); a finished result is rewritten by the
    engine only (``sandboxrun.engine.results.amend``)."""
    return type(model).model_validate({**model.__dict__, **changes})


class Mount(BaseModel):
    """A host path shown to the command at ``target`` (``--mount SRC:DST[:ro|rw]``):
    read-only unless ``read_only=False``. Checked when the sandbox is made
    (``sandboxrun.engine.mounts``): a missing source, a socket, an engine socket's directory,
    kernel interfaces, a target over the workspace or a relative one are refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    target: str
    read_only: bool = True

    @classmethod
    def parse(cls, spec: str) -> Mount:
        """``SRC:DST[:ro|rw]`` (as ``docker run -v``; the last ``:`` before DST splits, so a
        source may hold ``:``). ``ConfigError`` for anything else."""
        from sandboxrun.errors import ConfigError

        head, sep, mode = spec.rpartition(":")
        if sep and mode in ("ro", "rw") and ":" in head:
            spec = head
        else:
            mode = "ro"
        source, sep, target = spec.rpartition(":")
        if not sep or not source or not target:
            raise ConfigError(f"invalid --mount {spec!r}: expected SRC:DST[:ro|rw]")
        return cls(source=source, target=target, read_only=mode == "ro")

    def shown(self) -> str:
        return f"{self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"


class Policy(BaseModel):
    """What the command may touch. Each backend enforces what it can (``ExecResult.isolation``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    access: Access = "workspace-write"
    network: Network = "none"
    strict: bool = False
    """Refuse to run (``PolicyRefusedError``) when the backend cannot give every guarantee,
    even with ``allow_degraded``."""
    allow_degraded: bool = False
    """Run even when the backend cannot give every guarantee asked for (one warning, and
    ``missing_guarantees`` set). Without it such a run is refused (``PolicyRefusedError``)."""
    mask: tuple[str, ...] = ()
    """More host paths to hide from the command (a directory shown empty, a file unreadable),
    beside the built-in secret paths (``~/.ssh`` ...); inside the workspace on docker too (a
    container sees no other host path). A path that holds the workspace is refused."""
    mask_output: bool = True
    """Replace the values of secret-shaped variables given explicitly (``env=``, ``-e``) in the
    captured and live output with ``[masked:NAME]``."""
    mounts: tuple[Mount, ...] = ()
    """Host paths shown inside beside the workspace (``Mount``; ``"SRC:DST[:ro|rw]"`` strings
    are parsed), on every backend; a secret path under a source stays masked."""
    root: Root = "read-only"
    """The file system outside the workspace and mounts: ``read-only``; ``writable``, an
    ephemeral root (docker: the container's own layer) that the commands may change
    (``pip install``, ``apt-get``, ``adduser`` as ``user="0"``), discarded with the sandbox
    (a recycle starts a fresh one); the host's files stay untouched. Bounded by
    ``Limits.disk_bytes``. The guarantee ``ephemeral-root``: a backend that cannot give it
    refuses the sandbox (the local ones here: no overlay)."""
    workspace_at: Literal["sandbox", "host"] = "sandbox"
    """Where the commands start and see the workspace: ``sandbox``, ``/workspace`` on every
    backend (the local ones bind it there too, its host path kept); ``host``, its host path as
    their working directory on the local backends (docker has only ``/workspace``)."""

    @field_validator("mounts", mode="before")
    @classmethod
    def _parse_mounts(cls, value: object) -> object:
        if isinstance(value, (list, tuple)):
            return tuple(Mount.parse(v) if isinstance(v, str) else v for v in value)
        return value


class Limits(BaseModel):
    """Time, output and resource limits of a run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(default=120.0, gt=0)
    max_timeout_s: float | None = Field(default=None, gt=0)
    """The largest timeout a command may ask for (a larger one is refused, never shortened);
    None: no ceiling. An operator's cap (``--max-timeout``, ``SANDBOXRUN_MAX_TIMEOUT``)."""
    grace_s: float = Field(default=3.0, ge=0, le=MAX_GRACE_S)
    drain_s: float = Field(default=2.0, ge=0)
    max_output: int = Field(default=DEFAULT_MAX_OUTPUT, ge=64)
    spill_max: int = Field(default=DEFAULT_SPILL_MAX, ge=0)
    spill_dir: Path | None = None
    memory_bytes: int | None = Field(default=None, gt=0)
    cpus: float | None = None  # at least MIN_CPUS (validated below)
    pids: int | None = Field(default=None, gt=0)
    disk_bytes: int | None = Field(default=None, ge=1 << 20)
    """The most a writable root (``Policy.root``) may hold, at least 1 MiB. Docker: where its
    storage driver takes a size, a write past it fails (ENOSPC); elsewhere past it every
    command running in the sandbox is killed (``disk_exceeded``) and its root discarded (the
    next command gets a fresh one). The guarantee ``disk-limit``. None: no bound."""
    idle_timeout_s: float | None = None
    """End the run like a timeout (``timeout_kind="idle"``) once neither stdout nor stderr has
    had a byte for this many seconds; time a slow live reader holds the command back does not
    count. None: no idle timeout (validated below: positive and finite)."""

    @field_validator("timeout_s", "max_timeout_s", "grace_s", "drain_s", "cpus")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("cpus")
    @classmethod
    def _cpus_floor(cls, value: float | None) -> float | None:
        if value is not None and value < MIN_CPUS:
            raise ValueError(f"must be at least {MIN_CPUS} (a hundredth of a CPU), got {value:g}")
        return value

    @field_validator("idle_timeout_s")
    @classmethod
    def _idle_positive(cls, value: float | None) -> float | None:
        return check_idle_timeout(value)

    def with_idle_timeout(self, idle_timeout_s: float | None) -> Limits:
        """These limits with ``idle_timeout_s`` instead (None: unchanged); ``ValueError`` when
        it is not a positive finite number of seconds."""
        if idle_timeout_s is None:
            return self
        try:
            checked = check_idle_timeout(float(idle_timeout_s))
        except ValueError as exc:
            raise ValueError(f"idle_timeout {exc}") from None
        return replaced(self, idle_timeout_s=checked)

    @model_validator(mode="after")
    def _timeout_within_cap(self) -> Limits:
        if self.max_timeout_s is not None and self.timeout_s > self.max_timeout_s:
            raise ValueError(
                f"timeout_s={self.timeout_s:g} is above max_timeout_s={self.max_timeout_s:g} "
                "(a timeout is never shortened: raise max_timeout_s)"
            )
        return self

    def effective_timeout(self, timeout_s: float | None) -> float:
        """The timeout of one command: the given one, or ``timeout_s``. ``ValueError`` naming
        ``timeout`` when it is not a positive finite number of seconds or is above
        ``max_timeout_s`` (it is refused, never shortened)."""
        chosen = self.timeout_s if timeout_s is None else timeout_s
        if not math.isfinite(chosen) or chosen <= 0:
            raise ValueError(f"timeout must be a positive finite number of seconds, got {chosen}")
        if self.max_timeout_s is not None and chosen > self.max_timeout_s:
            raise ValueError(
                f"timeout={chosen:g} is above max_timeout_s={self.max_timeout_s:g} (a timeout "
                "is never shortened: raise Limits.max_timeout_s to allow it)"
            )
        return chosen


def check_idle_timeout(value: float | None) -> float | None:
    """An idle timeout must be None or a positive finite number of seconds."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a positive finite number of seconds, got {value:g}")
    return value


LIMIT_GUARANTEES = ("memory-limit", "cpu-limit", "pids-limit")
"""Every resource-limit guarantee, by the names ``isolation`` uses."""


def limit_guarantees(limits: Limits) -> list[str]:
    """The resource-limit guarantees ``limits`` ask for (``memory-limit``, ``cpu-limit``,
    ``pids-limit``), by the names ``isolation`` uses."""
    wanted: list[str] = []
    if limits.memory_bytes is not None:
        wanted.append("memory-limit")
    if limits.cpus is not None:
        wanted.append("cpu-limit")
    if limits.pids is not None:
        wanted.append("pids-limit")
    return wanted


def required_guarantees(policy: Policy, limits: Limits) -> list[str]:
    """The isolation guarantees a policy and limits ask for, by the names ``isolation`` uses."""
    wanted: list[str] = []
    ephemeral = ["ephemeral-root"] if policy.root == "writable" else []
    bounded = ["disk-limit"] if limits.disk_bytes is not None else []
    if policy.access == "danger-full-access":  # the caller asked for no isolation at all
        # (but a writable root it asks for is one whose writes are thrown away, and bounded)
        return limit_guarantees(limits) + ephemeral + bounded
    if policy.access == "read-only":
        wanted.append("read-only-workspace")
    wanted += ephemeral or ["read-only-root"]
    wanted.append("seccomp")  # no setuid/setgid file, no device node left in the workspace
    if policy.network == "none":
        wanted.append("network-none")
    return wanted + limit_guarantees(limits) + bounded


DenialKind = Literal["filesystem", "network", "syscall", "disk-full", "pids-limit", "memory-limit"]


class Denial(BaseModel):
    """The sandbox, not the program, refused something the command needed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: DenialKind
    evidence: str
    """The line of output (or the fact) that shows it."""
    message: str
    """One sentence for people: what the sandbox refused, and the wider policy that allows it."""
    escalate_to: Policy | None = None
    """The narrowest wider policy under which the command would not be refused (None when
    no policy helps, e.g. a limit was hit)."""


class ExecResult(BaseModel):
    """What happened to one command. A non-zero exit is data: call ``check()`` to raise."""

    model_config = ConfigDict(extra="forbid")

    status: Status
    exit_code: int | None = None
    signal: str | None = None
    timed_out: bool = False
    timeout_kind: TimeoutKind | None = None
    """For a ``timed_out`` run, the deadline that fired: ``wall`` (``timeout``) or ``idle``
    (no output for ``Limits.idle_timeout_s``; ``error`` says so). None otherwise."""
    duration_s: float
    cpu_s: float | None = None
    peak_rss_bytes: int | None = None
    stdout: str = ""
    stdout_total_bytes: int = 0
    stdout_dropped_bytes: int = 0
    stdout_truncated: bool = False
    stdout_spill: str | None = None
    stdout_spill_complete: bool = True
    stderr: str = ""
    stderr_total_bytes: int = 0
    stderr_dropped_bytes: int = 0
    stderr_truncated: bool = False
    stderr_spill: str | None = None
    stderr_spill_complete: bool = True
    backend: BackendName
    isolation: list[str] = Field(default_factory=list)
    missing_guarantees: list[str] = Field(default_factory=list)
    fallback_reason: str | None = None
    via: str | None = None
    """How the command was started: ``supervisor`` (the sandbox's supervisor: inside the
    container on docker, the sandbox's runner on process-group), ``engine`` (a docker exec
    through the Engine API: an image without python3, or a remote engine), ``scope`` (a
    systemd-run scope); None for runs that never reached a backend."""
    tty: bool = False
    """The command ran on a terminal (``Sandbox.open_terminal``): ``stdout`` is its transcript
    (the terminal merges the streams; ``stderr`` is empty)."""
    survivors: int = 0
    argv: list[str]
    run_id: str
    error: str | None = None
    """Human-readable detail for ``spawn_error`` / ``sandbox_error``, an idle timeout ("no
    output for 5s (idle timeout)") and survivors, else null."""
    denial: Denial | None = None
    """Set when the command failed because the sandbox refused something or a limit was hit;
    an ordinary failure of the program leaves it None."""
    escalated_from: Policy | None = None
    """Set on the result of a re-run after an approved escalation: the policy that refused the
    first run."""
    warnings: list[str] = Field(default_factory=list)
    """Trouble that did not change what happened to the command: a spill file that could not be
    written, a live sink that failed. The output accounting fields say what it cost."""

    def to_json(self) -> str:
        """One compact JSON object (``--json``). Unlike ``model_dump_json`` it never fails on
        text holding bytes that are not UTF-8 (an argv, a path: Python keeps them as lone
        surrogates, PEP 383): each such byte ``0xNN`` is written as the escape ``\\udcNN``, so
        ``os.fsencode(json.loads(text)["argv"][i])`` gives the exact bytes back. The text is
        valid UTF-8; every other character is written as itself."""
        text = json.dumps(self.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8", "backslashreplace").decode("utf-8")

    def check(self) -> ExecResult:
        """Return ``self`` when ``completed``, else raise ``ExecError`` carrying this result."""
        if self.status != "completed":
            raise ExecError(self)
        return self

    @property
    def ok(self) -> bool:
        return self.status == "completed"
