"""Every backend against hostile commands: real processes, a real engine, no mocks.

Every test asserts the status, the output, a timing bound, and that nothing of the run survives
(on docker: no process of the exec is left in the container either).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import anyio
import pytest
from conformance_helpers import assert_container_clean, assert_scope_gone
from helpers import assert_nothing_left, processes_with_arg

from sandboxrun import Limits, Sandbox
from sandboxrun.models import ExecResult

pytestmark = pytest.mark.anyio

FAST = Limits(grace_s=0.5, drain_s=0.5)


def token() -> str:
    """A unique sleep duration, to find a command's processes by their argv."""
    return f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"


async def run_shell(
    workspace: Path,
    backend: str,
    script: str,
    *,
    limits: Limits = FAST,
    timeout: float | None = None,
) -> ExecResult:
    async with Sandbox(workspace, backend=backend, limits=limits) as sb:
        result = await sb.exec(shell=script, timeout=timeout)
        await assert_container_clean(sb)
    assert_scope_gone(backend, result.run_id)
    return result


def assert_gone(result: ExecResult, tok: str | None = None) -> None:
    assert result.survivors == 0
    assert_nothing_left(result.run_id)
    if tok is not None:
        assert not processes_with_arg(tok), "a process of the run is still alive"


async def test_term_ignoring_loop_is_killed_after_grace(workspace: Path, backend: str) -> None:
    tok = token()
    start = time.monotonic()
    result = await run_shell(
        workspace, backend, f"trap '' TERM; echo ready; while :; do sleep {tok}; done", timeout=1
    )
    elapsed = time.monotonic() - start
    assert result.status == "timed_out"
    assert result.timed_out
    assert result.signal == "SIGKILL"
    assert result.stdout == "ready\n"
    assert 1.0 <= elapsed < 1.0 + 0.5 + 1.5
    assert_gone(result, tok)


async def test_setsid_double_forked_daemon_is_killed_when_command_ends(
    workspace: Path, backend: str
) -> None:
    tok = token()
    script = (
        f"(setsid sh -c 'trap \"\" TERM; exec sleep {tok}' </dev/null >/dev/null 2>&1 &); "
        "echo started"
    )
    start = time.monotonic()
    result = await run_shell(workspace, backend, script)
    elapsed = time.monotonic() - start
    assert result.status == "completed"
    assert result.stdout == "started\n"
    assert elapsed < FAST.drain_s + FAST.grace_s + 1.5
    assert_gone(result, tok)


async def test_daemon_that_clears_its_environment_is_still_found(
    workspace: Path, backend: str
) -> None:
    tok = token()
    script = f"(setsid env -i /bin/sleep {tok} </dev/null >/dev/null 2>&1 &); echo ok"
    result = await run_shell(workspace, backend, script)
    assert result.status == "completed"
    assert_gone(result, tok)


async def test_background_child_holding_stdout_does_not_hold_the_run(
    workspace: Path, backend: str
) -> None:
    tok = token()
    start = time.monotonic()
    result = await run_shell(workspace, backend, f"sleep {tok} & echo hi")
    elapsed = time.monotonic() - start
    assert result.status == "completed"
    assert result.exit_code == 0
    assert result.stdout == "hi\n"
    assert elapsed < FAST.drain_s + FAST.grace_s + 1.5
    assert_gone(result, tok)


async def test_late_writer_within_drain_period_is_kept(workspace: Path, backend: str) -> None:
    result = await run_shell(
        workspace, backend, "(sleep 0.2; echo late) & echo early", limits=Limits(drain_s=3)
    )
    assert result.stdout == "early\nlate\n"
    assert_gone(result)


async def test_self_stopped_command_times_out_and_dies(workspace: Path, backend: str) -> None:
    start = time.monotonic()
    result = await run_shell(
        workspace, backend, "echo before; kill -STOP $$; echo after", timeout=1
    )
    elapsed = time.monotonic() - start
    assert result.status == "timed_out"
    assert result.stdout == "before\n"
    assert elapsed < 1 + FAST.grace_s + 1.5
    assert_gone(result)


async def test_closed_output_then_sleep_times_out(workspace: Path, backend: str) -> None:
    tok = token()
    start = time.monotonic()
    result = await run_shell(workspace, backend, f"echo out; exec >&- 2>&-; sleep {tok}", timeout=1)
    elapsed = time.monotonic() - start
    assert result.status == "timed_out"
    assert result.signal == "SIGTERM"
    assert result.stdout == "out\n"
    assert elapsed < 1 + FAST.grace_s + 1.5
    assert_gone(result, tok)


async def test_cat_without_stdin_ends_at_once(workspace: Path, backend: str) -> None:
    async with Sandbox(workspace, backend=backend) as sb:
        start = time.monotonic()
        result = await sb.exec(["cat"], timeout=10)
    assert result.status == "completed"
    assert result.stdout == ""
    assert time.monotonic() - start < 2


async def test_stdin_is_delivered(workspace: Path, backend: str) -> None:
    async with Sandbox(workspace, backend=backend) as sb:
        result = await sb.exec(["cat"], stdin=b"abc\x00\xffdef" * 50000)
    assert result.stdout_total_bytes == 8 * 50000


async def test_stdin_not_read_does_not_hang(workspace: Path, backend: str) -> None:
    async with Sandbox(workspace, backend=backend) as sb:
        result = await sb.exec(["true"], stdin=b"x" * (8 << 20), timeout=10)
    assert result.status == "completed"


