"""Concurrent runs in one sandbox never touch each other; a run ends only when it is over.

Every backend: many short commands run beside neighbours that time out (TERM-ignoring, with a
background child) or are cancelled, round after round; none of the short ones may be signalled
or lose output (0 collateral). A timeout or a cancellation that fires before the command has
even started still kills it: nothing of it may run on afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from conformance_helpers import assert_container_clean
from helpers import require_backend

from sandboxrun import Limits, Sandbox
from sandboxrun.models import ExecResult

pytestmark = pytest.mark.anyio

FAST = Limits(grace_s=0.3, drain_s=0.5)
ROUNDS = 5
SHORT_RUNS = 32
CONCURRENCY = 8
TERM_IGNORING = "trap '' TERM; sleep 30 & sleep 30"


async def test_neighbours_that_time_out_or_are_cancelled_kill_nothing_else(
    workspace: Path, backend: str
) -> None:
    await hammer(workspace, backend, ROUNDS)


async def test_docker_without_exec_cgroups_kills_nothing_else(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the container's cgroup is not writable (a non-root invoker) docker execs are told
    apart by their markers: an exec still being started belongs to nobody yet."""
    from sandboxrun.backends.docker import cgroup as docker_cgroup

    require_backend("docker")
    monkeypatch.setattr(docker_cgroup, "unified_dir", lambda pid, cid: None)
    await hammer(workspace, "docker", 3)


async def hammer(workspace: Path, backend: str, rounds: int) -> None:
    collateral: list[ExecResult] = []
    neighbours: list[ExecResult] = []
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        limiter = anyio.CapacityLimiter(CONCURRENCY)
        for _ in range(rounds):

            async def short(index: int) -> None:
                async with limiter:
                    result = await sb.exec(shell=f"sleep 0.1; echo done-{index}", timeout=30)
                if result.status != "completed" or result.stdout != f"done-{index}\n":
                    collateral.append(result)

            async def timing_out() -> None:
                neighbours.append(await sb.exec(["sh", "-c", TERM_IGNORING], timeout=0.7))

            async def cancelled() -> None:
                with anyio.move_on_after(0.4):
                    await sb.exec(["sh", "-c", TERM_IGNORING], timeout=30)
                assert sb.last_result is not None

            async with anyio.create_task_group() as tg:
                tg.start_soon(timing_out)
                tg.start_soon(cancelled)
                for index in range(SHORT_RUNS):
                    tg.start_soon(short, index)
        await assert_container_clean(sb)
    summary = [(r.status, r.exit_code, r.signal, r.error, r.stdout) for r in collateral]
    assert not collateral, f"{len(collateral)} of {rounds * SHORT_RUNS} short runs hit: {summary}"
    assert [r.status for r in neighbours] == ["timed_out"] * rounds
    assert all(r.survivors == 0 for r in neighbours)


@pytest.mark.parametrize("timeout", [0.001, 0.01, 0.05])
async def test_timeout_before_the_command_started_still_kills_it(
    workspace: Path, backend: str, timeout: float
) -> None:
    """The deadline can pass while the command is still being started (docker: between exec
    start and the process existing). The run must not end until the command is known to be
    dead or never to start: no file appears later, no process is left."""
    target = workspace / "late.txt"
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        start = time.monotonic()
        result = await sb.exec(shell="sleep 1; echo late > late.txt", timeout=timeout)
        elapsed = time.monotonic() - start
        await assert_container_clean(sb)
    assert result.status == "timed_out"
    assert result.survivors == 0
    assert elapsed < 1.0, "the run waited for the command instead of killing it"
    await anyio.sleep(1.5)
    assert not target.exists(), "the command ran on after its run was over"


