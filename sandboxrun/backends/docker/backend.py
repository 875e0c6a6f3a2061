"""The docker backend: one hardened, workspace-mapped container per ``Sandbox``; many execs.

Lifecycle calls retry transient engine failures and have deadlines (``dockerapi``); execs go
through the Engine API (create/start on the raw socket, exit code from exec inspect) and the
multiplexed stream is demultiplexed here (``demux``). Docker cannot kill an exec, so the exec's
processes are found by their ``SANDBOXRUN_RUN_ID`` marker and their descendants, on this host's
/proc when the engine is local (fast, ~3 ms), else by an in-container sweep exec, and receive
TERM, grace, KILL until none is left (``docker_run``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import time
from pathlib import Path

import anyio
import anyio.to_thread

from sandboxrun.backends.base import ContainerAccess, Context, Probe, SandboxView
from sandboxrun.backends.client import RunnerClient
from sandboxrun.backends.docker import api as dockerapi
from sandboxrun.backends.docker import cgroup as docker_cgroup
from sandboxrun.backends.docker import config as cfg
from sandboxrun.backends.docker import disk
from sandboxrun.backends.docker import hint as image_hint
from sandboxrun.backends.docker import rendezvous as sv
from sandboxrun.backends.docker import seccomp as docker_seccomp
from sandboxrun.backends.docker.config import BASE_IMAGE
from sandboxrun.backends.docker.engine_exec import NO_ENGINE_TERMINAL, DockerRun, start_timeout
from sandboxrun.backends.docker.session import ContainerSession
from sandboxrun.backends.docker.watchdog import Watchdog
from sandboxrun.backends.owner import owner_of
from sandboxrun.backends.secrets import secret_paths
from sandboxrun.backends.supervised import SupervisedRun, start_supervised
from sandboxrun.engine import argv, results
from sandboxrun.engine.launch import Launch, Stdio
from sandboxrun.engine.paths import CONTAINER_ROOT
from sandboxrun.engine.request import ExecRequest
from sandboxrun.engine.results import NotStarted, Verdict
from sandboxrun.engine.supervise import RunHandle, Supervision
from sandboxrun.errors import (
    BackendError,
    ConfigError,
    PolicyRefusedError,
    SandboxUnavailableError,
)
from sandboxrun.models import BackendName, Limits, Policy
from sandboxrun.supervisor import procfs as proctree
from sandboxrun.supervisor.procfs import MARKER_VAR
from sandboxrun.units import format_size

CLOSE_BUDGET_S = 15.0
"""How long closing may take in all: removal attempts, retries and backoff."""
REMOVE_ATTEMPT_S = 5.0
"""The deadline of one removal request (a stalled engine is asked again)."""
SPAWN_EXTRA = {
    "inherit": True,  # the image's environment under it, as ``docker exec`` gives
    "oom_score_adj": 1000,  # the OOM killer takes a command, not the supervisor
}
GONE_WAIT_S = 5.0
"""How long a run whose sandbox's supervisor died waits for the container's other processes
to be gone (the kernel ends them a moment after the supervisor)."""
log = logging.getLogger("sandboxrun")


def probe_docker(image: str = BASE_IMAGE) -> Probe:
    try:
        client = dockerapi.connect(dockerapi.PROBE_TIMEOUT_S)
    except SandboxUnavailableError as exc:  # the reason alone: the caller names the backend
        return Probe("docker", False, exc.reason, ())
    except Exception as exc:  # any failure to reach the engine is a reason to fall back
        return Probe("docker", False, str(exc), ())
    try:
        found = dockerapi.inspect_image(client, image, budget_s=dockerapi.PROBE_TIMEOUT_S)
        if found is None:  # how to get it: pull where a registry has it, or build
            return Probe("docker", False, image_hint.missing_image(client, image), ())
    except Exception as exc:  # (a BackendError: "docker: inspect image ... failed: ...")
        return Probe("docker", False, str(exc), ())
    finally:
        client.close()
    # What a docker sandbox can give, whatever the policy and limits asked (a sandbox's own
    # ``isolation`` says what it does give: e.g. only the limits its cgroup really shows).
    default_user = cfg.parse_user(None)
    every = Policy(access="read-only"), Limits(cpus=1)  # asks for every guarantee
    enforced = cfg.isolation(every[0], every[1], default_user, seccomp=True)
    # a writable root is the container's own layer; its bound is checked at open (``disk``)
    enforced += ["ephemeral-root", "disk-limit"]
    return Probe("docker", True, None, tuple(enforced))


def gone_note(left: int) -> str:
    """What a result says of the processes of a dead container still alive (``_wait_gone``)."""
    return f"; {left} process(es) of the container still lived {GONE_WAIT_S:g} s on" if left else ""


def main_processes(init_pid: int, wait_s: float = 10.0) -> frozenset[int]:
    """The container's own main process(es): the init's children once it has forked them (a
    main process recorded too early would later look like a leftover of some exec)."""
    deadline = time.monotonic() + wait_s
    while proctree.alive(init_pid):
        found = frozenset(p.pid for p in proctree.process_table().values() if p.ppid == init_pid)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.005)
    return frozenset()  # the init is gone: the container is dying (seen by the first exec)


def owns_pid(pid: int, cid: str) -> bool:
    """Whether ``pid`` is a process of the container ``cid`` (its cgroup names it)."""
    return any(cid in path for _, path in proctree.cgroup_lines(pid))


def engine_visible(pid: int, cid: str) -> bool:
    """Whether the container's PID 1 (the engine's ``pid``) is a process of this host: its
    cgroup names the container (readable by anyone, also when PID 1 is the non-dumpable
    supervisor, whose ``environ`` only root may read), else its ``environ`` can be read."""
    return owns_pid(pid, cid) or os.access(f"/proc/{pid}/environ", os.R_OK)


def engine_socket() -> str | None:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return host.removeprefix("unix://") if host.startswith("unix://") else None


def _mount_points() -> list[str]:
    """This host's mount points (``/proc/self/mountinfo``), for ``cfg.mounts_under``."""
    try:
        text = Path("/proc/self/mountinfo").read_text(errors="replace")
    except OSError:
        return []
    return cfg.mount_points(text)


