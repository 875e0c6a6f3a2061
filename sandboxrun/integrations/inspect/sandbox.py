"""The ``sandboxrun`` sandbox environment for inspect_ai (docs/inspect.md).

``Task(..., sandbox="sandboxrun")`` or ``sandbox=("sandboxrun", "sandboxrun.yaml")``: every
sample gets its own ``sandboxrun.Sandbox`` (a hardened container on docker) over a private
temporary workspace, removed at sample cleanup. ``exec`` runs through sandboxrun, so a timeout
kills every process of the command and output is bounded; the results and errors are those of
inspect's contract (``sandboxrun.integrations.inspect.mapping``).

Imported only by inspect (through ``sandboxrun.integrations.inspect.registry``, the ``inspect_ai``
entry
point): it imports inspect_ai, which is an optional dependency (``sandboxrun[inspect]``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import posixpath
import shlex
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Literal, overload

import anyio
import anyio.to_thread
from inspect_ai.util import ExecResult as InspectResult
from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from inspect_ai.util import SandboxUnavailableError as InspectUnavailable
from pydantic import BaseModel

from sandboxrun.api.jobs import Job
from sandboxrun.api.sandbox import Sandbox
from sandboxrun.engine.paths import CONTAINER_ROOT
from sandboxrun.engine.request import ExecRequest
from sandboxrun.errors import (
    InputError,
    SandboxFileError,
    SandboxFileTooLargeError,
    SandboxrunError,
    WorkspaceError,
)
from sandboxrun.integrations.inspect import tools_server
from sandboxrun.integrations.inspect import workspace as workspaces
from sandboxrun.integrations.inspect.config import (
    CONFIG_FILES,
    SandboxrunConfig,
    load_config,
    parse_config,
)
from sandboxrun.integrations.inspect.mapping import (
    CwdPlan,
    file_error,
    missing_user_result,
    parse_passwd,
    passwd_entries,
    plan_cwd,
    sandbox_path,
    switch_user,
    to_inspect,
    user_verdict,
    with_wrapper,
)
from sandboxrun.integrations.inspect.tools_server import is_start_server, server_argv
from sandboxrun.models import replaced

log = logging.getLogger("sandboxrun")


class _OpenEnvironments:
    """The environments of one inspect lifecycle scope (an eval batch) not yet cleaned up."""

    def __init__(self) -> None:
        self.envs: set[SandboxrunSandboxEnvironment] = set()


_FALLBACK = _OpenEnvironments()


def _open_environments() -> set[SandboxrunSandboxEnvironment]:
    try:
        from inspect_ai.util._sandbox.lifecycle import sandbox_lifecycle_state
    except ImportError:  # an inspect_ai without lifecycle scopes: one set per process
        return _FALLBACK.envs
    state = sandbox_lifecycle_state()
    return (_FALLBACK if state is None else state.get(_OpenEnvironments)).envs


def _host_env(config: SandboxrunConfig) -> dict[str, str]:
    """Nothing of the eval's own environment (API keys...) but the names ``pass_env`` asks for."""
    return {name: os.environ[name] for name in config.pass_env if name in os.environ}


_BUILT: dict[tuple[str, str | None], str | Exception] = {}
"""The image each ``image_from`` (and ``dockerfile``) of this process was built as, or why it
could not be: built (or found up to date) once per process, by the first sample or
``task_init``; a failed build is not tried again by every later sample."""
_BUILDING: dict[tuple[str, str | None], threading.Lock] = {}
_LOCKS = threading.Lock()


class _LogProgress:
    """A build's notes and phases in sandboxrun's log (inspect shows no progress display)."""

    def phase(self, name: str, detail: str = "") -> None:
        if not detail:
            log.info("sandboxrun: image build: %s", name)

    def raw(self, line: str) -> None:
        log.debug("sandboxrun: image build: %s", line)

    def note(self, message: str) -> None:
        log.info("sandboxrun: image build: %s", message)


def _image(config: SandboxrunConfig) -> str | None:
    """The image a sample runs on: ``image``, or ``image_from`` built (once per process)."""
    if config.image_from is None:
        return config.image
    from sandboxrun.image.source import build_from

    key = (config.image_from, config.dockerfile)
    with _LOCKS:
        lock = _BUILDING.setdefault(key, threading.Lock())
    with lock:  # one build per image; different images build side by side
        if key not in _BUILT:
            try:
                made = build_from(config.image_from, _LogProgress(), dockerfile=config.dockerfile)
            except SandboxrunError as exc:
                _BUILT[key] = exc
            else:
                _BUILT[key] = made.tag
        built = _BUILT[key]
    if isinstance(built, Exception):
        raise copy.copy(built)  # a fresh one each time (its traceback does not grow)
    return built