async def test_cancellation_before_the_command_started_still_kills_it(
    workspace: Path, backend: str
) -> None:
    target = workspace / "late.txt"
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        for delay in (0.0, 0.001, 0.005, 0.02):
            sb.last_result = None
            with anyio.move_on_after(delay):
                await sb.exec(shell="sleep 1; echo late > late.txt", timeout=30)
            if sb.last_result is not None:  # None: cancelled before anything was started
                assert sb.last_result.status == "cancelled"
                assert sb.last_result.survivors == 0
        await assert_container_clean(sb)
    await anyio.sleep(1.5)
    assert not target.exists(), "a cancelled command ran on after its run was over"


async def test_closing_the_sandbox_during_an_exec_cancels_it_cleanly(
    workspace: Path, backend: str
) -> None:
    """``aclose`` while execs run (in a task group outside the sandbox's block): each exec
    returns a ``cancelled`` result that says why (it is not the caller's cancellation, so it is
    not raised), nothing of it is left, and no internal error escapes."""
    results: list[ExecResult] = []
    sb = Sandbox(workspace, backend=backend, limits=FAST)
    async with anyio.create_task_group() as tg:
        await sb.__aenter__()

        async def victim(script: str) -> None:
            results.append(await sb.exec(shell=script, timeout=30))

        tg.start_soon(victim, "echo up; sleep 30")
        tg.start_soon(victim, "trap '' TERM; echo up; sleep 30")
        await anyio.sleep(0.8)
        start = time.monotonic()
        await sb.aclose()
        closed_in = time.monotonic() - start
    assert len(results) == 2
    for result in results:
        assert result.status == "cancelled", result
        assert result.error is not None
        assert "closed" in result.error
        assert result.stdout == "up\n"
        assert result.survivors == 0
    assert closed_in < FAST.grace_s + 5
    with pytest.raises(RuntimeError, match="not open"):
        await sb.exec(["true"])


def docker_or_skip() -> None:
    require_backend("docker")


async def test_docker_exec_slow_to_start_under_a_cpu_limit_still_runs(workspace: Path) -> None:
    """Under a tiny CPU share with a busy neighbour the start stub takes long to stop itself;
    it must be waited for and continued, not given up on (it would stay stopped forever)."""
    docker_or_skip()
    limits = Limits(grace_s=0.3, drain_s=0.5, cpus=0.01)
    async with Sandbox(workspace, backend="docker", limits=limits) as sb:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: sb.exec(shell="while :; do :; done", timeout=25))
            await anyio.sleep(0.5)
            results = [await sb.exec(["echo", "hi"], timeout=20) for _ in range(3)]
            tg.cancel_scope.cancel()
        await assert_container_clean(sb)
    assert [(r.status, r.stdout) for r in results] == [("completed", "hi\n")] * 3


