"""Spawn overhead: ``true`` through the process-group backend vs ``subprocess.run(["true"])``.

One ``Sandbox`` is opened once, then ``BENCH_N`` (default 200) sequential ``sb.exec(["true"])``;
the baseline is ``subprocess.run(["true"])`` the same number of times, in the same process. The
two are interleaved in blocks so a noisy neighbour hits both alike. Reported: p50/p95 in ms and
the p50 ratio (sandboxrun / raw). Separately (not in the ratio): the cost of a whole
``async with Sandbox(...)`` (runner start) + one exec + close, p50 over ``BENCH_OPEN_N`` (20).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
from _common import emit, env_int, machine, quiet_logs, rounded, summary, temp_workspace

from sandboxrun import Limits, Sandbox

RATIO_TARGET = 3.0
BLOCK = 20
WARMUP = 10


def raw_true() -> float:
    start = time.perf_counter()
    subprocess.run(["true"], check=True)
    return time.perf_counter() - start


async def sequential(n: int, workspace: Path, limits: Limits) -> dict[str, Any]:
    raw: list[float] = []
    sbx: list[float] = []
    statuses: dict[str, int] = {}
    async with Sandbox(workspace, backend="process-group", limits=limits) as sb:
        for _ in range(WARMUP):
            await sb.exec(["true"])
            raw_true()
        while len(sbx) < n:
            for _ in range(min(BLOCK, n - len(sbx))):
                start = time.perf_counter()
                result = await sb.exec(["true"])
                sbx.append(time.perf_counter() - start)
                statuses[result.status] = statuses.get(result.status, 0) + 1
            for _ in range(min(BLOCK, n - len(raw))):
                raw.append(raw_true())  # blocking on purpose: nothing else runs in the loop
    return {"raw": raw, "sandboxrun": sbx, "statuses": statuses}


async def open_exec_close(repeats: int, workspace: Path, limits: Limits) -> list[float]:
    samples: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        async with Sandbox(workspace, backend="process-group", limits=limits) as sb:
            result = await sb.exec(["true"])
        samples.append(time.perf_counter() - start)
        if result.status != "completed":
            raise RuntimeError(f"open+exec+close: {result.status}: {result.error}")
    return samples


def main() -> None:
    quiet_logs()
    n = max(1, env_int("BENCH_N", 200))
    open_n = max(1, env_int("BENCH_OPEN_N", 20))
    limits = Limits(max_output=65536, spill_max=0, grace_s=1.0)
    with temp_workspace() as ws:
        seq = anyio.run(sequential, n, ws, limits)
        opened = anyio.run(open_exec_close, open_n, ws, limits)
    raw, sbx = summary(seq["raw"]), summary(seq["sandboxrun"])
    ratio = sbx["p50_ms"] / raw["p50_ms"] if raw["p50_ms"] else 0.0
    all_completed = seq["statuses"] == {"completed": n}
    emit(
        {
            "bench": "spawn",
            "n": n,
            "raw": raw,
            "sandboxrun": sbx,
            "p50_ratio": rounded(ratio),
            "p95_ratio": rounded(sbx["p95_ms"] / raw["p95_ms"] if raw["p95_ms"] else 0.0),
            "statuses": seq["statuses"],
            "open_exec_close": {"n": open_n, **summary(opened)},
            "targets": {"p50_ratio_max": RATIO_TARGET, "all_completed": True},
            "meets_targets": bool(ratio <= RATIO_TARGET and all_completed),
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
