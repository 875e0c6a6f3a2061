"""Exec overhead of the docker backend: ``true`` in a warm sandbox vs the raw Engine API exec.

One docker ``Sandbox`` is opened once and warmed up. Then ``BENCH_N`` (default 100) rounds, each
running (in a rotating order, so neither side always goes first) one of every variant:

* ``sandboxrun``: ``await sb.exec(["true"])``, wall time around the call;
* ``raw``: docker-py's low-level API on a client of its own, into the *same* running container:
  ``exec_create(["true"])`` + ``exec_start(socket=True)`` + read the socket to EOF +
  ``exec_inspect`` (the minimum to run a command and learn its exit code);
* ``raw_wrapped``: the same raw exec of the very argv sandboxrun runs (``bash -lc '<PATH
  prefix> exec "$@"' sandboxrun true``), which separates the cost of the login shell from the
  cost of sandboxrun's own machinery.

Reported: p50/p95 in ms of each, the p50 ratio sandboxrun / raw (the target) and sandboxrun /
raw_wrapped. Afterwards (not in the ratios) ``BENCH_PHASE_N`` (default 20) more execs run with
``DockerRun``'s steps wrapped in timers: where the time of one exec goes.

Env: ``BENCH_N`` (100), ``BENCH_PHASE_N`` (20).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
from _common import (
    docker_client,
    emit,
    env_int,
    machine,
    ms,
    own_containers,
    percentile,
    quiet_logs,
    raw_exec,
    rounded,
    summary,
    sweep_own_containers,
    temp_workspace,
)
from docker import DockerClient

from sandboxrun import Limits, Sandbox
from sandboxrun.backends.docker_run import DockerRun

RATIO_TARGET = 1.10
WARMUP = 5
PHASES = ("start", "pump", "wait_exit", "terminate", "_settled", "_sweep", "classify")


def timed_raw(client: DockerClient, container_id: str, cmd: list[str]) -> float:
    start = time.perf_counter()
    _, code = raw_exec(client, container_id, cmd)
    elapsed = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"raw exec of {cmd[:2]} exited {code}")
    return elapsed


@contextmanager
def phase_timers(totals: dict[str, list[float]]) -> Iterator[None]:
    """Wrap ``DockerRun``'s async steps in wall-clock timers (restored afterwards)."""
    originals: dict[str, Any] = {name: getattr(DockerRun, name) for name in PHASES}

    def wrap(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await func(*args, **kwargs)
            finally:
                totals.setdefault(name, []).append(time.perf_counter() - start)

        return timed

    for name, func in originals.items():
        setattr(DockerRun, name, wrap(name, func))
    try:
        yield
    finally:
        for name, func in originals.items():
            setattr(DockerRun, name, func)


async def measure(n: int, phase_n: int, workspace: Path) -> dict[str, Any]:
    limits = Limits(max_output=65536, spill_max=0, grace_s=1.0)
    client = docker_client()
    samples: dict[str, list[float]] = {"sandboxrun": [], "raw": [], "raw_wrapped": []}
    statuses: dict[str, int] = {}
    phases: dict[str, list[float]] = {}
    phase_walls: list[float] = []
    try:
        async with Sandbox(workspace, backend="docker", limits=limits) as sb:
            cid = getattr(sb.backend, "container_id", None)
            assert isinstance(cid, str)
            wrapped = sb.backend.command(sb.prepare(["true"]))

            async def sbx() -> float:
                start = time.perf_counter()
                result = await sb.exec(["true"])
                elapsed = time.perf_counter() - start
                statuses[result.status] = statuses.get(result.status, 0) + 1
                return elapsed

            async def raw() -> float:
                return timed_raw(client, cid, ["true"])  # blocks the loop: nothing else runs

            async def raw_wrapped() -> float:
                return timed_raw(client, cid, wrapped)

            variants = {"sandboxrun": sbx, "raw": raw, "raw_wrapped": raw_wrapped}
            names = list(variants)
            for _ in range(WARMUP):
                for name in names:
                    await variants[name]()
            statuses.clear()
            for i in range(n):
                order = names[i % len(names) :] + names[: i % len(names)]
                for name in order:
                    samples[name].append(await variants[name]())
            measured = dict(statuses)
            with phase_timers(phases):
                for _ in range(phase_n):
                    phase_walls.append(await sbx())
    finally:
        leaked = own_containers(client)
        sweep_own_containers(client)
        client.close()
    return {
        "samples": samples,
        "statuses": measured,
        "phases": phases,
        "phase_walls": phase_walls,
        "leaked": leaked,
    }


def main() -> None:
    quiet_logs()
    n = max(1, env_int("BENCH_N", 100))
    phase_n = max(1, env_int("BENCH_PHASE_N", 20))
    with temp_workspace() as ws:
        got = anyio.run(measure, n, phase_n, ws)
    sides = {name: summary(values) for name, values in got["samples"].items()}
    sbx_p50 = sides["sandboxrun"]["p50_ms"]
    ratio = sbx_p50 / sides["raw"]["p50_ms"] if sides["raw"]["p50_ms"] else 0.0
    ratio_wrapped = (
        sbx_p50 / sides["raw_wrapped"]["p50_ms"] if sides["raw_wrapped"]["p50_ms"] else 0.0
    )
    phases = {
        name: {"p50_ms": ms(percentile(v, 50)), "mean_ms": ms(sum(v) / len(v)), "calls": len(v)}
        for name, v in got["phases"].items()
    }
    all_completed = got["statuses"] == {"completed": n}
    emit(
        {
            "bench": "docker_exec",
            "n": n,
            **sides,
            "p50_ratio": rounded(ratio),
            "p95_ratio": rounded(
                sides["sandboxrun"]["p95_ms"] / sides["raw"]["p95_ms"]
                if sides["raw"]["p95_ms"]
                else 0.0
            ),
            "p50_ratio_vs_raw_wrapped": rounded(ratio_wrapped),
            "login_shell_p50_ms": rounded(sides["raw_wrapped"]["p50_ms"] - sides["raw"]["p50_ms"]),
            "statuses": got["statuses"],
            "phases": {
                "n": phase_n,
                "wall_p50_ms": ms(percentile(got["phase_walls"], 50)),
                **phases,
            },
            "leaked_containers": got["leaked"],
            "targets": {"p50_ratio_max": RATIO_TARGET, "all_completed": True},
            "meets_targets": bool(ratio <= RATIO_TARGET and all_completed and not got["leaked"]),
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
