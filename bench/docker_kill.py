"""Kill latency of the docker backend: from the deadline to no process of the exec left.

A TERM-ignoring shell that leaves a TERM-ignoring ``setsid`` grandchild behind is run in a docker
sandbox with a ``timeout`` of T (default 0.5 s) and ``grace_s`` G (default 1.0 s): TERM is
ignored by all of it, so the run can only end by SIGKILL once the grace period is over. The kill
latency is the wall time of ``exec`` minus T. The baseline is the same latency for a cooperative
command (``sleep 1000``, dies on TERM); runs alternate, ``BENCH_REPEATS`` (default 5) of each.

The engine is the judge of "nothing left": docker's ``top`` (``client.api.top``, the host's
``ps`` filtered to the container's cgroup) is polled from the deadline on, on a client of its
own in a thread, and the first time it shows only the container's own processes (the init and
``sleep infinity``, recorded when the sandbox opened) gives ``clean_latency_s``; right after
``exec`` returns ``top`` is asked once more (``left_after_return`` must be empty, like
``result.survivors``). While the hostile command runs, a probe checks through ``top`` that the
``setsid`` grandchild really exists in a session of its own (``setsid_child_seen``). A ``top``
call is not free (the engine runs ``ps``): ``top_call_p50_ms`` is the resolution of
``clean_latency_s``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from _common import (
    docker_client,
    emit,
    env_float,
    env_int,
    latency_stats,
    machine,
    own_containers,
    percentile,
    quiet_logs,
    rounded,
    sweep_own_containers,
    temp_workspace,
)
from docker import DockerClient

from sandboxrun import ExecResult, Limits, Sandbox

HOSTILE = "trap '' TERM; (setsid sh -c 'trap \"\" TERM; sleep 1000' &); while :; do sleep 0.1; done"
COOPERATIVE = ["sleep", "1000"]
TARGET_SLACK_S = 0.5
PS_ARGS = "-o pid,ppid,sid,stat,args"
POLL_S = 0.02


def top(client: DockerClient, container_id: str) -> list[dict[str, str]]:
    """The container's live (non-zombie) processes as the engine sees them."""
    listing = client.api.top(container_id, ps_args=PS_ARGS)
    titles = [str(t) for t in listing.get("Titles") or []]
    rows = [
        dict(zip(titles, map(str, row), strict=False)) for row in listing.get("Processes") or []
    ]
    return [r for r in rows if not r.get("STAT", "").startswith("Z")]


def foreign(rows: list[dict[str, str]], own: set[str]) -> list[dict[str, str]]:
    """Processes that are not the container's own (init, ``sleep infinity``)."""
    return [r for r in rows if r.get("PID") not in own]


class CleanWatcher:
    """Polls ``top`` in a thread from ``start()`` until only the container's own processes are
    left; ``clean_at`` is the ``perf_counter`` of the first such listing."""

    def __init__(self, client: DockerClient, container_id: str, own: set[str]) -> None:
        self._client, self._cid, self._own = client, container_id, own
        self._stop = threading.Event()
        self.clean_at: float | None = None
        self.polls = 0
        self.call_s: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            rows = top(self._client, self._cid)
            self.call_s.append(time.perf_counter() - start)
            self.polls += 1
            if not foreign(rows, self._own):
                self.clean_at = time.perf_counter()
                return
            self._stop.wait(POLL_S)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        self._stop.set()
        self._thread.join()


async def one_run(
    sb: Sandbox, client: DockerClient, cid: str, own: set[str], hostile: bool, timeout_s: float
) -> dict[str, Any]:
    probe: dict[str, int] = {}
    watcher = CleanWatcher(client, cid, own)

    async def look() -> None:
        await anyio.sleep(timeout_s * 0.6)
        rows = foreign(await anyio.to_thread.run_sync(top, client, cid), own)
        probe.update(processes=len(rows), sessions=len({r.get("SID") for r in rows}))

    async def watch() -> None:
        await anyio.sleep(timeout_s)  # from the deadline on
        watcher.start()

    if hostile:
        request = sb.prepare(shell=HOSTILE, timeout=timeout_s)
    else:
        request = sb.prepare(COOPERATIVE, timeout=timeout_s)
    result: ExecResult | None = None
    async with anyio.create_task_group() as tg:
        start = time.perf_counter()
        tg.start_soon(look)
        tg.start_soon(watch)
        result = await sb.run_request(request)
        returned = time.perf_counter()
    assert result is not None
    await anyio.to_thread.run_sync(watcher.join, 5.0)
    left = foreign(await anyio.to_thread.run_sync(top, client, cid), own)
    clean = watcher.clean_at
    return {
        "status": result.status,
        "latency_s": returned - start - timeout_s,
        "duration_latency_s": result.duration_s - timeout_s,
        "clean_latency_s": None if clean is None else clean - start - timeout_s,
        "top_polls": watcher.polls,
        "top_call_s": watcher.call_s,
        "survivors": result.survivors,
        "left_after_return": [r.get("COMMAND", "?") for r in left],
        "processes_seen": probe.get("processes", 0),
        "sessions_seen": probe.get("sessions", 0),
    }


