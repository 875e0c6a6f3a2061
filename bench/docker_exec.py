"""Exec overhead of the docker backend: ``true`` and ``echo hi`` in a warm sandbox, through the
in-container supervisor, vs the raw Engine API exec.

One docker ``Sandbox`` is opened once (default policy: ``network="none"``) and warmed up; its
commands must go through the supervisor (``ExecResult.via == "supervisor"``, else the run is
reported as not meeting the targets). Then ``BENCH_N`` (default 100) calls of every variant, in
blocks of ``BENCH_BLOCK`` (default 10) calls back to back (as an agent issues commands), the
blocks of all variants interleaved in a rotating order (so drift hits every variant alike, and
no variant always goes first), with a pause of ``BENCH_SETTLE_MS`` between blocks: a raw engine
exec leaves the engine busy with its cleanup for a while after it returns, which a call right
after it would be charged for. The variants:

* ``sandboxrun`` / ``sandboxrun_echo``: ``await sb.exec(["true"])`` / ``sb.exec(["echo",
  "hi"])`` (stdout must be ``hi\\n``), wall time around the call;
* ``raw`` / ``raw_echo``: docker-py's low-level API on a client of its own, into the *same*
  running container: ``exec_create`` + ``exec_start(socket=True)`` + read the socket to EOF +
  ``exec_inspect`` (the minimum to run a command and learn its exit code);
* ``raw_wrapped``: the same raw exec of the per-command login-shell argv (``bash -lc '<PATH
  prefix> exec "$@"' sandboxrun true``, ``argv.wrapped_argv``): ``raw_wrapped - raw`` is the
  login shell's cost;
* ``each``: ``sb.exec(["true"])`` in a second sandbox opened with ``login="each"`` (every
  command under its own login shell, as before the login-environment snapshot): ``each -
  sandboxrun`` is what the snapshot saves per exec. Reported, not a target.

The default sandbox's ``true`` must run as is (``result.argv == ["true"]``: the snapshot is in
force, ``login_in_force``), else the figures are those of the per-command login shell.

Targets, for ``true`` and for ``echo hi`` each: p50 ≤ 3 ms and ≥ 25× faster than the raw exec
of the same command (p50 raw / p50 sandboxrun), every run ``completed``, no container left.

Afterwards (not in the figures above) ``BENCH_PHASE_N`` (default 20) more ``true`` execs run
with the supervisor path's steps wrapped in timers: where the time of one exec goes (``spawn``:
the spawn message to the supervisor's "spawned"; ``wait_exit``: from the handle's creation to the
exit report; ``pump``: until both output pipes are at EOF; ``terminate``: the post-exit
terminate round trip, with ``leftovers``, the host's check of the container's cgroup;
``start``/``finalize``: the backend's share around supervision; the rest of ``wall`` is
``engine.run`` and the ``Sandbox`` layer).

Last, ``floor``: inside the same container, ``BENCH_N`` spawns of each command by the least a
process there can do (``posix_spawn`` of the resolved binary, two pipes read to EOF,
``waitpid``, timed in the container), and ``overhead_p50_ms``, sandboxrun's p50 less that floor:
the part of an exec that is sandboxrun's (host, protocol, supervisor) and not the container's
own cost of starting a program, which the engine's storage driver sets (``storage_driver``:
through ``fuse-overlayfs`` every binary and library is mapped through FUSE).

Env: ``BENCH_N`` (100), ``BENCH_BLOCK`` (10), ``BENCH_SETTLE_MS`` (20), ``BENCH_PHASE_N`` (20).
"""

from __future__ import annotations

import functools
import inspect
import json
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
    user_spec,
)
from docker import DockerClient

from sandboxrun import ExecResult, Limits, Sandbox
from sandboxrun.backends import supervised
from sandboxrun.backends.docker.backend import DockerBackend
from sandboxrun.engine.argv import wrapped_argv

