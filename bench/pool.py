"""Warm sandboxes: ``SandboxPool.acquire`` + ``true`` against a cold ``Sandbox`` open + ``true`` +
close, in the same run, on the same backend (docker when it is available, else process-group).

``BENCH_N`` (default 100) samples of each, after ``WARMUP`` rounds; the pool (size
``BENCH_POOL``, default 2) is given time to refill between two acquires (what a pipeline that
does work between samples sees), then the same again with no pause (acquires back to back: the
refill rate is the limit). Reported: p50/p95/p99 in ms of each and the ratios to the cold
path. Targets (issue 21): a warm acquire p50 ≤ 50 ms and p99 ≤ 150 ms.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from _common import emit, env_int, machine, percentile, rounded

from sandboxrun import Sandbox, SandboxPool, backends

WARMUP = 2
TARGET_MS = 50.0
TARGET_P99_MS = 150.0


def pick_backend() -> str:
    return "docker" if backends.probe("docker").available else "process-group"


async def cold(workspace: Path, backend: str) -> float:
    began = time.perf_counter()
    async with Sandbox(workspace, backend=backend) as sb:
        assert (await sb.exec(["true"])).ok
    return time.perf_counter() - began


async def warm(pool: SandboxPool, *, refill: bool) -> float:
    if refill:  # the pool full again before this acquire
        while pool.stats().ready < pool.size:
            await anyio.sleep(0.01)
    began = time.perf_counter()
    async with pool.acquire() as sb:
        assert (await sb.exec(["true"])).ok
        return time.perf_counter() - began  # (the release, in the background, not counted)


async def main() -> None:
    n = env_int("BENCH_N", 100)
    size = env_int("BENCH_POOL", 2)
    backend = pick_backend()
    samples: dict[str, list[float]] = {"cold": [], "warm": [], "back_to_back": []}
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
        workspace = Path(tmp) / "ws"
        workspace.mkdir()
        async with SandboxPool(size, backend=backend, root=Path(tmp) / "pool") as pool:
            for round_ in range(WARMUP + n):
                took = {
                    "cold": await cold(workspace, backend),
                    "warm": await warm(pool, refill=True),
                }
                if round_ >= WARMUP:
                    for name, value in took.items():
                        samples[name].append(value)
            for _ in range(n):
                samples["back_to_back"].append(await warm(pool, refill=False))
            stats = pool.stats()
    ms = {name: [v * 1000 for v in values] for name, values in samples.items()}
    p50 = {name: statistics.median(values) for name, values in ms.items()}
    emit(
        {
            "bench": "pool",
            "n": n,
            "size": size,
            "backend": backend,
            "p50_ms": {name: rounded(value, 1) for name, value in p50.items()},
            "p95_ms": {name: rounded(percentile(values, 95), 1) for name, values in ms.items()},
            "p99_ms": {name: rounded(percentile(values, 99), 1) for name, values in ms.items()},
            "warm_ratio_to_cold": rounded(p50["warm"] / p50["cold"], 3),
            "back_to_back_ratio_to_cold": rounded(p50["back_to_back"] / p50["cold"], 3),
            "target_warm_ms": TARGET_MS,
            "target_warm_p99_ms": TARGET_P99_MS,
            "met": p50["warm"] <= TARGET_MS and percentile(ms["warm"], 99) <= TARGET_P99_MS,
            "opened": stats.opened,
            "failed_opens": stats.failed_opens,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    sys.exit(anyio.run(main))
