"""Kill latency: from the deadline to the run being fully gone.

A TERM-ignoring shell that leaves a TERM-ignoring ``setsid`` grandchild behind is run with a
``timeout`` of T (default 0.5 s) and ``grace_s`` G (default 1.0 s): TERM is ignored by all of it,
so the run can only end by SIGKILL once the grace period is over. The kill latency is the wall
time of ``exec`` minus T. The baseline is the same latency for a cooperative command
(``sleep 1000``, dies on TERM); runs alternate, ``BENCH_REPEATS`` (default 5) of each.

After every run the whole process table is searched (psutil) for processes still carrying the
run's ``SANDBOXRUN_RUN_ID`` marker: ``survivors_observed`` must be 0, like ``result.survivors``.
While the hostile command runs, a probe checks that the ``setsid`` grandchild really exists in a
session of its own (``setsid_child_seen``), so the benchmark measures what it claims to.
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import anyio
import psutil
from _common import (
    MARKER_VAR,
    emit,
    env_float,
    env_int,
    latency_stats,
    machine,
    marked_alive,
    quiet_logs,
    rounded,
    temp_workspace,
)

from sandboxrun import ExecResult, Limits, Sandbox

HOSTILE = "trap '' TERM; (setsid sh -c 'trap \"\" TERM; sleep 1000' &); while :; do sleep 0.1; done"
COOPERATIVE = ["sleep", "1000"]
TARGET_SLACK_S = 0.5


def sessions_of_run(script_marker: str) -> tuple[int, int]:
    """``(processes, distinct sessions)`` among live processes carrying the run marker."""
    sids: set[int] = set()
    count = 0
    for proc in psutil.process_iter():
        with suppress(psutil.Error, OSError):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARKER_VAR) != script_marker:
                continue
            sids.add(os.getsid(proc.pid))
            count += 1
    return count, len(sids)


async def one_run(sb: Sandbox, hostile: bool, timeout_s: float) -> dict[str, Any]:
    probe: dict[str, int] = {}

    async def look() -> None:
        # The run id is only known once prepared: prepare here, then run that request.
        await anyio.sleep(timeout_s * 0.6)
        count, sessions = await anyio.to_thread.run_sync(sessions_of_run, run_id)
        probe.update(processes=count, sessions=sessions)

    if hostile:
        request = sb._prepare(shell=HOSTILE, timeout=timeout_s)
    else:
        request = sb._prepare(COOPERATIVE, timeout=timeout_s)
    run_id = request.run_id
    result: ExecResult | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(look)
        start = time.perf_counter()
        result = await sb._run_request(request)
        wall = time.perf_counter() - start
    assert result is not None
    observed = await anyio.to_thread.run_sync(marked_alive, result.run_id)
    return {
        "status": result.status,
        "latency_s": wall - timeout_s,
        "duration_latency_s": result.duration_s - timeout_s,
        "survivors": result.survivors,
        "survivors_observed": len(observed),
        "processes_seen": probe.get("processes", 0),
        "sessions_seen": probe.get("sessions", 0),
    }


def side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        **latency_stats([r["latency_s"] for r in runs]),
        "duration_latency_s": [rounded(r["duration_latency_s"]) for r in runs],
        "statuses": sorted({r["status"] for r in runs}),
        "survivors": [r["survivors"] for r in runs],
        "survivors_observed": [r["survivors_observed"] for r in runs],
        "processes_seen": [r["processes_seen"] for r in runs],
        "sessions_seen": [r["sessions_seen"] for r in runs],
    }


async def measure(repeats: int, timeout_s: float, grace_s: float, workspace: Path) -> Any:
    limits = Limits(max_output=65536, spill_max=0, grace_s=grace_s)
    hostile: list[dict[str, Any]] = []
    cooperative: list[dict[str, Any]] = []
    async with Sandbox(workspace, backend="process-group", limits=limits) as sb:
        await sb.exec(["true"])  # warm-up: the runner is up
        for _ in range(repeats):
            hostile.append(await one_run(sb, True, timeout_s))
            cooperative.append(await one_run(sb, False, timeout_s))
    return side(hostile), side(cooperative)


def main() -> None:
    quiet_logs()
    timeout_s = env_float("BENCH_T", 0.5)
    grace_s = env_float("BENCH_GRACE", 1.0)
    repeats = max(1, env_int("BENCH_REPEATS", 5))
    with temp_workspace() as ws:
        hostile, cooperative = anyio.run(measure, repeats, timeout_s, grace_s, ws)
    bound = grace_s + TARGET_SLACK_S
    clean = all(
        s == 0 for r in (hostile, cooperative) for s in r["survivors"] + r["survivors_observed"]
    )
    timed_out = hostile["statuses"] == ["timed_out"] and cooperative["statuses"] == ["timed_out"]
    setsid_seen = all(s >= 2 for s in hostile["sessions_seen"])
    ratio = hostile["p50_s"] / cooperative["p50_s"] if cooperative["p50_s"] > 0 else 0.0
    emit(
        {
            "bench": "kill",
            "timeout_s": timeout_s,
            "grace_s": grace_s,
            "repeats": repeats,
            "hostile": hostile,
            "cooperative": cooperative,
            "p50_ratio_hostile_vs_cooperative": rounded(ratio, 2),
            "setsid_child_seen": setsid_seen,
            "targets": {
                "hostile_max_latency_s": bound,
                "survivors": 0,
                "survivors_observed": 0,
                "status": "timed_out",
            },
            "meets_targets": bool(hostile["max_s"] <= bound and clean and timed_out),
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
