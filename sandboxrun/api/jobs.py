"""Background jobs: a command started in a sandbox that runs on while the caller does more.

``Sandbox.start`` returns a ``Job``. The job is an ordinary run (``Sandbox._run_request``: the
same backend exec, isolation, refusal and diagnosis as ``exec``) in a task the sandbox owns; its
output goes through the run's live sink into one ``JobLog`` per stream (``sandboxrun.api.joblog``),
which the caller reads by byte offset while the job runs (``Job.read``, ``Job.read_lines``).
An ended job holds no descriptor; ``release`` (``Sandbox.forget``, or the sandbox's cap on
ended jobs) removes its spill files. See ``docs/jobs.md``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal

import anyio

from sandboxrun.api.joblog import MAX_LINES_BYTES, JobChunk, JobLines, JobLog, StreamName
from sandboxrun.engine import results
from sandboxrun.engine.capture.redact import mask_model, redactor_for
from sandboxrun.engine.capture.spill import SpillDir, default_spill_root
from sandboxrun.engine.request import ExecRequest, Sink, StdinStream
from sandboxrun.engine.results import RunFacts, unstarted
from sandboxrun.models import BackendName, ExecResult, Policy, Status

__all__ = ["MAX_ENDED_JOBS", "Job", "JobChunk", "JobLines", "JobLog", "JobStatus", "StreamName"]

JobStatus = Literal["running"] | Status
JOB_ENDED = "the job has ended: its stdin is closed"
MAX_ENDED_JOBS = 16
"""``Sandbox.max_ended_jobs``' default: ended jobs a sandbox keeps (with their spill files)."""

RunFn = Callable[[ExecRequest, anyio.CancelScope], Awaitable[ExecResult]]
"""How a job runs its request: ``Sandbox._run_request`` with the job's own cancel scope."""


