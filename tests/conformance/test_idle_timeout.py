"""The idle timeout on every backend: no output for ``idle_timeout`` seconds ends the run like
the wall-clock timeout (same termination, nothing left), reported as ``timeout_kind="idle"``.
Timing bounds are loose: the machine may be small and loaded."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from conformance_helpers import assert_container_clean, assert_scope_gone
from helpers import assert_nothing_left, processes_with_arg

from sandboxrun import Limits, Sandbox
from sandboxrun.models import ExecResult

pytestmark = pytest.mark.anyio

FAST = Limits(grace_s=0.5, drain_s=0.5)
SLACK = FAST.grace_s + FAST.drain_s + 3.0
"""Start-up (a docker exec, a systemd scope), termination and a loaded machine."""


def token() -> str:
    """A unique sleep duration, to find a command's processes by their argv."""
    return f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"


async def run_shell(
    workspace: Path, backend: str, script: str, **kwargs: float
) -> tuple[ExecResult, float]:
    start = time.monotonic()
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        result = await sb.exec(shell=script, **kwargs)  # type: ignore[arg-type]
        elapsed = time.monotonic() - start
        await assert_container_clean(sb)
    assert result.backend == backend
    assert result.survivors == 0
    assert_nothing_left(result.run_id)
    assert_scope_gone(backend, result.run_id)
    return result, elapsed


async def test_silence_ends_the_run_as_an_idle_timeout(workspace: Path, backend: str) -> None:
    tok = token()
    result, elapsed = await run_shell(workspace, backend, f"echo a; sleep {tok}", idle_timeout=1)
    assert (result.status, result.timed_out, result.timeout_kind) == ("timed_out", True, "idle")
    assert result.stdout == "a\n"
    assert result.error is not None and "no output for 1s (idle timeout)" in result.error
    assert 1.0 <= result.duration_s < 1.0 + SLACK
    assert elapsed < 1.0 + SLACK + 3.0  # opening the sandbox is counted here too
    assert not processes_with_arg(tok)


async def test_steady_output_on_either_stream_is_not_idle(workspace: Path, backend: str) -> None:
    script = "i=0; while [ $i -lt 10 ]; do echo o$i; echo e$i >&2; sleep 0.2; i=$((i+1)); done"
    result, _ = await run_shell(workspace, backend, script, idle_timeout=1)
    assert (result.status, result.timed_out, result.timeout_kind) == ("completed", False, None)
    assert result.stdout.count("\n") == 10 and result.stderr.count("\n") == 10
    assert result.error is None


async def test_a_shorter_wall_clock_timeout_wins(workspace: Path, backend: str) -> None:
    tok = token()
    result, _ = await run_shell(
        workspace, backend, f"echo a; sleep {tok}", timeout=1, idle_timeout=20
    )
    assert (result.status, result.timed_out, result.timeout_kind) == ("timed_out", True, "wall")
    assert result.error is None
    assert 1.0 <= result.duration_s < 1.0 + SLACK
    assert not processes_with_arg(tok)


async def test_idle_timeout_kills_a_term_ignoring_setsid_grandchild(
    workspace: Path, backend: str
) -> None:
    tok = token()
    script = (
        f"(setsid sh -c 'trap \"\" TERM; exec sleep {tok}' </dev/null >/dev/null 2>&1 &); "
        f"echo started; trap '' TERM; sleep {tok}"
    )
    result, _ = await run_shell(workspace, backend, script, idle_timeout=1)
    assert (result.status, result.timeout_kind) == ("timed_out", "idle")
    assert result.stdout == "started\n"
    assert result.survivors == 0
    assert 1.0 <= result.duration_s < 1.0 + SLACK
    assert not processes_with_arg(tok)
