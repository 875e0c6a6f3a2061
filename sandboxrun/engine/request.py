"""The validated, backend-neutral description of one command (internal)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal

import anyio

from sandboxrun.models import Limits, Policy

if TYPE_CHECKING:
    from sandboxrun.engine.pty import PtyControl

Sink = Callable[[str, bytes], None]
"""Live output sink: called with ``("stdout" | "stderr", chunk)`` as chunks arrive."""


STDIN_CLOSED = "stdin was closed (close_stdin)"
STDIN_GONE = "the command's stdin is gone (the command closed it, or has ended)"


class _Chunk:
    """One ``send``: its bytes and, once the writer is done with it, how that went."""

    __slots__ = ("data", "done", "error")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.done = anyio.Event()
        self.error: str | None = None


class StdinStream:
    """A command's stdin fed while it runs (``Sandbox.start(..., stdin=True)``).

    ``send`` hands one chunk to the backend's stdin writer and returns once the writer has
    written all of it to the command's stdin (so a command that does not read holds the
    sender back), or raises ``BrokenPipeError`` when it cannot be (then an unknown part of it
    may have been written). ``close`` is EOF once what was sent is written. The writer takes
    each chunk with ``receive``, confirms it with ``written``, and ``abort``s the stream when
    it stops forwarding (the command's stdin is gone, the run is over): the chunk it holds and
    every later ``send`` then fail with the reason given.
    """

    def __init__(self) -> None:
        self._tx, self._rx = anyio.create_memory_object_stream[_Chunk](0)
        self._eof = False
        self._gone: str | None = None
        self._pending: _Chunk | None = None

    def _why(self) -> str:
        return STDIN_CLOSED if self._eof else self._gone or STDIN_GONE

    async def send(self, data: bytes) -> None:
        if self._eof or self._gone is not None:
            raise BrokenPipeError(self._why())
        if not data:
            return
        chunk = _Chunk(bytes(data))
        try:
            await self._tx.send(chunk)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise BrokenPipeError(self._why()) from None
        await chunk.done.wait()  # cancelled here: the writer still writes (or fails) it
        if chunk.error is not None:
            raise BrokenPipeError(chunk.error)

    async def receive(self) -> bytes | None:
        """The next chunk (confirm it with ``written``); None at EOF (closed) or once aborted."""
        try:
            chunk = await self._rx.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return None
        self._pending = chunk
        return chunk.data

    def written(self) -> None:
        """The chunk ``receive`` returned is written: its ``send`` returns."""
        chunk, self._pending = self._pending, None
        if chunk is not None:
            chunk.done.set()

    def close(self) -> None:
        """EOF: the writer closes the command's stdin once it has written what was sent."""
        self._eof = True
        self._tx.close()

    def abort(self, reason: str = STDIN_GONE) -> None:
        """The writer is done (the command's stdin is closed or the run over): the chunk it
        holds and later sends fail with ``BrokenPipeError(reason)`` (the first reason stays)."""
        if self._gone is None:
            self._gone = reason
        self._rx.close()
        self._tx.close()
        chunk, self._pending = self._pending, None
        if chunk is not None:
            chunk.error = self._gone
            chunk.done.set()

    @property
    def closed(self) -> bool:
        """Whether ``close`` (EOF) was called."""
        return self._eof


LoginMode = Literal["snapshot", "each", "raw"]
"""How the login profile reaches a command (``sandboxrun.api.login``): ``snapshot`` runs it under
the sandbox's login-shell environment snapshot (per-command login shell while there is none),
``each`` under its own login shell, ``raw`` runs the argv exactly (no shell, no profile)."""


@dataclass(frozen=True)
class Snapshot:
    """The environment a login shell printed inside the sandbox (``sandboxrun.api.login``)."""

    env: Mapping[str, str]
    """What ``<shell> -l -c 'env -0'`` printed, without sandboxrun's and the shell's own
    bookkeeping variables (``login.DROPPED``)."""
    base: Mapping[str, str]
    """The built environment that login shell was started with: a request's variables that
    differ from it (or were given explicitly) win over ``env``."""


@dataclass(frozen=True)
class ExecRequest:
    run_id: str
    argv: list[str] | None
    """The caller's argv (argv mode), or None in shell mode."""
    script: str | None
    """The caller's shell script (shell mode), or None in argv mode."""
    env: dict[str, str]
    path_prepend: list[str]
    workdir: Path
    """Resolved host working directory, inside the workspace."""
    workdir_rel: PurePosixPath
    """The working directory relative to the workspace root."""
    stdin: bytes | StdinStream | None
    """Fixed bytes (then EOF), a stream fed while the command runs, or None (``/dev/null``)."""
    timeout_s: float
    limits: Limits
    policy: Policy
    sink: Sink | None = None
    explicit: frozenset[str] = frozenset()
    """Names in ``env`` the caller gave explicitly (``--env``, ``env=``): every backend passes
    them as given, never replacing or dropping them (``PATH`` is re-applied after the login
    profile, see ``argv.EXPLICIT_PATH_VAR``)."""
    login: LoginMode = "snapshot"
    login_shell: str | None = None
    """The shell chosen inside the sandbox for the login profile and ``--shell`` scripts (None:
    the backend's default)."""
    tty: PtyControl | None = None
    """Run on a pseudo-terminal made inside the sandbox (``Sandbox.open_terminal``): its
    output is the terminal's (``stdout``), its input the ``stdin`` stream; the owner drives the
    terminal through this control."""
    snapshot: Snapshot | None = None
    """The login-shell environment in force (``login="snapshot"``); None: none was taken."""
    direct_argv: bool = False
    """No login shell can run here (``pids`` below ``login.MIN_LOGIN_PIDS``: a profile
    forks): no snapshot is taken and the local backends run an argv directly, as before
    snapshots existed (``login`` is ``each``: a script still gets its login shell)."""
