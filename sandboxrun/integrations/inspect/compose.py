"""A Docker Compose file (or inspect's ``ComposeConfig``) with one service, as the sandboxrun
sandbox's settings. Pure: a mapping in, ``SandboxrunConfig`` fields out.

What a sandboxrun sandbox is (one container, sandboxrun's own main process, init, read-only
root) decides what is taken: ``image`` or ``build``, ``environment``, ``working_dir``, ``user``,
``network_mode``, bind-mount ``volumes`` (as ``--mount``, checked the same way), and the limits
(``mem_limit``, ``cpus``, ``pids_limit``, ``deploy.resources.limits``). What only changes how a
container is started or looked at is ignored (``command``, ``init``, ``tty``, ``x-*``...).
Anything else would be a guarantee or a resource the sandbox silently lacks (named volumes,
``ports``, ``privileged``, ``cap_add``, a second service...): refused, by name, in one line.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandboxrun.errors import ConfigError

TAKEN = frozenset(
    {
        "image", "build", "environment", "working_dir", "user", "network_mode",
        "mem_limit", "cpus", "pids_limit", "deploy", "volumes",
    }
)  # fmt: skip
IGNORED = frozenset(
    {
        "command", "entrypoint", "init", "tty", "stdin_open", "restart", "healthcheck",
        "labels", "container_name", "hostname", "stop_signal", "stop_grace_period",
        "pull_policy", "platform", "expose", "logging", "cap_drop", "mem_reservation",
        "memswap_limit",
    }
)  # fmt: skip
"""Keys that change nothing a command in the sandbox can rely on: sandboxrun starts its own
main process (with an init), never publishes ports (``expose`` publishes none), drops every
capability and gives no swap."""
ALREADY = {
    "read_only": (True, False),
    "security_opt": ("no-new-privileges", "no-new-privileges:true"),
}
"""Hardening a sandboxrun sandbox always has: accepted with these values only
(``read_only: false`` asks for an ephemeral writable root: ``root: writable``; without the key
the root is read-only, sandboxrun's default)."""
TOP_IGNORED = frozenset({"version", "name"})
NETWORK_MODES = {"none": "none", "bridge": "on", "default": "on"}


def is_dockerfile(name: str) -> bool:
    """``Dockerfile``, ``Dockerfile.name`` or ``name.Dockerfile`` (as inspect names them)."""
    path = Path(name)
    return path.stem == "Dockerfile" or path.suffix == ".Dockerfile"


def is_compose_file(name: str) -> bool:
    """``compose.yaml`` and the other names ``docker compose`` looks for (``*.compose.yaml``
    too, as inspect's generated ones)."""
    base = Path(name).name
    return base in ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml") or (
        base.endswith((".compose.yaml", ".compose.yml"))
    )


