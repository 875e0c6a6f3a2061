"""Shared helpers of the benchmarks in ``bench/``.

Every benchmark is a standalone script that prints exactly one JSON line on stdout. Figures are
ratios against a baseline measured in the same run, so they say something on any machine; the
absolute numbers are reported too, with a little machine context.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil

MARKER_VAR = "SANDBOXRUN_RUN_ID"


def env_int(name: str, default: int) -> int:
    """An integer from the environment (``BENCH_BYTES=1073741824``), else ``default``."""
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def rounded(value: float, digits: int = 3) -> float:
    return round(value, digits)


def machine() -> dict[str, Any]:
    """A little context: where the numbers come from."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def emit(payload: dict[str, Any]) -> None:
    """Print the one JSON line of a benchmark."""
    sys.stdout.write(json.dumps(payload, separators=(",", ":")) + "\n")
    sys.stdout.flush()


@contextmanager
def temp_workspace(prefix: str = "sandboxrun-bench-") -> Iterator[Path]:
    """A throw-away workspace directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as path:
        yield Path(path)


def marked_alive(run_id: str) -> list[int]:
    """Pids of live (non-zombie) processes carrying the run's environment marker."""
    found: list[int] = []
    for proc in psutil.process_iter():
        with suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARKER_VAR) == run_id:
                found.append(proc.pid)
    return found


def quiet_logs() -> None:
    """Silence sandboxrun's one-off "cannot enforce" warning (the process-group backend cannot
    confine the filesystem or the network; that is expected here and not what is measured)."""
    logging.getLogger("sandboxrun").setLevel(logging.ERROR)
