"""``Sandbox``: open a backend once, run many commands in it, close it; and a sync ``run``.

Raises ``InputError`` (bad workspace, workdir, env, options) before anything runs,
``SandboxUnavailableError`` when the requested backend cannot be used, ``PolicyRefusedError``
under ``strict`` when a requested guarantee cannot be enforced, and re-raises the caller's
cancellation after a shielded, bounded cleanup (the cancelled result is in ``last_result``).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Self

import anyio
import anyio.to_thread

from sandboxrun import backends, denial, redact
from sandboxrun.argv import join_path_prepend, validate_argv
from sandboxrun.env import build_env
from sandboxrun.errors import ConfigError, PolicyRefusedError
from sandboxrun.models import ExecResult, Limits, Policy, required_guarantees
from sandboxrun.paths import Workspace
from sandboxrun.process import RunFacts
from sandboxrun.spec import ExecRequest, Sink

log = logging.getLogger("sandboxrun")

EscalationHook = Callable[[ExecResult, Policy], bool | Awaitable[bool]]
"""``exec(..., escalate=hook)``: called with the denied result and the proposed wider policy;
True re-runs the command once under it."""


def check_encodable(value: str) -> None:
    """Arguments, scripts and variables must be encodable for the OS (no lone surrogates)."""
    try:
        os.fsencode(value)
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{value!r} cannot be passed to a process: {exc.reason}") from None


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


def new_run_id() -> str:
    return secrets.token_hex(8)


class Sandbox:
    """``async with Sandbox(workspace=...) as sb: result = await sb.exec([...])``."""

    def __init__(
        self,
        workspace: str | os.PathLike[str] = ".",
        *,
        backend: str = "auto",
        policy: Policy | None = None,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        pass_proxy: bool = False,
        path_prepend: Sequence[str] = (),
        host_env: Mapping[str, str] | None = None,
        image: str | None = None,
        user: str | None = None,
    ) -> None:
        self.workspace = Workspace.open(workspace)
        self.policy = policy or Policy()
        for mask in self.policy.mask:
            check_mask(mask, self.workspace.root)
        self.limits = limits or Limits()
        self._requested = backend
        self._env = dict(env or {})
        self._pass_env = list(pass_env)
        self._pass_proxy = pass_proxy
        self._path_prepend = list(path_prepend)
        self._host_env = dict(os.environ if host_env is None else host_env)
        self._backend: backends.Backend | None = None
        self._warned: set[tuple[str, ...]] = set()
        self.image = image
        self.user = user
        self.fallback_reason: str | None = None
        self.last_result: ExecResult | None = None
        self.close_errors: list[str] = []
        """What closing could not clean up (a container the engine did not remove in time),
        one sentence each; also logged as warnings on the ``sandboxrun`` logger."""
        self._inflight: dict[anyio.CancelScope, anyio.Event] = {}
        self._closed: anyio.Event | None = None
        """Not None while ``aclose`` runs; a later ``aclose`` waits for it to be set."""
        if backend != "auto":
            backends.check_name(backend)

    @property
    def backend(self) -> backends.Backend:
        if self._backend is None:
            raise RuntimeError("the Sandbox is not open: use `async with Sandbox(...) as sb`")
        return self._backend

    def context(self) -> backends.Context:
        return backends.Context(
            self.workspace,
            self.policy,
            self.limits,
            self.image,
            self.user,
            tuple(self._path_prepend),
        )

    def choose_backend(self) -> tuple[backends.Backend, str | None]:
        """Probe and create (not open) the backend; refuse docker-only options elsewhere."""
        backend, reason = backends.select(self._requested, self.context())
        if (self.image is not None or self.user is not None) and backend.name != "docker":
            why = f" ({reason})" if reason else ""
            raise ConfigError(
                f"--image and --user need the docker backend, not {backend.name}{why}"
            )
        return backend, reason

    async def __aenter__(self) -> Self:
        backend, self.fallback_reason = await anyio.to_thread.run_sync(self.choose_backend)
        try:
            await backend.open()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await backend.close()
            self._collect_close_errors(backend)
            raise
        self._backend = backend
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the sandbox (idempotent). Execs still running are cancelled first and finish
        their cleanup (TERM, grace, KILL: bounded); each returns a ``cancelled`` result whose
        ``error`` says the sandbox was closed. Then the backend is closed (container removed)."""
        with anyio.CancelScope(shield=True):
            if self._closed is not None:  # another aclose() is at work: wait for its end
                await self._closed.wait()
                return
            if self._backend is None:
                return
            self._closed = closed = anyio.Event()
            try:
                for scope in list(self._inflight):
                    scope.cancel()
                for done in list(self._inflight.values()):
                    await done.wait()
                backend, self._backend = self._backend, None
                if backend is not None:
                    await backend.close()
                    self._collect_close_errors(backend)
            finally:
                self._closed = None
                closed.set()

    def _collect_close_errors(self, backend: backends.Backend) -> None:
        self.close_errors += getattr(backend, "close_errors", [])

    def prepare(
        self,
        argv: Sequence[str] | None = None,
        *,
        shell: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        timeout: float | None = None,
        stdin: bytes | None = None,
        path_prepend: Sequence[str] = (),
        sink: Sink | None = None,
    ) -> ExecRequest:
        """Validate one command into an ``ExecRequest``. No process is started."""
        if (argv is None) == (shell is None):
            raise ConfigError("give exactly one of an argv list or shell='script'")
        if shell is not None and "\0" in shell:
            raise ConfigError("the shell script contains a NUL byte")
        for value in [
            *(argv or []),
            shell or "",
            workdir or "",
            *(env or {}).values(),
            *(env or {}),
        ]:
            check_encodable(value)
        cwd = self.workspace.resolve_workdir(workdir)
        prepend = [*self._path_prepend, *path_prepend]
        if prepend:
            join_path_prepend(prepend)
        explicit = {**self._env, **(env or {})}
        built = build_env(
            self._host_env,
            explicit=explicit,
            pass_through=[*self._pass_env, *pass_env],
            pass_proxy=self._pass_proxy,
        )
        try:
            timeout_s = self.limits.clamp_timeout(timeout)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        return ExecRequest(
            run_id=new_run_id(),
            argv=None if argv is None else validate_argv(argv),
            script=shell,
            env=built,
            path_prepend=prepend,
            workdir=cwd,
            workdir_rel=PurePosixPath(cwd.relative_to(self.workspace.root).as_posix()),
            stdin=stdin,
            timeout_s=timeout_s,
            limits=self.limits,
            policy=self.policy,
            sink=sink,
            explicit=frozenset(explicit),
        )

    def missing_guarantees(self, request: ExecRequest) -> list[str]:
        enforced = set(self.backend.isolation(request))
        return [g for g in required_guarantees(self.policy, self.limits) if g not in enforced]

    async def exec(
        self,
        argv: Sequence[str] | None = None,
        *,
        shell: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        timeout: float | None = None,
        stdin: bytes | None = None,
        path_prepend: Sequence[str] = (),
        sink: Sink | None = None,
        escalate: EscalationHook | None = None,
    ) -> ExecResult:
        """Run one command and return what happened. Never raises for a non-zero exit.

        ``escalate``: when the run ends with a ``denial`` that a wider policy would allow
        (``denial.escalate_to``), the hook (sync or async) is called once with the result and
        that policy. The denial is read from the command's own output, which an untrusted
        command controls: it can ask for ``network on`` or ``workspace-write`` (never for
        ``danger-full-access``) by printing the right line, so a hook that approves without
        looking is a policy bypass. If it returns True the same command runs once more, in a
        fresh sandbox on the same workspace with the same backend request, limits and options
        but that policy,
        and that result is returned with ``escalated_from`` set to this sandbox's policy (the
        live sink sees both runs). False returns the denied result; an exception raised by the
        hook propagates (nothing has run again; the denied result is in ``last_result``)."""
        request = self.prepare(
            argv,
            shell=shell,
            workdir=workdir,
            env=env,
            pass_env=pass_env,
            timeout=timeout,
            stdin=stdin,
            path_prepend=path_prepend,
            sink=sink,
        )
        result = await self.run_request(request)
        if escalate is None:
            return result
        return await self._escalate(result, request, escalate)

    def escalated(self, request: ExecRequest, policy: Policy) -> tuple[Sandbox, ExecRequest]:
        """A fresh, unopened ``Sandbox`` like this one (workspace, requested backend, limits,
        env options, image, user) but under ``policy``, and ``request`` re-made for it (same
        command, environment, workdir, stdin and sink; a new run id)."""
        sandbox = Sandbox(
            self.workspace.root,
            backend=self._requested,
            policy=policy,
            limits=self.limits,
            env=self._env,
            pass_env=self._pass_env,
            pass_proxy=self._pass_proxy,
            path_prepend=self._path_prepend,
            host_env=self._host_env,
            image=self.image,
            user=self.user,
        )
        again = dataclasses.replace(request, run_id=new_run_id(), policy=policy)
        return sandbox, again

    async def _escalate(
        self, result: ExecResult, request: ExecRequest, hook: EscalationHook
    ) -> ExecResult:
        """Ask ``hook`` once about ``result``'s denial; on approval re-run once (no further
        escalation) under the proposed policy. ``aclose()`` cancels the re-run like any exec."""
        found = result.denial
        if found is None or found.escalate_to is None or found.escalate_to == self.policy:
            return result
        answer = hook(result, found.escalate_to)
        if inspect.isawaitable(answer):
            answer = await answer
        if not answer or self._closed is not None or self._backend is None:
            return result
        widened, again = self.escalated(request, found.escalate_to)
        escalated_from = {"escalated_from": self.policy}
        scope, done = anyio.CancelScope(), anyio.Event()
        self._inflight[scope] = done
        rerun: ExecResult | None = None
        try:
            with scope:
                async with widened:
                    rerun = await widened.run_request(again)
        finally:
            del self._inflight[scope]
            done.set()
            self.close_errors += widened.close_errors
        if rerun is None:  # aclose() cancelled the re-run: its cancelled result, if it started
            closed = widened.last_result or result
            rerun = closed.model_copy(
                update={"error": "cancelled: the sandbox was closed during the command"}
            )
        rerun = rerun.model_copy(update=escalated_from)
        self.last_result = rerun
        return rerun

    def _diagnose(self, result: ExecResult, request: ExecRequest) -> ExecResult:
        """``result`` with ``denial`` set when the sandbox refused something or a limit was hit
        (``sandboxrun.denial``); diagnosis never fails a run."""
        if result.status not in denial.DIAGNOSED:
            return result
        try:
            facts = denial.host_facts(result, self.workspace.root, workdir=request.workdir)
            found = denial.diagnose(result, request.policy, facts, request.limits)
        except Exception:  # a diagnosis is a courtesy: the result stands without it
            log.debug("sandboxrun: diagnosing run %s failed", result.run_id, exc_info=True)
            return result
        return result if found is None else result.model_copy(update={"denial": found})

    async def run_request(self, request: ExecRequest) -> ExecResult:
        backend = self.backend
        backend.check_request(request)
        missing = self.missing_guarantees(request)
        if missing and (self.policy.strict or not self.policy.allow_degraded):
            raise PolicyRefusedError(backend.name, missing, strict=self.policy.strict)
        if missing and tuple(missing) not in self._warned:
            self._warned.add(tuple(missing))
            log.warning(
                "sandboxrun: backend %s cannot enforce: %s", backend.name, ", ".join(missing)
            )
        facts = RunFacts(
            backend=backend.name,
            argv=redact.mask_argv(backend.command(request), request),
            run_id=request.run_id,
            isolation=backend.isolation(request),
            missing=missing,
            fallback_reason=self.fallback_reason,
        )
        if self._closed is not None:
            raise RuntimeError("the Sandbox is closing: no new command can start")
        scope, done = anyio.CancelScope(), anyio.Event()
        self._inflight[scope] = done
        result: ExecResult | None = None
        try:
            with scope:
                result, cancelled = await backend.exec(request, facts)
                self.last_result = result
                if cancelled is not None:
                    raise cancelled
        finally:
            del self._inflight[scope]
            done.set()
        if scope.cancelled_caught and (result is None or result.status == "cancelled"):
            # aclose() cancelled it, not the caller (a run that had already completed when the
            # cancellation landed keeps its result as it is)
            closed = {"error": "cancelled: the sandbox was closed during the command"}
            if result is None:  # before the backend started anything
                result = ExecResult(
                    status="cancelled",
                    duration_s=0.0,
                    backend=facts.backend,
                    isolation=facts.isolation,
                    missing_guarantees=facts.missing,
                    fallback_reason=facts.fallback_reason,
                    argv=facts.argv,
                    run_id=facts.run_id,
                    **closed,
                )
            else:
                result = result.model_copy(update=closed)
            self.last_result = result
        assert result is not None  # only our own scope's cancellation is swallowed above
        result = self._diagnose(result, request)
        self.last_result = result
        return result


def run(
    argv: Sequence[str] | None = None,
    *,
    shell: str | None = None,
    workspace: str | os.PathLike[str] = ".",
    backend: str = "auto",
    policy: Policy | None = None,
    limits: Limits | None = None,
    workdir: str | None = None,
    env: Mapping[str, str] | None = None,
    pass_env: Sequence[str] = (),
    pass_proxy: bool = False,
    path_prepend: Sequence[str] = (),
    timeout: float | None = None,
    stdin: bytes | None = None,
    escalate: EscalationHook | None = None,
) -> ExecResult:
    """Synchronous one-shot: open a sandbox, run one command, close it (``escalate``: see
    ``Sandbox.exec``)."""

    async def go() -> ExecResult:
        async with Sandbox(
            workspace,
            backend=backend,
            policy=policy,
            limits=limits,
            pass_proxy=pass_proxy,
        ) as sb:
            return await sb.exec(
                argv,
                shell=shell,
                workdir=workdir,
                env=env,
                pass_env=pass_env,
                timeout=timeout,
                stdin=stdin,
                path_prepend=path_prepend,
                escalate=escalate,
            )

    return anyio.run(go)
