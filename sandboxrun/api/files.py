"""Files in a sandbox: ``Sandbox.read_file``, ``write_file`` and ``list_dir`` (docs/files.md).

Paths are the sandbox's own. A relative path is workspace-relative; an absolute one is read in
the sandbox's view, where the workspace is ``/workspace`` (docker) or its host path (local
backends); ``~`` is the sandbox's ``HOME``. A workspace path may not leave the workspace, by
``..`` or through a symlink (``WorkspaceError``); a symlink that stays inside is followed.

How a file is reached, best first:

* the sandbox's supervisor (``supervisor/runner.py``: process-group's runner, systemd-scope's
  namespace holder, docker's in-container runner when the backend has one) opens the path: it
  resolves in the sandbox's view, with the sandbox's credentials, Landlock and masks; it passes
  the fd back and the I/O happens here (in a worker thread);
* without one, workspace paths are opened here below the workspace's host directory with
  ``supervisor.safeopen.open_beneath`` (no symlink is ever followed by the kernel),
  honouring a read-only policy and the masks; other paths: on a local backend (no namespaces:
  the sandbox sees this host's files) with ``files_paths.open_host`` (the same walk; one that
  reaches the workspace goes on beneath it), writes refused outside the workspace unless the
  policy is ``danger-full-access``; on a local docker engine through ``/proc/<init>/root``
  of the container (``open_beneath(in_root=True)``: its symlinks stay in it; never its /proc, /sys,
  /dev); on a remote engine through the engine's archive API (which cannot reach the tmpfs
  mounts ``/tmp`` and ``HOME``). No file of a kernel file system (procfs, sysfs...) is ever
  opened from this host: ``/proc/self`` would be this process.

Only regular files are read and written and only directories listed: a FIFO, a socket or a
device is refused (never opened for I/O here). Reads are bounded by ``max_bytes``: a larger
file raises ``SandboxFileTooLargeError``, never a partial read; listings by ``max_entries``
(``SandboxFileError``). A cancelled call leaves no fd open.
"""

from __future__ import annotations

import errno
import os
import select
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import anyio.to_thread

from sandboxrun.api.files_archive import ArchiveFiles
from sandboxrun.api.files_paths import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ENTRIES,
    DirEntry,
    Target,
    check_max_bytes,
    check_max_entries,
    check_write,
    file_error,
    list_fd,
    open_host,
    read_fd,
    refuse_kernel_fs,
    resolve,
    write_fd,
)
from sandboxrun.backends.secrets import secret_paths
from sandboxrun.engine.paths import CONTAINER_ROOT
from sandboxrun.errors import (
    BackendError,
)
from sandboxrun.supervisor.safeopen import open_beneath

if TYPE_CHECKING:
    from sandboxrun.backends.base import Backend, ContainerAccess
    from sandboxrun.backends.client import RunnerClient
    from sandboxrun.engine.paths import Workspace
    from sandboxrun.models import Policy

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_ENTRIES", "DirEntry", "SandboxFiles", "Target"]

READ = os.O_RDONLY
WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
LIST = os.O_RDONLY | os.O_DIRECTORY
CONTAINER_KERNEL_DIRS = ("proc", "sys", "dev")
"""Never reached through a container's root from this host (their files act on the kernel)."""
T = TypeVar("T")


