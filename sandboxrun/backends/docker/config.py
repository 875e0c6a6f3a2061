"""Pure builders for the docker backend: container configuration, exec environment, labels,
the ``docker exec`` argv shown by ``--dry-run``, the in-container sweep script, and the checks
that what is sent can be sent (the Engine API is JSON: text must be UTF-8)."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from sandboxrun.backends.owner import MAX_ID
from sandboxrun.engine.argv import is_utf8, wrapper_env
from sandboxrun.engine.env import redact
from sandboxrun.engine.mounts import KERNEL_ROOTS, around
from sandboxrun.engine.paths import CONTAINER_ROOT
from sandboxrun.errors import ConfigError, EnvError, WorkspaceError
from sandboxrun.models import LIMIT_GUARANTEES, Limits, Policy

VERSION = "0.1.0"
BASE_REPO = "sandboxrun/base"
BASE_IMAGE = f"{BASE_REPO}:latest"
"""The image the docker backend runs by default (``sandboxrun image build`` makes it)."""
LABEL = "sandboxrun.managed"
HOME = "/home/sandbox"
TMP = "/tmp"  # noqa: S108
VAR_TMP = "/var/tmp"  # noqa: S108
TMPFS_OPTS = "rw,nosuid,nodev,size=256m,mode=1777"
"""(The engine adds ``noexec`` unless ``exec`` is given.)"""
VAR_TMP_OPTS = "rw,exec,nosuid,nodev,size=256m,mode=1777"
"""``/var/tmp`` runs programs placed there (inspect installs its sandbox tools there) when
the workspace is writable (it can hold programs anyway); else it is ``noexec`` like ``/tmp``."""
DEFAULT_PIDS = 512
DEFAULT_MEMORY = 2 << 30
FORBIDDEN_ROOTS = KERNEL_ROOTS
"""Workspaces at or containing these would expose the engine socket or kernel interfaces (the
roots no ``--mount`` source may be at or around either)."""
HOST_ONLY = ("PATH", "TMPDIR", "SHELL", "HOME")
"""Host paths that mean nothing in the container: not forwarded unless given explicitly."""
NOT_UTF8 = (
    "is not valid UTF-8: the Docker Engine API carries only UTF-8 text "
    "(the process-group and systemd-scope backends pass any bytes)"
)


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
    to the engine socket.

    The hard-link check costs nothing in the normal case: a socket whose link count is 1 has no
    other name anywhere. Only when it has more is the workspace searched (when on the socket's
    file system), for at most ``max_entries`` entries; a workspace too large to search is then
    refused, naming that cause."""
    text = str(root)
    for forbidden in FORBIDDEN_ROOTS:
        if around(text, forbidden):
            raise ConfigError(f"refusing to mount {root}: it exposes {forbidden} to the sandbox")
    if not engine_socket:
        return
    if (engine_socket + "/").startswith(text.rstrip("/") + "/"):
        raise ConfigError(
            f"refusing to mount {root}: it contains the engine socket {engine_socket}"
        )
    try:
        sock = Path(engine_socket).stat()
        if sock.st_nlink <= 1 or root.stat().st_dev != sock.st_dev:
            return  # no other name anywhere; hard links cannot cross file systems
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
                f"refusing to mount {root}: the engine socket {engine_socket} has "
                f"{sock.st_nlink} hard links (names), and this workspace on its file system is "
                f"too large (>{max_entries} files) to search for one; remove the extra links"
            )


MIN_MEMORY = 6 << 20
"""The engine refuses smaller memory limits ("Minimum memory limit allowed is 6MB")."""


def check_limits(limits: Limits, *, cpu_count: int | None) -> None:
    """Refuse limits the engine would refuse, before any engine call: ``--memory`` below 6 MiB,
    ``--cpus`` above the engine's CPU count (``cpu_count``; None: unknown, the engine decides).
    The floor of ``--cpus`` (0.01) is ``Limits``' own."""
    if limits.memory_bytes is not None and limits.memory_bytes < MIN_MEMORY:
        raise ConfigError(
            f"--memory must be at least 6 MiB for docker, got {limits.memory_bytes} bytes"
        )
    if limits.cpus is not None and cpu_count is not None and limits.cpus > cpu_count:
        raise ConfigError(
            f"--cpus must be at most {cpu_count} (the engine's CPU count), got {limits.cpus:g}"
        )


