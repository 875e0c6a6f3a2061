"""The local isolation layer of process-group and systemd-scope: what to apply, and how.

A local sandbox gets one set of namespaces, like one container: bubblewrap (``bwrap``) starts
the sandbox's supervisor (the process-group runner, or systemd-scope's namespace holder) as PID
1 of new mount, PID, IPC and UTS namespaces (network too under ``network none``; a user
namespace where the sandbox's uid is not root, a root invoker's workspace owner included:
``backends.owner``; every capability dropped where it is root). Inside it the
host is read-only, the workspace is writable per policy, ``/tmp``, ``/var/tmp`` and ``/dev/shm``
are private, ``/dev`` is minimal, ``/run`` (every daemon's socket: Docker, containerd, D-Bus,
systemd) and the secret-bearing paths of the home directories are masked. Then, inside, the
supervisor confines itself and every command with ``_confine.apply``: no_new_privs, Landlock
(writes only where the policy allows; no device node anywhere; no signal or abstract socket
out of the sandbox) and the seccomp filter that refuses setuid/setgid modes and device nodes.

This module is pure but for ``probe_host`` (what this host can give, cached) and
``host_homes``; the supervisor side is ``_confine.py`` (stdlib only).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sandboxrun import supervisor
from sandboxrun.backends.owner import masks_for, own_home, run_as
from sandboxrun.backends.secrets import (
    ROOT_SECRETS,
    SECRET_PATHS,
    host_homes,
    made_supervisor_parent,
    runtime_dir,
)
from sandboxrun.engine.mounts import masked_inside
from sandboxrun.engine.paths import CONTAINER_ROOT, host_has_container_root
from sandboxrun.errors import ConfigError
from sandboxrun.models import Mount, Policy

SOCKET_DIRS = ("/run", "/var/run", "/tmp", "/var/tmp", "/dev/shm")
"""Where host daemons keep their unix sockets; each is empty (or private) inside."""

PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
SANDBOX_HOME = "/tmp/sandboxrun-home"
"""``HOME`` inside a local sandbox (unless given explicitly): private and writable, like the
container's, while the real home directory stays read-only (and its secrets masked) at its
own path. A login shell so reads no host profile that would try to write the real home."""
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/random")

NAMESPACE_LAYERS = (
    "pid-namespace",
    "read-only-root",
    "private-tmp",
    "sockets-masked",
    "secrets-masked",
)


@dataclass(frozen=True)
class HostSupport:
    """What this host can give a local sandbox, and why not where it cannot."""

    bwrap: str | None
    """The path of a bubblewrap that really starts a sandbox here, or None."""
    bwrap_reason: str | None
    """Why bubblewrap cannot be used (with how to get it), or None."""
    landlock_abi: int
    seccomp: bool

    def layers(self, policy: Policy, root: bool | None = None) -> tuple[str, ...]:
        """The isolation names a local backend gives under ``policy`` on this host (``root``:
        whether its commands run as root; default: whether this process is root)."""
        if policy.access == "danger-full-access":
            return ()
        names: list[str] = []
        if self.bwrap:
            names += NAMESPACE_LAYERS
            if policy.network == "none":
                names.append("network-none")
            if policy.access == "read-only":
                names.append("read-only-workspace")
        if not (os.geteuid() == 0 if root is None else root):
            names.append("non-root")
        if self.landlock_abi:  # alone it limits writes, but not reads or connect() to a
            names.append("landlock")  # host socket: it never stands for read-only-root
        if self.seccomp:
            names.append("seccomp")
        names.append("no-new-privileges")
        return tuple(dict.fromkeys(names))

    def why_not(self, missing: list[str]) -> str:
        """Why this host cannot give ``missing``: the layer and how to get it."""
        reasons = []
        if self.bwrap_reason and set(missing) & {*NAMESPACE_LAYERS, "network-none"}:
            reasons.append(self.bwrap_reason)
        if not self.seccomp and "seccomp" in missing:
            reasons.append("the kernel has no seccomp filters (CONFIG_SECCOMP_FILTER)")
        if set(missing) & {"ephemeral-root", "disk-limit"}:
            reasons.append(WRITABLE_ROOT_WHY)
        return "; ".join(reasons)


WRITABLE_ROOT_WHY = (
    "a local sandbox has no writable root: this bubblewrap has no overlay (--overlay came in "
    "0.9); --root writable runs on docker"
)


@dataclass(frozen=True)
class LocalPlan:
    """Everything one local sandbox applies; built once per ``Sandbox``."""

    policy: Policy
    workspace: Path
    homes: tuple[Path, ...]
    support: HostSupport
    extra_masks: tuple[Path, ...] = ()
    env_sockets: tuple[Path, ...] = ()
    """Unix sockets named by the host environment (``$SSH_AUTH_SOCK``...), masked too."""
    tools: tuple[Path, ...] = ()
    """Directories the caller prepends to PATH: shown read-only where a private directory
    (``/tmp``...) would hide them."""
    run_as: tuple[int, int] | None = None
    """``(uid, gid)`` the sandbox runs as: a root invoker's workspace owner (``owner``)."""
    run_as_why: str | None = None
    """Why a root invoker's sandbox runs as root although the workspace is another uid's."""

    @functools.cached_property
    def inside_root(self) -> str | None:
        """Where the sandbox's commands see the workspace when not at its host path:
        ``/workspace``, as in a container (bound there too: its host path stays, so absolute
        host paths, a virtualenv's shebangs, keep working). None without namespaces (the
        sandbox is the host's view), or where this host has a ``/workspace`` of its own (it
        may hold what runs the sandbox, its Python or a PATH directory: never hidden). Decided
        once per plan: its sandbox's root and every command's directory agree."""
        if not self.namespaces or self.policy.workspace_at == "host" or host_has_container_root():
            return None
        return str(CONTAINER_ROOT)

    def seen(self, host: Path) -> str:
        """``host`` (a path in the workspace) as the sandbox's commands see it."""
        inside = self.inside_root
        if inside is None or not (host == self.workspace or host.is_relative_to(self.workspace)):
            return str(host)
        rel = host.relative_to(self.workspace)
        return inside if str(rel) == "." else f"{inside}/{rel}"

    @property
    def as_root(self) -> bool:
        """Whether the sandbox's processes are root (every capability dropped)."""
        return os.geteuid() == 0 and self.run_as is None

    def layers(self) -> tuple[str, ...]:
        return self.support.layers(self.policy, root=self.as_root)

    @property
    def off(self) -> bool:
        return self.policy.access == "danger-full-access"

    @property
    def namespaces(self) -> bool:
        return not self.off and self.support.bwrap is not None

    def writable_dirs(self) -> list[str]:
        dirs = [] if self.policy.access == "read-only" else [str(self.workspace)]
        dirs += [m.target for m in self.policy.mounts if not m.read_only]
        if self.namespaces:
            return [*dirs, *PRIVATE_TMP, "/dev/pts"]
        return [*dirs, "/dev/pts"]  # no private /tmp to write without namespaces

    def confine(self) -> dict[str, object]:
        """The plan ``_confine.apply`` carries out inside (JSON-able)."""
        if self.off:
            return {}
        return {
            "drop_caps": True,
            "landlock": {
                "dirs": self.writable_dirs(),
                "files": list(WRITABLE_DEVICES),
                "deny_tcp": self.policy.network == "none" and not self.namespaces,
            }
            if self.support.landlock_abi
            else None,
            "seccomp": self.support.seccomp,
        }

    def shown_tools(self) -> list[Path]:
        """The PATH-prepend directories to show read-only inside: those a private directory
        would hide, but never ``/run`` (daemon sockets) or a directory holding a hidden one."""
        hidden = [Path(os.path.realpath(d)) for d in SOCKET_DIRS]
        shown = []
        for tool in self.tools:
            real = Path(os.path.realpath(tool))
            if not real.is_dir() or real.is_relative_to(self.workspace):
                continue
            if any(d.is_relative_to(real) for d in hidden) or real.is_relative_to("/run"):
                continue
            if any(real.is_relative_to(d) for d in hidden):
                shown.append(real)
        return shown

    def command_env(self, env: Mapping[str, str], explicit: frozenset[str]) -> dict[str, str]:
        """The command's environment inside: a private ``HOME`` and ``TMPDIR`` unless given."""
        out = dict(env)
        if self.namespaces:
            for name, value in (("HOME", SANDBOX_HOME), ("TMPDIR", "/tmp")):
                if name not in explicit:
                    out[name] = value
        return out

    def masked_paths(self) -> list[Path]:
        found: list[Path] = []
        for home in self.homes:
            found += [home / rel for rel in SECRET_PATHS]
        if os.geteuid() == 0:
            found += [Path(p) for p in ROOT_SECRETS]
        found = [*found, *self.extra_masks, *self.env_sockets]
        if self.run_as is None:
            return found
        # As the workspace's owner: where that uid cannot resolve a secret, bwrap (as that uid)
        # could not mount over it: the directory above it that it cannot search goes instead.
        uid, gid = self.run_as
        known = (self.workspace, *(Path(m.source) for m in self.policy.mounts))
        known += (*self.shown_tools(), *(Path(os.path.realpath(d)) for d in runtime_dirs()))
        return masks_for(found, uid, gid, known)

    def pin_mounts(self) -> dict[str, int]:
        """An ``O_PATH`` fd of each mount's source (by target), opened now and checked again
        (``mounts.rechecked``: the path still leads, without a symlink, to what was checked):
        bwrap binds the fd (``--bind-fd``), so a source swapped for a symlink after
        ``Sandbox()`` checked it is never mounted. The caller closes them once bwrap started."""
        from sandboxrun.backends.secrets import door_sockets
        from sandboxrun.engine.mounts import rechecked

        pinned: dict[str, int] = {}
        doors = [os.path.realpath(s) for s in door_sockets(os.environ)]
        try:
            for extra in self.policy.mounts:  # one fd per mount (bwrap closes each it binds)
                try:
                    fd = os.open(extra.source, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
                    pinned[extra.target] = fd
                    now = os.readlink(f"/proc/self/fd/{fd}")
                    link = stat.S_ISLNK(os.fstat(fd).st_mode)
                except OSError as exc:
                    raise ConfigError(f"cannot mount {exc.filename}: {exc.strerror}") from None
                rechecked(extra, now, doors, link=link)
        except BaseException:
            for fd in pinned.values():
                os.close(fd)
            raise
        if self.support.bwrap is not None and not binds_fds(self.support.bwrap):
            for fd in pinned.values():  # (a bubblewrap before 0.8: bound by path, checked)
                os.close(fd)
            return {}
        return pinned

    def bwrap_argv(self, command: list[str], pinned: Mapping[str, int] | None = None) -> list[str]:
        """``bwrap ... -- command``: the namespaces and mounts of this sandbox (pure but for
        ``lstat`` of the paths to mask: a missing path is not masked, a symlink is masked
        where it points). ``pinned``: the mounts' source fds (``pin_mounts``), bound by fd."""
        assert self.support.bwrap is not None
        argv = [self.support.bwrap, "--die-with-parent", "--as-pid-1"]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if self.policy.network == "none":
            argv.append("--unshare-net")
        if self.as_root:
            argv += ["--cap-drop", "ALL"]
        else:
            argv.append("--unshare-user")
        inside = self.inside_root
        argv += root_args() if inside is not None else ["--ro-bind", "/", "/"]
        argv += ["--dev", "/dev", "--proc", "/proc"]
        for path in SOCKET_DIRS:
            real = os.path.realpath(path)
            if os.path.isdir(real) and not os.path.islink(path):
                argv += ["--tmpfs", path]
        argv += ["--remount-ro", "/run"] if os.path.isdir("/run") else []
        argv += ["--dir", SANDBOX_HOME]
        for tool in self.shown_tools():
            argv += ["--ro-bind", str(tool), str(tool)]
        workspace = str(self.workspace)
        bind = "--bind" if self.policy.access != "read-only" else "--ro-bind"
        argv += [bind, workspace, workspace]
        if inside is not None:  # and at /workspace, as in a container
            argv += [bind, workspace, inside]
        for extra in self.policy.mounts:  # sources resolved and checked (engine.mounts)
            fd = (pinned or {}).get(extra.target)
            if fd is not None:
                argv += ["--ro-bind-fd" if extra.read_only else "--bind-fd", str(fd)]
            else:
                argv += ["--ro-bind" if extra.read_only else "--bind", extra.source]
            argv.append(extra.target)
        shown = [self.workspace, *self.shown_tools()]
        secrets = self.masked_paths()
        targets = [Path(m.target) for m in self.policy.mounts]
        for secret in secrets:  # after the workspace: a secret in it stays masked
            where = Path(os.path.realpath(secret))
            if any(where.is_relative_to(t) for t in targets):
                continue  # a mount is there: what of the host shows in it is masked below
            argv += mask_args(secret, self.workspace, shown)
        views = list(self.policy.mounts)
        if inside is not None:  # the workspace's second view: its secrets masked there too
            views.append(Mount(source=workspace, target=inside, read_only=False))
        for extra in views:  # and one under a mounted directory, where it shows
            for secret, seen in masked_inside(extra, secrets):
                argv += (
                    ["--tmpfs", seen, "--remount-ro", seen]
                    if secret.is_dir()
                    else ["--ro-bind", "/dev/null", seen]
                )
        if inside is not None:  # every mount point made: the root itself read-only
            argv += ["--remount-ro", "/"]
        return [*argv, "--", *command]


def root_args(top: str = "/") -> list[str]:
    """The host's root, read-only, entry by entry (bwrap's own root is a tmpfs, where a mount
    point such as ``/workspace`` can be made): each directory and file bound, each symlink
    made again; ``/proc`` and ``/dev`` are the sandbox's own, and what is neither directory,
    file nor symlink (a socket, a fifo, a device at the top) is left out (``LocalPlan
    .inside_root``: used only where the host has no ``/workspace``). A snapshot: a top-level
    entry made later is not seen by a sandbox already open."""
    argv: list[str] = []
    for name in sorted(os.listdir(top)):
        path = os.path.join(top, name)
        if path in ("/proc", "/dev", str(CONTAINER_ROOT)):
            continue
        try:
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                argv += ["--symlink", os.readlink(path), path]
            elif stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                argv += ["--ro-bind-try", path, path]  # (one gone meanwhile is no failure)
        except OSError:
            continue  # gone meanwhile
    return argv


def mask_args(path: Path, workspace: Path, shown: list[Path] | None = None) -> list[str]:
    """bwrap arguments that show ``path`` empty: an empty read-only directory, or
    ``/dev/null`` over a file or socket. Nothing for a missing path, or one that holds the
    workspace (the caller asked for that directory)."""
    try:
        real = Path(os.path.realpath(path))
        mode = os.stat(real).st_mode
    except OSError:
        return []
    if real == workspace or workspace.is_relative_to(real) or real == Path("/"):
        return []
    hidden = [Path(os.path.realpath(d)) for d in SOCKET_DIRS]
    exposed = any(real.is_relative_to(d) for d in shown or [workspace])
    if any(real.is_relative_to(d) for d in hidden) and not exposed:
        return []  # already private or empty inside
    target = str(real)
    if stat.S_ISDIR(mode):
        return ["--tmpfs", target, "--remount-ro", target]
    return ["--ro-bind", "/dev/null", target]


def env_sockets(env: dict[str, str]) -> tuple[Path, ...]:
    found = []
    for name in ("SSH_AUTH_SOCK", "GPG_AGENT_INFO", "DBUS_SESSION_BUS_ADDRESS", "DOCKER_HOST"):
        value = env.get(name, "")
        for part in value.replace(";", ",").split(","):
            part = part.removeprefix("unix:path=").removeprefix("unix://").split(":")[0]
            if part.startswith("/"):
                found.append(Path(part))
    found.append(runtime_dir(env))  # the detached sandboxes' keepers: never reachable inside
    found.append(made_supervisor_parent(env))  # docker sandboxes' runners, before they start
    return tuple(found)


@functools.cache
def probe_host() -> HostSupport:
    """What this host can give (cached for the process): a bubblewrap that starts, Landlock's
    ABI, seccomp."""
    from sandboxrun.supervisor import confine as _confine

    abi = _confine.landlock_abi()
    seccomp = Path("/proc/self/status").read_text().find("Seccomp:") >= 0
    chosen = os.environ.get("SANDBOXRUN_BWRAP")  # another bubblewrap, or "" to go without
    found = shutil.which(chosen or "bwrap") if chosen != "" else None
    if found is None:
        what = (
            "bubblewrap is turned off (SANDBOXRUN_BWRAP is empty)"
            if chosen == ""
            else f"bubblewrap {chosen!r} is not found"
            if chosen
            else "bubblewrap is not installed"
        )
        return HostSupport(None, f"{what} (apt-get install bubblewrap)", abi, seccomp)
    trial = [found, "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
    trial += ["--unshare-uts", "--as-pid-1"]
    trial += ["--cap-drop", "ALL"] if os.geteuid() == 0 else ["--unshare-user"]
    trial += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "true"]
    try:
        done = subprocess.run(trial, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return HostSupport(None, f"bubblewrap does not start: {exc}", abi, seccomp)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        hint = (
            " (user namespaces are disabled: sysctl user.max_user_namespaces / "
            "kernel.unprivileged_userns_clone, or an AppArmor userns restriction)"
            if os.geteuid() != 0
            else ""
        )
        why = said[-1] if said else f"exit status {done.returncode}"
        return HostSupport(
            None, f"bubblewrap cannot create namespaces here: {why}{hint}", abi, seccomp
        )
    return HostSupport(found, None, abi, seccomp)


def local_plan(
    policy: Policy,
    workspace: Path,
    env: Mapping[str, str] | None = None,
    tools: tuple[str, ...] = (),
) -> LocalPlan:
    """The plan of one local sandbox on this host."""
    host_env = dict(os.environ if env is None else env)
    plan = LocalPlan(
        policy=policy,
        workspace=workspace,
        homes=host_homes(host_env),
        support=probe_host(),
        extra_masks=tuple(Path(os.path.abspath(p)) for p in policy.mask),
        env_sockets=env_sockets(host_env),
        tools=tuple(Path(os.path.abspath(t)) for t in (*tools, *runtime_dirs())),
    )
    bound = (*(m.source for m in policy.mounts), *map(str, plan.shown_tools()))
    root = tuple(root_args()) if plan.inside_root is not None else ("--ro-bind", "/", "/")
    ids, why = run_as(
        workspace, plan.support.bwrap if plan.namespaces else None, runtime_dirs(), bound, root
    )
    home = None if ids is None else own_home(ids[0])  # (its secrets are the command's to read)
    homes = plan.homes if home is None else tuple(dict.fromkeys((*plan.homes, home)))
    plan = dataclasses.replace(plan, run_as=ids, run_as_why=why, homes=homes)
    if policy.mounts and not plan.namespaces:
        why = (
            "danger-full-access runs with no sandbox of its own"
            if plan.off
            else plan.support.bwrap_reason or "bubblewrap cannot run here"
        )
        raise ConfigError(f"--mount needs the local sandbox's own mount namespace ({why})")
    for extra in policy.mounts:
        check_local_target(extra.target, Path(extra.source).is_dir())
    return plan


@functools.cache
def binds_fds(bwrap: str) -> bool:
    """Whether this bubblewrap has ``--bind-fd`` (0.8 and later)."""
    try:
        done = subprocess.run(
            [bwrap, "--help"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--bind-fd" in done.stdout + done.stderr


MOUNTABLE_TMP = ("/tmp", "/var/tmp")
"""Private (a tmpfs of the sandbox's own) before the mounts are made: a target in them is made."""


def check_local_target(target: str, directory: bool) -> None:
    """A local sandbox sees the host's root read-only, so a mount point cannot be made there:
    the target must exist on the host as the same kind (directory or file), or lie in a private
    ``/tmp`` or ``/var/tmp``; never at, in or around what runs the sandbox (this Python and
    sandboxrun's supervisor, shown from the host)."""
    for own in runtime_dirs():
        real = os.path.realpath(own)
        if target == real or target.startswith(real + "/") or real.startswith(target + "/"):
            raise ConfigError(
                f"invalid --mount target {target}: {real} runs the sandbox (its Python and "
                "supervisor), not a place to mount"
            )
    if any(target.startswith(tmp + "/") for tmp in MOUNTABLE_TMP):
        return  # (private inside: the host's symlinks there are not the sandbox's)
    if os.path.realpath(target) != target:
        raise ConfigError(
            f"invalid --mount target {target}: it leads through a symlink here (to "
            f"{os.path.realpath(target)}); name the real path"
        )
    kind = "directory" if directory else "file"
    exists = os.path.isdir(target) if directory else os.path.isfile(target)
    if not exists or os.path.islink(target):
        raise ConfigError(
            f"invalid --mount target {target}: a local sandbox shows this host's root read-only, "
            f"so the target must be an existing {kind} here (not a symlink), or lie in /tmp or "
            "/var/tmp (made private for the sandbox); on docker any target is made"
        )


def plan_for(
    policy: Policy | None, workspace: Path | None, tools: tuple[str, ...] = ()
) -> LocalPlan | None:
    """A local backend's plan, or None for one built without a policy and workspace (an
    unconfined backend, as tests of the bare mechanism make)."""
    if policy is None or workspace is None:
        return None
    return local_plan(policy, workspace, tools=tools)


def runtime_dirs() -> tuple[str, ...]:
    """Where sandboxrun itself runs from (the supervisor is this Python and this package):
    shown read-only inside even under a private directory (a virtualenv or a checkout in
    ``/tmp``), as a ``--path-prepend`` directory would be."""
    return (sys.prefix, os.path.dirname(os.path.realpath(sys.executable)), supervisor.PACKAGE_ROOT)


def ns_differs(pid: int, kind: str, reported: Mapping[str, int]) -> bool:
    """Whether the sandbox's PID 1 is in another ``kind`` namespace than we are: read from its
    ``/proc`` links, or where they cannot be read (a non-dumpable process, without
    CAP_SYS_PTRACE) from what it reported before any command ran."""
    ours = os.stat(f"/proc/self/ns/{kind}").st_ino
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino != ours
    except OSError:
        theirs = reported.get(kind)
        return theirs is not None and theirs != ours


def verified_layers(
    plan: LocalPlan,
    inner_pid: int | None,
    applied: list[str],
    reported: Mapping[str, int] | None = None,
) -> list[str]:
    """The layers really in force, each checked from outside where it can be: the namespaces
    by comparing ``/proc/PID/ns/*`` of the sandbox's PID 1 with ours, Landlock, seccomp and
    no_new_privs as the supervisor reported applying them (and from its ``/proc`` status)."""
    if plan.off:
        return []
    ns_ok = plan.namespaces and inner_pid is not None
    if ns_ok and inner_pid is not None:
        kinds = ["pid", "mnt", "ipc", "uts"] + (["net"] if plan.policy.network == "none" else [])
        ns_ok = all(ns_differs(inner_pid, kind, reported or {}) for kind in kinds)
    layers = []
    for name in plan.layers():
        if name in ("landlock", "seccomp", "no-new-privileges"):
            ok = name in applied
        elif name == "non-root":
            ok = inner_pid is None or uid_of(inner_pid) != 0  # (unreadable: as planned)
        else:
            ok = plan.namespaces and ns_ok
        if ok:
            layers.append(name)
    return layers


def uid_of(pid: int) -> int | None:
    """The real uid of ``pid`` (its ``/proc`` status), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None