# -- the routes ---------------------------------------------------------------------------------
class SandboxFiles:
    """The file operations of one open sandbox (made per call by ``Sandbox``)."""

    def __init__(
        self,
        backend: Backend,
        workspace: Workspace,
        policy: Policy,
        *,
        home: str | None = None,
        host_home: str | None = None,
    ) -> None:
        self.backend = backend
        self.workspace = workspace
        self.policy = policy
        self._mask_cache: list[str] | None = None
        self.view = view = backend.view()
        self.docker = view.container is not None
        self.plan = view.host_plan
        inside = None if self.plan is None else self.plan.inside_root
        self.root = str(CONTAINER_ROOT) if self.docker else inside or str(workspace.root)
        """The workspace in the sandbox's view (a local sandbox's own: also at its host
        path, which names the same files)."""
        self.home = home if home is not None else (view.home or host_home or "/")
        """The sandbox's ``HOME`` (``~``): the one it was given, else its backend's default."""
        self.supervisor: RunnerClient | None = view.supervisor

    @property
    def container(self) -> ContainerAccess:
        access = self.view.container
        if access is None or not access.container_id:
            raise BackendError("docker: the sandbox container is gone (the sandbox was closed)")
        return access

    @property
    def archive(self) -> bool:
        """Docker without a supervisor and without local access to the container: through the
        engine's archive API."""
        access = self.view.container
        return access is not None and self.supervisor is None and not access.local

    def _remote(self) -> ArchiveFiles:
        return ArchiveFiles(lambda: self.container, self.root, self.home)

    def target(self, path: str | os.PathLike[str]) -> Target:
        alias = str(self.workspace.root) if self.root != str(self.workspace.root) else None
        return resolve(path, root=self.root, home=self.home, alias=None if self.docker else alias)

    # -- the API ------------------------------------------------------------------------------
    async def read_file(self, path: str | os.PathLike[str], max_bytes: int) -> bytes:
        check_max_bytes(max_bytes)
        target = self.target(path)
        if self.archive:
            return await anyio.to_thread.run_sync(self._remote().read, target, max_bytes)
        return await self._with_fd(
            target, READ, 0, "read", lambda fd: read_fd(fd, target, max_bytes)
        )

    async def write_file(
        self, path: str | os.PathLike[str], data: bytes | bytearray | memoryview, mode: int
    ) -> None:
        check_write(data, mode)
        target = self.target(path)
        if self.archive:
            await anyio.to_thread.run_sync(self._remote().write, target, data, mode)
            return
        await self._with_fd(target, WRITE, mode, "write", lambda fd: write_fd(fd, target, data))

    async def list_dir(
        self, path: str | os.PathLike[str], max_entries: int = DEFAULT_MAX_ENTRIES
    ) -> list[DirEntry]:
        check_max_entries(max_entries)
        target = self.target(path)
        if self.archive:
            return await anyio.to_thread.run_sync(self._remote().list, target, max_entries)
        return await self._with_fd(
            target, LIST, 0, "list", lambda fd: list_fd(fd, target, max_entries)
        )

    async def _with_fd(
        self, target: Target, flags: int, mode: int, doing: str, work: Callable[[int], T]
    ) -> T:
        """Open ``target`` and run ``work(fd)`` (which closes it) in a worker thread. A
        cancellation may land between the two (a cancelled ``run_sync`` never runs its
        function): the fd is then closed here."""
        fd = await self._open(target, flags, mode, doing)
        taken = False

        def run() -> T:
            nonlocal taken
            taken = True
            return work(fd)

        try:
            return await anyio.to_thread.run_sync(run)
        except OSError as exc:  # ENOSPC, EDQUOT, EFBIG, EIO...
            raise file_error(exc, target, doing) from None
        finally:
            if not taken:
                os.close(fd)

    # -- opening ------------------------------------------------------------------------------
    async def _open(self, target: Target, flags: int, mode: int, doing: str) -> int:
        """An fd of ``target`` (the caller closes it): the supervisor's, or opened here (in a
        worker thread that always finishes: its fd is returned even when cancelled)."""
        try:
            if self.supervisor is not None:
                self.supervisor.probe(deep=True)  # stopped while nobody waited: replaced first
                if self.supervisor.dead:
                    await self._revive()  # (a fresh one, or none: the host's view below)
            if self.supervisor is not None:
                if target.rel is not None:
                    fd = (
                        await self.supervisor.open_path(target.rel, flags, mode, beneath=self.root)
                    )[0]
                else:
                    fd = (await self.supervisor.open_path(target.path, flags, mode))[0]
            else:
                fd = await anyio.to_thread.run_sync(self._open_here, target, flags, mode)
        except OSError as exc:
            raise file_error(exc, target, doing) from None
        return fd

    async def _revive(self) -> None:
        """The supervisor was declared dead: the backend replaces it (a fresh runner or
        container, as the next exec would get) and this call uses the new one."""
        await self.backend.revive()
        self.view = self.backend.view()
        self.supervisor = self.view.supervisor

    def _open_here(self, target: Target, flags: int, mode: int) -> int:
        """Open ``target`` from this host without a supervisor (see the module's docstring).
        Opened without O_TRUNC: ``write_fd`` truncates once the file is known to be regular
        and not masked. Never a file of a kernel file system (``refuse_kernel_fs``)."""
        flags &= ~os.O_TRUNC
        if target.rel is not None:
            fd = self._open_workspace(target.rel, flags, mode)
        elif not self.docker:  # a local backend without namespaces: the sandbox sees our files
            confined = self.plan is not None and not self.plan.off
            if flags & os.O_WRONLY and confined:
                raise OSError(
                    errno.EACCES,
                    "the sandbox can write only its workspace here (no private "
                    "/tmp without bubblewrap)",
                )
            fd, created = open_host(
                target.path,
                flags,
                mode,
                str(self.workspace.root),
                lambda rel: (self._open_workspace(rel, flags, mode), False),
            )
            self._after_open(fd, created, masked=True)
        else:
            fd = self._open_in_container(target, flags, mode)
        refuse_kernel_fs(fd)
        return fd

    def _open_workspace(self, rel: str, flags: int, mode: int) -> int:
        """``rel`` below the workspace's host directory (``open_beneath``: no symlink the
        sandbox plants can lead out), honouring a read-only policy and the masks."""
        if flags & os.O_WRONLY and self.policy.access == "read-only":
            raise OSError(errno.EROFS, "the workspace is read-only under this policy")
        fd, created = open_beneath(str(self.workspace.root), rel, flags, mode)
        self._after_open(fd, created, masked=True)
        return fd

    def _after_open(self, fd: int, created: bool, *, masked: bool) -> None:
        """Refuse a masked workspace file; give a file this process created to the sandbox's
        user (docker's, or a local sandbox's workspace owner: root here would leave root-owned
        files in the workspace)."""
        try:
            if masked:
                real = str(Path(f"/proc/self/fd/{fd}").readlink())
                for hidden in self._masks():
                    if real == hidden or real.startswith(hidden.rstrip("/") + "/"):
                        raise OSError(errno.EACCES, "it is masked by the policy")
            if created and os.geteuid() == 0:
                if self.docker:
                    uid, _, gid = self.container.user.partition(":")
                    os.fchown(fd, int(uid), int(gid or uid))
                elif self.view.host_plan is not None and self.view.host_plan.run_as:
                    os.fchown(fd, *self.view.host_plan.run_as)  # (a local sandbox's owner)
        except BaseException:
            os.close(fd)
            raise

    def _masks(self) -> list[str]:
        """The real paths no file call may open from this host: the policy's masks and the
        host's built-in secret paths (``backends.secrets``; a workspace that is a home
        directory holds some), as the sandbox's own commands see them masked."""
        if self._mask_cache is None:
            given = [*self.policy.mask, *map(str, secret_paths(os.environ))]
            self._mask_cache = [os.path.realpath(mask) for mask in given]
        return self._mask_cache

    def _open_in_container(self, target: Target, flags: int, mode: int) -> int:
        """Through ``/proc/<init>/root`` of a local engine's container: the container's mounts
        (its tmpfs ``/tmp`` and ``HOME`` too), its symlinks kept inside it. Its init is pinned by
        a pidfd and checked to be the container's (a recycled pid must never lead to this host's
        root)."""
        access = self.container
        cid, pid = access.container_id, access.init_pid
        if not cid or not pid:
            raise BackendError("docker: the sandbox container is gone (the sandbox was closed)")
        pidfd = os.pidfd_open(pid)
        try:
            if cid not in Path(f"/proc/{pid}/cgroup").read_text():
                raise BackendError("docker: the sandbox container's init is gone")
            root = f"/proc/{pid}/root"
            kernel = set()
            for name in CONTAINER_KERNEL_DIRS:
                try:
                    dfd = open_beneath(root, name, os.O_PATH | os.O_DIRECTORY, in_root=True)[0]
                except OSError:
                    continue
                kernel.add(os.fstat(dfd).st_dev)
                os.close(dfd)
            fd, created = open_beneath(root, target.path.lstrip("/"), flags, mode, in_root=True)
            if select.select([pidfd], [], [], 0)[0]:  # it exited meanwhile: that was not it
                os.close(fd)
                raise BackendError("docker: the sandbox container's init is gone")
        finally:
            os.close(pidfd)
        if os.fstat(fd).st_dev in kernel:
            os.close(fd)
            raise OSError(errno.EACCES, "the container's /proc, /sys and /dev are not reachable")
        self._after_open(fd, created, masked=False)
        return fd
