"""Output throughput and memory: 1 GiB of stdout through the process-group backend.

``head -c N /dev/zero`` run by ``Sandbox.exec`` (bounded capture, ``spill_max=0``) against a raw
baseline in the same run: ``subprocess.Popen(..., stdout=PIPE)`` drained with an
``os.read(fd, 65536)`` loop. Each variant runs ``BENCH_REPEATS`` times (alternating) and the best
throughput counts. The byte accounting of every sandboxrun run must be exact.

The peak RSS growth of the process doing the sandboxrun run is measured in fresh child processes
(``bench/output.py --child nospill|spill``): import, warm-up exec, ``ru_maxrss`` baseline, the
big exec, ``ru_maxrss`` again. ``spill`` uses the default spill (64 MiB to a temporary
``SANDBOXRUN_SPILL_DIR``, removed afterwards).

Env: ``BENCH_BYTES`` (default 1 GiB), ``BENCH_REPEATS`` (default 3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from _common import (
    RssSampler,
    accounting,
    emit,
    env_int,
    head_argv,
    machine,
    maxrss_bytes,
    mb_per_s,
    pipe_read_once,
    quiet_logs,
    rounded,
    temp_workspace,
)

from sandboxrun import Limits, Sandbox

MAX_OUTPUT = 65536
EXEC_TIMEOUT_S = 100.0
RATIO_TARGET = 0.7
RSS_SLACK = 32 * 1024 * 1024
CHILD_TIMEOUT_S = 110.0


async def compare(n: int, repeats: int, workspace: Path) -> dict[str, Any]:
    limits = Limits(max_output=MAX_OUTPUT, spill_max=0, grace_s=1.0)
    raw_s: list[float] = []
    sbx_s: list[float] = []
    sbx_duration_s: list[float] = []
    checks: list[dict[str, Any]] = []
    async with Sandbox(workspace, backend="process-group", limits=limits) as sb:
        await sb.exec(["true"])  # warm-up: runner started, code paths imported
        pipe_read_once(min(n, 1 << 20))
        for _ in range(repeats):
            raw_s.append(pipe_read_once(n))  # blocks the loop on purpose: nothing else runs
            start = time.perf_counter()
            result = await sb.exec(head_argv(n), timeout=EXEC_TIMEOUT_S)
            sbx_s.append(time.perf_counter() - start)
            sbx_duration_s.append(result.duration_s)
            checks.append(accounting(result, n, MAX_OUTPUT))
    raw_best = mb_per_s(n, min(raw_s))
    sbx_best = mb_per_s(n, min(sbx_s))
    return {
        "raw_mb_per_s": rounded(raw_best, 1),
        "sandboxrun_mb_per_s": rounded(sbx_best, 1),
        "ratio": rounded(sbx_best / raw_best if raw_best else 0.0),
        "raw_wall_s": [rounded(s, 4) for s in raw_s],
        "sandboxrun_wall_s": [rounded(s, 4) for s in sbx_s],
        "sandboxrun_duration_s": [rounded(s, 4) for s in sbx_duration_s],
        "accounting": checks,
        "accounting_exact": all(c["exact"] for c in checks),
    }


# -- child mode: peak RSS growth of a fresh process ---------------------------------------------


async def child(variant: str, n: int, workspace: Path) -> dict[str, Any]:
    if variant == "nospill":
        limits = Limits(max_output=MAX_OUTPUT, spill_max=0, grace_s=1.0)
    else:  # the default spill_max, to $SANDBOXRUN_SPILL_DIR
        limits = Limits(max_output=MAX_OUTPUT, grace_s=1.0)
    async with Sandbox(workspace, backend="process-group", limits=limits) as sb:
        await sb.exec(["head", "-c", "4096", "/dev/zero"])  # small warm-up, no overflow
        baseline = maxrss_bytes()
        with RssSampler() as sampler:
            start = time.perf_counter()
            result = await sb.exec(head_argv(n), timeout=EXEC_TIMEOUT_S)
            wall = time.perf_counter() - start
        peak = maxrss_bytes()
    spill = result.stdout_spill
    return {
        "variant": variant,
        "spill_max": limits.spill_max,
        "baseline_maxrss_bytes": baseline,
        "peak_maxrss_bytes": peak,
        "growth_bytes": peak - baseline,
        "sampled_rss_growth_bytes": sampler.peak_rss - sampler.start_rss,
        "mb_per_s": rounded(mb_per_s(n, wall), 1),
        "spill_file_bytes": Path(spill).stat().st_size if spill else None,
        "spill_complete": result.stdout_spill_complete,
        "accounting": accounting(result, n, MAX_OUTPUT),
    }


def run_child(variant: str, n: int, spill_root: Path) -> dict[str, Any]:
    env = {**os.environ, "SANDBOXRUN_SPILL_DIR": str(spill_root), "BENCH_BYTES": str(n)}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", variant],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"variant": variant, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def main() -> None:
    quiet_logs()
    n = env_int("BENCH_BYTES", 1 << 30)
    repeats = max(1, env_int("BENCH_REPEATS", 3))
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        with temp_workspace() as ws, temp_workspace("sandboxrun-bench-spill-") as spill_root:
            # Never spill into the user's cache: the parent passes a temporary directory; a
            # child run by hand gets its own, removed with it.
            os.environ.setdefault("SANDBOXRUN_SPILL_DIR", str(spill_root))
            emit(anyio.run(child, sys.argv[2], n, ws))
        return
    with temp_workspace() as ws:
        throughput = anyio.run(compare, n, repeats, ws)
        rss: dict[str, Any] = {}
        for variant in ("nospill", "spill"):
            with temp_workspace("sandboxrun-bench-spill-") as spill_root:
                rss[variant] = run_child(variant, n, spill_root)
            rss[variant]["spill_dir_cleaned"] = not spill_root.exists()
    rss_limit = 2 * MAX_OUTPUT + RSS_SLACK
    growths = [r.get("growth_bytes") for r in rss.values()]
    rss_ok = all(isinstance(g, int) and g <= rss_limit for g in growths)
    children_exact = all(r.get("accounting", {}).get("exact") is True for r in rss.values())
    emit(
        {
            "bench": "output",
            "bytes": n,
            "max_output": MAX_OUTPUT,
            "repeats": repeats,
            **throughput,
            "rss": rss,
            "targets": {
                "ratio_min": RATIO_TARGET,
                "accounting_exact": True,
                "rss_growth_max_bytes": rss_limit,
            },
            "meets_targets": bool(
                throughput["ratio"] >= RATIO_TARGET
                and throughput["accounting_exact"]
                and children_exact
                and rss_ok
            ),
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
