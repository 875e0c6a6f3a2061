"""Output throughput and memory of the docker backend: 1 GiB of stdout through an exec.

``head -c N /dev/zero`` run by ``Sandbox.exec`` (bounded capture, ``spill_max=0``) against a raw
baseline in the same run, into the same container: docker-py's low-level ``exec_create`` +
``exec_start(socket=True)``, the raw socket read with ``recv(65536)`` until EOF *without*
demultiplexing (so the baseline reads the 8-byte frame headers too), then ``exec_inspect``.
Each variant runs ``BENCH_REPEATS`` times (alternating, the raw one first in odd rounds) and the
best throughput counts. The byte accounting of every sandboxrun run must be exact.

The peak RSS growth of the process doing the sandboxrun run is measured in fresh child processes
(``bench/docker_output.py --child nospill|spill``): import, open the sandbox, warm-up exec,
``ru_maxrss`` baseline, the big exec, ``ru_maxrss`` again. ``spill`` uses the default spill
(64 MiB to a temporary ``SANDBOXRUN_SPILL_DIR``, removed afterwards).

Beside each run: CPU seconds of this process, of the engine's daemons (dockerd, containerd),
and the host's busy fraction: on a small machine the engine's copying and framing competes with
the reader for the same CPUs, so the reader's own CPU cost shows in the throughput.

Env: ``BENCH_BYTES`` (default 1 GiB), ``BENCH_REPEATS`` (default 3).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
from _common import (
    RssSampler,
    accounting,
    docker_client,
    emit,
    env_int,
    head_argv,
    machine,
    maxrss_bytes,
    mb_per_s,
    own_containers,
    quiet_logs,
    raw_exec,
    rounded,
    sweep_own_containers,
    temp_workspace,
)
from docker import DockerClient

from sandboxrun import Limits, Sandbox

MAX_OUTPUT = 65536
READ_CHUNK = 65536
EXEC_TIMEOUT_S = 100.0
RATIO_TARGET = 0.8
RSS_SLACK = 48 * 1024 * 1024
CHILD_TIMEOUT_S = 110.0


def engine_processes() -> list[psutil.Process]:
    """The engine's daemons on this host (looked at, never touched): where the exec stream is
    framed and copied. Empty when the engine is remote or not visible."""
    found: list[psutil.Process] = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in ("dockerd", "containerd"):
            found.append(proc)
    return found


class CpuMeter:
    """CPU seconds spent during a block by this process (all threads), by the engine's daemons,
    and by the whole host (busy fraction of all CPUs): says who is the bottleneck."""

    def __init__(self, engine: list[psutil.Process]) -> None:
        self._engine = engine
        self.self_s = self.engine_s = self.host_busy = 0.0

    @staticmethod
    def _self() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def _engine_total(self) -> float:
        total = 0.0
        for proc in self._engine:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
        return total

    def __enter__(self) -> CpuMeter:
        self._t0 = time.perf_counter()
        self._s0, self._e0 = self._self(), self._engine_total()
        self._h0 = psutil.cpu_times()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._t0
        h1 = psutil.cpu_times()
        idle = (h1.idle + h1.iowait) - (self._h0.idle + self._h0.iowait)
        cpus = psutil.cpu_count() or 1
        self.self_s = self._self() - self._s0
        self.engine_s = self._engine_total() - self._e0
        self.host_busy = max(0.0, 1.0 - idle / (wall * cpus)) if wall > 0 else 0.0

    def report(self) -> dict[str, float]:
        return {
            "self_cpu_s": rounded(self.self_s),
            "engine_cpu_s": rounded(self.engine_s),
            "host_busy_frac": rounded(self.host_busy),
        }


def raw_once(client: DockerClient, container_id: str, n: int) -> tuple[float, int]:
    """Seconds to drain the exec stream of ``n`` bytes of output, and the stream's size."""
    start = time.perf_counter()
    stream_bytes, code = raw_exec(client, container_id, head_argv(n), chunk=READ_CHUNK)
    elapsed = time.perf_counter() - start
    if code != 0 or stream_bytes < n:
        raise RuntimeError(f"raw baseline read {stream_bytes} stream bytes for {n}, exit {code}")
    return elapsed, stream_bytes