def _per_sample(config: str) -> bool:
    """Whether the config file substitutes a sample's metadata (``SAMPLE_METADATA_<KEY>``)."""
    try:
        return "SAMPLE_METADATA_" in Path(config).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False  # (load_config says why)


def _owner(config: SandboxrunConfig) -> tuple[int, int] | None:
    """The ids a private workspace is given: a root invoker's sandbox running as ``user``."""
    if config.user is None or os.geteuid() != 0 or config.backend not in ("docker", "auto"):
        return None
    from sandboxrun.backends.docker.config import parse_user

    uid, gid = parse_user(config.user).split(":")
    return int(uid), int(gid)


@sandboxenv(name="sandboxrun")
class SandboxrunSandboxEnvironment(SandboxEnvironment):
    """One sample's sandbox: a ``sandboxrun.Sandbox`` and its workspace."""

    def __init__(
        self, sandbox: Sandbox, config: SandboxrunConfig, workspace: Path, owned: bool
    ) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.config = config
        self.workspace = workspace
        """The host directory mapped at ``/workspace`` (docker)."""
        self.owned = owned
        """Whether the workspace is this sample's own (removed at cleanup)."""
        view = sandbox.backend.view()
        container = view.container
        inside = None if view.host_plan is None else view.host_plan.inside_root
        self.root = str(CONTAINER_ROOT) if container is not None else inside or str(workspace)
        """The workspace as the sandbox sees it: relative paths are relative to it."""
        ids = None if view.host_plan is None else view.host_plan.run_as
        self.uid = (
            int(container.user.split(":")[0])
            if container is not None
            else ids[0]
            if ids is not None
            else os.geteuid()
        )
        """The uid every command runs as (a root invoker's local sandbox: the workspace
        owner's, ``backends.owner``)."""
        self._users: dict[str, int] | None = None
        self._entries: dict[str, tuple[int, int, str]] = {}
        self.switches_user = self.uid == 0 and container is not None and config.root == "writable"
        """Whether ``exec(user=...)`` may run a command as another user: uid 0 in a writable
        root on docker, which has ``SETUID`` and ``SETGID`` (``PACKAGE_CAPS``): ``setpriv``."""
        self._closed = False
        self._tools: Job | None = None
        self._tools_lock = anyio.Lock()
        """The job holding inspect's sandbox tools server, once started (``tools_server``)."""

    # -- lifecycle ----------------------------------------------------------------------------
    @classmethod
    def config_files(cls) -> list[str]:
        return list(CONFIG_FILES)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return parse_config(config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        return 2 * len(os.sched_getaffinity(0))

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Check the config and that its backend can run here (the docker image exists...),
        once, before any sample starts."""
        if isinstance(config, str) and _per_sample(config):
            return  # each sample's metadata completes it: checked (and built) per sample
        settings = load_config(config)
        image = await anyio.to_thread.run_sync(_image, settings)
        await anyio.to_thread.run_sync(_probe, settings, image)

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        env = await cls.open(load_config(config, metadata))
        _open_environments().add(env)
        return {"default": env}

    @classmethod
    async def open(cls, config: SandboxrunConfig) -> SandboxrunSandboxEnvironment:
        """A sandbox for one sample (what ``sample_init`` returns as ``default``)."""
        image = await anyio.to_thread.run_sync(_image, config)
        template = config.workspace_path()
        owned = template is None or config.workspace_mode == "copy"
        if owned:
            workspace = await anyio.to_thread.run_sync(workspaces.create, template, _owner(config))
        else:
            assert template is not None
            workspace = template
        try:
            sandbox = _sandbox(config, workspace, image)
            await sandbox.__aenter__()
        except BaseException:
            if owned:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(workspaces.remove, workspace)
            raise
        return cls(sandbox, config, workspace, owned)

    async def close(self) -> None:
        """Close the sandbox (its container is removed) and remove a private workspace.
        Idempotent; shielded from cancellation, bounded by sandboxrun's close budget."""
        with anyio.CancelScope(shield=True):
            if self._closed:
                return
            self._closed = True
            _open_environments().discard(self)
            try:
                await self.sandbox.aclose()
                for problem in self.sandbox.close_errors:
                    log.warning("sandboxrun: %s", problem)
            finally:
                if self.owned:
                    await anyio.to_thread.run_sync(workspaces.remove, self.workspace)

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for env in environments.values():
            if isinstance(env, SandboxrunSandboxEnvironment):
                await env.close()

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        """Close what samples left open (``--no-sandbox-cleanup``: keep them until this
        process exits, which ends their containers; their workspaces stay for
        ``inspect sandbox cleanup sandboxrun``)."""
        left = list(_open_environments())
        if not cleanup:
            for env in left:
                log.info("sandboxrun: keeping the sandbox workspace %s", env.workspace)
            return
        for env in left:
            await env.close()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup sandboxrun [ID]``: the workspaces (and their containers)
        of evals whose process is gone; ID (a workspace's name, or a container id) removes
        that one even while its eval runs."""
        containers, removed, kept = await anyio.to_thread.run_sync(workspaces.cleanup, id)
        print(f"sandboxrun: removed {containers} container(s) and {removed} workspace(s)")
        if kept:
            print(
                f"sandboxrun: kept {kept} workspace(s) of running evals "
                "(pass one's name to remove it)"
            )

    # -- commands -----------------------------------------------------------------------------
    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> InspectResult[str]:
        """Run ``cmd`` in the sandbox (sandboxrun's termination and output engine). A timeout
        raises ``TimeoutError`` once every process of the command is dead; a stream over
        inspect's output limit raises ``OutputLimitExceededError``. ``timeout_retry`` and
        ``concurrency`` do not apply: a timeout is the command's own, never the engine's."""
        if not cmd:
            raise ValueError("exec needs a command")
        if user is not None:
            verdict = user_verdict(user, uid=self.uid, users=await self._passwd(user))
            if verdict == "missing" and self.switches_user:  # adduser may have made it since
                verdict = user_verdict(user, uid=self.uid, users=await self._passwd(user, True))
            if verdict == "missing":
                return missing_user_result(user)
            if verdict == "other":
                if not self.switches_user:
                    raise SandboxUserUnsupportedError(
                        f"this sandboxrun sandbox runs every command as uid {self.uid} (the "
                        f"config's `user`); it cannot run one as {user!r} (a sandbox of uid 0 "
                        "with `root: writable` can)"
                    )
                if user.isdecimal():  # its name, groups and home: adduser may have made them
                    await self._passwd(user, True)
                words, env = switch_user(user, self._entries, env)
                cmd = [*words, *cmd]
        if is_start_server(cmd):
            async with self._tools_lock:  # one server: a second call finds it running
                if self._tools is None or self._tools.done:
                    return await self._start_tools_server(cmd[0], env, timeout)
        stdin = input.encode("utf-8") if isinstance(input, str) else input
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        if self.config.working_dir is not None:  # compose's: the default and the base
            cwd = posixpath.join(self.config.working_dir, cwd or "")
        plan = plan_cwd(cwd, self.root)
        try:
            try:
                request = self._prepare(plan, cmd, env, timeout, stdin, limit)
            except WorkspaceError:  # the host refuses the workdir: the sandbox decides
                plan = with_wrapper(plan, self.root)
                request = self._prepare(plan, cmd, env, timeout, stdin, limit)
        except InputError as exc:
            raise ValueError(str(exc)) from exc
        try:
            result = await self.sandbox._run_request(request)
        except (SandboxrunError, RuntimeError) as exc:
            raise InspectUnavailable(f"The sandbox cannot run commands: {exc}") from exc
        return to_inspect(
            result,
            limit=limit,
            limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
            timeout=timeout,
            cmd=cmd,
            wrapped=plan.wrap is not None,
        )

    async def _start_tools_server(
        self, cli: str, env: dict[str, str] | None, timeout: int | None
    ) -> InspectResult[str]:
        """inspect's ``start-server`` as a background job that holds the tools server until
        the sandbox closes (``tools_server``)."""
        argv, nonce = server_argv(cli)
        try:
            job = await self.sandbox.start(argv, env=env or None)
        except InputError as exc:
            raise ValueError(str(exc)) from exc
        except (SandboxrunError, RuntimeError) as exc:
            raise InspectUnavailable(f"The sandbox cannot run commands: {exc}") from exc
        try:
            found = await tools_server.started(
                job, nonce, None if timeout is None else float(timeout)
            )
        except BaseException:  # cancelled: the job nobody holds is ended
            with anyio.CancelScope(shield=True):
                await job.kill("cancelled: the start-server call was cancelled")
            raise
        if found is None:
            await job.kill(f"timed out: {cli} start-server took over {timeout} s")
            raise TimeoutError(f"Command timed out after {timeout} seconds: {cli} start-server")
        code, out, err = found
        if code == 0:
            self._tools = job
        else:
            await job.kill("failed: start-server failed")
        return InspectResult(
            success=code == 0,
            returncode=code,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
        )

    def _prepare(
        self,
        plan: CwdPlan,
        cmd: list[str],
        env: dict[str, str] | None,
        timeout: int | None,
        stdin: bytes | None,
        limit: int,
    ) -> ExecRequest:
        request = self.sandbox._prepare(
            plan.argv(cmd),
            workdir=plan.workdir,
            env=env or None,
            timeout=None if timeout is None else float(timeout),
            stdin=stdin,
        )
        # inspect's limit (a context variable: it may differ per call) is what is kept
        limits = replaced(request.limits, max_output=max(limit, 64))
        return dataclasses.replace(request, limits=limits)

    async def _passwd(self, user: str, fresh: bool = False) -> dict[str, int]:
        """The sandbox's users (its ``/etc/passwd``), read once (``fresh``: again); not needed
        for a uid, unless the sandbox switches users (its name and home then)."""
        if user.isdecimal() and not self.switches_user:
            return {}
        if self._users is None or fresh:
            try:
                text = await self.sandbox.read_file("/etc/passwd", max_bytes=16 << 20)
            except SandboxrunError:
                text = b""
            self._entries = passwd_entries(text.decode("utf-8", "replace"))
            self._users = parse_passwd(text.decode("utf-8", "replace"))
        return self._users

    # -- files --------------------------------------------------------------------------------
    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """The file's content (text: UTF-8, newlines kept as they are). Over inspect's read
        limit: ``OutputLimitExceededError`` (nothing is read past it)."""
        try:
            data = await self.sandbox.read_file(
                self._path(file), max_bytes=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
            )
        except SandboxFileTooLargeError as exc:
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
            ) from exc
        except (SandboxFileError, WorkspaceError) as exc:
            raise file_error(exc, file) from exc
        except SandboxrunError as exc:
            raise InspectUnavailable(f"The sandbox cannot read files: {exc}") from exc
        return data.decode("utf-8") if text else data

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Create or replace ``file`` (its missing parent directories are created)."""
        data = contents.encode("utf-8") if isinstance(contents, str) else bytes(contents)
        try:
            await self.sandbox.write_file(self._path(file), data, parents=True)
        except (SandboxFileError, WorkspaceError) as exc:
            raise file_error(exc, file) from exc
        except SandboxrunError as exc:
            raise InspectUnavailable(f"The sandbox cannot write files: {exc}") from exc

    def _path(self, file: str) -> str:
        """inspect's path as sandboxrun's: a relative one is relative to the ``working_dir``
        when the config has one (as in inspect's docker sandbox), else to the workspace."""
        if self.config.working_dir is not None and not file.startswith("/"):
            return posixpath.join(self.config.working_dir, file)
        return sandbox_path(file)

    # -- connection ---------------------------------------------------------------------------
    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """``docker exec -it ... bash -l`` into the sample's container (docker backend)."""
        backend = self.sandbox.backend if not self._closed else None
        if backend is None:
            raise ConnectionError("the sandbox is closed")
        if backend.name != "docker":
            raise NotImplementedError(f"no connection to a {backend.name} sandbox")
        access = backend.view().container
        container = None if access is None else access.container_id
        if access is None or container is None:
            raise ConnectionError("the sandbox's container is not running")
        who = user or access.user
        command = ["docker", "exec", "-it", "-u", who, "-w", self.root, container, "bash", "-l"]
        return SandboxConnection(
            type="sandboxrun",
            command=shlex.join(command),
            vscode_command=None
            if user
            else ["remote-containers.attachToRunningContainer", container],
            container=container,
        )


def _sandbox(config: SandboxrunConfig, workspace: Path, image: str | None) -> Sandbox:
    """The (unopened) ``Sandbox`` that ``config`` describes, over ``workspace``, on ``image``
    (``_image``: ``config.image`` or what ``image_from`` was built as)."""
    return Sandbox(
        workspace,
        backend=config.backend,
        policy=config.policy(),
        limits=config.limits(),
        env=config.env,
        pass_env=config.pass_env,
        host_env=_host_env(config),
        image=image,
        user=config.user,
        login=config.login,
        login_shell=config.login_shell,
    )


def _probe(config: SandboxrunConfig, image: str | None) -> None:
    """Raise what opening a sandbox with ``config`` would (no container is created)."""
    probe_dir = Path(tempfile.mkdtemp(prefix="sandboxrun-inspect-probe-"))
    try:
        _sandbox(config, probe_dir, image)._choose_backend()
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