def side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    clean = [r["clean_latency_s"] for r in runs if r["clean_latency_s"] is not None]
    return {
        **latency_stats([r["latency_s"] for r in runs]),
        "duration_latency_s": [rounded(r["duration_latency_s"]) for r in runs],
        "clean_latency_s": [
            None if r["clean_latency_s"] is None else rounded(r["clean_latency_s"]) for r in runs
        ],
        "clean_p50_s": rounded(percentile(clean, 50)) if clean else None,
        "clean_max_s": rounded(max(clean)) if clean else None,
        "all_clean_seen": len(clean) == len(runs),
        "top_polls": [r["top_polls"] for r in runs],
        "top_call_p50_ms": rounded(
            1000 * percentile([c for r in runs for c in r["top_call_s"]], 50), 1
        ),
        "statuses": sorted({r["status"] for r in runs}),
        "survivors": [r["survivors"] for r in runs],
        "left_after_return": [r["left_after_return"] for r in runs],
        "processes_seen": [r["processes_seen"] for r in runs],
        "sessions_seen": [r["sessions_seen"] for r in runs],
    }


async def measure(repeats: int, timeout_s: float, grace_s: float, workspace: Path) -> Any:
    limits = Limits(max_output=65536, spill_max=0, grace_s=grace_s)
    hostile: list[dict[str, Any]] = []
    cooperative: list[dict[str, Any]] = []
    client = docker_client()
    try:
        async with Sandbox(workspace, backend="docker", limits=limits) as sb:
            cid = getattr(sb.backend, "container_id", None)
            assert isinstance(cid, str)
            await sb.exec(["true"])  # warm-up
            own_rows = await anyio.to_thread.run_sync(top, client, cid)
            own = {r["PID"] for r in own_rows}
            own_commands = sorted(r.get("COMMAND", "?") for r in own_rows)
            for _ in range(repeats):
                hostile.append(await one_run(sb, client, cid, own, True, timeout_s))
                cooperative.append(await one_run(sb, client, cid, own, False, timeout_s))
            final = await anyio.to_thread.run_sync(top, client, cid)
            final_pids = {r["PID"] for r in final}
    finally:
        leaked = own_containers(client)
        sweep_own_containers(client)
        client.close()
    return {
        "hostile": side(hostile),
        "cooperative": side(cooperative),
        "own_processes": own_commands,
        "container_processes_unchanged": final_pids == own,
        "leaked": leaked,
    }


def main() -> None:
    quiet_logs()
    timeout_s = env_float("BENCH_T", 0.5)
    grace_s = env_float("BENCH_GRACE", 1.0)
    repeats = max(1, env_int("BENCH_REPEATS", 5))
    with temp_workspace() as ws:
        got = anyio.run(measure, repeats, timeout_s, grace_s, ws)
    hostile, cooperative = got["hostile"], got["cooperative"]
    bound = grace_s + TARGET_SLACK_S
    clean = all(s == 0 for r in (hostile, cooperative) for s in r["survivors"]) and not any(
        left for r in (hostile, cooperative) for left in r["left_after_return"]
    )
    timed_out = hostile["statuses"] == ["timed_out"] and cooperative["statuses"] == ["timed_out"]
    setsid_seen = all(s >= 2 for s in hostile["sessions_seen"])
    ratio = hostile["p50_s"] / cooperative["p50_s"] if cooperative["p50_s"] > 0 else 0.0
    clean_max = hostile["clean_max_s"]
    emit(
        {
            "bench": "docker_kill",
            "timeout_s": timeout_s,
            "grace_s": grace_s,
            "repeats": repeats,
            "hostile": hostile,
            "cooperative": cooperative,
            "p50_ratio_hostile_vs_cooperative": rounded(ratio, 2),
            "setsid_child_seen": setsid_seen,
            "own_processes": got["own_processes"],
            "container_processes_unchanged": got["container_processes_unchanged"],
            "leaked_containers": got["leaked"],
            "targets": {
                "hostile_max_latency_s": bound,
                "hostile_clean_max_latency_s": bound,
                "survivors": 0,
                "left_after_return": [],
                "status": "timed_out",
            },
            "meets_targets": bool(
                hostile["max_s"] <= bound
                and clean_max is not None
                and clean_max <= bound
                and hostile["all_clean_seen"]
                and clean
                and timed_out
                and setsid_seen
                and got["container_processes_unchanged"]
                and not got["leaked"]
            ),
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
