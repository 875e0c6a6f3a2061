"""The idle timeout, pure: validation, the captures' shared activity, and ``supervise`` driving a
fake run handle (no process): idle fires, steady output does not, a congested live sink does
not count as idle, the shorter wall-clock deadline wins."""

from __future__ import annotations

import math
import time
from pathlib import Path

import anyio
import pytest
from pydantic import ValidationError

from sandboxrun import Limits
from sandboxrun.api.sandbox import Sandbox
from sandboxrun.cli.report import summary
from sandboxrun.engine.capture.stream import Activity, StreamCapture
from sandboxrun.engine.launch import captures
from sandboxrun.engine.results import RunFacts
from sandboxrun.engine.results import build as build_result
from sandboxrun.engine.supervise import Supervision, Termination, supervise
from sandboxrun.errors import ConfigError
from sandboxrun.models import ExecResult

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan])
def test_invalid_idle_timeouts_are_refused(bad: float) -> None:
    with pytest.raises(ValidationError, match="idle_timeout_s"):
        Limits(idle_timeout_s=bad)
    with pytest.raises(ValueError, match="idle_timeout must be a positive finite number"):
        Limits().with_idle_timeout(bad)


def test_idle_timeout_defaults_to_none_and_is_overridden_per_exec(tmp_path: Path) -> None:
    assert Limits().idle_timeout_s is None
    limits = Limits(idle_timeout_s=5)
    assert limits.with_idle_timeout(None) is limits
    assert limits.with_idle_timeout(1).idle_timeout_s == 1.0
    sb = Sandbox(tmp_path, limits=limits)
    assert sb._prepare(["true"]).limits.idle_timeout_s == 5
    assert sb._prepare(["true"], idle_timeout=0.5).limits.idle_timeout_s == 0.5
    with pytest.raises(ConfigError, match="idle_timeout"):
        sb._prepare(["true"], idle_timeout=0)


def test_both_captures_of_a_run_share_one_activity(tmp_path: Path) -> None:
    request = Sandbox(tmp_path)._prepare(["true"])
    out, err, activity = captures(request)
    assert out.activity is err.activity is activity
    before = time.monotonic()
    err.feed(b"x")
    assert out.activity.last >= before
    last = out.activity.last
    out.feed(b"")  # nothing arrived: no sign of life
    assert out.activity.last == last


class FakeRun:
    """A RunHandle whose command writes ``chunks`` (one per ``every`` seconds) into the stdout
    capture, then exits 0 after ``exit_after`` seconds (None: never, until terminated)."""

    def __init__(
        self, out: StreamCapture, *, every: float, chunks: int, exit_after: float | None
    ) -> None:
        self.out, self.every, self.chunks, self.exit_after = out, every, chunks, exit_after
        self.terminated = anyio.Event()

    async def wait_exit(self) -> int | None:
        if self.exit_after is None:
            await self.terminated.wait()
            return 9  # killed by SIGKILL (raw wait status)
        await anyio.sleep(self.exit_after)
        return 0

    async def terminate(self, grace_s: float) -> Termination:
        self.terminated.set()
        return Termination()

    async def pump(self) -> None:
        for _ in range(self.chunks):
            await anyio.sleep(self.every)
            self.out.feed(b"tick\n")
            await self.out.wait_sink()


class Congestion:
    """A LiveSink congested while ``held`` (its reader is behind)."""

    def __init__(self) -> None:
        self.held = False

    def __call__(self, name: str, chunk: bytes) -> None:
        pass

    def congested(self, name: str) -> bool:
        return self.held

    def progress(self) -> int:
        return 0

    def lossy(self, name: str) -> bool:
        return False


def capture(sink: Congestion | None = None, activity: Activity | None = None) -> StreamCapture:
    return StreamCapture("stdout", 1024, 0, None, sink, activity=activity)


