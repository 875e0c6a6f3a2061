"""The host's secret paths, which no sandbox shows: the same ones on every backend (issue 20).

The local backends see the host's file system, and mask these paths in it (shown empty or
unreadable). A docker container sees only the workspace of the host: it masks those of these
paths that lie inside the workspace (a home directory given as the workspace, ``-w ~``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

SECRET_PATHS = (
    ".ssh",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker",
    ".gnupg",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".config/gh",
    ".config/hub",
    ".terraform.d",
    ".pgpass",
    ".my.cnf",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".config/rclone",
    ".password-store",
    ".local/share/keyrings",
    ".vault-token",
    ".boto",
    ".s3cfg",
    ".oci",
    ".bash_history",
    ".zsh_history",
    ".python_history",
)
"""Masked (shown empty) in every home directory the command could otherwise read."""

ROOT_SECRETS = (
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/var/lib/docker",
)
"""Masked too when the command runs as root (it could read them: uid 0 owns them)."""


def host_homes(env: Mapping[str, str]) -> tuple[Path, ...]:
    """The home directories whose secrets are masked: the invoker's, and as root every
    home on the host (root can read them all)."""
    homes: list[Path] = []
    for value in (env.get("HOME"), str(Path("~").expanduser())):
        if value and Path(value).is_absolute():
            homes.append(Path(value))
    if os.geteuid() == 0:
        homes.append(Path("/root"))
        with_home = Path("/home")
        with contextlib.suppress(OSError):
            homes += sorted(p for p in with_home.iterdir() if p.is_dir())
    return tuple(dict.fromkeys(homes))


def runtime_dir(env: Mapping[str, str], uid: int | None = None) -> Path:
    """Where this uid's detached sandboxes keep their sockets (``sandboxrun.detached``):
    ``SANDBOXRUN_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/sandboxrun``, else
    ``/tmp/sandboxrun-<uid>``. No sandbox sees it: a command could otherwise drive another
    sandbox of its uid (one with a wider policy) through its keeper."""
    uid = os.getuid() if uid is None else uid
    if env.get("SANDBOXRUN_RUNTIME_DIR"):
        return Path(env["SANDBOXRUN_RUNTIME_DIR"])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "sandboxrun"
    return Path(f"/tmp/sandboxrun-{uid}")  # noqa: S108 - private: checked where it is made


def supervisor_parent(env: Mapping[str, str]) -> Path:
    """Where docker sandboxes' supervisors are prepared (``docker.rendezvous``), one private
    directory each: ``/run/sandboxrun-supervisor`` for root, else
    ``$XDG_RUNTIME_DIR/sandboxrun-supervisor``, else ``sandboxrun/supervisor`` in the cache
    directory (beside the spill root). No sandbox sees it: a command could otherwise replace
    the runner of another sandbox starting beside it."""
    from sandboxrun.engine.capture.spill import default_spill_root

    runtime = env.get("XDG_RUNTIME_DIR", "")
    if os.geteuid() == 0:
        return Path("/run/sandboxrun-supervisor")
    if runtime.startswith("/") and Path(runtime).is_dir():
        return Path(runtime) / "sandboxrun-supervisor"
    return default_spill_root().parent / "supervisor"


def made_supervisor_parent(env: Mapping[str, str]) -> Path:
    """``supervisor_parent(env)``, made (mode 0700) when missing: a mask covers only what
    exists when a sandbox starts, and a docker sandbox opened later must not make it where
    a running sandbox sees it unmasked. Best effort (a read-only home: never made there)."""
    parent = supervisor_parent(env)
    if not parent.exists():
        with contextlib.suppress(OSError):
            parent.parent.mkdir(parents=True, exist_ok=True)
            parent.mkdir(mode=0o700, exist_ok=True)
    return parent


def secret_paths(env: Mapping[str, str]) -> list[Path]:
    """Every built-in secret path: ``SECRET_PATHS`` in each of ``host_homes(env)``, the
    detached sandboxes' runtime directory, the docker supervisors' parent directory, and as
    root ``ROOT_SECRETS``."""
    found = [home / rel for home in host_homes(env) for rel in SECRET_PATHS]
    found.append(runtime_dir(env))
    found.append(made_supervisor_parent(env))
    if os.geteuid() == 0:
        found += [Path(p) for p in ROOT_SECRETS]
    return found


ENGINE_SOCKETS = (
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
    "/var/run/crio/crio.sock",
)


def door_sockets(env: Mapping[str, str]) -> list[Path]:
    """The sockets no mount may show a sandbox: container engines' (``DOCKER_HOST``'s too, and a
    rootless engine's in ``$XDG_RUNTIME_DIR``), the agents the environment names and the
    detached sandboxes' runtime directory."""
    found = [Path(p) for p in ENGINE_SOCKETS]
    found.append(runtime_dir(env))  # the detached sandboxes' keepers, made or not yet
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        found += [Path(runtime) / "docker.sock", Path(runtime) / "podman" / "podman.sock"]
    for name in ("DOCKER_HOST", "SSH_AUTH_SOCK", "GPG_AGENT_INFO", "DBUS_SESSION_BUS_ADDRESS"):
        for part in env.get(name, "").replace(";", ",").split(","):
            part = part.removeprefix("unix:path=").removeprefix("unix://").split(":")[0]
            if part.startswith("/"):
                found.append(Path(part))
    return found
