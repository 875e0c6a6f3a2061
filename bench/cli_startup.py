"""CLI start-up: ``sandboxrun --help`` and ``import sandboxrun`` vs a bare ``python3 -c pass``.

Each command is run ``BENCH_N`` (default 30) times as a fresh process, interleaved so a noisy
neighbour hits all alike, after ``WARMUP`` rounds that fill the page cache. Reported: the median
wall time in ms of each, and its ratio to the bare interpreter (the same venv's ``python``).
Targets (issue 11): ``sandboxrun --help`` and ``import sandboxrun`` ≤ 150 ms. Reported beside
them, without a target: ``sandboxrun run --help`` (typer builds every option) and
``from sandboxrun import Sandbox`` (the whole library: pydantic models, anyio, the backends).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import emit, env_int, machine, rounded

TARGET_MS = 150.0
WARMUP = 3
BIN = Path(sys.executable).parent
CASES: dict[str, list[str]] = {
    "python_pass": [sys.executable, "-c", "pass"],
    "help": [str(BIN / "sandboxrun"), "--help"],
    "run_help": [str(BIN / "sandboxrun"), "run", "--help"],
    "import": [sys.executable, "-c", "import sandboxrun"],
    "import_sandbox": [sys.executable, "-c", "from sandboxrun import Sandbox"],
}


def once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    n = env_int("BENCH_N", 30)
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for round_ in range(WARMUP + n):
        for name, argv in CASES.items():
            took = once(argv)
            if round_ >= WARMUP:
                samples[name].append(took)
    p50 = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    base = p50["python_pass"]
    emit(
        {
            "bench": "cli_startup",
            "n": n,
            "p50_ms": {name: rounded(value, 1) for name, value in p50.items()},
            "ratio_to_python": {
                name: rounded(value / base, 2)
                for name, value in p50.items()
                if name != "python_pass"
            },
            "target_ms": TARGET_MS,
            "help_met": p50["help"] <= TARGET_MS,
            "import_met": p50["import"] <= TARGET_MS,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    main()
