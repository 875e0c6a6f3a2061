"""The local isolation layer of process-group and systemd-scope: what to apply, and how.

A local sandbox gets one set of namespaces, like one container: bubblewrap (``bwrap``) starts
the sandbox's supervisor (the process-group runner, or systemd-scope's namespace holder) as PID
1 of new mount, PID, IPC and UTS namespaces (network too under ``network none``; a user
namespace where the invoker is not root; every capability dropped where it is). Inside it the
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

import contextlib
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
from sandboxrun.models import Policy

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

    def layers(self, policy: Policy) -> tuple[str, ...]:
        """The isolation names a local backend gives under ``policy`` on this host."""
        if policy.access == "danger-full-access":
            return ()
        names: list[str] = []
        if self.bwrap:
            names += NAMESPACE_LAYERS
            if policy.network == "none":
                names.append("network-none")
            if policy.access == "read-only":
                names.append("read-only-workspace")
        if os.geteuid() != 0:
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
        return "; ".join(reasons)


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

    @property
    def off(self) -> bool:
        return self.policy.access == "danger-full-access"

    @property
    def namespaces(self) -> bool:
        return not self.off and self.support.bwrap is not None

    def writable_dirs(self) -> list[str]:
        dirs = [] if self.policy.access == "read-only" else [str(self.workspace)]
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
        return [*found, *self.extra_masks, *self.env_sockets]

    def bwrap_argv(self, command: list[str]) -> list[str]:
        """``bwrap ... -- command``: the namespaces and mounts of this sandbox (pure but for
        ``lstat`` of the paths to mask: a missing path is not masked, a symlink is masked
        where it points)."""
        assert self.support.bwrap is not None
        argv = [self.support.bwrap, "--die-with-parent", "--as-pid-1"]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if self.policy.network == "none":
            argv.append("--unshare-net")
        if os.geteuid() == 0:
            argv += ["--cap-drop", "ALL"]
        else:
            argv.append("--unshare-user")
        argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for path in SOCKET_DIRS:
            real = os.path.realpath(path)
            if os.path.isdir(real) and not os.path.islink(path):
                argv += ["--tmpfs", path]
        argv += ["--remount-ro", "/run"] if os.path.isdir("/run") else []
        argv += ["--dir", SANDBOX_HOME]
        for tool in self.shown_tools():
            argv += ["--ro-bind", str(tool), str(tool)]
        workspace = str(self.workspace)
        argv += ["--bind" if self.policy.access != "read-only" else "--ro-bind"]
        argv += [workspace, workspace]
        shown = [self.workspace, *self.shown_tools()]
        for secret in self.masked_paths():  # after the workspace: a secret in it stays masked
            argv += mask_args(secret, self.workspace, shown)
        return [*argv, "--", *command]


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


def host_homes(env: dict[str, str]) -> tuple[Path, ...]:
    """The home directories whose secrets are masked: the invoker's, and as root every
    home on the host (root can read them all)."""
    homes: list[Path] = []
    for value in (env.get("HOME"), os.path.expanduser("~")):
        if value and os.path.isabs(value):
            homes.append(Path(value))
    if os.geteuid() == 0:
        homes.append(Path("/root"))
        with_home = Path("/home")
        with contextlib.suppress(OSError):
            homes += sorted(p for p in with_home.iterdir() if p.is_dir())
    return tuple(dict.fromkeys(homes))


def env_sockets(env: dict[str, str]) -> tuple[Path, ...]:
    found = []
    for name in ("SSH_AUTH_SOCK", "GPG_AGENT_INFO", "DBUS_SESSION_BUS_ADDRESS", "DOCKER_HOST"):
        value = env.get(name, "")
        for part in value.replace(";", ",").split(","):
            part = part.removeprefix("unix:path=").removeprefix("unix://").split(":")[0]
            if part.startswith("/"):
                found.append(Path(part))
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
    return LocalPlan(
        policy=policy,
        workspace=workspace,
        homes=host_homes(host_env),
        support=probe_host(),
        extra_masks=tuple(Path(os.path.abspath(p)) for p in policy.mask),
        env_sockets=env_sockets(host_env),
        tools=tuple(Path(os.path.abspath(t)) for t in (*tools, *runtime_dirs())),
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
    for name in plan.support.layers(plan.policy):
        if name in ("landlock", "seccomp", "no-new-privileges"):
            ok = name in applied
        elif plan.namespaces:
            ok = ns_ok or name == "non-root"
        else:
            ok = name == "non-root"
        if ok:
            layers.append(name)
    return layers
