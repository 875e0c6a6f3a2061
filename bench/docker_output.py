"""Output throughput, CPU and memory of the docker backend: 1 GiB of stdout through an exec.

``head -c N /dev/zero`` run by ``Sandbox.exec`` (bounded capture, ``spill_max=0``) through the
in-container supervisor (``ExecResult.via == "supervisor"``: the command's stdout is a pipe whose
write end was passed into the container, read on the host as it is written) against baselines
in the same run:

* ``pipe`` (the target's baseline): the same ``head`` as a plain ``subprocess.Popen(...,
  stdout=PIPE)`` on the host, drained with an ``os.read(fd, 65536)`` loop to EOF, then reaped;
* ``engine`` (extra, the path before the supervisor; ``BENCH_ENGINE=0`` leaves it out): into the
  same container, docker-py's low-level ``exec_create`` + ``exec_start(socket=True)``, the raw
  socket read with ``recv(65536)`` to EOF *without* demultiplexing, then ``exec_inspect``.

Each variant runs ``BENCH_REPEATS`` times (rotating order) and the best throughput counts. The
client CPU of a run is this process's CPU time (``RUSAGE_SELF``, all threads: the reader, not the
``head`` writing) during it, scaled to seconds per GiB; the median run of each side counts. The
byte accounting of every sandboxrun run must be exact.

Targets: throughput ≥ 0.8× the pipe's; client CPU per GiB ≤ 1.5× the pipe reader's; peak RSS
growth ≤ 2 × max_output + 32 MiB, measured in fresh child processes (``bench/docker_output.py
--child nospill|spill``): import, open the sandbox, warm-up exec, ``ru_maxrss`` baseline, the big
exec, ``ru_maxrss`` again. ``spill`` uses the default spill (64 MiB to a temporary
``SANDBOXRUN_SPILL_DIR``, removed afterwards).

Beside each run: CPU seconds of the engine's daemons (dockerd, containerd) and the host's busy
fraction: on a small machine whoever copies competes with the reader for the same CPUs.

Env: ``BENCH_BYTES`` (default 1 GiB), ``BENCH_REPEATS`` (default 3), ``BENCH_ENGINE`` (1).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
from _common import (
    PIPE_READ_CHUNK,
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
    pipe_read_once,
    quiet_logs,
    raw_exec,
    rounded,
    sweep_own_containers,
    temp_workspace,
)
from docker import DockerClient

from sandboxrun import Limits, Sandbox

MAX_OUTPUT = 65536
READ_CHUNK = PIPE_READ_CHUNK
EXEC_TIMEOUT_S = 100.0
RATIO_TARGET = 0.8
CPU_RATIO_TARGET = 1.5
RSS_SLACK = 32 * 1024 * 1024
GIB = 1 << 30
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


def engine_once(client: DockerClient, container_id: str, n: int) -> tuple[float, int]:
    """Seconds to drain the exec stream of ``n`` bytes of output, and the stream's size."""
    start = time.perf_counter()
    stream_bytes, code = raw_exec(client, container_id, head_argv(n), chunk=READ_CHUNK)
    elapsed = time.perf_counter() - start
    if code != 0 or stream_bytes < n:
        raise RuntimeError(f"engine baseline read {stream_bytes} stream bytes for {n}, exit {code}")
    return elapsed, stream_bytes


def side(walls: list[float], cpu: list[dict[str, float]], n: int) -> dict[str, Any]:
    """Best throughput, and the median run's client CPU per GiB."""
    per_gib = [c["self_cpu_s"] * GIB / n for c in cpu]
    return {
        "mb_per_s": rounded(mb_per_s(n, min(walls)), 1),
        "wall_s": [rounded(s, 4) for s in walls],
        "client_cpu_s_per_gib": rounded(statistics.median(per_gib)),
        "cpu": cpu,
    }


