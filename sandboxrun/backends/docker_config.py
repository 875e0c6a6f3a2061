"""Pure builders for the docker backend: container configuration, exec environment, labels,
the ``docker exec`` argv shown by ``--dry-run``, and the in-container sweep script."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandboxrun.env import redact
from sandboxrun.errors import ConfigError
from sandboxrun.models import Limits, Policy
from sandboxrun.paths import CONTAINER_ROOT

LABEL = "sandboxrun.managed"
HOME = "/home/sandbox"
TMPFS_OPTS = "rw,nosuid,nodev,size=256m,mode=1777"
DEFAULT_PIDS = 512
DEFAULT_MEMORY = 2 << 30
FORBIDDEN_ROOTS = ("/proc", "/sys", "/dev", "/run", "/var/run")
"""Workspaces at or containing these would expose the engine socket or kernel interfaces."""


def labels(
    workspace: Path, *, owner_pid: int | None = None, now: float | None = None
) -> dict[str, str]:
    return {
        LABEL: "true",
        "sandboxrun.owner_pid": str(os.getpid() if owner_pid is None else owner_pid),
        "sandboxrun.owner_host": socket.gethostname(),
        "sandboxrun.created": str(int(time.time() if now is None else now)),
        "sandboxrun.workspace": hashlib.sha256(str(workspace).encode()).hexdigest()[:16],
    }


def check_workspace(root: Path, engine_socket: str | None, *, max_entries: int = 200_000) -> None:
    """Refuse workspaces whose bind mount would hand the command the engine or the kernel:
    at or around /proc, /sys, /dev, /run, the engine socket's directory, or holding a hard link
    to the engine socket (looked for only when both are on the same filesystem)."""
    text = str(root)
    for forbidden in FORBIDDEN_ROOTS:
        if (
            text == forbidden
            or text.startswith(forbidden + "/")
            or forbidden.startswith(text + "/")
        ):
            raise ConfigError(f"refusing to mount {root}: it exposes {forbidden} to the sandbox")
    if not engine_socket:
        return
    if (engine_socket + "/").startswith(text.rstrip("/") + "/"):
        raise ConfigError(
            f"refusing to mount {root}: it contains the engine socket {engine_socket}"
        )
    try:
        sock = Path(engine_socket).stat()
        if root.stat().st_dev != sock.st_dev:
            return  # hard links cannot cross filesystems
    except OSError:
        return
    seen = 0
    for directory, _dirs, files in os.walk(root):  # never follows symlinks
        for name in files:
            seen += 1
            try:
                st = os.lstat(os.path.join(directory, name))  # noqa: PTH118
            except OSError:
                continue
            if st.st_ino == sock.st_ino and st.st_dev == sock.st_dev:
                where = os.path.join(directory, name)  # noqa: PTH118
                raise ConfigError(f"refusing to mount {root}: {where} is the engine socket")
        if seen > max_entries:
            raise ConfigError(
                f"refusing to mount {root}: it shares a filesystem with the engine socket and "
                f"is too large (>{max_entries} files) to check for a hard link to it"
            )


_USER = re.compile(r"([0-9]+)(?::([0-9]+))?", re.ASCII)
MAX_ID = 2**31 - 1  # the engine refuses larger ids


def parse_user(user: str | None) -> str:
    """``UID[:GID]`` (decimal numbers), normalized (``007`` -> ``7:7``); default: the invoking
    user's uid:gid."""
    if user is None:
        return f"{os.getuid()}:{os.getgid()}"
    match = _USER.fullmatch(user)
    if match is None:
        raise ConfigError(f"invalid --user {user!r}: expected UID or UID:GID (decimal numbers)")
    uid = int(match.group(1))
    gid = int(match.group(2)) if match.group(2) is not None else uid
    if uid > MAX_ID or gid > MAX_ID:
        raise ConfigError(f"invalid --user {user!r}: ids must be at most {MAX_ID}")
    return f"{uid}:{gid}"