P50_TARGET_MS = 3.0
SPEEDUP_TARGET = 25.0
WARMUP = 5
SETTLE_MS = 20
BLOCK = env_int("BENCH_BLOCK", 10)
ECHO = ["echo", "hi"]
ECHO_OUT = "hi\n"
PHASES: tuple[tuple[Any, str, str], ...] = (
    (supervised, "_spawn", "spawn"),
    (supervised.SupervisedRun, "wait_exit", "wait_exit"),
    (supervised.SupervisedRun, "pump", "pump"),
    (supervised.SupervisedRun, "terminate", "terminate"),
    (DockerBackend, "_leftovers", "leftovers"),
    (DockerBackend, "start", "start"),
    (DockerBackend, "finalize", "finalize"),
)


FLOOR_SCRIPT = r"""
import json, os, sys, time
n, out = int(sys.argv[1]), {}
for name, argv in (("true", ["true"]), ("echo", ["echo", "hi"])):
    dirs = os.environ.get("PATH", "/usr/bin:/bin").split(":")
    path = next(p for p in (os.path.join(d, argv[0]) for d in dirs) if os.access(p, os.X_OK))
    times = []
    for _ in range(n):
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        start = time.perf_counter()
        acts = [(os.POSIX_SPAWN_DUP2, w1, 1), (os.POSIX_SPAWN_DUP2, w2, 2)]
        pid = os.posix_spawn(path, argv, dict(os.environ), file_actions=acts, setsid=True)
        os.close(w1)
        os.close(w2)
        while os.read(r1, 65536):
            pass
        while os.read(r2, 65536):
            pass
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - start)
        os.close(r1)
        os.close(r2)
    out[name] = times
print(json.dumps(out))
"""
"""Inside the sandbox's container, the least one command can cost there: ``posix_spawn`` of
the resolved binary with two pipes, read to EOF, ``waitpid``, timed in the container itself
(no engine, no supervisor, no host). On an engine whose storage driver is slow to map
binaries and libraries (fuse-overlayfs) this alone is well over a millisecond."""


def spawn_floor(client: DockerClient, container_id: str, n: int) -> dict[str, list[float]]:
    container = client.containers.get(container_id)
    code, output = container.exec_run(["python3", "-c", FLOOR_SCRIPT, str(n)], user=user_spec())
    if not isinstance(output, bytes) or code != 0:
        raise RuntimeError(f"the floor measurement failed ({code}): {output!r:.500}")
    found = json.loads(output.decode().strip().splitlines()[-1])
    return {name: [float(t) for t in found[name]] for name in ("true", "echo")}


def timed_raw(client: DockerClient, container_id: str, cmd: list[str]) -> float:
    start = time.perf_counter()
    _, code = raw_exec(client, container_id, cmd)
    elapsed = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"raw exec of {cmd[:2]} exited {code}")
    return elapsed