async def compare(n: int, repeats: int, with_engine: bool, workspace: Path) -> dict[str, Any]:
    limits = Limits(max_output=MAX_OUTPUT, spill_max=0, grace_s=1.0)
    walls: dict[str, list[float]] = {"sandboxrun": [], "pipe": [], "engine": []}
    cpu: dict[str, list[dict[str, float]]] = {"sandboxrun": [], "pipe": [], "engine": []}
    sbx_duration_s: list[float] = []
    checks: list[dict[str, Any]] = []
    via: list[str | None] = []
    stream_bytes = 0
    engine = engine_processes()
    client = docker_client()
    try:
        async with Sandbox(workspace, backend="docker", limits=limits) as sb:
            access = sb.backend.view().container  # the contract: no backend attribute
            cid = None if access is None else access.container_id
            assert isinstance(cid, str)
            await sb.exec(["true"])  # warm-up: code paths imported, snapshot taken
            await sb.exec(head_argv(min(n, 1 << 20)))
            pipe_read_once(min(n, 1 << 20))
            if with_engine:
                engine_once(client, cid, min(n, 1 << 20))

            async def sbx() -> None:
                with CpuMeter(engine) as meter:
                    start = time.perf_counter()
                    result = await sb.exec(head_argv(n), timeout=EXEC_TIMEOUT_S)
                    walls["sandboxrun"].append(time.perf_counter() - start)
                cpu["sandboxrun"].append(meter.report())
                sbx_duration_s.append(result.duration_s)
                checks.append(accounting(result, n, MAX_OUTPUT))
                via.append(result.via)

            async def pipe() -> None:
                with CpuMeter(engine) as meter:
                    walls["pipe"].append(pipe_read_once(n))  # blocks the loop: on purpose
                cpu["pipe"].append(meter.report())

            async def raw_engine() -> None:
                nonlocal stream_bytes
                with CpuMeter(engine) as meter:
                    elapsed, stream_bytes = engine_once(client, cid, n)
                walls["engine"].append(elapsed)
                cpu["engine"].append(meter.report())

            variants = [("sandboxrun", sbx), ("pipe", pipe)]
            if with_engine:
                variants.append(("engine", raw_engine))
            for i in range(repeats):
                k = i % len(variants)
                for _, run in variants[k:] + variants[:k]:
                    await run()
    finally:
        leaked = own_containers(client)
        sweep_own_containers(client)
        client.close()
    sides = {name: side(walls[name], cpu[name], n) for name, _ in variants}
    sbx_side, pipe_side = sides["sandboxrun"], sides["pipe"]
    extra: dict[str, Any] = {}
    if with_engine:
        extra = {
            "ratio_vs_engine": rounded(sbx_side["mb_per_s"] / sides["engine"]["mb_per_s"]),
            "engine_stream_bytes": stream_bytes,
        }
    return {
        **sides,
        "ratio": rounded(sbx_side["mb_per_s"] / pipe_side["mb_per_s"]),
        "cpu_ratio": rounded(
            sbx_side["client_cpu_s_per_gib"] / pipe_side["client_cpu_s_per_gib"]
            if pipe_side["client_cpu_s_per_gib"]
            else 0.0
        ),
        **extra,
        "sandboxrun_duration_s": [rounded(s, 4) for s in sbx_duration_s],
        "via": sorted({str(v) for v in via}),
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
        spill = result.stdout_spill  # (the sandbox removes its spill files as it closes)
        spill_bytes = Path(spill).stat().st_size if spill else None
    return {
        "variant": variant,
        "spill_max": limits.spill_max,
        "baseline_maxrss_bytes": baseline,
        "peak_maxrss_bytes": peak,
        "growth_bytes": peak - baseline,
        "sampled_rss_growth_bytes": sampler.peak_rss - sampler.start_rss,
        "mb_per_s": rounded(mb_per_s(n, wall), 1),
        "spill_file_bytes": spill_bytes,
        "spill_complete": result.stdout_spill_complete,
        "via": result.via,
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
    with_engine = env_int("BENCH_ENGINE", 1) != 0
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        with temp_workspace() as ws, temp_workspace("sandboxrun-bench-spill-") as spill_root:
            # Never spill into the user's cache: the parent passes a temporary directory; a
            # child run by hand gets its own, removed with it.
            os.environ.setdefault("SANDBOXRUN_SPILL_DIR", str(spill_root))
            emit(anyio.run(child, sys.argv[2], n, ws))
        return
    with temp_workspace() as ws:
        throughput = anyio.run(compare, n, repeats, with_engine, ws)
        rss: dict[str, Any] = {}
        for variant in ("nospill", "spill"):
            with temp_workspace("sandboxrun-bench-spill-") as spill_root:
                rss[variant] = run_child(variant, n, spill_root)
            rss[variant]["spill_dir_cleaned"] = not spill_root.exists()
    rss_limit = 2 * MAX_OUTPUT + RSS_SLACK
    growths = [r.get("growth_bytes") for r in rss.values()]
    rss_ok = all(isinstance(g, int) and g <= rss_limit for g in growths)
    children_exact = all(r.get("accounting", {}).get("exact") is True for r in rss.values())
    supervised = throughput["via"] == ["supervisor"] and all(
        r.get("via") == "supervisor" for r in rss.values()
    )
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
                "cpu_ratio_max": CPU_RATIO_TARGET,
                "accounting_exact": True,
                "rss_growth_max_bytes": rss_limit,
                "via": "supervisor",
            },
            "meets_targets": bool(
                throughput["ratio"] >= RATIO_TARGET
                and throughput["cpu_ratio"] <= CPU_RATIO_TARGET
                and supervised
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
