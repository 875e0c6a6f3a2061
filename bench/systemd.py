"""systemd-scope backend (run inside the systemd test host: ``scripts/systemd-host.sh --bench``).

Spawn: ``BENCH_N`` (default 100) sequential ``sb.exec(["true"])`` through the systemd-scope
backend, against ``systemd-run --scope --quiet --collect true`` run directly and against the
process-group backend, interleaved in blocks; p50/p95 in ms and the p50 ratios. Kill: a
TERM-ignoring command with a ``setsid`` child, timed out after 0.5 s with a grace of 1 s,
``BENCH_KILL_N`` (default 5) times: how long after the deadline the run is over (target: grace +
0.5 s) and how many of its processes are alive afterwards (target 0).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
from _common import (
    emit,
    env_int,
    machine,
    marked_alive,
    quiet_logs,
    rounded,
    summary,
    temp_workspace,
)

from sandboxrun import Limits, Sandbox
from sandboxrun.backends.registry import probe
from sandboxrun.backends.systemd.backend import manager_env, manager_mode

BLOCK = 10
WARMUP = 5
GRACE_S = 1.0
TIMEOUT_S = 0.5
KILL_TARGET_S = GRACE_S + 0.5


def raw_scope(n: int) -> float:
    argv = ["systemd-run", "--scope", "--quiet", "--collect", f"--unit=bench-{os.getpid()}-{n}"]
    if manager_mode() == "user":
        argv.insert(1, "--user")
    start = time.perf_counter()
    subprocess.run([*argv, "true"], check=True, env=manager_env(manager_mode()))
    return time.perf_counter() - start


async def spawn(n: int, workspace: Path) -> dict[str, Any]:
    limits = Limits(grace_s=0.5)
    samples: dict[str, list[float]] = {"raw": [], "systemd-scope": [], "process-group": []}
    async with (
        Sandbox(workspace, backend="systemd-scope", limits=limits) as scope,
        Sandbox(workspace, backend="process-group", limits=limits) as pgroup,
    ):
        for i in range(WARMUP):
            await scope.exec(["true"])
            await pgroup.exec(["true"])
            raw_scope(-i - 1)
        while len(samples["raw"]) < n:
            for _ in range(min(BLOCK, n - len(samples["raw"]))):
                for name, sb in (("systemd-scope", scope), ("process-group", pgroup)):
                    start = time.perf_counter()
                    result = await sb.exec(["true"])
                    samples[name].append(time.perf_counter() - start)
                    if result.status != "completed":
                        raise RuntimeError(f"{name}: {result.status}: {result.error}")
                samples["raw"].append(raw_scope(len(samples["raw"])))
    return {name: summary(values) for name, values in samples.items()}


async def kill(repeats: int, workspace: Path) -> dict[str, Any]:
    late: list[float] = []  # seconds from the deadline until the run is over
    survivors = 0
    limits = Limits(grace_s=GRACE_S, drain_s=0.5)
    async with Sandbox(workspace, backend="systemd-scope", limits=limits) as sb:
        for i in range(repeats):
            tok = f"{os.getpid()}{i}.25"
            start = time.perf_counter()
            result = await sb.exec(
                shell=f"trap '' TERM; (setsid sh -c 'trap \"\" TERM; sleep {tok}' &); sleep {tok}",
                timeout=TIMEOUT_S,
            )
            late.append(time.perf_counter() - start - TIMEOUT_S)
            if result.status != "timed_out":
                raise RuntimeError(f"kill: {result.status}: {result.error}")
            survivors += result.survivors + len(marked_alive(result.run_id))
    return {
        "after_deadline": summary(late),
        "max_after_deadline_s": rounded(max(late)),
        "target_s": KILL_TARGET_S,
        "survivors": survivors,
    }


async def main() -> None:
    quiet_logs()
    found = probe("systemd-scope")
    if not found.available:
        raise SystemExit(f"systemd-scope unavailable here: {found.reason}")
    n, repeats = env_int("BENCH_N", 100), env_int("BENCH_KILL_N", 5)
    with temp_workspace() as workspace:
        spawned = await spawn(n, workspace)
        killed = await kill(repeats, workspace)
    p50 = {name: s["p50_ms"] for name, s in spawned.items()}
    emit(
        {
            "bench": "systemd",
            "mode": manager_mode(),
            "n": n,
            "spawn": spawned,
            "ratio_p50_vs_systemd_run": rounded(p50["systemd-scope"] / p50["raw"]),
            "ratio_p50_vs_process_group": rounded(p50["systemd-scope"] / p50["process-group"]),
            "kill": killed,
            "kill_ok": killed["max_after_deadline_s"] <= KILL_TARGET_S and killed["survivors"] == 0,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    anyio.run(main)