_VARIABLE = re.compile(
    r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}$]*))?\}|([A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(value: Any, env: Mapping[str, str], where: str) -> Any:
    """Compose's variable substitution in every string of ``value``: ``$NAME``, ``${NAME}``,
    ``${NAME:-default}`` (also when empty), ``${NAME-default}`` (when unset), ``$$`` for a
    ``$``; an unset one is empty, as compose makes it. ``env``: the host's variables and the
    sample's metadata (``SAMPLE_METADATA_<KEY>``). Another ``${...}`` form (``${A:?err}``, a
    default holding a ``$``) is refused."""
    if isinstance(value, dict):
        return {k: interpolate(v, env, where) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, where) for v in value]
    if not isinstance(value, str) or "$" not in value:
        return value

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        got = env.get(name)
        if match.group(2) == ":-" and not got:
            return match.group(3)
        if match.group(2) == "-" and got is None:
            return match.group(3)
        return got or ""

    out = _VARIABLE.sub(one, value)
    left = value
    for match in _VARIABLE.finditer(value):
        left = left.replace(match.group(0), "", 1)
    if "${" in left:
        raise ConfigError(f"{where}: {value!r}: only $NAME, ${{NAME}}, ${{NAME:-default}} and "
                          "${NAME-default} are substituted")  # fmt: skip
    return out


def settings(
    data: Any, *, where: str, base: Path, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``SandboxrunConfig`` fields for a compose file's mapping ``data`` (``where`` names it in
    errors; ``base``: the directory its relative build contexts are relative to; ``env``: the
    variables substituted in it and given to a name ``environment`` lists without a value)."""
    env = {} if env is None else env
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: not a compose file (expected a mapping)")
    data = interpolate(data, env, where)
    for key in data:
        if key != "services" and key not in TOP_IGNORED and not str(key).startswith("x-"):
            raise ConfigError(f"{where}: top-level `{key}` is not supported by sandboxrun")
    services = data.get("services")
    if not isinstance(services, dict) or not services:
        raise ConfigError(f"{where}: no services")
    if len(services) > 1:
        names = ", ".join(str(name) for name in services)
        raise ConfigError(
            f"{where}: {len(services)} services ({names}); a sandboxrun sandbox is one "
            "container: give a compose file with one service"
        )
    ((name, service),) = services.items()
    here = f"{where}: service {name}"
    if not isinstance(service, dict):
        raise ConfigError(f"{here}: expected a mapping")
    for key, wanted in ALREADY.items():
        values = service.get(key)
        given = values if isinstance(values, list) else [] if values is None else [values]
        other = [value for value in given if value not in wanted]
        if other:
            raise ConfigError(
                f"{here}: {key} {other[0]!r} is not supported by a sandboxrun sandbox"
            )
    for key in service:
        if key in ALREADY:
            continue
        if key not in TAKEN and key not in IGNORED and not str(key).startswith("x-"):
            raise ConfigError(
                f"{here}: `{key}` is not supported by a sandboxrun sandbox (it takes "
                f"{', '.join(sorted(TAKEN))})"
            )
    out: dict[str, Any] = {"backend": "docker"}
    if service.get("read_only") is False:
        out["root"] = "writable"
    out |= _image(service, here, base)
    out |= _environment(service.get("environment"), here, env)
    if service.get("working_dir") is not None:
        out["working_dir"] = _working_dir(service["working_dir"], here)
    if service.get("user") is not None:
        user = str(service["user"])
        out["user"] = "0:0" if user in ("root", "root:root", "0") else user  # names: refused
    mode = service.get("network_mode")
    if mode is None:
        out["network"] = "none"  # sandboxrun's default (compose's is a network: say bridge)
    elif str(mode) in NETWORK_MODES:
        out["network"] = NETWORK_MODES[str(mode)]
    else:
        raise ConfigError(
            f"{here}: network_mode {mode!r} is not supported by a sandboxrun sandbox "
            "(none or bridge)"
        )
    out |= _limits(service, here)
    if service.get("volumes"):
        out["mounts"] = _volumes(service["volumes"], here, base)
    return out


def _volumes(volumes: Any, here: str, base: Path) -> list[str]:
    """Bind mounts (``./data:/data[:ro]``, or ``type: bind``), read-write unless ``ro``, as in
    compose; a named volume or a tmpfs is refused (a sandboxrun sandbox has no volumes)."""
    if not isinstance(volumes, list):
        raise ConfigError(f"{here}: `volumes` must be a list")
    out = []
    for volume in volumes:
        if isinstance(volume, str):
            parts = volume.split(":")
            if len(parts) not in (2, 3) or not parts[0].startswith(("/", ".", "~")):
                raise ConfigError(
                    f"{here}: volume {volume!r} is not a bind mount (SRC:DST[:ro] with SRC a "
                    "path); a sandboxrun sandbox has no named volumes"
                )
            source, target = parts[0], parts[1]
            read_only = len(parts) == 3 and "ro" in parts[2].split(",")
        elif isinstance(volume, dict) and volume.get("type") == "bind":
            for key in volume:
                if key not in ("type", "source", "target", "read_only", "bind"):
                    raise ConfigError(f"{here}: volume `{key}` is not supported")
            source, target = str(volume.get("source") or ""), str(volume.get("target") or "")
            read_only = bool(volume.get("read_only", False))
        else:
            raise ConfigError(
                f"{here}: volume {volume!r} is not a bind mount; a sandboxrun sandbox has no "
                "named volumes or tmpfs volumes"
            )
        path = Path(source).expanduser()
        if not path.is_absolute():
            path = base / path
        out.append(f"{path}:{target}:{'ro' if read_only else 'rw'}")
    return out


def _image(service: dict[str, Any], here: str, base: Path) -> dict[str, Any]:
    build = service.get("build")
    if build is None:
        image = service.get("image")
        if image is None:
            raise ConfigError(f"{here}: needs `image` or `build`")
        return {"image": str(image)}
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, dict):
        raise ConfigError(f"{here}: `build` must be a directory or a mapping")
    for key in build:
        if key not in ("context", "dockerfile"):
            raise ConfigError(
                f"{here}: build `{key}` is not supported by a sandboxrun sandbox "
                "(it takes context and dockerfile)"
            )
    context = Path(str(build.get("context") or ".")).expanduser()
    if not context.is_absolute():
        context = base / context
    out: dict[str, Any] = {"image_from": str(context)}
    if build.get("dockerfile") is not None:
        out["dockerfile"] = str(build["dockerfile"])
    return out


def _environment(env: Any, here: str, host: Mapping[str, str]) -> dict[str, Any]:
    """``environment`` as a mapping or a list of ``NAME=VALUE``; a name without a value (or
    with a null one) takes the host's value, as compose does (given explicitly: a
    secret-shaped one is masked in the output), and is left out when the host has none."""
    if env is None:
        return {}
    pairs: list[tuple[str, str | None]] = []
    if isinstance(env, dict):
        pairs = [(str(k), None if v is None else _scalar(v)) for k, v in env.items()]
    elif isinstance(env, list):
        for item in env:
            name, sep, value = str(item).partition("=")
            pairs.append((name, value if sep else None))
    else:
        raise ConfigError(f"{here}: `environment` must be a mapping or a list")
    fixed: dict[str, str] = {}
    for name, given in pairs:
        got = host.get(name) if given is None else given
        if got is not None:
            fixed[name] = got
    return {"env": fixed}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _working_dir(value: Any, here: str) -> str:
    text = str(value)
    if not text.startswith("/"):
        raise ConfigError(f"{here}: working_dir {text!r} must be an absolute path")
    return posixpath.normpath(text)


def _mapping(value: Any, what: str, here: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{here}: `{what}` must be a mapping")
    return value


def _one(
    service: dict[str, Any], limits: dict[str, Any], key: str, deploy_key: str, here: str
) -> Any:
    """A limit given as ``key`` or as ``deploy.resources.limits.<deploy_key>`` (both: the same)."""
    short, long = service.get(key), limits.get(deploy_key)
    if short is not None and long is not None and str(short) != str(long):
        raise ConfigError(
            f"{here}: {key} {short!r} and deploy.resources.limits.{deploy_key} {long!r} differ"
        )
    value = short if short is not None else long
    if isinstance(value, bool) or (value is not None and not isinstance(value, int | float | str)):
        raise ConfigError(f"{here}: {key} {value!r} is not a number")
    return value


def _limits(service: dict[str, Any], here: str) -> dict[str, Any]:
    deploy = _mapping(service.get("deploy"), "deploy", here)
    for key in deploy:
        if key != "resources":
            raise ConfigError(f"{here}: deploy `{key}` is not supported by a sandboxrun sandbox")
    resources = _mapping(deploy.get("resources"), "deploy.resources", here)
    for key in resources:
        if key not in ("limits", "reservations"):  # a reservation is a scheduling hint
            raise ConfigError(f"{here}: deploy.resources `{key}` is not supported")
    limits = _mapping(resources.get("limits"), "deploy.resources.limits", here)
    for key in limits:
        if key not in ("memory", "cpus", "pids"):
            raise ConfigError(f"{here}: deploy.resources.limits `{key}` is not supported")
    out: dict[str, Any] = {}
    memory = _one(service, limits, "mem_limit", "memory", here)
    if memory is not None:
        out["memory"] = memory if isinstance(memory, int) else str(memory).lower()
    cpus = _one(service, limits, "cpus", "cpus", here)
    if cpus is not None:
        try:
            out["cpus"] = float(cpus)
        except ValueError:
            raise ConfigError(f"{here}: cpus {cpus!r} is not a number") from None
    pids = _one(service, limits, "pids_limit", "pids", here)
    if pids is not None:
        if isinstance(pids, float) and not pids.is_integer():
            raise ConfigError(f"{here}: pids_limit {pids!r} is not a whole number")
        try:
            count = int(pids)
        except ValueError:
            raise ConfigError(f"{here}: pids_limit {pids!r} is not a number") from None
        if count != -1:  # -1: no limit, as compose's
            out["pids"] = count
    return out
