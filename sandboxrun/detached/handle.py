"""``DetachedSandbox``: a detached sandbox from Python (``Sandbox.create(..., detach=True)``,
``Sandbox.attach(name)``). Each call is one connection to its keeper, made in a worker thread;
cancelling a call cancels its run in the keeper (the connection ends)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from sandboxrun.detached import client

if TYPE_CHECKING:
    from sandboxrun.api.files_paths import DirEntry
    from sandboxrun.models import ExecResult, Limits, Policy


class DetachedSandbox:
    """A sandbox held by a keeper process: it outlives this object and this process, until
    ``remove`` (any client, also ``sandboxrun rm``) or its TTL."""

    def __init__(self, name: str, directory: Path | None = None) -> None:
        self.name = name
        self.directory = directory

    @classmethod
    async def attach(cls, name: str, *, directory: Path | None = None) -> DetachedSandbox:
        """The sandbox ``name`` of this uid (``NoSuchSandbox`` when none lives)."""
        found = cls(name, directory)
        await found.info()
        return found

    @classmethod
    async def create(
        cls,
        workspace: str | os.PathLike[str] = ".",
        *,
        name: str | None = None,
        ttl: float | None = None,
        idle_ttl: float | None = None,
        directory: Path | None = None,
        backend: str = "auto",
        policy: Policy | None = None,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        pass_proxy: bool = False,
        path_prepend: Sequence[str] = (),
        image: str | None = None,
        user: str | None = None,
        login_shell: str | None = None,
    ) -> DetachedSandbox:
        """Start a keeper holding ``Sandbox(workspace, ...)`` and wait until it serves. Its
        errors (a refused guarantee, a missing image) are raised here as they are."""
        spec: dict[str, Any] = {
            "workspace": os.path.abspath(workspace),  # noqa: ASYNC240, PTH100 - no I/O
            "backend": backend,
            "policy": None if policy is None else policy.model_dump(mode="json"),
            "limits": None if limits is None else limits.model_dump(mode="json"),
            "env": dict(env or {}),
            "pass_env": list(pass_env),
            "pass_proxy": pass_proxy,
            "path_prepend": list(path_prepend),
            "image": image,
            "user": user,
            "login_shell": login_shell,
        }
        made = await anyio.to_thread.run_sync(
            lambda: client.create(
                spec, name=name, ttl_s=ttl, idle_ttl_s=idle_ttl, directory=directory
            )
        )
        return cls(str(made["name"]), directory)

    async def info(self) -> dict[str, Any]:
        """What the keeper says of the sandbox (backend, workspace, TTLs, commands running)."""
        return await anyio.to_thread.run_sync(client.info, self.name, self.directory)

    async def exec(
        self,
        argv: Sequence[str] | None = None,
        *,
        shell: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        stdin: bytes | None = None,
        sink: Callable[[str, bytes], None] | None = None,
    ) -> ExecResult:
        """As ``Sandbox.exec``: one command, its result; never raises for a non-zero exit.
        ``sink(name, chunk)`` sees the output as it comes (called in a worker thread)."""
        from sandboxrun.models import ExecResult

        request: dict[str, Any] = {"json": True}
        if (argv is None) == (shell is None):
            from sandboxrun.errors import InputError

            raise InputError("exec takes argv or shell=, not both")
        request["argv" if argv is not None else "shell"] = list(argv) if argv is not None else shell
        for key, value in (
            ("workdir", workdir),
            ("env", dict(env) if env else None),
            ("timeout", timeout),
            ("idle_timeout", idle_timeout),
        ):
            if value is not None:
                request[key] = value
        conn = await anyio.to_thread.run_sync(client.connect, self.name, self.directory, None)
        feed = _Feed(stdin) if stdin is not None else None

        def run() -> dict[str, Any]:
            return client.run_exec(conn, request, sink or _ignore, feed)

        try:
            final = await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        finally:
            conn.shutdown()  # (cancelled: the keeper sees the connection end and cancels it)
        return ExecResult.model_validate_json(str(final["result"]))

    async def read_file(self, path: str | os.PathLike[str], *, max_bytes: int = 16 << 20) -> bytes:
        """As ``Sandbox.read_file`` (the same errors), through the keeper."""
        return await anyio.to_thread.run_sync(
            client.read_file, self.name, self.directory, os.fspath(path), max_bytes
        )

    async def write_file(
        self,
        path: str | os.PathLike[str],
        data: bytes | bytearray | memoryview,
        *,
        mode: int = 0o644,
        parents: bool = False,
    ) -> None:
        """As ``Sandbox.write_file`` (the same errors), through the keeper: at most 64 MiB."""
        payload = bytes(data)
        await anyio.to_thread.run_sync(
            lambda: client.write_file(
                self.name, self.directory, os.fspath(path), payload, mode, parents
            )
        )

    async def list_dir(
        self, path: str | os.PathLike[str] = ".", *, max_entries: int = 10_000
    ) -> list[DirEntry]:
        """As ``Sandbox.list_dir`` (the same errors), through the keeper."""
        from sandboxrun.api.files_paths import DirEntry

        rows = await anyio.to_thread.run_sync(
            client.list_dir, self.name, self.directory, os.fspath(path), max_entries
        )
        return [DirEntry(**row) for row in rows]

    async def remove(self, *, force: bool = False) -> list[str]:
        """Remove it with every process (``force``: commands running are ended, else refused);
        returns what could not be cleaned up, one sentence each."""
        answer = await anyio.to_thread.run_sync(
            lambda: client.remove(self.name, self.directory, force=force)
        )
        return [str(w) for w in answer.get("warnings") or []]


def _ignore(name: str, chunk: bytes) -> None:
    return None


class _Feed:
    """``stdin`` bytes handed out in chunks, then EOF."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def __call__(self) -> bytes:
        piece = self.data[self.at : self.at + (1 << 16)]
        self.at += len(piece)
        return piece