def _spawn(main: Callable[[], Coroutine[Any, Any, None]]) -> object:
    """Run ``main`` in a task of its own, outside every caller's cancel scope (it ends by its
    job's own scope: ``kill``, ``aclose``). Returns what keeps the task alive."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio: anyio's other backend
        trio: Any = importlib.import_module("trio")
        trio.lowlevel.spawn_system_task(main)
        return None
    return loop.create_task(main())


class Job:
    """A command running in the background of a sandbox (``Sandbox.start``).

    ``id`` is its run id; ``status`` is ``"running"`` until it ends, then its result's status.
    """

    def __init__(
        self,
        request: ExecRequest,
        *,
        backend: BackendName,
        stdin: StdinStream | None,
        sink: Sink | None = None,
        on_end: Callable[[Job], None] | None = None,
    ) -> None:
        """``on_end``: called with the job once it has ended (its result set)."""
        limits = request.limits
        spill_dir: SpillDir | None = None
        if limits.spill_max > 0:
            spill_dir = SpillDir(limits.spill_dir or default_spill_root(), f"{request.run_id}.log")
        self.id = request.run_id
        self.argv = None if request.argv is None else list(request.argv)
        """The argv as given, or None for a ``shell=`` job."""
        self.shell = request.script
        """The script of a ``shell=`` job, else None."""
        self.started_at = time.time()
        self.ended_at: float | None = None
        """When the job ended (``time.time()``), else None."""
        self.released = False
        """Whether ``release`` removed its spill files (then only memory parts are held)."""
        self.result: ExecResult | None = None
        self.warnings: list[str] = []
        self.logs = {
            "stdout": JobLog("stdout", limits.max_output, limits.spill_max, spill_dir),
            "stderr": JobLog("stderr", limits.max_output, limits.spill_max, spill_dir),
        }
        self._backend = backend
        self._user_sink = sink
        self._stdin = stdin
        self._on_end = on_end
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        self._killed: str | None = None
        """Why ``kill`` ended it (the error its cancelled result gets)."""
        self._task: object = None
        self._request = dataclasses.replace(request, sink=self._sink)

    def __repr__(self) -> str:
        what = self.argv if self.argv is not None else f"shell={self.shell!r}"
        return f"<Job {self.id} {self.status} {what}>"

    @property
    def status(self) -> JobStatus:
        return "running" if self.result is None else self.result.status

    @property
    def done(self) -> bool:
        return self.result is not None

    # -- output ---------------------------------------------------------------------------
    def _sink(self, name: str, chunk: bytes) -> None:
        log = self.logs.get(name)
        if log is not None:
            log.feed(chunk)
        user = self._user_sink
        if user is not None:
            try:
                user(name, chunk)
            except Exception as exc:  # the job's own log must go on
                self._user_sink = None
                self.warnings.append(f"live sink failed and was dropped: {exc!r}")

    def read(self, offset: int = 0, limit: int = 65536, stream: StreamName = "stdout") -> JobChunk:
        """Up to ``limit`` bytes of ``stream`` from byte ``offset`` (see ``JobChunk``)."""
        return self._log(stream).read(offset, limit)

    def read_lines(
        self,
        offset: int | None = None,
        limit: int = 100,
        stream: StreamName = "stdout",
        max_bytes: int = MAX_LINES_BYTES,
    ) -> JobLines:
        """The last lines (``offset`` None), or the lines from byte ``offset``: at most
        ``limit`` lines and ``max_bytes`` bytes of them (see ``JobLines``)."""
        return self._log(stream).read_lines(offset, limit, max_bytes)

    def _log(self, stream: str) -> JobLog:
        if stream not in self.logs:
            raise ValueError(f"stream must be 'stdout' or 'stderr', not {stream!r}")
        return self.logs[stream]

    # -- stdin ----------------------------------------------------------------------------
    async def write_stdin(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin: returns once all of it is in the pipe (it
        waits while the pipe is full: the command does not read). ``BrokenPipeError`` when it
        cannot be written (then a part of it may have been): after ``close_stdin``, once the
        command's stdin is gone (closed by it, or it has ended), or once the job has ended."""
        if self._stdin is None:
            raise RuntimeError("the job was not started with stdin=True: it has no stdin to write")
        await self._stdin.send(data)

    def close_stdin(self) -> None:
        """EOF on the command's stdin (after what was written). Idempotent."""
        if self._stdin is not None:
            self._stdin.close()

    # -- lifetime -------------------------------------------------------------------------
    async def wait(self, timeout: float | None = None) -> ExecResult:
        """The job's result once it has ended. With ``timeout``: ``TimeoutError`` when it is
        still running after that many seconds (it runs on)."""
        if timeout is None:
            await self._done.wait()
        else:
            with anyio.move_on_after(timeout):
                await self._done.wait()
        if self.result is None:
            raise TimeoutError(f"job {self.id} is still running after {timeout:g} s")
        return self.result

    async def kill(self, why: str = "killed: Job.kill() ended the job") -> ExecResult:
        """End the job like a cancelled exec (TERM, grace, KILL, until nothing of it is left)
        and return its result (``cancelled``, ``error`` saying ``kill()``, or ``why``); a job
        that had already ended keeps its result."""
        if self.result is None:
            self._killed = self._killed or why
            self._scope.cancel()
        return await self.wait()

    def launch(self, run: RunFn) -> None:
        """Start the job's task (``Sandbox.start``)."""
        self._task = _spawn(lambda: self._main(run))

    def cancel(self) -> None:
        """End the job (``aclose``): its result is a ``cancelled`` one saying so."""
        self._scope.cancel()

    async def ended(self) -> None:
        await self._done.wait()

    async def _main(self, run: RunFn) -> None:
        result: ExecResult | None = None
        started = time.monotonic()
        try:
            if self._scope.cancel_called:  # the sandbox closed before the job's task ran
                result = self._unrun(
                    started, "cancelled: the sandbox was closed during the command"
                )
            else:
                result = await run(self._request, self._scope)
        except anyio.get_cancelled_exc_class():
            result = self._unrun(started, "cancelled: the job's task was cancelled")
            raise
        except Exception as exc:  # e.g. the sandbox closing, the engine gone: the job failed
            status: Status = "cancelled" if self._scope.cancel_called else "sandbox_error"
            result = self._unrun(started, f"the job could not run: {exc}", status)
        finally:
            self._finish(result or self._unrun(started, "the job ended without a result"))

    def _unrun(self, started: float, error: str, status: Status = "cancelled") -> ExecResult:
        argv = self.argv if self.argv is not None else [self.shell or ""]
        facts = RunFacts(self._backend, argv, self.id, [], [], None)
        return unstarted(facts, status, error, started)

    def _finish(self, result: ExecResult) -> None:
        if self._killed and result.status == "cancelled":
            result = results.amend(result, error=self._killed)
        if self.warnings or any(log.error for log in self.logs.values()):
            notes = [*self.warnings, *(log.error for log in self.logs.values() if log.error)]
            result = results.amend(result, warnings=notes)
        # masked as every result is (a job that never ran too: its argv, its error text)
        self.result = mask_model(result, redactor_for(self._request), keep=(Policy,))
        self.ended_at = time.time()
        for log in self.logs.values():
            log.end()  # no descriptor is held from now on
        if self._stdin is not None:
            self._stdin.abort(JOB_ENDED)
        self._done.set()
        if self._on_end is not None:
            self._on_end(self)

    def release(self) -> None:
        """Remove the logs' spill files (an ended job: ``Sandbox.forget``, the cap on ended
        jobs, ``aclose``): only the memory part of each log stays readable. Idempotent."""
        self.released = True
        for log in self.logs.values():
            log.discard()