async def run(
    handle: FakeRun, *, timeout_s: float = 30, idle_s: float | None = 0.3
) -> tuple[Supervision, float]:
    start = time.monotonic()
    sup = await supervise(
        handle,
        timeout_s=timeout_s,
        grace_s=0,
        drain_s=0.1,
        started=start,
        idle_s=idle_s,
        activity=handle.out.activity,
    )
    return sup, time.monotonic() - start


async def test_no_output_ends_the_run_as_an_idle_timeout() -> None:
    sup, elapsed = await run(FakeRun(capture(), every=0.05, chunks=1, exit_after=None))
    assert (sup.reason, sup.timeout_kind) == ("timeout", "idle")
    assert 0.3 <= elapsed < 2.0


async def test_steady_output_keeps_the_run_alive() -> None:
    handle = FakeRun(capture(), every=0.05, chunks=20, exit_after=0.9)
    sup, _ = await run(handle)
    assert (sup.reason, sup.timeout_kind) == ("exited", None)
    assert sup.wait_status == 0


async def test_no_idle_timeout_without_idle_s() -> None:
    sup, _ = await run(FakeRun(capture(), every=0.05, chunks=0, exit_after=0.5), idle_s=None)
    assert (sup.reason, sup.timeout_kind) == ("exited", None)


async def test_a_congested_live_sink_is_not_idleness() -> None:
    sink = Congestion()
    sink.held = True
    handle = FakeRun(capture(sink), every=0.01, chunks=1, exit_after=1.0)

    async def release() -> None:
        await anyio.sleep(0.8)  # the reader is behind for far longer than the idle timeout
        sink.held = False

    async with anyio.create_task_group() as tg:
        tg.start_soon(release)
        sup, _ = await run(handle)
    assert (sup.reason, sup.timeout_kind) == ("exited", None)


async def test_idle_clock_restarts_when_the_reader_catches_up() -> None:
    sink = Congestion()
    sink.held = True
    handle = FakeRun(capture(sink), every=0.01, chunks=1, exit_after=None)

    async def release() -> None:
        await anyio.sleep(0.6)
        sink.held = False

    async with anyio.create_task_group() as tg:
        tg.start_soon(release)
        sup, elapsed = await run(handle)
    assert (sup.reason, sup.timeout_kind) == ("timeout", "idle")
    assert elapsed >= 0.6 + 0.3


async def test_a_shorter_wall_clock_deadline_wins() -> None:
    handle = FakeRun(capture(), every=0.05, chunks=0, exit_after=None)
    sup, elapsed = await run(handle, timeout_s=0.2, idle_s=5)
    assert (sup.reason, sup.timeout_kind) == ("timeout", "wall")
    assert elapsed < 2.0


def facts() -> RunFacts:
    return RunFacts("process-group", ["sh"], "r", [], [], None)


def test_result_says_which_deadline_fired() -> None:
    idle = Supervision(reason="timeout", timeout_kind="idle", idle_s=5.0, wait_status=9)
    result = build_result(facts(), idle, capture(), capture())
    assert (result.status, result.timed_out, result.timeout_kind) == ("timed_out", True, "idle")
    assert result.error == "no output for 5s (idle timeout)"
    line = summary(result)
    assert line is not None and "no output for 5s (idle timeout)" in line
    wall = Supervision(reason="timeout", timeout_kind="wall", wait_status=9)
    result = build_result(facts(), wall, capture(), capture())
    assert (result.timeout_kind, result.error) == ("wall", None)
    done = build_result(facts(), Supervision(wait_status=0), capture(), capture())
    assert (done.status, done.timeout_kind) == ("completed", None)


def test_json_carries_timeout_kind() -> None:
    base = {"duration_s": 1.0, "backend": "docker", "argv": ["x"], "run_id": "r"}
    r = ExecResult.model_validate(
        {**base, "status": "timed_out", "timed_out": True, "timeout_kind": "idle"}
    )
    assert '"timeout_kind":"idle"' in r.to_json()
    failed = ExecResult.model_validate({**base, "status": "failed"})
    assert '"timeout_kind":null' in failed.to_json()
