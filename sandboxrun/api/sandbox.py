"""``Sandbox``: open a backend once, run many commands in it, close it; and a sync ``run``.

Raises ``InputError`` (bad workspace, workdir, env, options) before anything runs,
``SandboxUnavailableError`` when the requested backend cannot be used, ``PolicyRefusedError``
under ``strict`` when a requested guarantee cannot be enforced, and re-raises the caller's
cancellation after a shielded, bounded cleanup (the cancelled result is in ``last_result``).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import inspect
import logging
import math
import os
import posixpath
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, overload

import anyio
import anyio.to_thread

from sandboxrun import backends
from sandboxrun.api import files
from sandboxrun.api import request as prepared
from sandboxrun.api.jobs import MAX_ENDED_JOBS, Job
from sandboxrun.api.login import Logins, NotRun
from sandboxrun.api.pool_reset import taint_of
from sandboxrun.api.shell import SHELL_ENV, Shell
from sandboxrun.api.terminal import MAX_TERMINALS, Terminal
from sandboxrun.engine import denial, results
from sandboxrun.engine.argv import script_hint
from sandboxrun.engine.capture import redact
from sandboxrun.engine.capture.prune import auto_prune
from sandboxrun.engine.capture.spill import SpillSession, default_spill_root
from sandboxrun.engine.env import build_env
from sandboxrun.engine.launch import Launch
from sandboxrun.engine.paths import Workspace
from sandboxrun.engine.pty import PtyControl
from sandboxrun.engine.request import ExecRequest, LoginMode, Sink, StdinStream
from sandboxrun.engine.results import RunFacts
from sandboxrun.engine.run import run as run_engine
from sandboxrun.errors import (
    ConfigError,
    InputError,
    PolicyRefusedError,
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
    SandboxUnavailableError,
)
from sandboxrun.models import ExecResult, Limits, Policy, Status, replaced, required_guarantees

if TYPE_CHECKING:
    from sandboxrun.detached.handle import DetachedSandbox

log = logging.getLogger("sandboxrun")

INTERACTIVE_SHELL = "if command -v bash >/dev/null 2>&1; then exec bash -i; fi; exec sh -i"
"""What ``open_terminal`` runs without an argv (in the login shell: the profile applies)."""
MKDIR = "/bin/mkdir"
"""``write_file(parents=True)`` makes missing directories with it, by absolute path: never a
``mkdir`` the workspace or a profile put first in PATH."""
OPEN_TERMINAL_TIMEOUT_S = 30.0
"""``open_terminal`` returns by then (the login snapshot and the spawn have their own)."""

EscalationHook = Callable[[ExecResult, Policy], bool | Awaitable[bool]]
"""``exec(..., escalate=hook)``: called with the denied result and the proposed wider policy;
True re-runs the command once under it."""


class Sandbox:
    """``async with Sandbox(workspace=...) as sb: result = await sb.exec([...])``."""

    max_ended_jobs: int = MAX_ENDED_JOBS
    """Ended jobs kept in ``jobs()`` (with their spill files); beyond it, the oldest ended
    ones are released (``forget``). Set it on the instance to change it. The same number of
    ended terminals is kept in ``terminals()``."""
    max_terminals: int = MAX_TERMINALS
    """Terminals open at once (``open_terminal``); one more is refused."""

    def __init__(
        self,
        workspace: str | os.PathLike[str] = ".",
        *,
        backend: str | backends.Backend = "auto",
        policy: Policy | None = None,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        pass_proxy: bool = False,
        path_prepend: Sequence[str] = (),
        host_env: Mapping[str, str] | None = None,
        image: str | None = None,
        user: str | None = None,
        login: LoginMode = "snapshot",
        login_shell: str | None = None,
        keep_spill: bool = False,
    ) -> None:
        """``login``: ``"snapshot"`` runs the login profile once per sandbox and gives every
        command its environment; ``"each"`` gives every command its own login shell
        (``sandboxrun.api.login``). ``login_shell``: the shell for both and for ``shell=`` scripts
        (default: chosen inside the sandbox from the user's login shell).

        ``keep_spill``: leave the spill files (the results' ``*_spill`` paths) when the sandbox
        closes; by default they are removed then. Kept ones are pruned later with the rest
        of the spill root (``sandboxrun.engine.capture.prune``: 24 h, 1 GiB by default)."""
        self.workspace = Workspace.open(workspace)
        self.policy = policy or Policy()
        masks = prepared.mapped_masks(self.policy.mask, self.workspace)
        if masks != self.policy.mask:  # ``/workspace/...``: the workspace's, on every backend
            self.policy = replaced(self.policy, mask=masks)
        for mask in self.policy.mask:
            prepared.check_mask(mask, self.workspace.root)
        if self.policy.mounts:  # each source resolved, every refusal before anything starts
            self.policy = replaced(
                self.policy, mounts=prepared.checked_mounts(self.policy, self.workspace.root)
            )
        self.limits = limits or Limits()
        if self.limits.disk_bytes is not None and self.policy.root != "writable":
            raise ConfigError(
                "--disk (Limits.disk_bytes) bounds a writable root: give --root writable "
                "(Policy(root='writable')) too; the workspace's own file system is not bounded"
            )
        self._requested = backend
        self._env = dict(env or {})
        self._pass_env = list(pass_env)
        self._pass_proxy = pass_proxy
        self._path_prepend = list(path_prepend)
        self._host_env = dict(os.environ if host_env is None else host_env)
        self._base_env: dict[str, str] | None = None
        """The environment of a command that adds no variables (``_base``: built once)."""
        self._logins = Logins(login, login_shell, base=self._base, explicit=self._env)
        self._secrets = redact.SecretBook()
        """The secret values given to this sandbox: masked in the ``sandboxrun`` logger's
        records while it lives (``redact.LOG_MASK``)."""
        redact.LOG_MASK.watch(self._secrets)
        if self.policy.mask_output:
            self._secrets.note(redact.secret_pairs(self._env.items()))
        self._backend: backends.Backend | None = None
        self._warned: set[tuple[str, ...]] = set()
        self.image = image
        self.user = user
        self.fallback_reason: str | None = None
        self.last_result: ExecResult | None = None
        self._opened = False
        self.close_errors: list[str] = []
        """What closing could not clean up (a container the engine did not remove in time),
        one sentence each; also logged as warnings on the ``sandboxrun`` logger."""
        self._inflight: dict[anyio.CancelScope, anyio.Event] = {}
        self._jobs: list[Job] = []
        self._terminals: list[Terminal] = []
        self._closed: anyio.Event | None = None
        """Not None while ``aclose`` runs; a later ``aclose`` waits for it to be set."""
        self.keep_spill = keep_spill
        self._spill: SpillSession | None = None
        """This sandbox's spill directory while open (None: spilling straight to the root)."""
        self._spill_owned = True
        """False for an escalation's re-run sandbox: it spills into its parent's directory."""
        self._taint: str | None = None
        """Why this sandbox may not be handed to another holder in place (a pool's reset,
        ``api.pool_reset``): the first thing beyond a plain command that ended on its own."""
        self._retired = False
        """Handed back to its pool (``SandboxPool``): closed for its holder at once, whether
        the pool closes it or hands its backend on (``_adopt``)."""
        if isinstance(backend, str) and backend != "auto":
            backends.check_name(backend)

    def _base(self) -> dict[str, str]:
        """What ``prepare`` builds for a command that adds no variables (a snapshot is taken
        with it too): built once, its inputs never change; a copy each time."""
        if self._base_env is None:
            self._base_env = build_env(
                self._host_env,
                explicit=self._env,
                pass_through=self._pass_env,
                pass_proxy=self._pass_proxy,
            )
        return dict(self._base_env)

    @property
    def backend(self) -> backends.Backend:
        if self._retired:
            raise RuntimeError(RETIRED)
        if self._backend is None:
            raise RuntimeError("the Sandbox is not open: use `async with Sandbox(...) as sb`")
        return self._backend

    @property
    def spill_dir(self) -> Path | None:
        """The directory of this sandbox's spill files (``<spill root>/sandbox-<id>``) while
        it is open; None when closed, or when it could not be made (runs then spill to the
        root itself, or say in ``warnings`` why they could not)."""
        return None if self._spill is None or self._spill.closed else self._spill.path

    def _spill_root(self) -> Path:
        return self.limits.spill_dir or default_spill_root()

    def _open_spill(self) -> None:
        """Make this sandbox's locked spill directory; trouble only means runs spill to the
        root as they would without one (where a failure ends up in their ``warnings``)."""
        if self._spill is not None or not self._spill_owned or self.limits.spill_max <= 0:
            return
        try:
            self._spill = SpillSession.create(self._spill_root())
        except (OSError, ConfigError) as exc:
            log.debug("sandboxrun: no spill directory of its own for this sandbox: %s", exc)

    def _with_spill_dir(self, request: ExecRequest) -> ExecRequest:
        """``request`` spilling into this sandbox's directory (when it has one)."""
        where = self.spill_dir
        if where is None or request.limits.spill_dir == where:
            return request
        limits = replaced(request.limits, spill_dir=where)
        return dataclasses.replace(request, limits=limits)

    def context(self) -> backends.Context:
        return backends.Context(
            self.workspace,
            self.policy,
            self.limits,
            self.image,
            self.user,
            tuple(self._path_prepend),
        )

    def _choose_backend(self) -> tuple[backends.Backend, str | None]:
        """Probe and create (not open) the backend; refuse docker-only options elsewhere. A
        backend given as an object (``sandboxrun.testing.FakeBackend``) is used as it is."""
        requested = self._requested
        if isinstance(requested, str):
            backend, reason = backends.select(requested, self.context())
        else:
            backend, reason = requested, None
        if (self.image is not None or self.user is not None) and backend.name != "docker":
            if requested == "auto":  # docker is what it needs: say why docker cannot, as -b docker
                docker = backends.probe("docker", self.image, self.policy)
                if not docker.available:
                    raise SandboxUnavailableError(
                        "docker",
                        f"{docker.reason or 'unavailable'} (--image and --user run only on docker)",
                    )
            why = f" ({reason})" if reason else ""
            raise ConfigError(
                f"--image and --user need the docker backend, not {backend.name}{why}"
            )
        return backend, reason

    async def __aenter__(self) -> Self:
        return await self.open()

    @classmethod
    async def attach(cls, name: str, *, directory: Path | None = None) -> DetachedSandbox:
        """The detached sandbox ``name`` (made by ``create(..., detach=True)`` or ``sandboxrun
        create``) of this uid: a ``DetachedSandbox`` (``exec``, ``info``, ``remove``)."""
        from sandboxrun.detached.handle import DetachedSandbox

        return await DetachedSandbox.attach(name, directory=directory)

    @overload
    @classmethod
    async def create(
        cls,
        workspace: str | os.PathLike[str] = ...,
        *,
        detach: Literal[False] = ...,
        name: None = ...,
        ttl: None = ...,
        idle_ttl: None = ...,
        **options: Any,
    ) -> Sandbox: ...

    @overload
    @classmethod
    async def create(
        cls,
        workspace: str | os.PathLike[str] = ...,
        *,
        detach: Literal[True],
        name: str | None = ...,
        ttl: float | None = ...,
        idle_ttl: float | None = ...,
        **options: Any,
    ) -> DetachedSandbox: ...

    @overload
    @classmethod
    async def create(
        cls,
        workspace: str | os.PathLike[str] = ...,
        *,
        detach: bool,
        name: str | None = ...,
        ttl: float | None = ...,
        idle_ttl: float | None = ...,
        **options: Any,
    ) -> Sandbox | DetachedSandbox: ...

    @classmethod
    async def create(
        cls,
        workspace: str | os.PathLike[str] = ".",
        *,
        detach: bool = False,
        name: str | None = None,
        ttl: float | None = None,
        idle_ttl: float | None = None,
        **options: Any,
    ) -> Sandbox | DetachedSandbox:
        """An open sandbox. ``detach``: held by a keeper process of its own, so that it
        outlives this process (until ``remove``, ``sandboxrun rm`` or its ``ttl`` /
        ``idle_ttl`` in seconds); ``options``: ``Sandbox``'s (a ``DetachedSandbox`` takes
        backend, policy, limits, env, pass_env, pass_proxy, path_prepend, image, user,
        login_shell)."""
        if not detach:
            if name is not None or ttl is not None or idle_ttl is not None:
                raise InputError("name, ttl and idle_ttl are for a detached sandbox (detach=True)")
            return await cls(workspace, **options).open()
        from sandboxrun.detached.handle import DetachedSandbox

        return await DetachedSandbox.create(
            workspace, name=name, ttl=ttl, idle_ttl=idle_ttl, **options
        )

    async def open(self) -> Self:
        """Open the sandbox (what ``async with`` does): for a long-lived agent that holds it
        outside one block; ``aclose()`` ends it. Opening one that is open, or was closed, is
        refused (``RuntimeError``): a ``Sandbox`` is opened once. An open that failed (docker
        not running yet, a refusal) released what it took and may be tried again."""
        if self._closed is not None:
            raise RuntimeError("this Sandbox was closed: a Sandbox is opened once")
        if self._opened:
            raise RuntimeError("this Sandbox was opened already: a Sandbox is opened once")
        self._opened = True
        try:
            backend, self.fallback_reason = await anyio.to_thread.run_sync(self._choose_backend)
            if self._spill_owned:  # old spill files go first (throttled, bounded, never fails)
                await anyio.to_thread.run_sync(auto_prune, self._spill_root())
            try:
                await backend.open()
            except BaseException:
                with anyio.CancelScope(shield=True):
                    self.close_errors += await backend.close()
                raise
        except BaseException:
            self._opened = False  # nothing is held: it may be opened again
            raise
        self._backend = backend
        self._open_spill()
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
        ``error`` says the sandbox was closed. Then the backend is closed (container removed)
        and the sandbox's spill files are removed (unless ``keep_spill``)."""
        with anyio.CancelScope(shield=True):
            if self._closed is not None:  # another aclose() is at work: wait for its end
                await self._closed.wait()
                return
            if self._backend is None:  # never opened (or its open failed): closed for good
                self._closed = anyio.Event()
                self._closed.set()
                return
            self._closed = closed = anyio.Event()
            try:
                for job in [*self._jobs, *(t.job for t in self._terminals)]:
                    job.cancel()  # ended like the execs (jobs not yet running too)
                for scope in list(self._inflight):
                    scope.cancel()
                for done in list(self._inflight.values()):
                    await done.wait()
                for job in [*self._jobs, *(t.job for t in self._terminals)]:
                    await job.ended()
                backend, self._backend = self._backend, None
                if backend is not None:
                    self.close_errors += await backend.close()
                for job in [*self._jobs, *(t.job for t in self._terminals)]:
                    job.release()
            finally:
                spill, self._spill = self._spill, None
                try:
                    if spill is not None and self._spill_owned:  # its spill files go too
                        close_spill = functools.partial(spill.close, keep=self.keep_spill)
                        await anyio.to_thread.run_sync(close_spill)
                finally:
                    self._closed = None
                    closed.set()

    # -- files (sandboxrun/api/files.py, docs/files.md) -------------------------------------------
    def _files(self) -> files.SandboxFiles:
        return files.SandboxFiles(
            self.backend,
            self.workspace,
            self.policy,
            home=self._env.get("HOME"),
            host_home=self._host_env.get("HOME"),
        )

    async def read_file(
        self, path: str | os.PathLike[str], *, max_bytes: int = files.DEFAULT_MAX_BYTES
    ) -> bytes:
        """The content of the regular file ``path`` in the sandbox (relative: in the workspace;
        absolute: the sandbox's view, ``/tmp`` and ``~`` too). A file over ``max_bytes`` raises
        ``SandboxFileTooLargeError`` (nothing partial); a missing path, a directory, a FIFO or a
        denied read raise their ``SandboxFileError``; leaving the workspace (``..``, a symlink
        out) raises ``WorkspaceError``."""
        return await self._files().read_file(path, max_bytes)

    async def write_file(
        self,
        path: str | os.PathLike[str],
        data: bytes | bytearray | memoryview,
        *,
        mode: int = 0o644,
        parents: bool = False,
    ) -> None:
        """Create or replace the regular file ``path`` in the sandbox with ``data``, as the
        sandbox would (its credentials, its read-only paths). ``mode``: the permission bits of
        a new file (less the sandbox's umask; an existing file keeps its own). The directory
        must exist, unless ``parents``: then the missing ones are made first, as the sandbox
        would make them (``mkdir -p`` in it: its uid, umask and read-only paths). Errors as
        ``read_file``."""
        try:
            await self._files().write_file(path, data, mode)
            return
        except SandboxFileNotFoundError:
            parent = posixpath.dirname(os.fspath(path))
            if not parents or parent in ("", ".", "/"):
                raise
        await self._make_dirs(parent, os.fspath(path))
        await self._files().write_file(path, data, mode)

    async def _make_dirs(self, parent: str, path: str) -> None:
        """``mkdir -p -- parent`` in the sandbox; a failure is the ``SandboxFileError`` of
        what it said (``path``: the file that was to be written)."""
        result = await self.exec([MKDIR, "-p", "--", parent], timeout=60)
        if result.status == "completed":
            return
        said = (result.stderr.strip() or result.error or result.status)[-500:]
        message = f"cannot create the directory {parent!r} for {path!r}: {said}"
        for words, kind, code in (
            ("permission denied", SandboxPermissionError, errno.EACCES),
            ("read-only file system", SandboxPermissionError, errno.EROFS),
            ("not a directory", SandboxNotADirectoryError, errno.ENOTDIR),
            ("file exists", SandboxNotADirectoryError, errno.ENOTDIR),
        ):
            if words in said.lower():
                raise kind(message, path, code)
        raise SandboxFileError(message, path, errno.EIO)

    async def list_dir(
        self, path: str | os.PathLike[str] = ".", *, max_entries: int = files.DEFAULT_MAX_ENTRIES
    ) -> list[files.DirEntry]:
        """The entries of the directory ``path`` in the sandbox, sorted by name: ``name``,
        ``kind`` (file, dir, symlink, other: symlinks are not followed), ``size``, ``mode``;
        more than ``max_entries`` is a ``SandboxFileError``."""
        return await self._files().list_dir(path, max_entries=max_entries)

    def _prepare(
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
        idle_timeout: float | None = None,
    ) -> ExecRequest:
        """Validate one command into an ``ExecRequest``. No process is started.
        ``idle_timeout`` overrides ``Limits.idle_timeout_s`` for this command."""
        if self._retired:  # (before the workspace is looked at: the pool is refilling it)
            raise RuntimeError(RETIRED)
        defaults = prepared.Defaults(
            workspace=self.workspace,
            policy=self.policy,
            limits=self.limits,
            env=self._env,
            pass_env=self._pass_env,
            pass_proxy=self._pass_proxy,
            path_prepend=self._path_prepend,
            host_env=self._host_env,
            login=self._logins.mode,
            base=self._base,
        )
        request = prepared.build(
            defaults,
            argv,
            shell=shell,
            workdir=workdir,
            env=env,
            pass_env=pass_env,
            timeout=timeout,
            stdin=stdin,
            path_prepend=path_prepend,
            sink=sink,
            idle_timeout=idle_timeout,
        )
        if env and self.policy.mask_output:
            self._secrets.note(redact.secret_pairs(env.items()))
        return self._with_spill_dir(request)

    def missing_guarantees(self, request: ExecRequest) -> list[str]:
        """What the policy and limits ask for that this backend would not enforce for
        ``request`` (``InputError`` when it cannot carry it)."""
        return self._missing(self.backend.plan(request).isolation)

    def _missing(self, isolation: list[str]) -> list[str]:
        enforced = set(isolation)
        return [g for g in required_guarantees(self.policy, self.limits) if g not in enforced]

    def _refuse(self, missing: list[str]) -> None:
        """Fail closed: a run missing a guarantee it asks for needs ``allow_degraded``."""
        if missing and (self.policy.strict or not self.policy.allow_degraded):
            raise PolicyRefusedError(self.backend.name, missing, strict=self.policy.strict)

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
        idle_timeout: float | None = None,
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
        hook propagates (nothing has run again; the denied result is in ``last_result``).

        ``idle_timeout``: seconds without a byte of output after which the run ends as
        ``timed_out`` with ``timeout_kind="idle"`` (overrides ``Limits.idle_timeout_s``)."""
        request = self._prepare(
            argv,
            shell=shell,
            workdir=workdir,
            env=env,
            pass_env=pass_env,
            timeout=timeout,
            stdin=stdin,
            path_prepend=path_prepend,
            sink=sink,
            idle_timeout=idle_timeout,
        )
        result = await self._run_request(request)
        if escalate is None:
            return result
        return await self._escalate(result, request, escalate)

    async def start(
        self,
        argv: Sequence[str] | None = None,
        *,
        shell: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        timeout: float | None = None,
        idle_timeout: float | None = None,
        stdin: bool | bytes = False,
        path_prepend: Sequence[str] = (),
        sink: Sink | None = None,
    ) -> Job:
        """Start a background job (``docs/jobs.md``) and return it at once; it runs like an
        ``exec`` (same validation, refusal, isolation) until it ends, ``job.kill()``, or the
        sandbox closes. ``timeout`` None: no wall-clock limit (else checked like ``exec``'s);
        ``idle_timeout``: only the job's own (``Limits.idle_timeout_s`` does not apply).
        ``stdin``: False ``/dev/null``, bytes as ``exec``, True fed by ``job.write_stdin``."""
        request = self._prepare(
            argv,
            shell=shell,
            workdir=workdir,
            env=env,
            pass_env=pass_env,
            timeout=timeout,
            path_prepend=path_prepend,
            idle_timeout=idle_timeout,
        )
        stream = StdinStream() if stdin is True else None
        fed = stream if stream is not None else None if isinstance(stdin, bool) else bytes(stdin)
        request = self._background(request, timeout, idle_timeout, stdin=fed)
        backend = self.backend
        job = Job(request, backend=backend.name, stdin=stream, sink=sink, on_end=self._job_ended)
        self._jobs.append(job)
        job.launch(self._run_request)
        return job

    async def open_terminal(
        self,
        argv: Sequence[str] | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        term: str = "xterm-256color",
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        timeout: float | None = None,
        idle_timeout: float | None = None,
        path_prepend: Sequence[str] = (),
    ) -> Terminal:
        """Start ``argv`` (None: an interactive shell, bash where there is one) on a new
        terminal of ``rows`` x ``cols`` made inside the sandbox, and return it once it runs
        (``docs/terminals.md``). It runs like a job (same validation, refusal, isolation) until
        it ends, ``close()``, or the sandbox closes; ``TERM`` is ``term`` unless ``env`` says
        otherwise. ``timeout`` None: no wall-clock limit; ``idle_timeout``: its own only. A
        command that cannot start gives an ended terminal whose result says why. ``ConfigError``
        with ``max_terminals`` open, or where the backend cannot make one (docs/terminals.md)."""
        if sum(not t.done for t in self._terminals) >= self.max_terminals:
            raise ConfigError(
                f"this sandbox has {self.max_terminals} terminals open (max_terminals): "
                "close one first"
            )
        control = PtyControl(rows, cols, term)
        request = self._prepare(
            argv,
            shell=INTERACTIVE_SHELL if argv is None else None,
            workdir=workdir,
            env={"TERM": term, **(env or {})},
            pass_env=pass_env,
            timeout=timeout,
            path_prepend=path_prepend,
            idle_timeout=idle_timeout,
        )
        request = self._background(
            dataclasses.replace(request, tty=control), timeout, idle_timeout, stdin=StdinStream()
        )
        backend = self.backend
        terminal = Terminal(request, backend=backend.name, on_end=self._terminal_ended)
        self._terminals.append(terminal)
        terminal.job.launch(self._run_request)
        try:
            with anyio.move_on_after(OPEN_TERMINAL_TIMEOUT_S):
                async with anyio.create_task_group() as tg:

                    async def first(event: Callable[[], Awaitable[None]]) -> None:
                        await event()
                        tg.cancel_scope.cancel()

                    tg.start_soon(first, control.ready.wait)
                    tg.start_soon(first, terminal.job.ended)
        except BaseException:  # the caller gave up: the terminal nobody holds is ended
            with anyio.CancelScope(shield=True):
                await terminal.close()
            raise
        return terminal

    async def open_shell(
        self,
        shell: str = "bash",
        *,
        rows: int = 50,
        cols: int = 200,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        path_prepend: Sequence[str] = (),
    ) -> Shell:
        """A persistent ``shell`` (bash) on a terminal, for agents (``sandboxrun.api.shell``):
        ``await sh.run("cd src && make")`` gives the output, the exit code and whether it
        timed out; ``cd``, variables and functions persist between runs. It counts against
        ``max_terminals`` and ends with the sandbox (or ``sh.close()``)."""
        argv = [shell, "--noediting", "--norc", "--noprofile", "-i"]
        variables = {**SHELL_ENV, **(env or {})}

        async def reopen() -> Terminal:
            return await self.open_terminal(
                argv,
                rows=rows,
                cols=cols,
                term=variables["TERM"],
                workdir=workdir,
                env=variables,
                pass_env=pass_env,
                path_prepend=path_prepend,
            )

        terminal = await reopen()
        if terminal.done:
            why = terminal.result.error if terminal.result is not None else None
            raise ConfigError(f"the shell {shell!r} could not start in the sandbox: {why}")
        opened = Shell(terminal, reopen)
        try:
            await opened.start()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await terminal.close()
            raise
        return opened

    def terminals(self) -> list[Terminal]:
        """The terminals opened in this sandbox, oldest first: every open one and the newest
        ``max_ended_jobs`` ended ones."""
        return list(self._terminals)

    def _terminal_ended(self, terminal: Terminal) -> None:
        ended = sorted((t for t in self._terminals if t.done), key=lambda t: t.job.ended_at or 0)
        for old in ended[: max(0, len(ended) - max(0, self.max_ended_jobs))]:
            self._terminals.remove(old)
            old.release()

    def _background(
        self,
        request: ExecRequest,
        timeout: float | None,
        idle_timeout: float | None,
        *,
        stdin: bytes | StdinStream | None,
    ) -> ExecRequest:
        """``request`` as a run the sandbox owns in the background (a job, a terminal): no
        wall-clock limit unless ``timeout``, only its own ``idle_timeout``, ``stdin``; refused
        as ``exec`` would be (the backend's plan too: a terminal it cannot make), or while
        the sandbox closes (a ``StdinStream`` is then aborted)."""
        request = dataclasses.replace(
            request,
            stdin=stdin,
            timeout_s=math.inf if timeout is None else request.timeout_s,
            limits=replaced(request.limits, idle_timeout_s=idle_timeout),
        )
        try:
            self._refuse(self.missing_guarantees(request))
            if self._closed is not None:
                raise RuntimeError("the Sandbox is closing: nothing new can start in it")
        except BaseException:
            if isinstance(stdin, StdinStream):
                stdin.abort()  # (nothing will ever read it)
            raise
        self._taint = self._taint or "it ran a job or a terminal"
        return request

    def jobs(self) -> list[Job]:
        """The jobs started in this sandbox, oldest first: every running one and the newest
        ``max_ended_jobs`` ended ones that were not ``forget``-ed."""
        return list(self._jobs)

    def forget(self, job: Job) -> None:
        """Drop an ended job from ``jobs()`` and remove its spill files (``Job.release``): the
        job object keeps its result and the memory part of its logs. ``RuntimeError`` for a
        job still running (``kill`` or ``wait`` first). Idempotent."""
        if not job.done:
            raise RuntimeError(f"job {job.id} is still running: kill() or wait() for it first")
        if job in self._jobs:
            self._jobs.remove(job)
        job.release()

    def _job_ended(self, job: Job) -> None:
        """A job ended: past ``max_ended_jobs``, release the oldest ended ones."""
        ended = sorted((j for j in self._jobs if j.done), key=lambda j: j.ended_at or 0.0)
        for old in ended[: max(0, len(ended) - max(0, self.max_ended_jobs))]:
            self.forget(old)

    def _escalated(self, request: ExecRequest, policy: Policy) -> tuple[Sandbox, ExecRequest]:
        """A fresh, unopened ``Sandbox`` like this one (workspace, requested backend, limits,
        env options, image, user) but under ``policy``, and ``request`` re-made for it (same
        command, environment, workdir, stdin and sink; a new run id). A backend given as an
        object belongs to this sandbox: no fresh one can be made for the re-run."""
        if not isinstance(self._requested, str):
            raise ConfigError(
                "escalation needs the backend by name (a backend object belongs to its sandbox: "
                "the re-run cannot have a fresh one)"
            )
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
            login=self._logins.mode,
            login_shell=self._logins.shell,
        )
        sandbox.keep_spill = self.keep_spill
        if self._spill is not None:  # this one is open: the re-run's results outlive it
            sandbox._spill, sandbox._spill_owned = self._spill, False
        # else (the CLI's --ask re-runs after the first sandbox closed) it has its own locked
        # spill directory, removed at its close unless kept, like any sandbox's
        again = dataclasses.replace(request, run_id=prepared.new_run_id(), policy=policy)
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
        widened, again = self._escalated(request, found.escalate_to)
        scope, done = anyio.CancelScope(), anyio.Event()
        self._inflight[scope] = done
        rerun: ExecResult | None = None
        try:
            with scope:
                async with widened:
                    rerun = await widened._run_request(again)
        finally:
            del self._inflight[scope]
            done.set()
            self.close_errors += widened.close_errors
        if rerun is None:  # aclose() cancelled the re-run: its cancelled result, if it started
            closed = widened.last_result or result
            rerun = results.amend(
                closed, error="cancelled: the sandbox was closed during the command"
            )
        rerun = results.amend(rerun, escalated_from=self.policy)
        self.last_result = rerun
        return rerun

    def _diagnose(self, result: ExecResult, request: ExecRequest) -> ExecResult:
        """``result`` with ``denial`` set when the sandbox refused something or a limit was hit
        (``sandboxrun.engine.denial``); diagnosis never fails a run."""
        if result.status == "spawn_error" and result.exit_code == 127:
            hint = script_hint(request.argv)
            if hint is not None:
                return results.amend(result, error=f"{result.error}; {hint}")
        if result.status not in denial.DIAGNOSED:
            return result
        try:
            plan = self.backend.view().host_plan
            facts = denial.host_facts(
                result,
                self.workspace.root,
                workdir=request.workdir,
                mapped=plan is not None and plan.inside_root is not None,
            )
            found = denial.diagnose(result, request.policy, facts, request.limits)
        except Exception:  # a diagnosis is a courtesy: the result stands without it
            log.debug("sandboxrun: diagnosing run %s failed", result.run_id, exc_info=True)
            return result
        return result if found is None else results.amend(result, denial=found)

    async def _run_request(
        self, request: ExecRequest, scope: anyio.CancelScope | None = None
    ) -> ExecResult:
        """Run a prepared request. ``scope``: the run's own cancel scope (a job's: cancelling
        it ends the run like ``aclose`` does, with a ``cancelled`` result), else a new one."""
        backend = self.backend
        request = self._with_spill_dir(request)
        ready = self._logins.ready(request, consume=False)  # the snapshot taken, or none needed
        launch = backend.plan(request if ready is None else ready[0])  # InputError: nothing ran
        missing = self._missing(launch.isolation)
        self._refuse(missing)
        if missing and tuple(missing) not in self._warned:
            self._warned.add(tuple(missing))
            log.warning(
                "sandboxrun: backend %s cannot enforce: %s", backend.name, ", ".join(missing)
            )
        if self._closed is not None:
            raise RuntimeError("the Sandbox is closing: no new command can start")
        facts = self._facts(launch, missing)  # the per-command form until the login resolves
        scope, done = anyio.CancelScope() if scope is None else scope, anyio.Event()
        self._inflight[scope] = done
        started = time.monotonic()
        result: ExecResult | None = None
        unstarted: tuple[Status, str] = ("cancelled", "cancelled before the command started")
        try:
            with scope:
                try:  # the login-shell snapshot (sandboxrun.api.login), in the run's scope and time
                    resolved = None if ready is None else self._logins.ready(request)
                    if resolved is None:  # (or evicted meanwhile) taken now, then planned
                        resolved = await self._logins.resolve(request, self._raw_exec)
                        launch = backend.plan(resolved[0])
                except NotRun as exc:
                    unstarted = (exc.status, str(exc))
                else:
                    request, warning = resolved
                    login_s = time.monotonic() - started
                    facts = self._facts(launch, missing, login_s, warning)
                    finished = await run_engine(backend, launch, facts)
                    result = finished.result
                    self.last_result = self._masked(result, request)
                    if finished.cancelled is not None:
                        raise finished.cancelled
        except anyio.get_cancelled_exc_class():
            self._taint = self._taint or "a command of it was cancelled"
            if result is None:  # the caller's cancellation, before the command started
                self.last_result = self._masked(
                    results.unstarted(facts, *unstarted, started), request
                )
            raise
        finally:
            del self._inflight[scope]
            done.set()
        if scope.cancelled_caught and (result is None or result.status == "cancelled"):
            # aclose() cancelled it, not the caller (a run that had already completed when the
            # cancellation landed keeps its result as it is)
            unstarted = ("cancelled", "cancelled: the sandbox was closed during the command")
            if result is not None:
                result = results.amend(result, error=unstarted[1])
        if result is None:  # closed before the backend started anything, or NotRun
            result = results.unstarted(facts, *unstarted, started)
        result = self._masked(self._diagnose(result, request), request)
        self.last_result = result
        self._taint = self._taint or taint_of(result)
        return result

    def _adopt(self, old: Sandbox) -> SpillSession | None:
        """Take over ``old``'s open backend and login snapshots: a pooled sandbox handed to
        its next holder in place (``api.pool_reset``). ``old`` is closed for its holder from
        now on (its calls fail as on a closed ``Sandbox``); this one gets a spill directory
        of its own, and ``old``'s is returned for the caller to close (it blocks). ``old``
        must be idle (no run, job or terminal) and this one made alike and never opened."""
        if old._inflight or old._jobs or old._terminals:
            raise RuntimeError("a command, job or terminal of it was still there")
        if old._backend is None:
            raise RuntimeError("it is not open")
        if self._opened or self._closed is not None:
            raise RuntimeError("a Sandbox takes over another only before it is opened")
        self._backend, old._backend = old._backend, None
        old._retired = True
        self._opened = True
        self.fallback_reason = old.fallback_reason
        self._logins = old._logins
        self._logins.rebase(self._base)
        self._warned = set(old._warned)
        spill, old._spill = old._spill, None
        self._open_spill()
        return spill if old._spill_owned else None

    @staticmethod
    def _masked(result: ExecResult, request: ExecRequest) -> ExecResult:
        """``result`` as the caller sees it: every string masked (``error``, ``warnings``, the
        denial's evidence and message, ``argv``, ...) with the values its output was masked
        with; the policy a denial offers is kept exact (it is what an escalation runs)."""
        return redact.mask_model(result, redact.redactor_for(request), keep=(Policy,))

    def _facts(
        self,
        launch: Launch,
        missing: list[str],
        login_s: float = 0.0,
        warning: str | None = None,
    ) -> RunFacts:
        return RunFacts(
            backend=self.backend.name,
            argv=redact.mask_argv(launch.argv, launch.request),
            run_id=launch.request.run_id,
            isolation=launch.isolation,
            missing=missing,
            fallback_reason=self.fallback_reason,
            via=launch.via,
            login_s=login_s,
            warnings=(*launch.warnings, *(() if warning is None else (warning,))),
            tty=launch.request.tty is not None,
        )

    async def _exec_fixed(
        self, argv: Sequence[str], env: Mapping[str, str], timeout: float
    ) -> ExecResult:
        """Run ``argv`` as is with exactly ``env`` (and the variables sandboxrun owns): no
        login snapshot, no path prepends, no variable of the sandbox's. What a holder of a
        pooled sandbox could change (its profile, a prepended directory it can write) has no
        say in it (``api.pool_reset``'s listing). A command like any other otherwise: tracked,
        killed on close, its taint counted."""
        request = dataclasses.replace(
            self._prepare(argv, timeout=timeout),
            env=dict(env),
            path_prepend=[],
            explicit=frozenset(),
            login="raw",
            login_shell=None,
            snapshot=None,
        )
        return await self._run_request(request)

    async def _raw_exec(self, request: ExecRequest) -> ExecResult:
        """Run ``request`` as is (``login.Logins``'s snapshot), in the caller's scope."""
        launch = self.backend.plan(request)
        finished = await run_engine(self.backend, launch, self._facts(launch, []))
        if finished.cancelled is not None:
            raise finished.cancelled
        return finished.result


RETIRED = (
    "this Sandbox was handed back to its pool: it is not open for its holder any more (use "
    "a pooled sandbox only inside its `pool.acquire()` block)"
)


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
    keep_spill: bool = False,
) -> ExecResult:
    """Synchronous one-shot: open a sandbox, run one command, close it (``escalate``: see
    ``Sandbox.exec``). The result's ``*_spill`` files are removed with the sandbox unless
    ``keep_spill``."""

    async def go() -> ExecResult:
        async with Sandbox(
            workspace,
            backend=backend,
            policy=policy,
            limits=limits,
            pass_proxy=pass_proxy,
            keep_spill=keep_spill,
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