_USER = re.compile(r"([0-9]+)(?::([0-9]+))?", re.ASCII)


def parse_user(user: str | None, *, owner: tuple[int, int] | None = None) -> str:
    """``UID[:GID]`` (decimal numbers), normalized (``007`` -> ``7:7``); default: the invoking
    user's uid:gid, except that a root invoker's command runs as ``owner`` (the workspace
    root's uid and gid) when that is not root: a uid-0 command could leave root-owned files
    behind in someone's workspace."""
    if user is None:
        if os.geteuid() == 0 and owner is not None and 0 < owner[0] <= MAX_ID:
            return f"{owner[0]}:{owner[1] if owner[1] <= MAX_ID else owner[0]}"
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
    *,
    workspace: Path,
    policy: Policy,
    limits: Limits,
    image: str,
    user: str,
    lbls: dict[str, str],
    seccomp: str | None = None,
    supervisor: tuple[Path, str, list[str]] | None = None,
    secrets: tuple[Path, ...] = (),
    disk_quota: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``APIClient.create_container`` / ``create_host_config``: hardened.
    ``seccomp``: the seccomp profile's JSON text (``docker_seccomp.profile_json``), or None for
    the engine's default profile. ``supervisor``: ``(host directory, mount point, main
    command)`` of the in-container supervisor (``docker_supervisor``); the container is then
    removed by the engine once its main process (the supervisor) exits, and it has no init:
    the supervisor is PID 1 of the container (a subreaper of everything there, and out of
    reach of every signal a command could send it: the kernel delivers none to its
    namespace's init that it has no handler for, SIGSTOP and SIGKILL included). ``secrets``:
    the host's secret paths (``backends.secrets``): those inside the workspace are masked as
    the local backends mask them (a workspace that is a home directory). ``disk_quota``: the
    size the engine's storage driver gives the writable root (``--storage-opt size=``; only
    an engine whose driver takes one: ``disk``).

    A writable root (``Policy.root``) is the container's own layer; a command running as uid 0
    there gets the capabilities a package manager needs (``PACKAGE_CAPS``, a part of the
    engine's default set), every other one stays dropped."""
    memory = limits.memory_bytes or DEFAULT_MEMORY
    # (inside the container) /var/tmp may run programs (inspect's sandbox tools) only where
    # the workspace could hold them anyway: with a read-only workspace nothing writable may
    var_tmp = TMPFS_OPTS if policy.access == "read-only" else VAR_TMP_OPTS
    host: dict[str, Any] = {
        "init": supervisor is None,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges", *([f"seccomp={seccomp}"] if seccomp else [])],
        "read_only": policy.root != "writable",
        "tmpfs": {TMP: TMPFS_OPTS, VAR_TMP: var_tmp, HOME: TMPFS_OPTS},
        "pids_limit": limits.pids or DEFAULT_PIDS,
        "mem_limit": memory,
        "memswap_limit": memory,
        "network_mode": "none" if policy.network == "none" else "bridge",
        "log_config": {"Type": "none", "Config": {}},
        # A Mount, not a "src:dst:mode" bind string: any name (':', ',') stays one path.
        "mounts": [
            mount(str(CONTAINER_ROOT), str(workspace), "bind", policy.access == "read-only")
        ],
    }
    masks = (*policy.mask, *map(str, secrets))
    host["mounts"] += mask_mounts(workspace, masks)
    for extra in policy.mounts:  # sources resolved and checked (engine.mounts)
        host["mounts"].append(mount(extra.target, extra.source, "bind", extra.read_only))
        # a secret under a mounted directory stays hidden, as one in the workspace
        host["mounts"] += mask_mounts(Path(extra.source), masks, inside=extra.target)
    command = ["sleep", "infinity"]
    if supervisor is not None:
        source, target, command = supervisor
        host["mounts"].append(mount(target, str(source), "bind", True))
        host["auto_remove"] = True
    if limits.cpus is not None:
        host["nano_cpus"] = int(limits.cpus * 1e9)
    if policy.root == "writable" and user.split(":")[0] == "0":
        host["cap_add"] = list(PACKAGE_CAPS)
    if disk_quota is not None:
        host["storage_opt"] = {"size": str(disk_quota)}
    return {
        "image": image,
        "command": command,
        "user": user,
        "labels": lbls,
        "working_dir": str(CONTAINER_ROOT),
        "network_disabled": policy.network == "none",
        "host_config": host,
    }


PACKAGE_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETUID", "SETGID")
"""What ``apt-get``/``dpkg`` (owners and modes of the files they unpack, the ``_apt`` user)
and ``adduser`` (a home it chowns, then fills) need as root in a writable root, and ``KILL``:
the supervisor ends what a command started as another uid (``setpriv``, ``runuser``). A part
of the engine's default set (it also gives ``MKNOD``, ``NET_RAW``, ``SYS_CHROOT``,
``SETPCAP``...). ``no-new-privileges`` stays: no setuid program gains anything. The
supervisor itself keeps only ``KILL`` in effect (``runner.keep_only_kill``): the files API
answers as root without ``DAC_OVERRIDE``, a file's mode bits hold."""

Mount = dict[str, object]
"""A ``HostConfig.Mounts`` entry of the Engine API (what docker-py's ``types.Mount`` makes)."""


def mount(target: str, source: str | None, kind: str, read_only: bool) -> Mount:
    return {"Target": target, "Source": source, "Type": kind, "ReadOnly": read_only}


def mask_mounts(
    workspace: Path, masks: tuple[str, ...], *, inside: str = str(CONTAINER_ROOT)
) -> list[Mount]:
    """``--mask`` inside the container: a masked directory of the workspace (or of a mounted
    directory: ``inside`` is where the container sees it) is an empty read-only tmpfs, a
    masked file ``/dev/null`` (read-only). A path outside it is not in the container at all; a
    missing one is skipped."""
    mounts = []
    for mask in masks:
        real = Path(os.path.realpath(mask))
        if not real.is_relative_to(workspace) or real == workspace or not real.exists():
            continue
        target = str(PurePosixPath(inside) / real.relative_to(workspace))
        if real.is_dir():
            mounts.append(mount(target, None, "tmpfs", True))
        else:
            mounts.append(mount(target, "/dev/null", "bind", True))
    return mounts


def mount_points(mountinfo: str) -> list[str]:
    """The mount points of a ``/proc/self/mountinfo`` text (octal escapes undone)."""
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def mounts_under(source: str, points: Sequence[str]) -> list[str]:
    """The mount points strictly inside ``source``."""
    prefix = source.rstrip("/") + "/"
    return sorted(p for p in points if p.startswith(prefix))


SECCOMP_UNSUPPORTED = (
    "seccomp is not enabled",  # a kernel without seccomp (the daemon's own words)
    "seccomp profiles are not supported",  # a daemon built without it
)
"""What an engine that cannot apply a seccomp profile answers to one (at container start)."""


def seccomp_unsupported(message: str) -> bool:
    """Whether an engine's error says it cannot apply any seccomp profile (not: this one)."""
    return any(words in message for words in SECCOMP_UNSUPPORTED)


UNLIMITED_MEMORY = 1 << 62
"""cgroup v1 shows "no memory limit" as a huge number (PAGE_COUNTER_MAX pages)."""


def isolation(
    policy: Policy,
    limits: Limits,
    user: str,
    *,
    shown: set[str] | None = None,
    seccomp: bool = False,
    disk: bool = False,
) -> list[str]:
    """What the container enforces. ``shown``: the limits its cgroup really shows (None: not
    known, e.g. a remote engine; the configured limits are listed). ``seccomp``: whether
    sandboxrun's seccomp profile was applied. ``disk``: whether its writable root is bounded
    (``disk``)."""
    root = "ephemeral-root" if policy.root == "writable" else "read-only-root"
    enforced = ["container", "descendant-sweep", root, "secrets-masked"]
    if policy.access == "read-only":
        enforced.append("read-only-workspace")
    if policy.network == "none":
        enforced.append("network-none")
    if int(user.split(":")[0]) != 0:
        enforced.append("non-root")
    if seccomp:
        enforced.append("seccomp")
    enforced += ["memory-limit", "pids-limit"]
    if limits.cpus is not None:
        enforced.append("cpu-limit")
    if disk:
        enforced.append("disk-limit")
    if shown is not None:
        enforced = [name for name in enforced if name not in LIMIT_GUARANTEES or name in shown]
    return enforced


def cgroup_limits(lines: list[tuple[str, str]], mount: str = "/sys/fs/cgroup") -> set[str] | None:
    """The limits (``LIMIT_GUARANTEES``) a process's cgroup really sets, from its
    ``proctree.cgroup_lines``: v1 ``cpu.cfs_quota_us``, ``memory.limit_in_bytes``, ``pids.max``;
    v2 ``cpu.max``, ``memory.max``, ``pids.max``. None when none of those files can be read."""
    v1: dict[str, list[str]] = {}
    unified: str | None = None
    for controllers, path in lines:
        if controllers == "":
            unified = path
        for name in controllers.split(","):
            v1.setdefault(name, []).extend(
                [f"{mount}/{controllers}{path}", f"{mount}/{name}{path}"]
            )
    files: dict[str, list[str]] = {
        "cpu-limit": [f"{d}/cpu.cfs_quota_us" for d in v1.get("cpu", [])],
        "memory-limit": [f"{d}/memory.limit_in_bytes" for d in v1.get("memory", [])],
        "pids-limit": [f"{d}/pids.max" for d in v1.get("pids", [])],
    }
    if unified is not None:  # v2 (or hybrid: then these files do not exist there)
        base = f"{mount}{unified}".rstrip("/")
        files["cpu-limit"].append(f"{base}/cpu.max")
        files["memory-limit"].append(f"{base}/memory.max")
        files["pids-limit"].append(f"{base}/pids.max")
    shown: set[str] = set()
    read_any = False
    for name, candidates in files.items():
        for candidate in candidates:
            try:
                content = Path(candidate).read_text().strip()
            except OSError:
                continue
            read_any = True
            if _limit_set(name, content):
                shown.add(name)
            break
    return shown if read_any else None


def _limit_set(name: str, content: str) -> bool:
    value = content.split()[0] if content else ""
    if value in ("", "max", "-1"):
        return False
    if name == "memory-limit":
        return value.isdigit() and int(value) < UNLIMITED_MEMORY
    return value.isdigit()


def exec_env(
    built: Mapping[str, str],
    *,
    explicit: Collection[str],
    marker: tuple[str, str],
    prepend: Sequence[str],
) -> dict[str, str]:
    """The environment of an exec: the built one without the host's ``HOST_ONLY`` paths (those
    given explicitly stay), ``HOME`` the container's unless given, the marker, and the wrapper's
    variables. ``PATH`` itself is never sent: the engine finds the shell by the image's PATH,
    and an explicit PATH travels in ``EXPLICIT_PATH_VAR`` for the wrapper to apply after the
    login profile (see ``argv.PATH_PREFIX``)."""
    env = {k: v for k, v in built.items() if k not in HOST_ONLY or (k in explicit and k != "PATH")}
    env.setdefault("HOME", HOME)
    env[marker[0]] = marker[1]
    explicit_path = built.get("PATH") if "PATH" in explicit else None
    env.update(wrapper_env(explicit_path=explicit_path, prepend=prepend))
    return env


def printable(text: str, limit: int = 80) -> str:
    """``text`` for a message: bytes that are not UTF-8 as ``\\xNN``, long text cut."""
    out = os.fsencode(text).decode("utf-8", "backslashreplace")
    return out if len(out) <= limit else out[:limit] + "..."


def check_workspace_utf8(root: Path) -> None:
    """Refuse a workspace path the Engine API cannot carry (raises ``WorkspaceError``)."""
    if not is_utf8(str(root)):
        raise WorkspaceError(f"workspace '{printable(str(root), 400)}' {NOT_UTF8}")


def check_utf8(
    *, argv: Sequence[str] | None, script: str | None, env: Mapping[str, str], workdir: str
) -> None:
    """Refuse what the Engine API cannot carry exactly, naming it (a value is never shown):
    ``ConfigError`` for argv and script, ``EnvError`` for variables, ``WorkspaceError`` for
    the working directory."""
    for index, arg in enumerate(argv or ()):
        if not is_utf8(arg):
            raise ConfigError(f"argv[{index}] '{printable(arg)}' {NOT_UTF8}")
    if script is not None and not is_utf8(script):
        raise ConfigError(f"the shell script {NOT_UTF8}")
    for name, value in env.items():
        if not is_utf8(name):
            raise EnvError(f"environment variable name '{printable(name)}' {NOT_UTF8}")
        if not is_utf8(value):
            raise EnvError(f"the value of environment variable {name!r} {NOT_UTF8}")
    if not is_utf8(workdir):
        raise WorkspaceError(f"workdir '{printable(workdir, 400)}' {NOT_UTF8}")


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
