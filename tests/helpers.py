"""Shared test helpers (importable: tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import psutil

MARKER = "SANDBOXRUN_RUN_ID"
CLI = [sys.executable, "-m", "sandboxrun"]


def cli(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``sandboxrun ARGS``, its output as text, never raising on its exit status."""
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
        input=input,
        check=False,
    )


def marked_processes(run_id: str) -> list[psutil.Process]:
    """Every live process that carries the run's environment marker."""
    found = []
    for proc in psutil.process_iter():
        with suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARKER) == run_id:
                found.append(proc)
    return found


def assert_nothing_left(run_id: str) -> None:
    left = marked_processes(run_id)
    assert not left, f"processes of run {run_id} survived: {[p.pid for p in left]}"


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def processes_with_arg(token: str) -> list[psutil.Process]:
    """Live processes with ``token`` as one whole argument (for commands that clear their env)."""
    found = []
    for proc in psutil.process_iter():
        with suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and token in proc.cmdline():
                found.append(proc)
    return found


def processes_mentioning(text: str) -> list[int]:
    """Live processes (not this one, nor a pytest runner whose ``-k`` names it) with ``text``
    anywhere in their command line: a ``sh -c '... sleep 4321.5'`` wrapper too."""
    found = []
    for proc in psutil.process_iter():
        with suppress(psutil.Error):
            line = " ".join(proc.cmdline())
            if text not in line or proc.pid == os.getpid() or "pytest" in line:
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
    return found


def require_backend(name: str) -> str:
    """Skip (with the probe's reason) when backend ``name`` cannot run here, or fail when it is
    required (``SANDBOXRUN_REQUIRE_BACKENDS``, as CI sets it): a required backend never skips."""
    import os

    import pytest

    from sandboxrun import backends

    probe = backends.probe(backends.check_name(name))
    if not probe.available:
        if name in os.environ.get("SANDBOXRUN_REQUIRE_BACKENDS", "").split(","):
            pytest.fail(f"{name} is required (SANDBOXRUN_REQUIRE_BACKENDS) but: {probe.reason}")
        pytest.skip(f"{name} unavailable here: {probe.reason}")
    return name


def kill_watchdog(owner_pid: int) -> None:
    """SIGKILL the docker watchdog of the sandbox owner ``owner_pid`` (its one child running
    ``backends/docker/watchdog``), as if it died with its owner: the container of a sandbox
    without a supervisor then outlives the owner, for ``sandboxrun clean`` to find."""
    dogs = [p for p in psutil.Process(owner_pid).children() if "watchdog" in " ".join(p.cmdline())]
    assert len(dogs) == 1, dogs
    dogs[0].kill()  # (a zombie until its parent, killed next, is gone)
    assert wait_until(lambda: dogs[0].status() == psutil.STATUS_ZOMBIE, 10)
