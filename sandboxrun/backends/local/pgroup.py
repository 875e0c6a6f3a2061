"""The process-group backend: the local fallback that always works.

Commands run in a new session under a private runner process (``sandboxrun/supervisor/runner.py``)
that
is a child subreaper: descendants that double-fork or ``setsid`` re-parent to it and stay
visible, and termination sweeps the whole tree. It gives ``own-session`` and
``descendant-sweep``; it cannot confine the filesystem, the network or resources.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import anyio

from sandboxrun.backends.base import Context, Probe, SandboxView
from sandboxrun.backends.client import RunnerClient
from sandboxrun.backends.local.isolation import SANDBOX_HOME, LocalPlan, plan_for, probe_host
from sandboxrun.backends.supervised import ANSWER_MARGIN_S, SupervisedRun, start_supervised
from sandboxrun.engine import argv
from sandboxrun.engine.launch import Launch, Stdio
from sandboxrun.engine.request import ExecRequest
from sandboxrun.engine.results import Verdict
from sandboxrun.engine.supervise import KILL_BUDGET_S, RunHandle, Supervision
from sandboxrun.models import BackendName, Policy
from sandboxrun.supervisor.procfs import MARKER_VAR

ISOLATION = ("own-session", "descendant-sweep")


def probe_pgroup(policy: Policy | None = None) -> Probe:
    if not sys.platform.startswith("linux") or not Path("/proc/self/stat").exists():
        return Probe("process-group", False, "needs Linux with /proc", ())
    support = probe_host()
    layers = support.layers(policy or Policy())
    return Probe("process-group", True, None, (*ISOLATION, *layers), support)


def local_env(request: ExecRequest, plan: LocalPlan | None = None) -> dict[str, str]:
    """The command's environment on the host: under a login-shell snapshot
    (``argv.exec_env``) the snapshot, the request's own variables, the sandbox's private
    ``HOME`` and ``TMPDIR`` (isolation layer), ``PWD`` (the workdir: no shell sets it for an
    argv; ``/workspace/...`` where the sandbox shows the workspace there), each unless given,
    the run marker, PATH prepends; else the built env (with that ``HOME`` and ``TMPDIR``),
    the marker, and PATH prepends (``each``: applied by the login shell after the profile,
    which also re-applies an explicit PATH: the profile may assign PATH; ``raw``: on the
    host)."""
    if argv.uses_snapshot(request):
        owned = {} if plan is None else plan.command_env({}, request.explicit)
        if "PWD" not in request.explicit:
            owned["PWD"] = seen_dir(request, plan)
        owned[MARKER_VAR] = request.run_id
        return argv.exec_env(request, owned=owned)
    env = dict(request.env) if plan is None else plan.command_env(request.env, request.explicit)
    env[MARKER_VAR] = request.run_id
    direct = request.login == "raw" or (request.direct_argv and request.script is None)
    if not direct:
        explicit = env.get("PATH") if "PATH" in request.explicit else None
        env.update(argv.wrapper_env(explicit_path=explicit, prepend=request.path_prepend))
    elif request.path_prepend:
        joined = argv.join_path_prepend(request.path_prepend)
        env["PATH"] = f"{joined}:{env['PATH']}" if env.get("PATH") else joined
    return env


def seen_dir(request: ExecRequest, plan: LocalPlan | None) -> str:
    """The working directory as the command sees it (``/workspace/...`` where the sandbox
    shows the workspace there: ``LocalPlan.inside_root``)."""
    return str(request.workdir) if plan is None else plan.seen(request.workdir)


def owner_warning(plan: LocalPlan | None) -> tuple[str, ...]:
    """A root invoker's run that stays root in another uid's workspace: why, in its result."""
    return () if plan is None or plan.run_as_why is None else (plan.run_as_why,)


def local_command(request: ExecRequest) -> list[str]:
    """The argv that runs ``request`` on the host (``argv.command``; the default shell is
    the host's bash, else sh)."""
    path = request.env.get("PATH")
    shell = shutil.which("bash", path=path) or shutil.which("sh", path=path)
    return argv.command(request, shell or "/bin/sh", local=True)


class ProcessGroupBackend:
    name: BackendName = "process-group"

    def __init__(self, ctx: Context) -> None:
        self._plan = plan_for(ctx.policy, ctx.workspace.root, ctx.path_prepend)
        self._client = RunnerClient(self._plan)
        self._grace_s = ctx.limits.grace_s
        self._layers: list[str] = []
        self._revive_lock = anyio.Lock()

    async def open(self) -> None:
        await self._client.start()
        self._layers = self._client.layers_in_force()

    async def close(self) -> list[str]:
        # Closing terminates what still runs: give it the grace and the kill budget.
        await self._client.close(self._grace_s + KILL_BUDGET_S + ANSWER_MARGIN_S + 10.0)
        return []

    async def revive(self) -> None:
        """Replace a runner that was declared dead (it exited, was stopped, or stopped
        answering: ``RunnerClient.declare_dead`` killed it) with a fresh one, as docker
        replaces its container: the next call gets a working sandbox. Never half done."""
        dead = self._client
        dead.probe(deep=True)  # stopped while nobody waited: seen now, before this call uses it
        if dead.dead is None:
            return
        async with self._revive_lock:
            if self._client is not dead:
                return  # another call replaced it meanwhile
            with anyio.CancelScope(shield=True):
                await dead.close(KILL_BUDGET_S)
                fresh = RunnerClient(self._plan)
                await fresh.start()
                self._client = fresh
                self._layers = fresh.layers_in_force()

    def plan(self, request: ExecRequest) -> Launch:
        """Any bytes can be carried (argv, env and cwd are passed as bytes): nothing to refuse;
        the argv shown is the command's own (no wrapper runs around it)."""
        command = local_command(request)
        return Launch(
            request=request,
            argv=command,
            env=local_env(request, self._plan),
            cwd=seen_dir(request, self._plan),
            isolation=[*ISOLATION, *self._layers],
            via="supervisor",
            describe=lambda: list(command),
            warnings=owner_warning(self._plan),
        )

    def view(self) -> SandboxView:
        plan = self._plan
        home = SANDBOX_HOME if plan is not None and plan.namespaces else None
        return SandboxView(home=home, supervisor=self._client, host_plan=plan)

    async def start(self, launch: Launch, stdio: Stdio) -> RunHandle:
        return await start_supervised(self._client, launch, stdio)

    async def finalize(self, handle: RunHandle, sup: Supervision) -> Verdict:
        assert isinstance(handle, SupervisedRun)
        handle.close()
        return Verdict()
