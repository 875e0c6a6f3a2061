"""Detached sandboxes: ``sandboxrun exec NAME -- true`` against the CLI's own start-up
(``sandboxrun --version``) and ``docker exec`` into the same container, in the same run.

One sandbox is made with ``sandboxrun create`` (docker when it is available, else
process-group); then each command runs ``BENCH_N`` (default 30) times as a fresh process,
interleaved, after ``WARMUP`` rounds. Reported: the median wall time in ms of each, ``exec``'s
extra cost over ``--version`` and its ratio to ``docker exec``. Target (issue 20): the extra
cost ≤ 10 ms at p50.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, env_int, machine, rounded

TARGET_EXTRA_MS = 10.0
WARMUP = 3
SANDBOXRUN = str(Path(sys.executable).parent / "sandboxrun")


def once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def container_of(keeper_pid: int) -> str | None:
    out = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=sandboxrun.owner_pid={keeper_pid}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    ids = out.stdout.split()
    return ids[0] if ids else None


def main() -> None:
    n = env_int("BENCH_N", 30)
    runtime = Path(tempfile.mkdtemp(prefix="srb-", dir="/tmp"))
    workspace = Path(tempfile.mkdtemp(prefix="sandboxrun-bench-"))
    os.environ["SANDBOXRUN_RUNTIME_DIR"] = str(runtime)
    docker = (
        shutil.which("docker") is not None
        and subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0
    )
    backend = "docker" if docker else "process-group"
    made = subprocess.run(
        [SANDBOXRUN, "create", "--json", "--name", "bench", "-w", str(workspace), "-b", backend],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    try:
        info = json.loads(made.stdout)
        cases = {
            "version": [SANDBOXRUN, "--version"],
            "exec": [SANDBOXRUN, "exec", "bench", "--", "true"],
        }
        cid = container_of(int(info["pid"])) if docker else None
        if cid is not None:
            cases["docker_exec"] = ["docker", "exec", cid, "true"]
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for round_ in range(WARMUP + n):
            for name, argv in cases.items():
                took = once(argv)
                if round_ >= WARMUP:
                    samples[name].append(took)
    finally:
        subprocess.run([SANDBOXRUN, "rm", "--force", "bench"], capture_output=True, check=False)
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(workspace, ignore_errors=True)
    p50 = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    extra = p50["exec"] - p50["version"]
    emit(
        {
            "bench": "detached",
            "n": n,
            "backend": backend,
            "p50_ms": {name: rounded(value, 1) for name, value in p50.items()},
            "exec_extra_over_version_ms": rounded(extra, 1),
            "exec_ratio_to_docker_exec": rounded(p50["exec"] / p50["docker_exec"], 2)
            if "docker_exec" in p50
            else None,
            "target_extra_ms": TARGET_EXTRA_MS,
            "met": extra <= TARGET_EXTRA_MS,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