def host_config(
    *, workspace: Path, policy: Policy, limits: Limits, image: str, user: str, lbls: dict[str, str]
) -> dict[str, Any]:
    """Keyword arguments of ``APIClient.create_container`` / ``create_host_config``: hardened."""
    memory = limits.memory_bytes or DEFAULT_MEMORY
    host: dict[str, Any] = {
        "init": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "read_only": True,
        "tmpfs": {"/tmp": TMPFS_OPTS, HOME: TMPFS_OPTS},  # noqa: S108 - inside the container
        "pids_limit": limits.pids or DEFAULT_PIDS,
        "mem_limit": memory,
        "memswap_limit": memory,
        "network_mode": "none" if policy.network == "none" else "bridge",
        "log_config": {"Type": "none", "Config": {}},
        "binds": {
            str(workspace): {
                "bind": str(CONTAINER_ROOT),
                "mode": "ro" if policy.access == "read-only" else "rw",
            }
        },
    }
    if limits.cpus is not None:
        host["nano_cpus"] = int(limits.cpus * 1e9)
    return {
        "image": image,
        "command": ["sleep", "infinity"],
        "user": user,
        "labels": lbls,
        "working_dir": str(CONTAINER_ROOT),
        "network_disabled": policy.network == "none",
        "host_config": host,
    }


def isolation(policy: Policy, limits: Limits, user: str) -> list[str]:
    enforced = ["container", "descendant-sweep", "read-only-root"]
    if policy.access == "read-only":
        enforced.append("read-only-workspace")
    if policy.network == "none":
        enforced.append("network-none")
    if int(user.split(":")[0]) != 0:
        enforced.append("non-root")
    enforced += ["memory-limit", "pids-limit"]
    if limits.cpus is not None:
        enforced.append("cpu-limit")
    return enforced


def exec_env(built: Mapping[str, str], *, marker: tuple[str, str], prepend: str) -> dict[str, str]:
    """The environment of an exec: the built one minus host-only paths, plus the marker."""
    env = {k: v for k, v in built.items() if k not in ("PATH", "TMPDIR", "SHELL", "HOME")}
    env["HOME"] = HOME
    env[marker[0]] = marker[1]
    if prepend:
        env["SANDBOXRUN_PATH_PREPEND"] = prepend
    return env


def docker_exec_argv(
    container: str,
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    workdir: str,
    user: str,
    interactive: bool,
) -> list[str]:
    """The ``docker exec`` equivalent of an exec (``--dry-run``); secret values redacted."""
    argv = ["docker", "exec"]
    if interactive:
        argv.append("-i")
    argv += ["-w", workdir]
    for name, value in sorted(redact(env).items()):
        argv += ["-e", f"{name}={value}"]
    argv += ["-u", user, container, *command]
    return argv


SWEEP_SCRIPT = r"""
run=$1; sig=$2; me=$$; pids=" "
for d in /proc/[0-9]*; do
  p=${d#/proc/}; [ "$p" = "$me" ] && continue
  if tr '\0' '\n' < "$d/environ" 2>/dev/null | grep -qxF "SANDBOXRUN_RUN_ID=$run"; then
    pids="$pids$p "
  fi
done
changed=1
while [ "$changed" = 1 ]; do
  changed=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$pids" in *" $p "*) continue ;; esac
    read -r stat < "$d/stat" 2>/dev/null || continue
    set -- ${stat##*) }
    case "$pids" in *" $2 "*) [ "$p" != "$me" ] && pids="$pids$p " && changed=1 ;; esac
  done
done
n=0
for p in $pids; do
  read -r stat < "/proc/$p/stat" 2>/dev/null || continue
  set -- ${stat##*) }
  [ "$1" = Z ] && continue
  if [ "$sig" != 0 ]; then
    kill -s "$sig" "$p" 2>/dev/null
    [ "$sig" = TERM ] && kill -s CONT "$p" 2>/dev/null
  fi
  n=$((n + 1))
done
echo "$n"
"""
"""Signal every live process of one exec inside the container: those carrying its marker and
all their descendants; print how many were alive. POSIX sh and /proc only (any image)."""


def sweep_argv(run_id: str, sig: str) -> list[str]:
    return ["/bin/sh", "-c", SWEEP_SCRIPT, "sandboxrun-sweep", run_id, sig]
