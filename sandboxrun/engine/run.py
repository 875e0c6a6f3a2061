"""``run``: THE exec sequence, written once for every backend (anyio's ``run_process`` over its
``Process``): the run's streams, the shielded start, supervision, the backend's verdict, the one
place the result is built, and the cancellation handed back for the caller to re-raise.

A backend supplies ``plan`` (pure), ``start`` (a ``RunHandle``, or ``NotStarted``), ``finalize``
(a ``Verdict``, releasing what the run held) and ``revive`` (``backends.base.Backend``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import anyio

from sandboxrun.engine import results
from sandboxrun.engine.launch import Launch, Stdio
from sandboxrun.engine.results import NotStarted, RunFacts, Verdict
from sandboxrun.engine.supervise import RunHandle, Supervision, supervise_request

if TYPE_CHECKING:
    from sandboxrun.models import ExecResult


class Runs(Protocol):
    """The part of a backend ``run`` drives (``backends.base.Backend``)."""

    async def revive(self) -> None: ...

    async def start(self, launch: Launch, stdio: Stdio) -> RunHandle: ...

    async def finalize(self, handle: RunHandle, sup: Supervision) -> Verdict: ...


@dataclass(frozen=True)
class Finished:
    """A run's result and, when the caller's scope was cancelled meanwhile, the cancellation
    (raised by the caller once the result is recorded)."""

    result: ExecResult
    cancelled: BaseException | None = None


async def run(backend: Runs, launch: Launch, facts: RunFacts) -> Finished:
    """Run ``launch`` on ``backend`` to its end. A non-zero exit, a timeout, a command that
    could not start: all are results. Cancellation is returned, after the cleanup."""
    await backend.revive()  # a supervisor found dead is replaced before this run (cancellable)
    request = launch.request
    started = time.monotonic()
    with Stdio(request) as stdio:
        try:
            with anyio.CancelScope(shield=True):
                handle = await backend.start(launch, stdio)
        except NotStarted as exc:
            stdio.close()
            return Finished(results.not_started(facts, exc, stdio.stdout, stdio.stderr, started))
        sup = Supervision(reason="lost")
        try:
            sup = await supervise_request(handle, request, started, stdio.activity)
        finally:
            with anyio.CancelScope(shield=True):
                verdict = await backend.finalize(handle, sup)
    return Finished(results.build(facts, sup, stdio.stdout, stdio.stderr, verdict), sup.cancel_exc)