@contextmanager
def phase_timers(totals: dict[str, list[float]]) -> Iterator[list[str]]:
    """Wrap the supervisor path's steps in wall-clock timers (restored afterwards); yields the
    steps that were not found (the code moved on: they are left out, not guessed)."""
    originals: list[tuple[Any, str, Any]] = []
    missing: list[str] = []

    def wrap(label: str, func: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return await func(*args, **kwargs)
                finally:
                    totals.setdefault(label, []).append(time.perf_counter() - start)

            return timed_async

        @functools.wraps(func)
        def timed_sync(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                totals.setdefault(label, []).append(time.perf_counter() - start)

        return timed_sync

    for owner, name, label in PHASES:
        func = getattr(owner, name, None)
        if func is None:
            missing.append(label)
            continue
        originals.append((owner, name, func))
        setattr(owner, name, wrap(label, func))
    try:
        yield missing
    finally:
        for owner, name, func in originals:
            setattr(owner, name, func)


async def measure(n: int, phase_n: int, settle_s: float, workspace: Path) -> dict[str, Any]:
    limits = Limits(max_output=65536, spill_max=0, grace_s=1.0)
    client = docker_client()
    names = ("sandboxrun", "raw", "sandboxrun_echo", "raw_echo", "raw_wrapped", "each")
    samples: dict[str, list[float]] = {name: [] for name in names}
    statuses: dict[str, dict[str, int]] = {}
    via: dict[str, int] = {}
    wrong_stdout = 0
    phases: dict[str, list[float]] = {}
    phase_walls: list[float] = []
    missing: list[str] = []
    network = "?"
    floor: dict[str, list[float]] = {}
    driver = "?"
    argvs: set[tuple[str, ...]] = set()
    wrapped = wrapped_argv(["true"], shell="bash")
    try:
        async with (
            Sandbox(workspace, backend="docker", limits=limits) as sb,
            Sandbox(workspace, backend="docker", limits=limits, login="each") as sb_each,
        ):
            network = sb.policy.network
            access = sb.backend.view().container  # the contract: no backend attribute
            cid = None if access is None else access.container_id
            assert isinstance(cid, str)

            def note(name: str, result: ExecResult) -> None:
                counts = statuses.setdefault(name, {})
                counts[result.status] = counts.get(result.status, 0) + 1
                key = str(result.via)
                via[key] = via.get(key, 0) + 1

            async def sbx() -> float:
                start = time.perf_counter()
                result = await sb.exec(["true"])
                elapsed = time.perf_counter() - start
                note("sandboxrun", result)
                argvs.add(tuple(result.argv))
                return elapsed

            async def sbx_echo() -> float:
                nonlocal wrong_stdout
                start = time.perf_counter()
                result = await sb.exec(ECHO)
                elapsed = time.perf_counter() - start
                note("sandboxrun_echo", result)
                wrong_stdout += result.stdout != ECHO_OUT
                return elapsed

            async def each() -> float:
                start = time.perf_counter()
                result = await sb_each.exec(["true"])
                elapsed = time.perf_counter() - start
                note("each", result)
                return elapsed

            async def raw() -> float:
                return timed_raw(client, cid, ["true"])  # blocks the loop: nothing else runs

            async def raw_echo() -> float:
                return timed_raw(client, cid, ECHO)

            async def raw_wrapped() -> float:
                return timed_raw(client, cid, wrapped)

            variants = {
                "sandboxrun": sbx,
                "raw": raw,
                "sandboxrun_echo": sbx_echo,
                "raw_echo": raw_echo,
                "raw_wrapped": raw_wrapped,
                "each": each,
            }
            for _ in range(WARMUP):
                for name in names:
                    await variants[name]()
            statuses.clear()
            via.clear()
            argvs.clear()
            wrong_stdout = 0
            block = max(1, min(BLOCK, n))
            for i in range(-(-n // block)):
                k = i % len(names)
                for name in names[k:] + names[:k]:
                    if settle_s:  # between blocks: the engine finishes a raw exec's cleanup
                        await anyio.sleep(settle_s)
                    for _ in range(min(block, n - i * block)):
                        samples[name].append(await variants[name]())
            measured = {k: dict(v) for k, v in statuses.items()}
            measured_via = dict(via)
            measured_argvs = sorted(argvs)
            with phase_timers(phases) as missing:
                for _ in range(phase_n):
                    phase_walls.append(await sbx())
            floor = spawn_floor(client, cid, n)
            driver = str(client.info().get("Driver", "?"))
    finally:
        leaked = own_containers(client)
        sweep_own_containers(client)
        client.close()
    return {
        "samples": samples,
        "statuses": measured,
        "via": measured_via,
        "wrong_stdout": wrong_stdout,
        "network": network,
        "argvs": measured_argvs,
        "phases": phases,
        "phases_missing": missing,
        "phase_walls": phase_walls,
        "floor": floor,
        "storage_driver": driver,
        "leaked": leaked,
    }


def main() -> None:
    quiet_logs()
    n = max(1, env_int("BENCH_N", 100))
    phase_n = max(1, env_int("BENCH_PHASE_N", 20))
    settle_ms = max(0, env_int("BENCH_SETTLE_MS", SETTLE_MS))
    with temp_workspace() as ws:
        got = anyio.run(measure, n, phase_n, settle_ms / 1000, ws)
    sides = {name: summary(values) for name, values in got["samples"].items()}

    def speedup(raw: str, sbx: str) -> float:
        p50 = sides[sbx]["p50_ms"]
        return rounded(sides[raw]["p50_ms"] / p50 if p50 else 0.0, 2)

    speedups = {
        "true": speedup("raw", "sandboxrun"),
        "echo": speedup("raw_echo", "sandboxrun_echo"),
        "each_true": speedup("raw", "each"),
    }
    phases = {
        name: {"p50_ms": ms(percentile(v, 50)), "mean_ms": ms(sum(v) / len(v)), "calls": len(v)}
        for name, v in got["phases"].items()
    }
    all_completed = got["statuses"] == {
        "sandboxrun": {"completed": n},
        "sandboxrun_echo": {"completed": n},
        "each": {"completed": n},
    }
    supervised_all = got["via"] == {"supervisor": 3 * n}
    snapshot = got["argvs"] == [("true",)]
    per_command = {
        cmd: {
            "p50_ms": sides[sbx]["p50_ms"],
            "speedup_vs_raw": speedups[cmd],
            "meets_p50": sides[sbx]["p50_ms"] <= P50_TARGET_MS,
            "meets_speedup": speedups[cmd] >= SPEEDUP_TARGET,
        }
        for cmd, sbx in (("true", "sandboxrun"), ("echo", "sandboxrun_echo"))
    }
    emit(
        {
            "bench": "docker_exec",
            "n": n,
            "settle_ms": settle_ms,
            "block": BLOCK,
            "network": got["network"],
            "login_in_force": "snapshot" if snapshot else [list(a) for a in got["argvs"]],
            **sides,
            "speedup_vs_raw": speedups,
            "per_command": per_command,
            "login_shell_p50_ms": {
                "engine": rounded(sides["raw_wrapped"]["p50_ms"] - sides["raw"]["p50_ms"]),
                "supervisor": rounded(sides["each"]["p50_ms"] - sides["sandboxrun"]["p50_ms"]),
            },
            "p50_ratio_vs_raw_wrapped": rounded(
                sides["sandboxrun"]["p50_ms"] / sides["raw_wrapped"]["p50_ms"]
                if sides["raw_wrapped"]["p50_ms"]
                else 0.0
            ),
            "floor": {
                "storage_driver": got["storage_driver"],
                **{
                    cmd: {
                        "p50_ms": ms(percentile(got["floor"][cmd], 50)),
                        "overhead_p50_ms": rounded(
                            sides[sbx]["p50_ms"] - ms(percentile(got["floor"][cmd], 50))
                        ),
                    }
                    for cmd, sbx in (("true", "sandboxrun"), ("echo", "sandboxrun_echo"))
                },
            },
            "statuses": got["statuses"],
            "via": got["via"],
            "wrong_stdout": got["wrong_stdout"],
            "phases": {
                "n": phase_n,
                "wall_p50_ms": ms(percentile(got["phase_walls"], 50)),
                **phases,
                "missing": got["phases_missing"],
            },
            "leaked_containers": got["leaked"],
            "targets": {
                "p50_ms_max": P50_TARGET_MS,
                "speedup_vs_raw_min": SPEEDUP_TARGET,
                "commands": ["true", "echo hi"],
                "network": "none",
                "via": "supervisor",
                "all_completed": True,
            },
            "meets_targets": bool(
                all(c["meets_p50"] and c["meets_speedup"] for c in per_command.values())
                and all_completed
                and supervised_all
                and got["wrong_stdout"] == 0
                and got["network"] == "none"
                and not got["leaked"]
            ),
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