def precheck(root: Path, policy: Policy) -> None:
    """What this backend refuses of a workspace and its mounts, before anything reaches the
    engine (also called before ``--image-from`` builds: a refusal does not wait for a build)."""
    if policy.workspace_at == "host":
        raise ConfigError(
            "--workspace-at host needs a local backend: a docker sandbox shows the workspace at "
            "/workspace only"
        )
    cfg.check_workspace_utf8(root)
    cfg.check_workspace(root, engine_socket())
    for extra in policy.mounts:  # a hard link to the engine socket in a mounted directory
        cfg.check_workspace(Path(extra.source), engine_socket())
        if extra.read_only:  # this engine's read-only bind is not recursive
            inner = cfg.mounts_under(extra.source, _mount_points())
            if inner:
                raise ConfigError(
                    f"invalid --mount {extra.shown()!r}: {inner[0]} is a file system mounted "
                    "inside it, which a read-only docker bind would show writable; mount "
                    "it on its own"
                )


def recheck_mounts(policy: Policy) -> None:
    """Each mount's source checked again just before the container is made (the engine
    resolves the path itself): it still leads, without a symlink, to the path checked."""
    from sandboxrun.backends.secrets import door_sockets
    from sandboxrun.engine.mounts import rechecked

    doors = [os.path.realpath(s) for s in door_sockets(os.environ)]
    for extra in policy.mounts:
        rechecked(extra, os.path.realpath(extra.source), doors)


