"""The systemd-scope backend: each command in its own transient scope (a cgroup).

The fallback when containers are unavailable and systemd is: as root the system manager, as
another user that user's manager. A scope gives ``cgroup`` (the whole managed range, exact),
``own-session`` and the resource limits systemd really applied (checked in the scope's cgroup
files, per run); it cannot make the file system read-only or cut the network.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import NoReturn

import anyio
import anyio.to_thread
import psutil

from sandboxrun import supervisor
from sandboxrun.backends.base import Context, Probe, SandboxView, log
from sandboxrun.backends.client import RunnerClient
from sandboxrun.backends.local.isolation import SANDBOX_HOME, ns_differs, plan_for, probe_host
from sandboxrun.backends.local.pgroup import local_command, local_env, owner_warning, seen_dir
from sandboxrun.backends.systemd import config as cfg
from sandboxrun.backends.systemd.scope import ScopeRun, read_text
from sandboxrun.engine import results
from sandboxrun.engine.launch import Launch, Stdio
from sandboxrun.engine.pty import PtyControl, check_master, host_signaller
from sandboxrun.engine.request import ExecRequest
from sandboxrun.engine.results import NotStarted, Verdict, spawn_exit_code
from sandboxrun.engine.supervise import KILL_BUDGET_S, RunHandle, Supervision
from sandboxrun.errors import BackendError
from sandboxrun.models import (
    LIMIT_GUARANTEES,
    BackendName,
    Limits,
    Policy,
    limit_guarantees,
)
from sandboxrun.supervisor import launchwire
from sandboxrun.supervisor.launchwire import AS_VAR, TTY_VAR
from sandboxrun.supervisor.protocol import clip

BASE_ISOLATION = ("cgroup", "own-session", "descendant-sweep")
LAUNCHER = str(Path(supervisor.HERE, "launcher.py"))
WATCHDOG = str(Path(supervisor.HERE, "scope_watch.py"))
WATCHDOG_EXIT_S = 60.0
PROBE_TIMEOUT_S = 10.0
SYSTEMCTL_TIMEOUT_S = 120.0
"""``systemctl stop`` waits for the unit's own TERM -> grace -> KILL."""
PAGE = os.sysconf("SC_PAGE_SIZE")
SPAWN_TIMEOUT_S = 15.0


def manager_mode() -> cfg.Mode:
    """root talks to the system manager, everyone else to their own user manager."""
    return "system" if os.geteuid() == 0 else "user"


def manager_env(mode: cfg.Mode) -> dict[str, str]:
    """The environment of systemd-run/systemctl: only what reaching the manager needs (the
    command's own environment goes through the launcher, never through systemd)."""
    env = {"PATH": os.environ.get("PATH") or os.defpath, "LC_ALL": "C", "SYSTEMD_PAGER": ""}
    if mode == "user":
        for name in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"):
            if os.environ.get(name):
                env[name] = os.environ[name]
    return env


def launcher_env(
    mode: cfg.Mode, tty: PtyControl | None, ids: tuple[int, int] | None = None
) -> dict[str, str]:
    """systemd-run's environment, which its scope's launcher inherits: ``manager_env``, for
    a run on a terminal its size (``launcher.TTY_VAR``; never the command's own), and the
    ``uid:gid`` the launcher becomes before it joins the sandbox (``AS_VAR``: a root invoker's
    workspace owner; systemd-run's ``--uid`` resolves ids through NSS, and the owner of a
    workspace need not have a passwd entry)."""
    env = manager_env(mode)
    if tty is not None:
        rows, cols = tty.spawn_options().values()
        env[TTY_VAR] = f"{rows},{cols}"
    if ids is not None:
        env[AS_VAR] = f"{ids[0]}:{ids[1]}"
    return env