async def test_docker_env_cleared_main_process_is_still_its_runs(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without exec cgroups, a main process that re-execs with an empty environment beside a
    running neighbour is still found (by its exec pid) and killed, with its child."""
    from helpers import processes_with_arg

    from sandboxrun.backends.docker import cgroup as docker_cgroup

    docker_or_skip()
    monkeypatch.setattr(docker_cgroup, "unified_dir", lambda pid, cid: None)
    tok = "1000.4321"
    sb = Sandbox(workspace, backend="docker", limits=FAST)
    async with sb, anyio.create_task_group() as tg:
        tg.start_soon(lambda: sb.exec(shell="sleep 4", timeout=10))
        await anyio.sleep(0.3)
        start = time.monotonic()
        result = await sb.exec(["env", "-i", "sh", "-c", f"sleep {tok} & wait"], timeout=1)
        elapsed = time.monotonic() - start
        assert not processes_with_arg(tok), "the env-cleared run outlived its timeout"
    assert result.status == "timed_out"
    assert result.survivors == 0
    assert elapsed < 1 + FAST.grace_s + 3


async def test_docker_recycle_waits_for_running_neighbours(workspace: Path) -> None:
    """A recycle (after an unkillable leftover or a dead container) replaces the container
    once, after the execs still running in it have ended: they are not cut off."""
    from sandboxrun.backends.docker.backend import DockerBackend

    docker_or_skip()
    async with Sandbox(workspace, backend="docker", limits=FAST) as sb:
        backend = sb.backend
        assert isinstance(backend, DockerBackend)
        first = backend.session.container_id
        results: list[ExecResult] = []
        async with anyio.create_task_group() as tg:

            async def neighbour() -> None:
                results.append(await sb.exec(shell="sleep 1; echo neighbour", timeout=10))

            async def later() -> None:
                results.append(await sb.exec(["echo", "after"], timeout=10))

            tg.start_soon(neighbour)
            await anyio.sleep(0.3)
            backend.session.recycle_needed = True
            for _ in range(3):
                tg.start_soon(later)
            # one more exec arriving while the recycle is replacing the container
            while not (backend._recycle_lock.locked() and not backend.session.active):
                await anyio.sleep(0.001)
            tg.start_soon(later)
        assert backend.session.container_id != first
        again = await sb.exec(["echo", "after"], timeout=10)
    outcomes = sorted((r.status, r.stdout) for r in [*results, again])
    assert outcomes == [("completed", "after\n")] * 5 + [("completed", "neighbour\n")]


async def test_concurrent_closes_wait_for_the_first(workspace: Path, backend: str) -> None:
    sb = Sandbox(workspace, backend=backend, limits=FAST)
    await sb.__aenter__()
    done: list[str] = []

    async def close(name: str) -> None:
        await sb.aclose()
        done.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(close, "first")
        await anyio.sleep(0)
        tg.start_soon(close, "second")
    assert done == ["first", "second"]
    assert sb.close_errors == []
    with pytest.raises(RuntimeError, match="not open"):
        await sb.exec(["true"])


@pytest.mark.parametrize("timeout", [0.001, 0.01, 0.05])
async def test_docker_without_exec_cgroups_timeout_before_start_still_kills(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, timeout: float
) -> None:
    """Without exec cgroups termination waits until the engine has the exec's pid (it says
    ``Running`` before the runtime has started the process)."""
    from sandboxrun.backends.docker import cgroup as docker_cgroup

    docker_or_skip()
    monkeypatch.setattr(docker_cgroup, "unified_dir", lambda pid, cid: None)
    async with Sandbox(workspace, backend="docker", limits=FAST) as sb:
        for _ in range(3):
            result = await sb.exec(shell="sleep 1; echo late >> late.txt", timeout=timeout)
            assert result.status == "timed_out"
            assert result.survivors == 0
        await assert_container_clean(sb)
    await anyio.sleep(1.5)
    assert not (workspace / "late.txt").exists(), "the command ran on after its run was over"


ESCAPE = """
for f in $(find /sys/fs/cgroup -name cgroup.procs 2>/dev/null); do
  if echo $$ > "$f" 2>/dev/null; then echo "moved to $f"; fi
done
trap '' TERM; echo up; sleep 30
"""


async def test_docker_exec_cannot_leave_its_cgroup_and_none_is_left(workspace: Path) -> None:
    """A command (uid 0 when the invoker is root) tries to move itself into every cgroup it can
    see, then ignores TERM: it cannot move (cgroupfs is read-only in the container), its run
    still ends on time with nothing left, and no run cgroup is left on the host."""
    from sandboxrun.backends.docker.backend import DockerBackend

    require_backend("docker")
    async with Sandbox(workspace, backend="docker", limits=FAST) as sb:
        backend = sb.backend
        assert isinstance(backend, DockerBackend)
        start = time.monotonic()
        result = await sb.exec(shell=ESCAPE, timeout=2)
        elapsed = time.monotonic() - start
        await assert_container_clean(sb)
        base = backend.session.run_cgroup_base
        left = [] if base is None else [p.name for p in base.glob("sandboxrun-*")]
    assert "moved" not in result.stdout, result.stdout
    assert result.stdout.endswith("up\n")
    assert result.status == "timed_out"
    assert result.survivors == 0
    assert elapsed < 2 + FAST.grace_s + 3
    assert left == [], f"run cgroups left behind: {left}"