class DockerBackend:
    name: BackendName = "docker"

    def __init__(self, ctx: Context) -> None:
        workspace, policy, limits, image, user = (
            ctx.workspace,
            ctx.policy,
            ctx.limits,
            ctx.image,
            ctx.user,
        )
        precheck(workspace.root, policy)  # before anything reaches the engine
        cfg.check_limits(limits, cpu_count=os.cpu_count() if engine_socket() else None)
        self.workspace = workspace
        self.policy = policy
        self.limits = limits
        self.image = image or BASE_IMAGE
        # root runs the command as the workspace's owner, if not root (as the local backends)
        owner = owner_of(workspace.root) if user is None else None
        self.user = cfg.parse_user(user, owner=owner)
        self.session = ContainerSession(self.user)
        """The container, as this backend and its engine-path runs share it."""
        self.seccomp = True
        """Whether containers get sandboxrun's seccomp profile (False once the engine said it
        cannot apply one: they then get the engine's default and ``isolation`` says so)."""
        self.shell = "bash" if image is None else "sh"
        self._oom_before: dict[str, int | None] = {}
        """Per supervised run: the container's OOM kill count before it started."""
        self._recycle_lock = anyio.Lock()
        self.limits_shown: set[str] | None = None
        """The limits the container's cgroup really shows (local engines), else None."""
        self.close_errors: list[str] = []
        """What could not be removed (a container left behind), one sentence each, until
        ``close`` returns it."""
        self.supervisor: RunnerClient | None = None
        """The supervisor inside the container (``docker_supervisor``), once it connected;
        None: commands go through the engine's exec API (no python3, remote engine)."""
        self.want_supervisor = engine_socket() is not None
        """Whether to start one: the host directory it comes from must be on the engine's
        host (a local unix socket; ``SANDBOXRUN_DOCKER_SUPERVISOR=0`` turns it off)."""
        if os.environ.get("SANDBOXRUN_DOCKER_SUPERVISOR", "1") == "0":
            self.want_supervisor = False
        self._rendezvous: sv.Rendezvous | None = None
        self._watchdog: Watchdog | None = None
        """Removes a container without a supervisor if this process dies (``watchdog``)."""
        self.oom_file: str | None = None
        """The container's OOM-kill counter file (local engines), found once at open."""
        self.disk_mode: str | None = "quota" if limits.disk_bytes is not None else None
        """How ``--disk`` is enforced: ``quota`` (the engine's storage driver; tried first),
        ``watch`` (``disk.LayerWatch``: the driver takes no size), None (no bound)."""
        self._layer_watch: disk.LayerWatch | None = None
        self._watch_pidfd: int | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    async def open(self) -> None:
        conn = await anyio.to_thread.run_sync(self._open_sync)
        if conn is not None:
            supervisor = RunnerClient()
            try:
                await supervisor.attach(conn, start_timeout(self.limits.cpus))
            except BaseException:  # cancelled, or no ready: the caller's close removes the rest
                conn.close()
                raise
            supervisor.watch(self.session.supervisor_pid)  # stopped or gone: seen from here at once
            self.supervisor = supervisor

    def _open_sync(self) -> socket.socket | None:
        self.session.reset()  # a recycle's
        self.session.client = dockerapi.connect()
        parent = sv.parent_dir(self.workspace.root) if self.want_supervisor else None
        if parent is not None:
            self._rendezvous = sv.Rendezvous(parent)
        try:
            cid = self._create()
        except BackendError as exc:
            if self._rendezvous is None or "bind source path does not exist" not in str(exc):
                raise
            # the engine does not see this host's files (docker-in-docker, a VM, ssh):
            # the sandbox runs without a supervisor, through the engine's exec path
            self._rendezvous.close()
            self._rendezvous = None
            cid = self._create()
        if not self._start(cid):
            self.seccomp = False
            log.warning(
                "sandboxrun: the docker engine cannot apply a seccomp profile: the sandbox runs "
                "under its default (`seccomp` is not in isolation)"
            )
            self._discard(cid)
            cid = self._create()
            self._start(cid)
        self._learn(cid)
        wanted = self._rendezvous is not None
        conn = self._meet_supervisor()
        if conn is None and wanted and self.session.local:
            # No supervisor can run here (no usable python3): a container with an init to
            # reap the engine's execs' orphans, which the idle ``sleep`` would not.
            self._discard(cid)
            self.session.keep = frozenset()
            cid = self._create()
            self._start(cid)
            self._learn(cid)
        try:
            self._bound_disk(self.session.container_id or cid)
        except BaseException:  # refused: the caller's close removes the container
            if conn is not None:
                conn.close()
            raise
        if conn is None:  # nothing in the container ends its runs when this process dies
            try:
                self._watchdog = Watchdog(cid)
            except OSError as exc:
                log.warning(
                    "sandboxrun: no watchdog for the sandbox container (%s): if this process "
                    "dies, `sandboxrun clean` removes it",
                    exc,
                )
        return conn

    def _learn(self, cid: str) -> None:
        """What this host sees of the started container ``cid``: its PID 1, own processes,
        cgroup, limits and OOM counter (a local engine's only)."""
        state = self.session.state()
        if not state.get("Running"):
            raise BackendError(f"the sandbox container did not start: {state}")
        pid = int(state.get("Pid") or 0)
        self.session.local = pid > 0 and engine_visible(pid, cid)
        if self.session.local:
            self.session.init_pid = pid
            if self._rendezvous is None:  # the init's children now are the main process
                self.session.keep = main_processes(pid)
            self.session.cgroup_procs = proctree.cgroup_procs_file(pid)
            self.session.run_cgroup_base = docker_cgroup.unified_dir(pid, cid)
            self.limits_shown = cfg.cgroup_limits(proctree.cgroup_lines(pid))
            self.oom_file = proctree.oom_file(pid)

    def _bound_disk(self, cid: str) -> None:
        """Watch what the container ``cid`` holds from here (``disk.LayerWatch``): its layer
        where the engine gave no size (``disk_mode`` ``watch``), and in every mode the engine's
        own files it may write (``/etc/hosts``...), which no quota covers. Refused
        (``disk-limit`` missing) where the layer cannot be read: a remote engine, a driver
        without one, a layer this uid may not read."""
        limit = self.limits.disk_bytes
        if self.disk_mode is None or limit is None:
            return
        inspected = dockerapi.inspect_container(self.session.api(), cid)
        upper = disk.upper_dir(inspected) if self.disk_mode == "watch" else None
        init, procs = self.session.init_pid, self.session.cgroup_procs
        local = self.session.local and init is not None and owns_pid(init, cid)
        why = None
        if self.disk_mode == "watch" and (not local or upper is None):
            why = "the engine's storage driver takes no size and its layers are not on this host"
        elif local and init is not None:
            extras = disk.engine_files(inspected)
            try:
                devices = (
                    frozenset({Path(upper).stat().st_dev, Path(f"/proc/{init}/root").stat().st_dev})
                    if upper is not None
                    else frozenset()
                )
                pidfd = os.pidfd_open(init)
            except OSError as exc:
                why = f"the engine's storage driver takes no size; its layer: {exc}"
            else:

                def measure() -> int:
                    total = disk.files_bytes(extras)
                    if upper is not None:
                        total += disk.layer_bytes(upper)
                        if procs is not None:
                            total += disk.deleted_open_bytes(proctree.read_pids(procs), devices)
                    return total

                def exceeded(held: int, unread: str | None) -> None:
                    self._overfull(cid, pidfd, held, unread)

                try:
                    self._layer_watch = disk.LayerWatch(measure, limit, exceeded)
                    self._watch_pidfd = pidfd
                except OSError as exc:
                    os.close(pidfd)
                    why = f"the engine's storage driver takes no size; its layer: {exc}"
        if why is None:
            return
        if self.policy.allow_degraded and not self.policy.strict:
            self.disk_mode = None  # ``disk-limit`` is then missing from every result
            log.warning("sandboxrun: --disk is not enforced: %s", why)
            return
        raise PolicyRefusedError("docker", ["disk-limit"], why, strict=self.policy.strict)

    def _overfull(self, cid: str, pidfd: int, held: int, unread: str | None = None) -> str | None:
        """The container ``cid`` holds ``held`` bytes, past ``--disk`` (or ``unread``: a part
        of its layer cannot be measured). Every process of it dies with its PID 1 (SIGKILL
        through a pidfd taken at open: never another process); the runs end
        ``disk_exceeded`` and the next command gets a fresh container (only a running
        command writes, so none passes the bound unseen). Returns why, or None for a watch of
        a container replaced since (stale)."""
        if self.session.container_id != cid:
            return None
        limit = format_size(self.limits.disk_bytes or 0)
        what = (
            f"a part of the sandbox's writable root cannot be measured ({unread}), so it counts "
            f"as past --disk {limit}"
            if unread
            else f"the sandbox's writable root held {held / (1 << 20):.1f} MiB, past --disk {limit}"
        )
        why = (
            f"{what}: every process in it was killed and its files outside the workspace are "
            "gone (the next command gets a fresh root)"
        )
        self.session.disk_exceeded = why
        self.session.recycle_needed = True
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # (already dead)
        except OSError as exc:
            log.warning("sandboxrun: could not kill the over-full sandbox container: %s", exc)
        return why

    def _disk_look(self) -> str | None:
        """One look at the bound now (a run's end: one that passed it between two looks of
        the watch is not reported ``completed``); why it is past, else None."""
        watch, pidfd, cid = self._layer_watch, self._watch_pidfd, self.session.container_id
        if watch is None or pidfd is None or cid is None:
            return None
        over = watch.look()
        if over is None:
            return None
        return self._overfull(cid, pidfd, *over)

    def _discard(self, cid: str) -> None:
        """Remove a container set up in vain (it is started again another way)."""
        assert self.session.client is not None
        self.session.container_id = None
        error = dockerapi.remove_container(
            self.session.client, cid, budget_s=CLOSE_BUDGET_S, attempt_s=REMOVE_ATTEMPT_S
        )
        if error is not None:
            self._left_behind(cid, error)

    def _meet_supervisor(self) -> socket.socket | None:
        """Our end of the supervisor's connection, or None: the image cannot run one (a
        ``sleep`` idles in the container instead) or the engine's processes are not visible
        here. The supervisor may sit below an entrypoint that forks: any process of the
        container may be it (nothing else runs there before it connects)."""
        rendezvous, self._rendezvous = self._rendezvous, None
        if rendezvous is None:
            return None
        init = self.session.init_pid
        if not self.session.local or init is None or self.session.cgroup_procs is None:
            rendezvous.close()
            return None
        procs = self.session.cgroup_procs

        def gave_up() -> bool:
            if not proctree.alive(init):
                raise BackendError("the sandbox container stopped while its supervisor started")
            return sv.sleeping(proctree.read_pids(procs))

        met = rendezvous.accept(
            start_timeout(self.limits.cpus), lambda pid: sv.descends_from(pid, init), gave_up
        )
        if met is None:
            if not sv.sleeping(proctree.read_pids(procs)):
                raise BackendError("the sandbox's supervisor did not connect")
            return None
        conn, self.session.supervisor_pid = met
        chain: set[int] = {init}
        pid = self.session.supervisor_pid
        while pid not in (init, 0) and len(chain) < 64:  # an entrypoint's processes above it
            chain.add(pid)
            found = proctree.read_proc(pid)
            pid = found.ppid if found is not None else 0
        self.session.keep = self.session.keep | frozenset(chain - {init})
        return conn

    def _create(self) -> str:
        assert self.session.client is not None
        recheck_mounts(self.policy)  # just before the engine resolves the sources itself
        config = cfg.host_config(
            workspace=self.workspace.root,
            policy=self.policy,
            limits=self.limits,
            image=self.image,
            user=self.user,
            lbls=cfg.labels(self.workspace.root),
            seccomp=docker_seccomp.profile_json() if self.seccomp else None,
            secrets=tuple(secret_paths(os.environ)),
            supervisor=None
            if self._rendezvous is None
            else (self._rendezvous.dir, sv.MOUNT, sv.MAIN_COMMAND),
            disk_quota=self.limits.disk_bytes if self.disk_mode == "quota" else None,
        )
        try:
            cid = dockerapi.create_container(self.session.client, config)
        except BackendError as exc:
            if self.disk_mode != "quota" or not disk.storage_opt_refused(str(exc)):
                raise
            self.disk_mode = "watch"  # this driver takes no size: watched from here instead
            return self._create()
        self.session.container_id = cid
        return cid

    def _start(self, cid: str) -> bool:
        """Start the container: False (at once, no retry) when the engine cannot apply the
        seccomp profile it was given."""
        assert self.session.client is not None
        seccomp = self.seccomp
        return dockerapi.start_container(
            self.session.client, cid, lambda said: seccomp and cfg.seccomp_unsupported(said)
        )

    async def close(self) -> list[str]:
        """Remove the container within ``CLOSE_BUDGET_S``; what could not be removed (it keeps
        its labels: ``sandboxrun clean`` removes it) is logged and returned, one sentence each,
        with what a failed setup left behind before."""
        cid = self.session.container_id
        supervisor, self.supervisor = self.supervisor, None
        self.session.supervisor_pid = None
        if supervisor is not None:
            with anyio.move_on_after(1.0):
                await supervisor.close()
        if self._rendezvous is not None:
            self._rendezvous.close()
            self._rendezvous = None
        with anyio.move_on_after(CLOSE_BUDGET_S + 2.0) as scope:
            await anyio.to_thread.run_sync(self._close_sync, abandon_on_cancel=True)
        if scope.cancelled_caught and cid is not None:  # a safety net: attempts have deadlines
            self._left_behind(cid, "the engine did not answer")
        left, self.close_errors = self.close_errors, []
        return left

    def _close_sync(self) -> None:
        watch, self._layer_watch = self._layer_watch, None
        if watch is not None:
            watch.stop()
        pidfd, self._watch_pidfd = self._watch_pidfd, None
        if pidfd is not None:
            os.close(pidfd)
        # Taken at once: an abandoned close thread must never clear a later (reopened) client.
        client, self.session.client = self.session.client, None
        cid, self.session.container_id = self.session.container_id, None
        error = None
        if client is not None and cid is not None:
            error = dockerapi.remove_container(
                client, cid, budget_s=CLOSE_BUDGET_S, attempt_s=REMOVE_ATTEMPT_S
            )
            if error is not None:
                self._left_behind(cid, error)
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            if error is None:
                watchdog.stop()
            else:
                watchdog.keep()  # it removes the container once this process is gone
        if client is not None:
            client.close()

    def _left_behind(self, cid: str, why: str) -> None:
        message = (
            f"could not remove the sandbox container {cid[:12]} ({why}); "
            "`sandboxrun clean` removes it once this process has exited"
        )
        self.close_errors.append(message)
        log.warning("sandboxrun: %s", message)

    # -- commands ---------------------------------------------------------------------------
    def plan(self, request: ExecRequest) -> Launch:
        """The Engine API is JSON: argv, script, variables or workdir that are not UTF-8 are
        refused (``InputError``) instead of being mangled by the engine into U+FFFD."""
        command = argv.command(request, self.shell)
        cwd = str(CONTAINER_ROOT / request.workdir_rel)
        env = self._env(request, cwd)
        cfg.check_utf8(argv=request.argv, script=request.script, env=env, workdir=cwd)
        isolation = cfg.isolation(
            self.policy,
            self.limits,
            self.user,
            shown=self.limits_shown,
            seccomp=self.seccomp,
            disk=self.disk_mode is not None,
        )

        def shown() -> list[str]:
            return cfg.docker_exec_argv(
                self.session.container_id or "<sandbox-container>",
                command,
                env=env,
                workdir=cwd,
                user=self.user,
                interactive=request.stdin is not None,
            )

        via = "supervisor" if self.supervisor is not None else "engine"
        if request.tty is not None and via == "engine" and self.session.run_cgroup_base is None:
            raise ConfigError(NO_ENGINE_TERMINAL)  # (known before anything starts)
        return Launch(request, command, env, cwd, isolation, via, shown)

    def _env(self, request: ExecRequest, cwd: str) -> dict[str, str]:
        """Under a login-shell snapshot the whole environment (``argv.exec_env``: PATH
        included; the host's ``HOST_ONLY`` paths only when explicit; ``HOME`` the container's
        unless given; ``PWD`` the workdir: the supervisor's own would be inherited); else
        ``docker_config.exec_env`` (``raw``: no wrapper variables)."""
        marker = (MARKER_VAR, request.run_id)
        if argv.uses_snapshot(request):
            owned = {marker[0]: marker[1]}
            if "PWD" not in request.explicit:
                owned["PWD"] = cwd
            if "HOME" not in request.explicit:
                owned["HOME"] = cfg.HOME
            return argv.exec_env(request, owned=owned, drop=cfg.HOST_ONLY, utf8_only=True)
        raw = request.login == "raw"
        return cfg.exec_env(
            request.env,
            explicit=request.explicit - {"PATH"} if raw else request.explicit,
            marker=marker,
            prepend=() if raw else request.path_prepend,
        )

    def view(self) -> SandboxView:
        access = ContainerAccess(
            container_id=self.session.container_id,
            init_pid=self.session.init_pid,
            local=bool(self.session.local),
            archive=None
            if self.session.client is None or self.session.container_id is None
            else dockerapi.Archive(self.session.client, self.session.container_id),
            user=self.user,
        )
        return SandboxView(home=cfg.HOME, supervisor=self.supervisor, container=access)

    async def start(self, launch: Launch, stdio: Stdio) -> RunHandle:
        if self.session.client is None or self.session.container_id is None:
            raise BackendError("docker: the sandbox container is gone (the sandbox was closed)")
        if self.supervisor is not None:  # as it is now (a recycle may have changed it)
            return await self._start_supervised(launch, stdio)
        run = DockerRun(self.session, launch, stdio.stdout, stdio.stderr)
        self.session.active.add(launch.request.run_id)  # visible to a recycle from now on
        try:
            await run.start()
        except BackendError as exc:
            await anyio.to_thread.run_sync(run.close)
            raise NotStarted("sandbox_error", str(exc)) from None
        except BaseException:
            await anyio.to_thread.run_sync(run.close)
            raise
        return run

    async def _start_supervised(self, launch: Launch, stdio: Stdio) -> SupervisedRun:
        """Through the supervisor in the container (``backends/supervised``); OOM kills and
        the container's death are read from the host (``finalize``), as is what of the run
        is left (``_verify``)."""
        supervisor, run_id = self.supervisor, launch.request.run_id
        assert supervisor is not None
        if supervisor.dead or self.session.dying():
            self.session.recycle_needed = True
            why = "the sandbox container is not running (it will be recreated)"
            raise NotStarted("sandbox_error", why)
        oom_before = proctree.read_oom(self.oom_file) if self.oom_file else None
        self.session.active.add(run_id)
        try:
            run = await start_supervised(supervisor, launch, stdio, SPAWN_EXTRA, self._verify)
        except BaseException:
            self.session.active.discard(run_id)
            raise
        self._oom_before[run_id] = oom_before
        return run

    scratch = (cfg.TMP, cfg.VAR_TMP, cfg.HOME, "/dev/shm", "/dev/mqueue")  # noqa: S108
    """The container's own scratch directories (tmpfs, and the IPC namespace's file systems):
    empty when it starts, emptied again between two holders of a pooled sandbox
    (``api.pool_reset``)."""

    def strays(self) -> int | None:
        """With no run in progress: SIGKILL every process of the container beyond its own
        (its cgroup: nothing hides from it) and return how many could not be killed; None
        when they cannot be seen (a remote engine, the engine's exec path) or a run is in
        progress. Blocking (up to a second): call it in a thread."""
        if self.session.active or not self.session.cgroup_procs or not self.session.init_pid:
            return None
        return self._leftovers("", kill=True)

    async def _verify(self, run_id: str) -> int:
        if not self._leftovers(run_id, kill=False):  # one cgroup read: no thread needed
            return 0
        return await anyio.to_thread.run_sync(self._leftovers, run_id)

    async def finalize(self, handle: RunHandle, sup: Supervision) -> Verdict:
        verdict = await self._finalize(handle, sup)
        if self._layer_watch is not None and verdict.status != "disk_exceeded":
            why = await anyio.to_thread.run_sync(self._disk_look)
            if why is not None:  # past the bound between two looks of the watch: killed now
                left = await anyio.to_thread.run_sync(self._wait_gone)
                why += gone_note(left)
                return dataclasses.replace(verdict, status="disk_exceeded", error=why)
        return verdict

    async def _finalize(self, handle: RunHandle, sup: Supervision) -> Verdict:
        if isinstance(handle, DockerRun):
            handle.release_terminal()  # here, not in the thread below: the loop uses it
            try:
                verdict = dataclasses.replace(await handle.verdict(sup), via="engine")
            finally:
                await anyio.to_thread.run_sync(handle.close)
            if self.session.dying():  # (its init killed: the rest of the namespace follows)
                left = await anyio.to_thread.run_sync(self._wait_gone)
                if left:
                    verdict = dataclasses.replace(
                        verdict, error=(verdict.error or "") + gone_note(left)
                    )
            return verdict
        assert isinstance(handle, SupervisedRun)
        handle.close()
        try:
            verdict = self._supervised_verdict(handle, sup)
            if handle.client.dead or self.session.dying():
                left = await anyio.to_thread.run_sync(self._wait_gone)
                if left:
                    verdict = dataclasses.replace(
                        verdict, error=(verdict.error or "") + gone_note(left)
                    )
            return dataclasses.replace(verdict, via="supervisor")
        finally:
            self.session.active.discard(handle.run_id)

    def _wait_gone(self) -> int:
        """The supervisor (the container's PID 1) died: wait, at most ``GONE_WAIT_S``, until
        no process of the container lives, and return how many still do. The kernel kills the
        rest of its PID namespace only after the supervisor's socket closed, which is how the
        run's end is seen: without this wait a result could come while a process of the
        sandbox still ran (a ``setsid`` daemon, for a moment). Blocking: a thread."""
        procs = self.session.cgroup_procs
        if not procs:
            return 0
        deadline = time.monotonic() + GONE_WAIT_S
        while True:
            left = {pid for pid in proctree.read_pids(procs) if proctree.alive(pid)}
            if not left or time.monotonic() > deadline:
                return len(left)
            time.sleep(0.005)

    def _supervised_verdict(self, handle: SupervisedRun, sup: Supervision) -> Verdict:
        oom_before = self._oom_before.pop(handle.run_id, None)
        supervisor = handle.client
        status, _, sig = results.outcome(sup)
        if status == "completed" and not supervisor.dead:
            return Verdict()  # exited 0 and everything of it gone: nothing more to ask
        if supervisor.dead or self.session.dying():
            self.session.recycle_needed = True
            if self.session.disk_exceeded:
                return Verdict(status="disk_exceeded", error=self.session.disk_exceeded)
            why = supervisor.dead or "its supervisor is gone"
            error = (
                f"the sandbox container stopped or was removed during the exec ({why}); "
                "the next command gets a fresh container"
            )
            return Verdict(status="sandbox_error", error=error)
        after = proctree.read_oom(self.oom_file) if self.oom_file else None
        killed = status == "failed" and sig == "SIGKILL"
        if killed and None not in (oom_before, after) and oom_before != after:
            return Verdict(status="oom_killed")
        return Verdict()

    def _leftovers(self, run_id: str, kill: bool = True) -> int:
        """What of a run the supervisor said was over is still alive, seen from the host
        (the container's cgroup: forks and cleared environments cannot hide from it): with
        no other run active, every process but the container's own; else those whose nearest
        marked ancestor is this run. Those found in the first look, and what they fork, are
        killed (a neighbour's run starting meanwhile is never taken for one of them); returns
        how many could not be (``kill=False``: how many there are, one look)."""
        if not self.session.cgroup_procs or not self.session.init_pid:
            return 0
        base = self.session.keep | {self.session.init_pid}
        known: set[tuple[int, int]] | None = None
        deadline = time.monotonic() + 1.0
        while True:
            others = frozenset(self.session.active - {run_id})  # read afresh: execs come and go
            live = proctree.cgroup_members(
                self.session.cgroup_procs, run_id, base=base, others=frozenset()
            )
            if others:
                table = {p.pid: p for p in live}
                live = [p for p in live if proctree.owner_by_marker(p.pid, table) == run_id]
            if known is None:
                known = {(p.pid, p.start) for p in live}
            else:
                parents = {pid for pid, _ in known}
                live = [p for p in live if (p.pid, p.start) in known or p.ppid in parents]
                known |= {(p.pid, p.start) for p in live}
            if not live or not kill or time.monotonic() > deadline:
                return len(live)
            proctree.signal_all(live, signal.SIGKILL)
            time.sleep(0.01)

    async def revive(self) -> None:
        """Before a call uses the sandbox: a supervisor seen dead now (exited, stopped, its
        limits changed: ``RunnerClient.probe``), or a container marked for it, is replaced
        (``_recycle``; a call meanwhile waits for the one under way)."""
        if self.supervisor is not None:
            self.supervisor.probe(deep=True)
            self.session.recycle_needed = (
                self.session.recycle_needed or self.supervisor.dead is not None
            )
        if self.session.recycle_needed or self._recycle_lock.locked():
            await self._recycle()

    async def _recycle(self) -> None:
        """Replace the container, once, after the execs still running in it have ended (they
        are not killed by a neighbour's recycle; new execs wait here meanwhile)."""
        async with self._recycle_lock:
            if not self.session.recycle_needed:
                return  # another exec recycled it while this one waited
            while self.session.active:  # noqa: ASYNC110 - runs leave `active` in worker threads
                await anyio.sleep(0.05)
            with anyio.CancelScope(shield=True):  # never half done: no container, or a leak
                self.close_errors += await self.close()  # kept: the sandbox's close reports
                await self.open()
            self.session.recycle_needed = (
                False  # only now: a failed open is retried by the next exec
            )