def tools() -> tuple[str, str] | str:
    """``(systemd-run, systemctl)`` paths, or why they cannot be used."""
    if not sys.platform.startswith("linux"):
        return "needs Linux"
    run, ctl = shutil.which("systemd-run"), shutil.which("systemctl")
    if run is None or ctl is None:
        return "systemd-run/systemctl not found on PATH"
    return run, ctl


def run_captured(
    argv: list[str], env: dict[str, str], timeout: float = PROBE_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )


def systemctl(*args: str, timeout: float = SYSTEMCTL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``systemctl ARGS`` against this process's manager (the system's as root, else the
    user's). Raises OSError / SubprocessError when it cannot run."""
    mode = manager_mode()
    return run_captured(cfg.systemctl_argv("systemctl", mode, *args), manager_env(mode), timeout)


def unit_active(unit: str) -> bool:
    """The unit is loaded and not inactive (``--collect`` unloads it once it has stopped)."""
    return systemctl("show", "-P", "ActiveState", unit).stdout.strip() not in ("", "inactive")


def owner() -> tuple[int, int]:
    """This process as a unit's owner: pid and start time (for pid reuse checks)."""
    return os.getpid(), int(psutil.Process().create_time())


def probe_systemd(policy: Policy | None = None) -> Probe:
    found = tools()
    if isinstance(found, str):
        return Probe("systemd-scope", False, found, ())
    run, ctl = found
    mode = manager_mode()
    env = manager_env(mode)
    manager = "the system manager" if mode == "system" else "the user manager"
    if mode == "user" and "XDG_RUNTIME_DIR" not in env:
        return Probe(
            "systemd-scope",
            False,
            "XDG_RUNTIME_DIR is not set: no user manager to reach (log in, or enable lingering)",
            (),
        )
    try:
        state = run_captured(cfg.systemctl_argv(ctl, mode, "is-system-running"), env)
        status = state.stdout.strip()
        if status in ("", "offline", "unknown"):
            why = cfg.probe_reason("", state.stderr, state.returncode, "systemctl")
            if mode == "system" and not Path("/run/systemd/system").is_dir():
                why = "System has not been booted with systemd as init system (PID 1)"
            elif not state.stderr.strip():
                why = f"systemctl is-system-running says {status or 'nothing'}"
            return Probe("systemd-scope", False, f"{manager} is not usable: {why}", ())
        unit = cfg.unit_name(f"probe-{os.getpid()}-{time.monotonic_ns()}")
        trial = run_captured(
            [
                *cfg.systemd_run_argv(
                    run,
                    mode,
                    unit,
                    cfg.description("probe", *owner()),
                    Limits(),
                    [sys.executable, "-c", ""],
                )
            ],
            env,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Probe("systemd-scope", False, f"{manager} is not usable: {exc}", ())
    if trial.returncode != 0:
        why = cfg.probe_reason(trial.stdout, trial.stderr, trial.returncode, "systemd-run --scope")
        return Probe("systemd-scope", False, f"systemd-run --scope fails: {why}", ())
    support = probe_host()
    layers = support.layers(policy or Policy())
    given = (*BASE_ISOLATION, *LIMIT_GUARANTEES, *layers)
    return Probe("systemd-scope", True, None, given, support)


def _pure_v2(mount: str = "/sys/fs/cgroup") -> bool:
    return Path(mount, "cgroup.controllers").exists()


class SystemdScopeBackend:
    name: BackendName = "systemd-scope"

    def __init__(self, ctx: Context) -> None:
        self._plan = plan_for(ctx.policy, ctx.workspace.root, ctx.path_prepend)
        self._holder: RunnerClient | None = None
        """The sandbox's namespace holder: PID 1 of its namespaces, which every run joins."""
        self._holder_pidfd: int | None = None
        self._ns_extra: list[str] = []
        """Which of the user and network namespaces the holder has its own of (runs join
        those too)."""
        self._layers: list[str] = []
        self.mode: cfg.Mode = manager_mode()
        self._limits = ctx.limits
        self.applied_limits: set[str] | None = None
        """The limits a trial scope showed applied (checked once at open when any is set)."""
        self._tools: tuple[str, str] | None = None
        self._owner = owner()
        self.watchdog: subprocess.Popen[bytes] | None = None
        self._watch_failed = False
        self._revive_lock = anyio.Lock()

    async def open(self) -> None:
        found = tools()
        if isinstance(found, str):
            raise BackendError(found)
        self._tools = found
        await self._open_holder()
        if limit_guarantees(self._limits) and self.applied_limits is None:
            run, _ = found
            self.applied_limits = await anyio.to_thread.run_sync(
                trial_limits, run, self.mode, self._limits
            )
        if self.watchdog is None:
            try:
                self.watchdog = subprocess.Popen(  # noqa: ASYNC220 (vfork+exec: no wait)
                    [sys.executable, "-I", "-S", "-B", WATCHDOG, found[1], self.mode],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    env=manager_env(self.mode),
                )
            except OSError as exc:
                raise BackendError(f"cannot start the scope watchdog: {exc}") from exc
            assert self.watchdog.stdin is not None
            os.set_blocking(self.watchdog.stdin.fileno(), False)

    async def _open_holder(self) -> None:
        plan = self._plan
        if plan is None or plan.off or self._layers:
            return
        if plan.namespaces:
            holder = RunnerClient(plan, holder=True)
            self._holder = holder  # before it starts: a cancelled start is closed by close()
            await holder.start()
            self._layers = holder.layers_in_force()
            inner = holder.inner_pid()
            if inner is not None:  # runs join through this pidfd: never a reused pid
                self._holder_pidfd = os.pidfd_open(inner)
                extra = ("user", "net")
                self._ns_extra = [k for k in extra if ns_differs(inner, k, holder.namespaces)]
        else:  # Landlock and seccomp only: each launcher applies them (probed, not verified)
            self._layers = list(plan.layers())

    async def revive(self) -> None:
        """Replace a namespace holder that is gone or was declared dead (it ended itself: a
        command changed its limits; killed by the kernel) with a fresh one: the next run joins
        new namespaces (what lived in the old ones died with their PID 1)."""
        if self._tools is None:
            await self.open()
        holder = self._holder
        if holder is None:
            return
        holder.probe(deep=True)
        if holder.dead is None:
            return
        async with self._revive_lock:
            if self._holder is not holder:
                return  # another call replaced it meanwhile
            with anyio.CancelScope(shield=True):
                if self._holder_pidfd is not None:
                    os.close(self._holder_pidfd)
                    self._holder_pidfd = None
                self._holder, self._layers = None, []
                await holder.close(KILL_BUDGET_S)
                await self._open_holder()

    def plan_fds(self) -> tuple[int, ...]:
        """The launcher's plan memfd (``_launcher.py`` PLAN_FD) and, under namespaces, a pidfd
        of the holder (HOLDER_FD); none for an unconfined run. The caller owns them."""
        plan = self._plan
        if plan is None or plan.off:
            return ()
        ns_fd = None
        if plan.namespaces:
            if self._holder_pidfd is None:
                raise BackendError("the sandbox's namespace holder is gone")
            ns_fd = os.dup(self._holder_pidfd)
        try:
            data = launchwire.encode_plan(ns_fd, self._ns_extra, plan.confine())
            return (_memfd("sandboxrun-plan", data),) + (() if ns_fd is None else (ns_fd,))
        except BaseException:
            if ns_fd is not None:
                os.close(ns_fd)
            raise

    def _watch(self, sign: str, unit: str) -> None:
        """Tell the watchdog about a unit (``+unit`` before launch, ``-unit`` once empty)."""
        pipe = None if self.watchdog is None else self.watchdog.stdin
        if pipe is None:
            return
        try:  # non-blocking: a stopped or dead watchdog must never stall a run
            os.write(pipe.fileno(), launchwire.watch_line(sign, unit))
        except (OSError, ValueError) as exc:
            if not self._watch_failed:
                self._watch_failed = True
                log.warning(
                    "sandboxrun: the scope watchdog does not listen (%s): scopes of a "
                    "crashed sandboxrun are left to `sandboxrun clean`",
                    exc,
                )

    async def close(self) -> list[str]:
        """Every exec empties its scope before it returns; a scope that could not be emptied
        is still registered, and the watchdog stops it when its stdin closes here."""
        if self._holder_pidfd is not None:
            os.close(self._holder_pidfd)
            self._holder_pidfd = None
        holder, self._holder = self._holder, None
        if holder is not None:
            with anyio.CancelScope(shield=True):
                await holder.close()
        watchdog, self.watchdog = self.watchdog, None
        if watchdog is None:
            return []
        if watchdog.stdin is not None:
            with suppress(OSError):
                watchdog.stdin.close()
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(watchdog.wait, WATCHDOG_EXIT_S)
            except subprocess.TimeoutExpired:
                watchdog.kill()
                await anyio.to_thread.run_sync(watchdog.wait)
        return []

    def _isolation(self, request: ExecRequest) -> list[str]:
        """The scope's guarantees and the requested limits, minus those the trial scope at
        ``open`` showed not applied (each run checks its own scope again)."""
        applied = self.applied_limits
        limits = limit_guarantees(request.limits)
        return [
            *BASE_ISOLATION,
            *(n for n in limits if applied is None or n in applied),
            *self._layers,
        ]

    def plan(self, request: ExecRequest) -> Launch:
        """Any bytes can be carried (argv, env and cwd are passed as bytes): nothing to refuse.
        The launcher in between applies env and cwd; ``shown`` is systemd-run's argv around
        the command."""
        command = local_command(request)
        return Launch(
            request=request,
            argv=command,
            env=local_env(request, self._plan),
            cwd=seen_dir(request, self._plan),
            isolation=self._isolation(request),
            via="scope",
            describe=lambda: self._systemd_run_argv(request, command),
            warnings=owner_warning(self._plan),
        )

    def _systemd_run_argv(self, request: ExecRequest, inner: list[str]) -> list[str]:
        run = self._tools[0] if self._tools else "systemd-run"
        desc = cfg.description(f"run {request.run_id}", *self._owner)
        unit = cfg.unit_name(request.run_id)
        return cfg.systemd_run_argv(
            run, self.mode, unit, desc, request.limits, inner, self._our_tasks()
        )

    def _our_tasks(self) -> int:
        """Tasks of ours in each scope: the keeper, and the launcher where it stays to mirror
        the command it forked into the sandbox's PID namespace."""
        mirrors = self._plan is not None and self._plan.namespaces
        return cfg.KEEPER_TASKS + (1 if mirrors else 0)

    def view(self) -> SandboxView:
        """The namespace holder opens paths in the sandbox's view (none: no namespaces, the
        host's view)."""
        plan = self._plan
        home = SANDBOX_HOME if plan is not None and plan.namespaces else None
        return SandboxView(home=home, supervisor=self._holder, host_plan=plan)

    async def start(self, launch: Launch, stdio: Stdio) -> RunHandle:
        """systemd-run starts a scope whose launcher joins the sandbox, applies env and cwd and
        exec's the command; the run begins once the launcher said so on its status pipe."""
        assert self._tools is not None  # revive() opened it
        request = launch.request
        tty = request.tty
        unit = cfg.unit_name(request.run_id)
        with ExitStack() as always, ExitStack() as on_fail:
            if tty is None:
                pipes = stdio.pipes()
                child_stdio: tuple[int, ...] = pipes.child
                status_r, status_w = os.pipe2(os.O_CLOEXEC)
            else:  # the launcher makes the terminal and sends its master on a status socket
                pipes = None
                null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                always.callback(os.close, null)
                child_stdio = (null, null, null)
                ends = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                status_r, status_w = (end.detach() for end in ends)
                os.set_inheritable(status_r, False)
                os.set_inheritable(status_w, False)
            on_fail.callback(os.close, status_r)
            always.callback(os.close, status_w)
            os.set_blocking(status_r, False)
            hold_r, hold_w = os.pipe2(os.O_CLOEXEC)
            always.callback(os.close, hold_r)
            on_fail.callback(os.close, hold_w)
            spec_fd = _spec_memfd(launch)
            always.callback(os.close, spec_fd)
            plan_fds = self.plan_fds()
            for fd in plan_fds:
                always.callback(os.close, fd)
            child_fds = (spec_fd, status_w, *child_stdio, hold_r, *plan_fds)
            inner = [sys.executable, "-I", "-S", "-B", LAUNCHER, *map(str, child_fds)]
            argv = self._systemd_run_argv(request, inner)
            self._watch("+", unit)
            on_fail.callback(self._watch, "-", unit)
            try:
                proc = subprocess.Popen(  # noqa: ASYNC220 (vfork+exec: no wait)
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=status_w,
                    stderr=status_w,
                    pass_fds=tuple(dict.fromkeys(child_fds)),
                    start_new_session=True,
                    env=launcher_env(
                        self.mode, tty, None if self._plan is None else self._plan.run_as
                    ),
                )
            except OSError as exc:
                raise NotStarted("sandbox_error", str(exc)) from None
            if pipes is not None:
                stdio.sent()
            on_fail.pop_all()  # the run owns the status and hold ends, and the unit, now
        run = ScopeRun(
            proc,
            unit,
            self.mode,
            self._tools[1],
            manager_env(self.mode),
            None if pipes is None else pipes.pump,
            status_r,
            hold_w,
        )
        received: list[int] | None = None if tty is None else []
        try:
            run.lost = await self._launch(run, launch, received)
            if tty is not None and received is not None:
                master = self._master(received)
                if master is None:
                    await self._unusable(run)
                received.clear()  # the run's streams own it from here
                run.use_pump(stdio.terminal(master))
                tty.attach(master, host_signaller(tty))
        except BaseException:
            for fd in received or ():
                with suppress(OSError):
                    os.close(fd)
            self._release(run)
            raise
        return run

    @staticmethod
    def _master(received: list[int]) -> int | None:
        """The one pty master the launcher sent (None: anything else came, or nothing)."""
        if len(received) != 1 or check_master(received[0]) is not None:
            return None
        return received[0]

    async def _unusable(self, run: ScopeRun) -> NoReturn:
        """The run started, but no terminal came with it: it is ended, and not started."""
        survivors = (await run.terminate(0.0)).survivors
        await run.wait_exit()
        why = "the scope's launcher sent no terminal master for the run"
        raise NotStarted("sandbox_error", why, survivors=survivors)

    async def finalize(self, handle: RunHandle, sup: Supervision) -> Verdict:
        """The scope's own accounting (its cgroup counts orphans too), an OOM kill in it, and
        the limits it turned out not to apply."""
        assert isinstance(handle, ScopeRun)
        try:
            status, _, sig = results.outcome(sup)
            oom = status == "failed" and handle.oom_killed(sig, handle.sent_kill)
            return Verdict(
                status="oom_killed" if oom else None,
                usage=handle.accounting_figures(),
                lost=tuple(handle.lost),
            )
        finally:
            self._release(handle)

    def _release(self, run: ScopeRun) -> None:
        if run.emptied:
            self._watch("-", run.unit)  # else the watchdog stops it
        run.close()

    async def _launch(
        self, run: ScopeRun, launch: Launch, received: list[int] | None = None
    ) -> list[str]:
        """Wait until the launcher exec'd the command inside the scope; return the limits its
        cgroup does not show (``_check_limits``). ``NotStarted`` for a run that ended before
        it began (or, under ``strict``, whose scope lost a limit it claimed)."""
        request = launch.request
        report = await run.read_status(SPAWN_TIMEOUT_S, received)
        if report is not None:
            run.set_keeper(report.keeper)
            if report.cgroup is not None:  # the launcher ran in the scope
                with suppress(ValueError):
                    run.paths = cfg.cgroup_paths(report.cgroup, run.unit, pure_v2=_pure_v2())
                    run.accounting.slice_oom_before = run.slice_oom_kills()
        if report is not None and report.launched and report.spawn_error is None:
            unapplied = self._check_limits(run, request)
            claimed = [n for n in unapplied if n in launch.isolation]
            if not (claimed and request.policy.strict):
                return unapplied
            survivors = (await run.terminate(0.0)).survivors
            await run.wait_exit()
            why = f"strict: this run's scope did not apply {', '.join(claimed)}; it was killed"
            raise NotStarted("sandbox_error", why, survivors=survivors, lost=unapplied)
        survivors = (await run.terminate(0.0)).survivors
        status = await run.wait_exit()
        code = None if status is None else os.waitstatus_to_exitcode(status)
        if report is not None and report.spawn_error is not None:
            errno_value = report.spawn_error.get("errno")
            exit_code = spawn_exit_code(errno_value if isinstance(errno_value, int) else 0)
            error = clip(str(report.spawn_error.get("error")), 4000)  # the launcher's is shorter
            raise NotStarted("spawn_error", error, exit_code=exit_code, survivors=survivors)
        if report is None:
            why = f"systemd-run did not start the scope within {SPAWN_TIMEOUT_S:g} s"
        else:
            said = report.messages or "no message"
            why = f"systemd-run could not start the scope (exit code {code}): {said}"
        raise NotStarted("sandbox_error", why, survivors=survivors)

    def _check_limits(self, run: ScopeRun, request: ExecRequest) -> list[str]:
        """The limits asked for that the scope's cgroup does not really show (they move from
        the result's ``isolation`` to its ``missing_guarantees``)."""
        wanted = limit_guarantees(request.limits)
        if not wanted:
            return []
        files = cfg.limit_files(run.paths) if run.paths is not None else {}
        return [
            name
            for name in wanted
            if not cfg.limit_applied(
                name, read_text(files.get(name)), request.limits, PAGE, self._our_tasks()
            )
        ]


def trial_limits(systemd_run: str, mode: cfg.Mode, limits: Limits) -> set[str]:
    """Start a trial scope with ``limits`` and return the names of those its cgroup shows
    applied (a user manager on cgroup v1, for one, applies none). Blocking; bounded."""
    unit = cfg.unit_name(f"trial-{os.getpid()}-{time.monotonic_ns()}")
    script = 'while read -r l; do echo "$l"; done </proc/self/cgroup; echo END; read _'  # builtins
    argv = cfg.systemd_run_argv(
        systemd_run,
        mode,
        unit,
        cfg.description("limits trial", *owner()),
        limits,
        ["/bin/sh", "-c", script],
    )
    applied: set[str] = set()
    with subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=manager_env(mode),
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            lines = []
            for line in proc.stdout:
                if line.strip() == "END":
                    break
                lines.append(line)
            with suppress(ValueError):
                paths = cfg.cgroup_paths("".join(lines), unit, pure_v2=_pure_v2())
                for name, path in cfg.limit_files(paths).items():
                    if cfg.limit_applied(name, read_text(path), limits, PAGE):
                        applied.add(name)
        finally:
            proc.stdin.close()
            try:
                proc.wait(PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
    return applied


def _spec_memfd(launch: Launch) -> int:
    """The command's argv, environment and working directory in a private memfd."""
    data = launchwire.encode_spec(launch.argv, dict(launch.env), launch.cwd)
    return _memfd("sandboxrun-spec", data)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
