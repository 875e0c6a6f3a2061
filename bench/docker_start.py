"""Sandbox start-up of the docker backend: from nothing to a finished first exec, and close.

``BENCH_REPEATS`` (default 10) rounds, alternating which side goes first, of:

* ``sandboxrun``: ``async with Sandbox(ws, backend="docker")`` (probe the engine and the image,
  connect, create + start the hardened container) and a first ``sb.exec(["true"])``: *ready*
  is the time from before the ``async with`` to the exec's return; *close* is the exit of the
  ``async with`` (the container force-removed);
* ``raw``: docker-py's low-level API on a client connected once beforehand: ``create_container``
  with the same hardening (same image, ``sleep infinity`` under an init, cap_drop ALL,
  no-new-privileges, sandboxrun's seccomp profile, read-only root with the same tmpfs mounts,
  network none, pids/memory limits, no logging, the workspace bound) + ``start`` + one exec of
  ``true`` (create + start + read to EOF + inspect): *ready*; then
  ``remove_container(force=True)``: *close*.

Reported: p50/p95 of ready and close for each side, the p50 ratio of ready (the target: 1.0,
issue 21) and of close, and where sandboxrun's ready time goes (probe, connect, create, start,
the supervisor's start-up until it connects, the whole open, the first exec; p50 ms).

Env: ``BENCH_REPEATS`` (10).
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
    create_baseline,
    docker_client,
    emit,
    env_int,
    machine,
    ms,
    own_containers,
    percentile,
    quiet_logs,
    raw_exec,
    remove_container,
    rounded,
    summary,
    sweep_own_containers,
    temp_workspace,
)
from docker import DockerClient

from sandboxrun import Limits, Sandbox
from sandboxrun.backends.docker import api as dockerapi
from sandboxrun.backends.docker.backend import DockerBackend

RATIO_TARGET = 1.0
BENCH = "docker_start"


@contextmanager
def patched(owner: Any, name: str, timings: dict[str, list[float]], key: str) -> Iterator[None]:
    """Time every call of ``owner.name`` (a sync function) into ``timings[key]``."""
    original: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            timings.setdefault(key, []).append(time.perf_counter() - start)

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, original)


def raw_round(
    client: DockerClient, workspace: Path, phases: dict[str, list[float]]
) -> tuple[float, float]:
    """One raw create + start + exec, then remove: ``(ready_s, close_s)``."""
    start = time.perf_counter()
    container_id = create_baseline(client, workspace, BENCH, seccomp=True)
    try:
        created = time.perf_counter()
        client.api.start(container_id)
        started = time.perf_counter()
        _, code = raw_exec(client, container_id, ["true"])
        ready = time.perf_counter()
        if code != 0:
            raise RuntimeError(f"raw first exec exited {code}")
    finally:
        closing = time.perf_counter()
        remove_container(client, container_id)
        closed = time.perf_counter()
    phases.setdefault("create", []).append(created - start)
    phases.setdefault("start", []).append(started - created)
    phases.setdefault("first_exec", []).append(ready - started)
    return ready - start, closed - closing


async def sandboxrun_round(
    workspace: Path, limits: Limits, phases: dict[str, list[float]]
) -> tuple[float, float, str]:
    start = time.perf_counter()
    async with Sandbox(workspace, backend="docker", limits=limits) as sb:
        opened = time.perf_counter()
        result = await sb.exec(["true"])
        ready = time.perf_counter()
    closed = time.perf_counter()
    phases.setdefault("open_total", []).append(opened - start)
    phases.setdefault("first_exec", []).append(ready - opened)
    return ready - start, closed - ready, result.status


async def measure(repeats: int, workspace: Path) -> dict[str, Any]:
    limits = Limits(max_output=65536, spill_max=0, grace_s=1.0)
    client = docker_client()
    ready: dict[str, list[float]] = {"sandboxrun": [], "raw": []}
    close: dict[str, list[float]] = {"sandboxrun": [], "raw": []}
    sbx_phases: dict[str, list[float]] = {}
    raw_phases: dict[str, list[float]] = {}
    statuses: dict[str, int] = {}
    try:
        # warm-up, untimed: image layers in the page cache, code paths imported
        await sandboxrun_round(workspace, limits, {})
        raw_round(client, workspace, {})
        with (
            patched(Sandbox, "_choose_backend", sbx_phases, "probe"),
            patched(dockerapi, "connect", sbx_phases, "connect"),
            patched(DockerBackend, "_open_sync", sbx_phases, "open"),
            patched(DockerBackend, "_create", sbx_phases, "create"),
            patched(DockerBackend, "_start", sbx_phases, "start"),
            patched(DockerBackend, "_meet_supervisor", sbx_phases, "supervisor"),
        ):
            for i in range(repeats):
                for side in ("sandboxrun", "raw") if i % 2 == 0 else ("raw", "sandboxrun"):
                    if side == "raw":
                        r, c = raw_round(client, workspace, raw_phases)
                    else:
                        r, c, status = await sandboxrun_round(workspace, limits, sbx_phases)
                        statuses[status] = statuses.get(status, 0) + 1
                    ready[side].append(r)
                    close[side].append(c)
    finally:
        leaked = own_containers(client)
        sweep_own_containers(client)
        client.close()
    return {
        "ready": ready,
        "close": close,
        "sbx_phases": sbx_phases,
        "raw_phases": raw_phases,
        "statuses": statuses,
        "leaked": leaked,
    }


def main() -> None:
    quiet_logs()
    repeats = max(1, env_int("BENCH_REPEATS", 10))
    with temp_workspace() as ws:
        got = anyio.run(measure, repeats, ws)
    ready = {side: summary(v) for side, v in got["ready"].items()}
    close = {side: summary(v) for side, v in got["close"].items()}
    ratio = ready["sandboxrun"]["p50_ms"] / ready["raw"]["p50_ms"]
    close_ratio = close["sandboxrun"]["p50_ms"] / close["raw"]["p50_ms"]

    def p50s(phases: dict[str, list[float]]) -> dict[str, float]:
        # connect runs twice per open (the probe's client, then the sandbox's): per call
        return {name: ms(percentile(v, 50)) for name, v in phases.items()}

    all_completed = got["statuses"] == {"completed": repeats}
    emit(
        {
            "bench": BENCH,
            "repeats": repeats,
            "ready": ready,
            "close": close,
            "ready_p50_ratio": rounded(ratio),
            "close_p50_ratio": rounded(close_ratio),
            "sandboxrun_phases_p50_ms": p50s(got["sbx_phases"]),
            "connect_calls_per_open": len(got["sbx_phases"].get("connect", [])) // repeats,
            "raw_phases_p50_ms": p50s(got["raw_phases"]),
            "statuses": got["statuses"],
            "leaked_containers": got["leaked"],
            "targets": {"ready_p50_ratio_max": RATIO_TARGET, "all_completed": True},
            "meets_targets": bool(ratio <= RATIO_TARGET and all_completed and not got["leaked"]),
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
