"""The ``sandboxrun`` inspect_ai sandbox's configuration: ``sandbox=("sandboxrun", "cfg.yaml")``.

Pure apart from reading the YAML file: the model, its loading (a file name, a model, a dict or
nothing), and what it becomes for ``Sandbox``: ``Policy``, ``Limits`` and the workspace
directory. Every field is documented in docs/inspect.md.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sandboxrun.errors import ConfigError
from sandboxrun.models import Access, Limits, Mount, Network, Policy, Root, replaced
from sandboxrun.units import parse_size

NO_TIMEOUT_S = 30 * 86400.0
"""What an ``exec`` without a timeout runs under when ``default_timeout`` is None (inspect's
own providers have no limit then; sandboxrun's run always has one): 30 days."""

CONFIG_FILES = (
    "sandboxrun.yaml",
    "sandboxrun.yml",
    "compose.yaml",
    "compose.yml",
    "docker-compose.yaml",
    "docker-compose.yml",
    "Dockerfile",
)
"""Found next to the task file when ``sandbox="sandboxrun"`` names no file, the first that
exists (sandboxrun's own, then what inspect's docker sandbox looks for: listing
``compose.yaml`` makes the provider docker-compatible, so ``--sandbox sandboxrun`` takes a
docker task's Dockerfile or compose file)."""


class SandboxrunConfig(BaseModel):
    """One sandbox per sample, made from these settings (docs/inspect.md lists each one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["docker", "auto", "process-group", "systemd-scope"] = "docker"
    image: str | None = None
    """Docker image (default: sandboxrun's ``sandboxrun/base:latest``)."""
    image_from: str | None = None
    """A Dockerfile, or a directory with one, the image is built from (once per content, as
    ``sandboxrun run --image-from``); instead of ``image``. Relative: to the config file."""
    dockerfile: str | None = None
    """With ``image_from`` a directory: its Dockerfile, relative to it (compose's
    ``build.dockerfile``; default ``Dockerfile``)."""
    working_dir: str | None = None
    """Where a command without a ``cwd`` runs, and what a relative ``cwd`` or file path is
    relative to (compose's ``working_dir``; default: the workspace)."""
    user: str | None = None
    """Docker ``UID[:GID]`` every command runs as (default: sandboxrun's: the invoking user,
    or the workspace's owner when the invoker is root)."""
    workspace: str | None = None
    """A host directory for ``/workspace``: copied into each sample's private workspace
    (``workspace_mode: copy``) or used in place by every sample (``shared``). None: each
    sample starts from an empty private directory. Relative: to the config file."""
    workspace_mode: Literal["copy", "shared"] = "copy"
    access: Access = "workspace-write"
    network: Network = "none"
    allow_degraded: bool = False
    root: Root = "read-only"
    """``writable``: an ephemeral root (``Policy.root``; docker only), for tasks that install
    their dependencies (``pip``, ``apt-get``, ``adduser`` with ``user: "0"``)."""
    disk: str | int | None = None
    """With a writable root, the most it may hold: bytes or ``512m``/``2g`` (``--disk``)."""
    memory: str | int | None = None
    """Memory limit, bytes or ``512m``/``2g`` (docker's default: 2g)."""
    cpus: float | None = None
    pids: int | None = Field(default=None, gt=0)
    grace: float = Field(default=3.0, ge=0)
    """Seconds between TERM and KILL when a command times out."""
    default_timeout: float | None = None
    """Seconds for an ``exec`` that gives no timeout (None: no limit, as inspect's providers)."""
    mounts: list[str] = Field(default_factory=list)
    """Host paths shown inside, ``SRC:DST[:ro|rw]`` as ``--mount`` (read-only unless ``:rw``;
    a relative SRC: to the config file)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables every command gets (an ``exec``'s own ``env`` wins)."""
    pass_env: list[str] = Field(default_factory=list)
    """Host variables to copy into every command (none by default: not even the host's
    ``PATH``, ``HOME`` or ``LANG``; secret-shaped names are refused)."""
    mask_output: bool = True
    """Mask the values of secret-shaped variables of ``env`` in the output."""
    login: Literal["snapshot", "each"] = "snapshot"
    login_shell: str | None = None

    @field_validator("default_timeout", "cpus", "grace")
    @classmethod
    def _finite_positive(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("default_timeout")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("must be a positive number of seconds")
        return value

    @field_validator("working_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must be an absolute path in the sandbox")
        return value

    def policy(self) -> Policy:
        return Policy(
            access=self.access,
            network=self.network,
            allow_degraded=self.allow_degraded,
            mask_output=self.mask_output,
            mounts=tuple(Mount.parse(spec) for spec in self.mounts),
            root=self.root,
        )

    def limits(self) -> Limits:
        """``Limits`` for the sandbox; the output limit is set per command (inspect's own, a
        context variable), spill files are off: inspect keeps no file of a command's output."""
        memory, disk = self.memory, self.disk
        if isinstance(memory, str):
            memory = parse_size(memory, what="memory")
        if isinstance(disk, str):
            disk = parse_size(disk, what="disk")
        timeout = self.default_timeout or NO_TIMEOUT_S
        try:
            return Limits(
                timeout_s=timeout,
                grace_s=self.grace,
                spill_max=0,
                memory_bytes=memory,
                disk_bytes=disk,
                cpus=self.cpus,
                pids=self.pids,
            )
        except ValidationError as exc:
            raise ConfigError(f"invalid sandboxrun config: {_first_error(exc)}") from None

    def workspace_path(self) -> Path | None:
        return None if self.workspace is None else Path(self.workspace)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])


def parse_config(data: Any, *, base: Path | None = None) -> SandboxrunConfig:
    """A config from a mapping (YAML's or a serialized model's). ``base``: the directory a
    relative ``workspace`` is relative to (the config file's); it is made absolute here."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"invalid sandboxrun config: expected a mapping, got {type(data).__name__}"
        )
    try:
        config = SandboxrunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid sandboxrun config: {_first_error(exc)}") from None
    for field in ("workspace", "image_from"):
        value = getattr(config, field)
        if value is not None:
            path = Path(value).expanduser()
            if not path.is_absolute() and base is not None:
                path = base / path
            config = replaced(config, **{field: str(path)})
    if config.mounts:
        config = replaced(config, mounts=[_relative_mount(m, base) for m in config.mounts])
        config.policy()  # each parsed now (the paths are checked when a sample opens)
    if config.user is not None:  # checked now: not after a build, at the first sample
        from sandboxrun.backends.docker.config import parse_user

        try:
            parse_user(config.user)
        except ConfigError as exc:
            raise ConfigError(f"invalid sandboxrun config: user: {exc}") from None
    if config.image is not None and config.image_from is not None:
        raise ConfigError("invalid sandboxrun config: give image or image_from, not both")
    if config.dockerfile is not None and config.image_from is None:
        raise ConfigError("invalid sandboxrun config: dockerfile needs image_from")
    if config.image_from is not None and config.backend not in ("docker", "auto"):
        raise ConfigError(
            f"invalid sandboxrun config: image_from needs the docker backend, not {config.backend}"
        )
    config.limits()  # every field checked now, not at the first sample
    return config


def _relative_mount(spec: str, base: Path | None) -> str:
    mount = Mount.parse(spec)
    source = Path(mount.source).expanduser()
    if not source.is_absolute() and base is not None:
        source = base / source
    return Mount(source=str(source), target=mount.target, read_only=mount.read_only).shown()


def from_compose(
    data: Any, *, where: str, base: Path, metadata: Mapping[str, Any] | None = None
) -> SandboxrunConfig:
    """A config from a compose file's mapping (one service: ``compose.settings``), with the
    host's variables and the sample's metadata (``SAMPLE_METADATA_<KEY>``, as inspect's
    docker sandbox names them) substituted in it."""
    from sandboxrun.integrations.inspect import compose

    env = dict(os.environ)
    for key, value in (metadata or {}).items():
        env[f"SAMPLE_METADATA_{str(key).replace(' ', '_').upper()}"] = str(value)
    return parse_config(compose.settings(data, where=where, base=base, env=env), base=base)


def load_config(
    config: BaseModel | str | None, metadata: Mapping[str, Any] | None = None
) -> SandboxrunConfig:
    """What inspect hands the provider: None (defaults), a ``SandboxrunConfig`` (or another
    model with the same fields), or the path of a YAML file (made absolute by inspect).
    ``metadata``: the sample's, substituted in a compose file."""
    if config is None:
        return parse_config({})
    if isinstance(config, BaseModel):
        if "services" in type(config).model_fields:  # inspect's ComposeConfig
            dumped = config.model_dump(exclude_none=True, by_alias=True)
            return from_compose(dumped, where="the compose config", base=Path.cwd())
        return parse_config(config.model_dump(), base=Path.cwd())
    import yaml

    from sandboxrun.integrations.inspect.compose import is_compose_file, is_dockerfile

    path = Path(config)
    if is_dockerfile(path.name):  # as inspect's docker sandbox: the image is built from it
        if not path.is_file():
            raise ConfigError(f"cannot read the Dockerfile {config!r}: no such file")
        return parse_config({"image_from": str(path.resolve())})
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the sandboxrun config {config!r}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"the sandboxrun config {config!r} is not valid YAML: {exc}") from None
    base = path.resolve().parent
    if is_compose_file(path.name) or (isinstance(data, dict) and "services" in data):
        return from_compose(data, where=path.name, base=base, metadata=metadata)
    return parse_config(data, base=base)