async def test_timeout_keeps_partial_output(workspace: Path, backend: str) -> None:
    result = await run_shell(workspace, backend, "echo before; echo err >&2; sleep 30", timeout=0.5)
    assert result.status == "timed_out"
    assert result.stdout == "before\n"
    assert result.stderr == "err\n"


async def test_stderr_flood_while_stdout_waits(workspace: Path, backend: str) -> None:
    script = "head -c 20000000 /dev/zero >&2; echo done"
    result = await run_shell(workspace, backend, script, timeout=30)
    assert result.status == "completed"
    assert result.stdout == "done\n"
    assert result.stderr_total_bytes == 20_000_000
    assert result.stderr_truncated
    assert result.stderr_dropped_bytes == 20_000_000 - Limits().max_output


async def test_raw_bytes_are_reported_not_interpreted(workspace: Path, backend: str) -> None:
    script = r"printf 'a\377\376b\000c\033]0;title\007\033[31mred\033[0m'"
    result = await run_shell(workspace, backend, script)
    assert result.stdout == "a\ufffd\ufffdb\x00c\x1b]0;title\x07\x1b[31mred\x1b[0m"
    assert result.stdout_total_bytes == 28


async def test_multibyte_character_cut_at_limit(workspace: Path, backend: str) -> None:
    limits = Limits(max_output=101, spill_max=0)
    async with Sandbox(workspace, backend=backend, limits=limits) as sb:
        result = await sb.exec(["python3", "-c", "print('é' * 1000, end='')"])
    assert "\ufffd" not in result.stdout
    assert result.stdout_total_bytes == 2000
    kept = result.stdout.split("[...")[0].encode() + result.stdout.split("...]")[1].encode()
    assert len(kept) + result.stdout_dropped_bytes == 2000
    assert f"[... {result.stdout_dropped_bytes} bytes omitted ...]" in result.stdout
    assert not result.stdout_spill_complete


async def test_signal_not_sent_by_sandboxrun_is_failed(workspace: Path, backend: str) -> None:
    result = await run_shell(workspace, backend, "kill -SEGV $$")
    assert result.status == "failed"
    assert result.signal == "SIGSEGV"
    assert result.exit_code is None


async def test_cancellation_from_enclosing_scope(workspace: Path, backend: str) -> None:
    tok = token()
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        start = time.monotonic()
        with anyio.move_on_after(0.5) as scope:
            await sb.exec(shell=f"trap '' TERM; echo partial; sleep {tok}")
        elapsed = time.monotonic() - start
        assert scope.cancelled_caught
        result = sb.last_result
    assert result is not None
    assert result.status == "cancelled"
    assert result.stdout == "partial\n"
    assert elapsed < 0.5 + FAST.grace_s + 1.5
    assert_gone(result, tok)


async def test_cancellation_is_reraised(workspace: Path, backend: str) -> None:
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await sb.exec(["sleep", "30"])
            pytest.fail("the cancellation was swallowed")
        assert sb.last_result is not None
        assert sb.last_result.status == "cancelled"


async def test_concurrent_runs_are_terminated_independently(workspace: Path, backend: str) -> None:
    tok_a, tok_b = token(), token()
    results: dict[str, ExecResult] = {}
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:

        async def long() -> None:
            results["b"] = await sb.exec(shell=f"sleep {tok_b}; echo b-done", timeout=3)

        async with anyio.create_task_group() as tg:
            tg.start_soon(long)
            await anyio.sleep(0.3)
            results["a"] = await sb.exec(shell=f"(setsid sleep {tok_a} &); echo a", timeout=5)
            assert not processes_with_arg(tok_a)
            assert processes_with_arg(tok_b), "run b must not be touched by run a's sweep"
    assert results["a"].status == "completed"
    assert results["b"].status == "timed_out"
    assert_gone(results["b"], tok_b)


WALKER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("walking", flush=True)
end = time.time() + 30
while time.time() < end:
    if os.fork():
        os._exit(0)
"""


async def test_fork_walker_that_never_keeps_a_pid_is_killed(workspace: Path, backend: str) -> None:
    """The main process exits at once (its first fork), leaving a TERM-ignoring chain of
    processes that each fork and exit, faster than any walk of /proc can see them."""
    tok = token()
    start = time.monotonic()
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        result = await sb.exec(["python3", "-c", WALKER, tok], timeout=20)
        elapsed = time.monotonic() - start
        await anyio.sleep(0.5)
        assert not processes_with_arg(tok), "the fork walker outlived its run"
        await assert_container_clean(sb)
    assert result.status == "completed"
    assert result.stdout == "walking\n"
    assert result.survivors == 0
    assert elapsed < 15


ZOMBIE_LEADER = """
import ctypes, signal, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
threading.Thread(target=time.sleep, args=(300,)).start()
print("leader exits", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


async def test_zombie_leader_with_live_thread_is_killed(workspace: Path, backend: str) -> None:
    start = time.monotonic()
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        result = await sb.exec(["python3", "-c", ZOMBIE_LEADER], timeout=1)
        await assert_container_clean(sb)
    assert result.status == "timed_out"
    assert result.stdout == "leader exits\n"
    assert time.monotonic() - start < 1 + FAST.grace_s + 3
    assert_gone(result)


async def test_native_double_cancel_still_cleans_up(workspace: Path, backend: str) -> None:
    import asyncio

    tok = token()
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        task = asyncio.ensure_future(sb.exec(shell=f"trap '' TERM; echo up; sleep {tok}"))
        await asyncio.sleep(0.8)
        task.cancel()
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        result = sb.last_result
        assert result is not None
        assert result.status == "cancelled"
        assert not processes_with_arg(tok)
        await assert_container_clean(sb)
