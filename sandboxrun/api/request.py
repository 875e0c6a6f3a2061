"""One command validated into an ``ExecRequest`` (``Sandbox._prepare``): the checks of its
argv, script, variables and workdir, and the request built from them and the sandbox's own
options (``Defaults``). Nothing runs here and nothing is read but the workspace's paths: every
bad input is a ``ConfigError`` naming it, before any process starts."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sandboxrun.engine.argv import join_path_prepend, validate_argv
from sandboxrun.engine.env import build_env
from sandboxrun.engine.paths import Workspace
from sandboxrun.engine.request import ExecRequest, LoginMode, Sink
from sandboxrun.errors import ConfigError
from sandboxrun.models import Limits, Mount, Policy


def check_encodable(value: str) -> None:
    """Arguments, scripts and variables must be encodable for the OS (no lone surrogates)."""
    try:
        os.fsencode(value)
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{value!r} cannot be passed to a process: {exc.reason}") from None


def mapped_masks(masks: tuple[str, ...], workspace: Workspace) -> tuple[str, ...]:
    """``--mask /workspace/x``, as the commands see the workspace, is the workspace's ``x``
    (where this host has no ``/workspace`` of its own: a host path stays a host path)."""
    from sandboxrun.engine.paths import CONTAINER_ROOT, host_has_container_root

    if host_has_container_root():
        return masks
    out = []
    for mask in masks:
        norm = os.path.normpath(mask) if mask.startswith("/") else mask
        if norm == str(CONTAINER_ROOT) or norm.startswith(f"{CONTAINER_ROOT}/"):
            mask = str(workspace.to_host(norm))
        out.append(mask)
    return tuple(out)


def check_mask(mask: str, root: Path) -> None:
    """A ``mask`` path must be absolute-able, and may not hold the workspace (it could not be
    hidden from a command that works in it)."""
    check_encodable(mask)
    if not mask or "\0" in mask:
        raise ConfigError(f"invalid --mask {mask!r}: expected a path")
    real = Path(os.path.realpath(mask))
    if root.is_relative_to(real):
        raise ConfigError(
            f"invalid --mask {mask!r}: it holds the workspace {str(root)!r}, which the command "
            "works in (mask a path inside it, or beside it)"
        )


def checked_mounts(policy: Policy, root: Path) -> tuple[Mount, ...]:
    """``policy.mounts`` checked (``engine.mounts.checked``) against the workspace ``root``
    and the sockets no sandbox may reach; their sources resolved."""
    from sandboxrun.backends.secrets import door_sockets, secret_paths
    from sandboxrun.engine import mounts
    from sandboxrun.engine.paths import CONTAINER_ROOT

    return mounts.checked(
        policy.mounts,
        workspace=root,
        inside=str(CONTAINER_ROOT),
        sockets=door_sockets(os.environ),
        secrets=[*secret_paths(os.environ), *map(Path, policy.mask)],
    )


def new_run_id() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True)
class Defaults:
    """What a sandbox gives each of its commands."""

    workspace: Workspace
    policy: Policy
    limits: Limits
    env: Mapping[str, str]
    """The sandbox's own variables (``Sandbox(env=...)``)."""
    pass_env: Sequence[str]
    pass_proxy: bool
    path_prepend: Sequence[str]
    host_env: Mapping[str, str]
    login: LoginMode
    base: Callable[[], dict[str, str]]
    """The environment of a command that adds no variables (built once by the sandbox)."""


def build(
    defaults: Defaults,
    argv: Sequence[str] | None,
    *,
    shell: str | None,
    workdir: str | None,
    env: Mapping[str, str] | None,
    pass_env: Sequence[str],
    timeout: float | None,
    stdin: bytes | None,
    path_prepend: Sequence[str],
    sink: Sink | None,
    idle_timeout: float | None,
) -> ExecRequest:
    """The request of one command (``Sandbox._prepare`` documents the options)."""
    if (argv is None) == (shell is None):
        raise ConfigError("give exactly one of an argv list or shell='script'")
    if shell is not None and "\0" in shell:
        raise ConfigError("the shell script contains a NUL byte")
    for value in [*(argv or []), shell or "", workdir or "", *(env or {}).values(), *(env or {})]:
        check_encodable(value)
    workspace = defaults.workspace
    cwd = workspace.resolve_workdir(workdir)
    prepend = [*defaults.path_prepend, *path_prepend]
    if prepend:
        join_path_prepend(prepend)
    explicit = {**defaults.env, **(env or {})}
    if env or pass_env:
        built = build_env(
            defaults.host_env,
            explicit=explicit,
            pass_through=[*defaults.pass_env, *pass_env],
            pass_proxy=defaults.pass_proxy,
        )
    else:
        built = defaults.base()
    try:
        timeout_s = defaults.limits.effective_timeout(timeout)
        limits = defaults.limits.with_idle_timeout(idle_timeout)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return ExecRequest(
        run_id=new_run_id(),
        argv=None if argv is None else validate_argv(argv),
        script=shell,
        env=built,
        path_prepend=prepend,
        workdir=cwd,
        workdir_rel=PurePosixPath(cwd.relative_to(workspace.root).as_posix()),
        stdin=stdin,
        timeout_s=timeout_s,
        limits=limits,
        policy=defaults.policy,
        sink=sink,
        explicit=frozenset(explicit),
        login=defaults.login,
    )
