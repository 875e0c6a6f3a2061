"""A blocking facade over ``Sandbox`` for synchronous code (the pytest ``sandbox`` fixture).

``BlockingSandbox.open(Sandbox(...))`` starts an event loop in a thread of its own (anyio's
blocking portal), opens the sandbox in it and returns a facade whose methods block until the
sandbox's coroutine ends: ``exec``, ``start``, ``read_file``, ``write_file``, ``list_dir``. Each
method has the signature and the documentation of the ``Sandbox`` method it calls. Callbacks
(``sink``, ``escalate``) run in the loop's thread. Leaving the ``with`` block closes the sandbox
as ``aclose`` does (running jobs are ended) and stops the loop. See ``docs/pytest.md``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Concatenate, Generic, ParamSpec, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from sandboxrun.api.jobs import Job, JobStatus
from sandboxrun.api.sandbox import Sandbox
from sandboxrun.models import ExecResult

__all__ = ["BlockingJob", "BlockingSandbox"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class _Facade(Generic[T]):
    """An object of the event loop's thread (``target``) and the portal into that thread."""

    def __init__(self, target: T, portal: BlockingPortal) -> None:
        self._target = target
        self._portal = portal


def _awaited(
    method: Callable[Concatenate[T, P], Awaitable[R]],
) -> Callable[Concatenate[_Facade[T], P], R]:
    """The coroutine method ``method`` of the target, awaited in the loop's thread."""

    @functools.wraps(method)
    def call(self: _Facade[T], /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._portal.call(functools.partial(method, self._target, *args, **kwargs))

    return call


def _in_loop(method: Callable[Concatenate[T, P], R]) -> Callable[Concatenate[_Facade[T], P], R]:
    """The plain method ``method`` of the target, called in the loop's thread (the target's
    state is only ever touched there)."""

    @functools.wraps(method)
    def call(self: _Facade[T], /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._portal.call(functools.partial(method, self._target, *args, **kwargs))

    return call


def _job_starter(
    method: Callable[Concatenate[Sandbox, P], Awaitable[Job]],
) -> Callable[Concatenate[_Facade[Sandbox], P], BlockingJob]:
    """``Sandbox.start``, awaited in the loop's thread; the job wrapped for this thread."""

    @functools.wraps(method)
    def call(self: _Facade[Sandbox], /, *args: P.args, **kwargs: P.kwargs) -> BlockingJob:
        job = self._portal.call(functools.partial(method, self._target, *args, **kwargs))
        return BlockingJob(job, self._portal)

    return call


class BlockingJob(_Facade[Job]):
    """A background job (``Job``, ``docs/jobs.md``) seen from synchronous code."""

    read = _in_loop(Job.read)
    read_lines = _in_loop(Job.read_lines)
    write_stdin = _awaited(Job.write_stdin)
    close_stdin = _in_loop(Job.close_stdin)
    wait = _awaited(Job.wait)
    kill = _awaited(Job.kill)

    @property
    def job(self) -> Job:
        """The ``Job`` itself (its coroutine methods belong to the loop's thread)."""
        return self._target

    @property
    def id(self) -> str:
        return self._target.id

    @property
    def status(self) -> JobStatus:
        return self._target.status

    @property
    def done(self) -> bool:
        return self._target.done

    @property
    def result(self) -> ExecResult | None:
        return self._target.result

    def __repr__(self) -> str:
        return f"BlockingJob({self._target!r})"


class BlockingSandbox(_Facade[Sandbox]):
    """An open ``Sandbox`` seen from synchronous code: ``with BlockingSandbox.open(Sandbox(...))
    as sb: sb.exec([...])``."""

    exec = _awaited(Sandbox.exec)
    read_file = _awaited(Sandbox.read_file)
    write_file = _awaited(Sandbox.write_file)
    list_dir = _awaited(Sandbox.list_dir)
    start = _job_starter(Sandbox.start)

    @classmethod
    @contextlib.contextmanager
    def open(cls, sandbox: Sandbox) -> Iterator[BlockingSandbox]:
        """Open ``sandbox`` in an event loop of its own thread; close both on leaving."""
        with (
            start_blocking_portal("asyncio") as portal,
            portal.wrap_async_context_manager(sandbox) as opened,
        ):
            yield cls(opened, portal)

    def jobs(self) -> list[BlockingJob]:
        """The jobs started in this sandbox, oldest first (``Sandbox.jobs``)."""
        return [BlockingJob(job, self._portal) for job in self._portal.call(self._target.jobs)]

    @property
    def sandbox(self) -> Sandbox:
        """The ``Sandbox`` itself (its coroutine methods belong to the loop's thread)."""
        return self._target

    @property
    def portal(self) -> BlockingPortal:
        """The portal into the loop's thread: ``sb.portal.call(async_fn, *args)``."""
        return self._portal

    @property
    def workspace(self) -> Path:
        """The workspace on the host (canonical, absolute)."""
        return self._target.workspace.root

    @property
    def backend_name(self) -> str:
        """The backend the sandbox runs on (``docker``, ``systemd-scope``, ``process-group``)."""
        return self._target.backend.name

    def __repr__(self) -> str:
        return f"BlockingSandbox(workspace={str(self.workspace)!r}, backend={self.backend_name!r})"