async def compare(n: int, repeats: int, workspace: Path) -> dict[str, Any]:
    limits = Limits(max_output=MAX_OUTPUT, spill_max=0, grace_s=1.0)
    raw_s: list[float] = []
    sbx_s: list[float] = []
    sbx_duration_s: list[float] = []
    checks: list[dict[str, Any]] = []
    stream_bytes = 0
    cpu: dict[str, list[dict[str, float]]] = {"raw": [], "sandboxrun": []}
    engine = engine_processes()
    client = docker_client()
    try:
        async with Sandbox(workspace, backend="docker", limits=limits) as sb:
            cid = getattr(sb.backend, "container_id", None)
            assert isinstance(cid, str)
            await sb.exec(["true"])  # warm-up: code paths imported, connections open
            raw_once(client, cid, min(n, 1 << 20))

            async def sbx() -> None:
                with CpuMeter(engine) as meter:
                    start = time.perf_counter()
                    result = await sb.exec(head_argv(n), timeout=EXEC_TIMEOUT_S)
                    sbx_s.append(time.perf_counter() - start)
                cpu["sandboxrun"].append(meter.report())
                sbx_duration_s.append(result.duration_s)
                checks.append(accounting(result, n, MAX_OUTPUT))

            for i in range(repeats):
                if i % 2:
                    await sbx()
                with CpuMeter(engine) as meter:
                    elapsed, stream_bytes = raw_once(client, cid, n)  # blocks the loop: on purpose
                raw_s.append(elapsed)
                cpu["raw"].append(meter.report())
                if not i % 2:
                    await sbx()
    finally:
        leaked = own_containers(client)
        sweep_own_containers(client)
        client.close()
    raw_best = mb_per_s(n, min(raw_s))
    sbx_best = mb_per_s(n, min(sbx_s))
    return {
        "raw_mb_per_s": rounded(raw_best, 1),
        "sandboxrun_mb_per_s": rounded(sbx_best, 1),
        "ratio": rounded(sbx_best / raw_best if raw_best else 0.0),
        "raw_stream_bytes": stream_bytes,
        "raw_wall_s": [rounded(s, 4) for s in raw_s],
        "sandboxrun_wall_s": [rounded(s, 4) for s in sbx_s],
        "sandboxrun_duration_s": [rounded(s, 4) for s in sbx_duration_s],
        "cpu": cpu,
        "accounting": checks,
        "accounting_exact": all(c["exact"] for c in checks),
        "leaked_containers": leaked,
    }


# -- child mode: peak RSS growth of a fresh process ---------------------------------------------


async def child(variant: str, n: int, workspace: Path) -> dict[str, Any]:
    if variant == "nospill":
        limits = Limits(max_output=MAX_OUTPUT, spill_max=0, grace_s=1.0)
    else:  # the default spill_max, to $SANDBOXRUN_SPILL_DIR
        limits = Limits(max_output=MAX_OUTPUT, grace_s=1.0)
    async with Sandbox(workspace, backend="docker", limits=limits) as sb:
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
    with subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--child", variant],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        # the child's sandbox container carries the child's pid: none may be left behind
        client = docker_client()
        try:
            leaked = sweep_own_containers(client, proc.pid)
        finally:
            client.close()
    lines = stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {
            "variant": variant,
            "error": f"exit {proc.returncode}: {stderr[-2000:]}",
            "leaked_containers": leaked,
        }
    report: dict[str, Any] = json.loads(lines[-1])
    report["leaked_containers"] = leaked
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
            "bench": "docker_output",
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
                and not throughput["leaked_containers"]
                and not any(r.get("leaked_containers") for r in rss.values())
            ),
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
