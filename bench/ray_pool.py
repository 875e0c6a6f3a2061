"""The cost of Ray: ``sandboxrun.ray.SandboxPool.exec(["true"])`` against the same command in
a local ``Sandbox`` on the driver's machine, in the same run, on the same backend (docker when
it is available, else process-group).

The cluster is the tests' (``tests/ray_cluster.py``: a head and one worker node started with
``ray start`` in a network namespace with only ``lo``; needs root, ``ip`` and Ray). In one
driver: ``BENCH_N`` (default 200) execs of ``true`` in a local sandbox, then as many through a
pool of one slot that keeps its sandbox (``fresh=False``: the Ray round trip and nothing else
added), then ``BENCH_N // 10`` through a ``fresh`` pool (a new sandbox for each command, the
next one opened while the driver waits: the refill bounds the rate). Reported: p50/p95 in ms
of each, the Ray overhead per exec (pool p50 minus local p50; target ≤ 3 ms, issue 21) and the
ratios.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from _common import emit, env_int, machine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import ray_cluster  # (the tests' cluster harness, on the path above)

TARGET_MS = 3.0

DRIVER = """
import json, statistics, sys, tempfile, time
import anyio, ray
ray.init(address="127.0.0.1:6379", logging_level="ERROR")
from sandboxrun import Sandbox, backends
from sandboxrun.ray import SandboxPool

n = int(sys.argv[1])
backend = "docker" if backends.probe("docker").available else "process-group"

def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] * 1000

async def local():
    times = []
    with tempfile.TemporaryDirectory() as ws:
        async with Sandbox(ws, backend=backend) as sb:
            for _ in range(5):
                await sb.exec(["true"])
            for _ in range(n):
                t = time.perf_counter()
                assert (await sb.exec(["true"])).ok
                times.append(time.perf_counter() - t)
    return times

def pooled(fresh, count):
    times = []
    with SandboxPool(size=1, backend=backend, fresh=fresh, root=sys.argv[2]) as pool:
        for _ in range(3):
            pool.exec(["true"])
        for _ in range(count):
            t = time.perf_counter()
            assert pool.exec(["true"]).ok
            times.append(time.perf_counter() - t)
    return times

loc = anyio.run(local)
shared = pooled(False, n)
fresh = pooled(True, max(5, n // 10))
print(json.dumps({"backend": backend, "local": [pct(loc, .5), pct(loc, .95)],
                  "shared": [pct(shared, .5), pct(shared, .95)],
                  "fresh": [pct(fresh, .5), pct(fresh, .95)]}))
"""


def main() -> None:
    why = ray_cluster.why_not()
    if why is not None:
        emit({"bench": "ray_pool", "skipped": why})
        return
    n = env_int("BENCH_N", 200)
    cluster = ray_cluster.start({"sbr-bench-w1": 1})
    try:
        done = cluster.python(DRIVER, str(n), str(cluster.root / "ws"), timeout=900)
    finally:
        cluster.stop()
    if done.returncode != 0:
        raise SystemExit(done.stderr[-4000:])
    got = json.loads(done.stdout.strip().splitlines()[-1])
    local_p50, shared_p50 = got["local"][0], got["shared"][0]
    overhead = shared_p50 - local_p50
    emit(
        {
            "bench": "ray_pool",
            "backend": got["backend"],
            "n": n,
            "local_p50_ms": round(local_p50, 3),
            "local_p95_ms": round(got["local"][1], 3),
            "ray_shared_p50_ms": round(shared_p50, 3),
            "ray_shared_p95_ms": round(got["shared"][1], 3),
            "ray_fresh_p50_ms": round(got["fresh"][0], 3),
            "ray_fresh_p95_ms": round(got["fresh"][1], 3),
            "ray_overhead_p50_ms": round(overhead, 3),
            "ray_over_local": round(shared_p50 / local_p50, 3) if local_p50 else None,
            "target_overhead_ms": TARGET_MS,
            "met": overhead <= TARGET_MS,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
