"""Supervision of one running command, shared by every backend.

A backend starts the command and hands back a ``RunHandle``; ``supervise`` then applies the
deadline (and the idle timeout: no output for a while), drains output with a bounded drain
period, terminates the whole managed range (TERM -> grace -> KILL, done by the backend), and
turns cancellation into a shielded, bounded cleanup. ``engine.results`` turns the outcome into
the public ``ExecResult``; ``engine.run`` is the sequence around it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import anyio

from sandboxrun.engine.capture.stream import Activity, LiveSink, live_sink
from sandboxrun.engine.request import ExecRequest
from sandboxrun.models import TimeoutKind
from sandboxrun.supervisor.protocol import KILL_BUDGET_S

__all__ = ["KILL_BUDGET_S"]


@dataclass
class Termination:
    """What the backend reports once the managed range is (as far as it can tell) empty."""

    survivors: int = 0
    cpu_s: float | None = None
    peak_rss_bytes: int | None = None
    error: str | None = None


class RunHandle(Protocol):
    """One started command, as a backend exposes it to ``supervise``."""

    async def wait_exit(self) -> int | None:
        """Wait for the main process; return its raw wait status (None: backend lost it)."""

    async def terminate(self, grace_s: float) -> Termination:
        """TERM the whole managed range, wait ``grace_s``, KILL what is left, until empty."""

    async def pump(self) -> None:
        """Read every output stream into its capture until EOF. May be called again."""


Reason = Literal["exited", "timeout", "cancel", "lost"]


@dataclass
class Supervision:
    reason: Reason = "exited"
    timeout_kind: TimeoutKind | None = None
    """With ``reason == "timeout"``: which deadline fired."""
    idle_s: float | None = None
    wait_status: int | None = None
    termination: Termination = field(default_factory=Termination)
    duration_s: float = 0.0
    cancel_exc: BaseException | None = None


async def _quiet_for(activity: Activity, idle_s: float, since: float) -> None:
    """Return once the run has shown no sign of life (``Activity``) for ``idle_s`` seconds,
    counting from ``since`` at the earliest. Wakes about once per ``idle_s``, not per chunk."""
    while True:
        now = time.monotonic()
        quiet = now - max(activity.latest(now), since)
        if quiet >= idle_s:
            return
        await anyio.sleep(idle_s - quiet)


async def _wait_exit(
    handle: RunHandle, sup: Supervision, idle_s: float | None, activity: Activity | None
) -> bool:
    """Wait for the main process into ``sup.wait_status``; True when it exited (or the backend
    lost it), False when the idle watchdog fired first (``sup.timeout_kind == "idle"``)."""
    if idle_s is None or activity is None:
        sup.wait_status = await handle.wait_exit()
        return True
    exited = False

    async def watchdog(scope: anyio.CancelScope) -> None:
        await _quiet_for(activity, idle_s, time.monotonic())
        if not exited:
            sup.timeout_kind = "idle"
            scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watchdog, tg.cancel_scope)
        sup.wait_status = await handle.wait_exit()
        exited = True
        tg.cancel_scope.cancel()
    return exited


async def _drain(handle: RunHandle, drain_s: float) -> None:
    with anyio.move_on_after(drain_s):
        await handle.pump()


async def _deliver_rest(output_done: anyio.Event, drain_s: float, flow: LiveSink) -> None:
    """Nothing of the run is alive, so what is left in the pipes is finite: read it to the end
    while the live sink holds the read loop back (a slow reader, however slow: like ``cat``
    into a pipe), and give up only after ``drain_s`` with neither congestion nor progress."""
    while not output_done.is_set():
        before = flow.progress()
        with anyio.move_on_after(max(drain_s, 0.05)):
            await output_done.wait()
        waiting_on_reader = flow.congested("stdout") or flow.congested("stderr")
        if not waiting_on_reader and flow.progress() == before:
            return


async def uninterruptible(
    action: Callable[[], Awaitable[None]], deadline: float
) -> BaseException | None:
    """Run a cleanup ``action`` to its end (or until ``deadline``), shielded from anyio
    cancellation and restarted on a native one (``task.cancel()`` pierces anyio shields):
    cleanup steps are idempotent, so a restart only finishes what was interrupted. Returns the
    native cancellation that arrived meanwhile, for the caller to re-raise."""
    caught: BaseException | None = None
    while True:
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_at(deadline):
                await action()
            return caught
        except anyio.get_cancelled_exc_class() as exc:
            caught = exc
            if anyio.current_time() >= deadline:
                return caught


async def supervise(
    handle: RunHandle,
    *,
    timeout_s: float,
    grace_s: float,
    drain_s: float,
    started: float,
    flow: LiveSink | None = None,
    idle_s: float | None = None,
    activity: Activity | None = None,
) -> Supervision:
    """Run ``handle`` to its end. Never raises the caller's cancellation: it is returned in
    ``Supervision.cancel_exc`` after the cleanup, for the caller to re-raise.

    With ``idle_s`` (and the captures' shared ``activity``), a run that shows no sign of life
    for ``idle_s`` seconds ends like a timeout (``timeout_kind == "idle"``); the wall-clock
    ``timeout_s`` still applies, whichever fires first.

    With a flow-controlled live sink (``flow``), after a normal exit whose termination left
    nothing alive, the output is read to its end however slow the sink's reader is; the
    duration is taken before that wait. After a timeout or a cancellation, draining stays
    bounded by ``drain_s``: the deadline wins over a slow reader."""
    sup = Supervision(idle_s=idle_s)
    bound = 2 * grace_s + KILL_BUDGET_S + 2 * drain_s + 15.0  # backends' own fallbacks fit
    output_done = anyio.Event()

    async def pump() -> None:
        await handle.pump()
        output_done.set()

    async def after_exit() -> None:
        if sup.reason == "exited" and not output_done.is_set():  # (a set Event still yields)
            with anyio.move_on_after(drain_s):  # let late writers finish, then sweep the rest
                await output_done.wait()
        sup.termination = await handle.terminate(grace_s)
        if sup.reason == "timeout":
            sup.wait_status = await handle.wait_exit()
        if not output_done.is_set():
            with anyio.move_on_after(drain_s):
                await output_done.wait()

    async def after_cancel() -> None:
        if sup.wait_status is None:
            sup.reason = "cancel"
        sup.termination = await handle.terminate(grace_s)
        if sup.wait_status is None:
            sup.wait_status = await handle.wait_exit()
        await _drain(handle, drain_s)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            exited = False
            with anyio.move_on_after(timeout_s) as deadline:
                exited = await _wait_exit(handle, sup, idle_s, activity)
            if exited:
                sup.timeout_kind = None
                if sup.wait_status is None:
                    sup.reason = "lost"
            elif deadline.cancelled_caught or sup.timeout_kind is not None:
                sup.reason = "timeout"
                sup.timeout_kind = sup.timeout_kind or "wall"
            sup.cancel_exc = await uninterruptible(after_exit, anyio.current_time() + bound)
            sup.duration_s = time.monotonic() - started
            everything_gone = sup.reason == "exited" and not sup.termination.survivors
            if flow is not None and sup.cancel_exc is None and everything_gone:
                await _deliver_rest(output_done, drain_s, flow)
            if not output_done.is_set():  # (a cancel schedules its delivery: a loop turn)
                tg.cancel_scope.cancel()
    except anyio.get_cancelled_exc_class() as exc:
        sup.cancel_exc = exc
        await uninterruptible(after_cancel, anyio.current_time() + bound)
    if not sup.duration_s:
        sup.duration_s = time.monotonic() - started
    return sup


async def supervise_request(
    handle: RunHandle, request: ExecRequest, started: float, activity: Activity | None
) -> Supervision:
    """``supervise`` with the request's limits. The idle timeout (``Limits.idle_timeout_s``)
    watches ``activity``: the one both captures of the run stamp."""
    limits = request.limits
    return await supervise(
        handle,
        timeout_s=request.timeout_s,
        grace_s=limits.grace_s,
        drain_s=limits.drain_s,
        started=started,
        flow=live_sink(request.sink),
        idle_s=limits.idle_timeout_s,
        activity=activity,
    )
