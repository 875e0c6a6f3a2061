"""Concurrent execs in one docker sandbox: 32 × ``sleep 0.1`` at concurrency 8.

One docker ``Sandbox`` (default policy: ``network="none"``) is opened and warmed up. A round runs
``BENCH_JOBS`` (default 32) ``sleep 0.1`` commands, at most ``BENCH_CONCURRENCY`` (default 8) at
a time (workers pulling from one queue), and is timed from the first start to the last result:
execs/s = jobs / wall. The ideal is ``concurrency / 0.1 s`` (80/s): what is lost below it is the
per-exec overhead and how well concurrent execs overlap.

* ``sandboxrun``: ``await sb.exec(["sleep", "0.1"])`` in ``concurrency`` tasks of one event loop;
  every run must be ``completed`` (exit 0) and go through the in-container supervisor
  (``ExecResult.via == "supervisor"``);
* ``raw`` (the baseline): the same jobs as raw docker-py execs into the *same* container
  (``exec_create`` + ``exec_start(socket=True)`` + read to EOF + ``exec_inspect``) in
  ``concurrency`` threads, on a client of its own; every exit code must be 0.

Rounds alternate (``BENCH_REPEATS``, default 3; the raw one first in odd rounds). Reported per
side: execs/s of every round and their median, p50/max latency of one exec; the target is on
the median round of sandboxrun (and its worst round is reported beside it), the ratio is
sandboxrun / raw of the medians.

Env: ``BENCH_JOBS`` (32), ``BENCH_CONCURRENCY`` (8), ``BENCH_REPEATS`` (3), ``BENCH_SLEEP``
(0.1 s).
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
from _common import (
    docker_client,
    emit,
    env_float,
    env_int,
    machine,
    own_containers,
    quiet_logs,
    raw_exec,
    rounded,
    summary,
    sweep_own_containers,
    temp_workspace,
)
from docker import DockerClient

from sandboxrun import Limits, Sandbox

RATE_TARGET = 60.0
TIMEOUT_S = 30.0


def raw_round(
    client: DockerClient, cid: str, argv: list[str], jobs: int, concurrency: int
) -> dict[str, Any]:
    latencies: list[float] = []
    codes: list[int | None] = []

    def one(_: int) -> None:
        start = time.perf_counter()
        _, code = raw_exec(client, cid, argv)
        latencies.append(time.perf_counter() - start)
        codes.append(code)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        start = time.perf_counter()
        list(pool.map(one, range(jobs)))
        wall = time.perf_counter() - start
    return {"wall_s": wall, "latencies": latencies, "ok": sum(c == 0 for c in codes)}


async def sbx_round(sb: Sandbox, argv: list[str], jobs: int, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    via: dict[str, int] = {}
    queue = list(range(jobs))

    async def worker() -> None:
        while queue:
            queue.pop()
            start = time.perf_counter()
            result = await sb.exec(argv, timeout=TIMEOUT_S)
            latencies.append(time.perf_counter() - start)
            ok = result.status == "completed" and result.exit_code == 0
            key = result.status if ok or result.status != "completed" else "nonzero_exit"
            statuses[key] = statuses.get(key, 0) + 1
            via[str(result.via)] = via.get(str(result.via), 0) + 1

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "latencies": latencies, "statuses": statuses, "via": via}


async def measure(
    jobs: int, concurrency: int, repeats: int, sleep_s: float, workspace: Path
) -> dict[str, Any]:
    limits = Limits(max_output=65536, spill_max=0, grace_s=1.0)
    argv = ["sleep", f"{sleep_s:g}"]
    sbx: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    network = "?"
    client = docker_client()
    try:
        async with Sandbox(workspace, backend="docker", limits=limits) as sb:
            network = sb.policy.network
            access = sb.backend.view().container  # the contract: no backend attribute
            cid = None if access is None else access.container_id
            assert isinstance(cid, str)
            for _ in range(3):  # warm-up: the login snapshot, code paths, connections
                await sb.exec(["true"])
            raw_exec(client, cid, ["true"])
            for i in range(repeats):
                if i % 2:
                    raw.append(raw_round(client, cid, argv, jobs, concurrency))
                sbx.append(await sbx_round(sb, argv, jobs, concurrency))
                if not i % 2:
                    raw.append(raw_round(client, cid, argv, jobs, concurrency))
    finally:
        leaked = own_containers(client)
        sweep_own_containers(client)
        client.close()
    return {"sandboxrun": sbx, "raw": raw, "network": network, "leaked": leaked}


def side(rounds: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    rates = [jobs / r["wall_s"] for r in rounds]
    return {
        "execs_per_s": [rounded(x, 1) for x in rates],
        "median_execs_per_s": rounded(statistics.median(rates), 1),
        "min_execs_per_s": rounded(min(rates), 1),
        "wall_s": [rounded(r["wall_s"]) for r in rounds],
        "latency": summary([x for r in rounds for x in r["latencies"]]),
    }


def main() -> None:
    quiet_logs()
    jobs = max(1, env_int("BENCH_JOBS", 32))
    concurrency = max(1, env_int("BENCH_CONCURRENCY", 8))
    repeats = max(1, env_int("BENCH_REPEATS", 3))
    sleep_s = env_float("BENCH_SLEEP", 0.1)
    with temp_workspace() as ws:
        got = anyio.run(measure, jobs, concurrency, repeats, sleep_s, ws)
    sbx, raw = side(got["sandboxrun"], jobs), side(got["raw"], jobs)
    statuses: dict[str, int] = {}
    via: dict[str, int] = {}
    for r in got["sandboxrun"]:
        for k, v in r["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
        for k, v in r["via"].items():
            via[k] = via.get(k, 0) + v
    total = jobs * repeats
    raw_ok = sum(r["ok"] for r in got["raw"])
    ratio = (
        sbx["median_execs_per_s"] / raw["median_execs_per_s"] if raw["median_execs_per_s"] else 0
    )
    emit(
        {
            "bench": "docker_concurrency",
            "jobs": jobs,
            "concurrency": concurrency,
            "sleep_s": sleep_s,
            "repeats": repeats,
            "network": got["network"],
            "ideal_execs_per_s": rounded(concurrency / sleep_s, 1),
            "sandboxrun": sbx,
            "raw": raw,
            "ratio_vs_raw": rounded(ratio, 2),
            "statuses": statuses,
            "via": via,
            "raw_exit_0": raw_ok,
            "leaked_containers": got["leaked"],
            "targets": {
                "execs_per_s_min": RATE_TARGET,
                "all_completed": True,
                "via": "supervisor",
            },
            "meets_targets": bool(
                sbx["median_execs_per_s"] >= RATE_TARGET
                and statuses == {"completed": total}
                and via == {"supervisor": total}
                and not got["leaked"]
            ),
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
