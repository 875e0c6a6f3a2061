"""Kill latency of the docker backend: from the deadline (or the caller's cancellation) to the
result, and no process of the exec left.

A TERM-ignoring shell that leaves a TERM-ignoring ``setsid`` grandchild behind is run in a docker
sandbox, through the in-container supervisor (``ExecResult.via == "supervisor"``), with
``grace_s`` G (default 1.0 s): TERM is ignored by all of it, so the run can only end by SIGKILL
once the grace period is over. Three kinds of run alternate, ``BENCH_REPEATS`` (default 5) each:

* ``hostile``: ``timeout`` T (default 0.5 s); the latency is the wall time of the exec minus T
  (measured from the call, so it includes the spawn: an upper bound of "from the timeout firing");
* ``hostile_cancel``: no timeout; the caller's cancel scope (``anyio.move_on_after(T)``) cancels
  the exec; the latency is from the cancellation to the exec's return (``last_result`` holds
  the ``cancelled`` result and its ``survivors``);
* ``cooperative`` (the baseline): ``sleep 1000`` with timeout T, which dies on TERM.

Targets: hostile latency (both kinds) ≤ G + 0.1 s, 0 survivors. "Nothing left" is checked three
ways after every run: ``result.survivors``; the engine's ``top`` (``client.api.top``, the host's
``ps`` filtered to the container's cgroup), which must show only the container's own processes
(its init and the supervisor, recorded when the sandbox opened: ``left_after_return``); and a
host ``/proc`` scan for processes carrying the run's ``SANDBOXRUN_RUN_ID`` marker
(``marked_after_return``; ``marked_seen``: what that scan found while the command ran, so an
empty answer means something). ``top`` is also polled from the deadline on, on a client of its
own in a thread: the first listing with only the container's own processes gives
``clean_latency_s`` (reported; a ``top`` call is not free, ``top_call_p50_ms`` is its
resolution). While the hostile command runs, a probe checks through ``top`` that the ``setsid``
grandchild really exists in a session of its own (``setsid_child_seen``).

Env: ``BENCH_T`` (0.5 s), ``BENCH_GRACE`` (1.0 s), ``BENCH_REPEATS`` (5).
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
    marked_alive,
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
TARGET_SLACK_S = 0.1
KINDS = ("hostile", "hostile_cancel", "cooperative")
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
    sb: Sandbox, client: DockerClient, cid: str, own: set[str], kind: str, timeout_s: float
) -> dict[str, Any]:
    probe: dict[str, int] = {}
    watcher = CleanWatcher(client, cid, own)

    async def look() -> None:
        await anyio.sleep(timeout_s * 0.6)
        rows = foreign(await anyio.to_thread.run_sync(top, client, cid), own)
        probe.update(processes=len(rows), sessions=len({r.get("SID") for r in rows}))
        # the host's /proc scan must see them too, or its empty answer afterwards means nothing
        probe["marked"] = len(await anyio.to_thread.run_sync(marked_alive, request.run_id))

    async def watch() -> None:
        await anyio.sleep(timeout_s)  # from the deadline on
        watcher.start()

    if kind == "cooperative":
        request = sb._prepare(COOPERATIVE, timeout=timeout_s)
    elif kind == "hostile":
        request = sb._prepare(shell=HOSTILE, timeout=timeout_s)
    else:  # ended by the caller's cancellation, no timeout of its own
        request = sb._prepare(shell=HOSTILE, timeout=3600.0)
    result: ExecResult | None = None
    async with anyio.create_task_group() as tg:
        start = time.perf_counter()
        tg.start_soon(look)
        tg.start_soon(watch)
        if kind == "hostile_cancel":
            with anyio.move_on_after(timeout_s):
                await sb._run_request(request)
            last = sb.last_result
            result = last if last is not None and last.run_id == request.run_id else None
        else:
            result = await sb._run_request(request)
        returned = time.perf_counter()
    await anyio.to_thread.run_sync(watcher.join, 5.0)
    left = foreign(await anyio.to_thread.run_sync(top, client, cid), own)
    marked = await anyio.to_thread.run_sync(marked_alive, request.run_id)
    clean = watcher.clean_at
    return {
        "status": "?" if result is None else result.status,
        "via": None if result is None else result.via,
        "latency_s": returned - start - timeout_s,
        "duration_latency_s": None if result is None else result.duration_s - timeout_s,
        "clean_latency_s": None if clean is None else clean - start - timeout_s,
        "top_polls": watcher.polls,
        "top_call_s": watcher.call_s,
        "survivors": -1 if result is None else result.survivors,
        "left_after_return": [r.get("COMMAND", "?") for r in left],
        "marked_after_return": len(marked),
        "processes_seen": probe.get("processes", 0),
        "sessions_seen": probe.get("sessions", 0),
        "marked_seen": probe.get("marked", 0),
    }


def side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    clean = [r["clean_latency_s"] for r in runs if r["clean_latency_s"] is not None]
    return {
        **latency_stats([r["latency_s"] for r in runs]),
        "duration_latency_s": [
            None if r["duration_latency_s"] is None else rounded(r["duration_latency_s"])
            for r in runs
        ],
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
        "marked_after_return": [r["marked_after_return"] for r in runs],
        "via": sorted({str(r["via"]) for r in runs}),
        "processes_seen": [r["processes_seen"] for r in runs],
        "sessions_seen": [r["sessions_seen"] for r in runs],
        "marked_seen": [r["marked_seen"] for r in runs],
    }


async def measure(repeats: int, timeout_s: float, grace_s: float, workspace: Path) -> Any:
    limits = Limits(max_output=65536, spill_max=0, grace_s=grace_s)
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    client = docker_client()
    try:
        async with Sandbox(workspace, backend="docker", limits=limits) as sb:
            access = sb.backend.view().container  # the contract: no backend attribute
            cid = None if access is None else access.container_id
            assert isinstance(cid, str)
            await sb.exec(["true"])  # warm-up
            own_rows = await anyio.to_thread.run_sync(top, client, cid)
            own = {r["PID"] for r in own_rows}
            own_commands = sorted(r.get("COMMAND", "?") for r in own_rows)
            for _ in range(repeats):
                for kind in KINDS:
                    runs[kind].append(await one_run(sb, client, cid, own, kind, timeout_s))
            final = await anyio.to_thread.run_sync(top, client, cid)
            final_pids = {r["PID"] for r in final}
    finally:
        leaked = own_containers(client)
        sweep_own_containers(client)
        client.close()
    return {
        **{kind: side(r) for kind, r in runs.items()},
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
    sides = [got[kind] for kind in KINDS]
    hostile, cancel, cooperative = sides
    bound = rounded(grace_s + TARGET_SLACK_S)
    clean = all(
        s == 0 for r in sides for s in r["survivors"] + r["marked_after_return"]
    ) and not any(left for r in sides for left in r["left_after_return"])
    statuses_ok = (
        hostile["statuses"] == ["timed_out"]
        and cooperative["statuses"] == ["timed_out"]
        and cancel["statuses"] == ["cancelled"]
    )
    supervised = all(r["via"] == ["supervisor"] for r in sides)
    setsid_seen = all(s >= 2 for r in (hostile, cancel) for s in r["sessions_seen"])
    marker_scan_works = all(m >= 2 for r in (hostile, cancel) for m in r["marked_seen"])
    ratio = hostile["p50_s"] / cooperative["p50_s"] if cooperative["p50_s"] > 0 else 0.0
    emit(
        {
            "bench": "docker_kill",
            "timeout_s": timeout_s,
            "grace_s": grace_s,
            "repeats": repeats,
            "hostile": hostile,
            "hostile_cancel": cancel,
            "cooperative": cooperative,
            "p50_ratio_hostile_vs_cooperative": rounded(ratio, 2),
            "setsid_child_seen": setsid_seen,
            "marker_scan_saw_the_tree": marker_scan_works,
            "own_processes": got["own_processes"],
            "container_processes_unchanged": got["container_processes_unchanged"],
            "leaked_containers": got["leaked"],
            "targets": {
                "hostile_max_latency_s": bound,
                "hostile_cancel_max_latency_s": bound,
                "survivors": 0,
                "left_after_return": [],
                "marked_after_return": 0,
                "status": {"hostile": "timed_out", "hostile_cancel": "cancelled"},
                "via": "supervisor",
            },
            "meets_targets": bool(
                hostile["max_s"] <= bound
                and cancel["max_s"] <= bound
                and clean
                and statuses_ok
                and supervised
                and setsid_seen
                and marker_scan_works
                and got["container_processes_unchanged"]
                and not got["leaked"]
            ),
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
