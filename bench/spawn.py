"""Spawn overhead: ``true`` through the process-group backend vs ``subprocess.run(["true"])``.

Two ``Sandbox`` es are opened once: one with the isolation layer on (the default policy:
namespaces by bubblewrap, Landlock, seccomp) and one with it off (``danger-full-access``); then
``BENCH_N`` (default 200) sequential ``sb.exec(["true"])`` in each; the baseline is
``subprocess.run(["true"])`` the same number of times, in the same process. The three are
interleaved in blocks so a noisy neighbour hits all alike. Reported: p50/p95 in ms, the p50
ratio (sandboxrun with the layer / raw), and the layer's added p50 (on - off, target <= 5 ms).
Separately (not in the ratio): the cost of a whole ``async with Sandbox(...)`` (runner start,
with bubblewrap when the layer is on) + one exec + close, p50 over ``BENCH_OPEN_N`` (20).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
from _common import emit, env_int, machine, quiet_logs, rounded, summary, temp_workspace

from sandboxrun import Limits, Policy, Sandbox

RATIO_TARGET = 3.0
LAYER_TARGET_MS = 5.0
OFF = Policy(access="danger-full-access")
BLOCK = 20
WARMUP = 10


def raw_true() -> float:
    start = time.perf_counter()
    subprocess.run(["true"], check=True)
    return time.perf_counter() - start


async def sequential(n: int, workspace: Path, limits: Limits) -> dict[str, Any]:
    raw: list[float] = []
    on: list[float] = []
    off: list[float] = []
    statuses: dict[str, int] = {}
    async with (
        Sandbox(workspace, backend="process-group", limits=limits) as sb_on,
        Sandbox(workspace, backend="process-group", limits=limits, policy=OFF) as sb_off,
    ):
        layers = sb_on.backend.plan(sb_on._prepare(["true"])).isolation
        for _ in range(WARMUP):
            await sb_on.exec(["true"])
            await sb_off.exec(["true"])
            raw_true()
        while len(on) < n:
            for sb, samples in ((sb_on, on), (sb_off, off)):
                for _ in range(min(BLOCK, n - len(samples))):
                    start = time.perf_counter()
                    result = await sb.exec(["true"])
                    samples.append(time.perf_counter() - start)
                    statuses[result.status] = statuses.get(result.status, 0) + 1
            for _ in range(min(BLOCK, n - len(raw))):
                raw.append(raw_true())  # blocking on purpose: nothing else runs in the loop
    return {"raw": raw, "on": on, "off": off, "statuses": statuses, "layers": layers}


async def open_exec_close(
    repeats: int, workspace: Path, limits: Limits, policy: Policy | None = None
) -> list[float]:
    samples: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        async with Sandbox(workspace, backend="process-group", limits=limits, policy=policy) as sb:
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
        opened_off = anyio.run(open_exec_close, open_n, ws, limits, OFF)
    raw, sbx, off = summary(seq["raw"]), summary(seq["on"]), summary(seq["off"])
    ratio = sbx["p50_ms"] / raw["p50_ms"] if raw["p50_ms"] else 0.0
    layer_ms = sbx["p50_ms"] - off["p50_ms"]
    all_completed = seq["statuses"] == {"completed": 2 * n}
    emit(
        {
            "bench": "spawn",
            "n": n,
            "raw": raw,
            "sandboxrun": sbx,
            "layer_off": off,
            "layers": seq["layers"],
            "layer_added_p50_ms": rounded(layer_ms),
            "p50_ratio": rounded(ratio),
            "p95_ratio": rounded(sbx["p95_ms"] / raw["p95_ms"] if raw["p95_ms"] else 0.0),
            "statuses": seq["statuses"],
            "open_exec_close": {"n": open_n, **summary(opened)},
            "open_exec_close_layer_off": {"n": open_n, **summary(opened_off)},
            "targets": {
                "p50_ratio_max": RATIO_TARGET,
                "layer_added_p50_ms_max": LAYER_TARGET_MS,
                "all_completed": True,
            },
            "meets_targets": bool(
                ratio <= RATIO_TARGET and layer_ms <= LAYER_TARGET_MS and all_completed
            ),
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
