"""Background jobs (``Sandbox.start``) on every backend: real servers, floods and hostile
process trees, no mocks. Every test checks that nothing of a job survives it."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import anyio
import pytest
from conformance_helpers import assert_container_clean, assert_scope_gone
from helpers import assert_nothing_left, processes_with_arg

from sandboxrun import Job, Limits, Sandbox
from sandboxrun.engine.paths import CONTAINER_ROOT

pytestmark = pytest.mark.anyio

FAST = Limits(grace_s=0.5, drain_s=0.5)

SERVER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen(8)
print("listening", s.getsockname()[1], flush=True)
while True:
    conn, _ = s.accept()
    line = conn.makefile("rb").readline().strip()
    print("served", line.decode(), flush=True)
    conn.sendall(b"echo:" + line + b"\n")
    conn.close()
"""

CLIENT = r"""
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
c.sendall(sys.argv[2].encode() + b"\n")
print(c.makefile("rb").readline().decode().strip())
"""


def token() -> str:
    """A unique sleep duration, to find a job's processes by their argv."""
    return f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"


async def wait_for_output(job: Job, needle: bytes, timeout: float = 20.0) -> bytes:
    """Poll the job's stdout by offset until ``needle`` shows up; return all of it so far."""
    seen = b""
    offset = 0
    with anyio.fail_after(timeout):
        while needle not in seen:
            chunk = job.read(offset)
            assert not chunk.lossy
            assert chunk.offset == offset
            seen += chunk.data
            offset = chunk.next_offset
            if needle in seen:
                break
            assert not chunk.eof, f"the job ended first: {job.result}"
            await anyio.sleep(0.05)
    return seen


async def assert_job_gone(sb: Sandbox, backend: str, job: Job, tok: str | None = None) -> None:
    assert job.result is not None
    assert job.result.survivors == 0, job.result
    if backend != "docker":
        assert_nothing_left(job.id)
    if tok is not None:
        assert not processes_with_arg(tok), "a process of the job is still alive"
        if backend == "docker":  # seen from inside the container too
            ps = await sb.exec(["python3", "-c", PS_SCAN, tok], timeout=30)
            assert ps.stdout.strip() == "0", ps
    await assert_container_clean(sb)
    assert_scope_gone(backend, job.id)


PS_SCAN = r"""
import os, sys
me = str(os.getpid())
n = 0
for pid in os.listdir("/proc"):
    if not pid.isdigit() or pid == me:
        continue
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        continue
    if sys.argv[1].encode() in args and state != "Z":
        n += 1
print(n)
"""


async def test_server_job_is_reached_by_a_later_exec(workspace: Path, backend: str) -> None:
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        server = await sb.start(["python3", "-u", "-c", SERVER])
        assert server.status == "running"
        assert [j.id for j in sb.jobs()] == [server.id]
        head = await wait_for_output(server, b"\n")
        assert head.startswith(b"listening "), head
        port = int(head.split()[1])
        offset = len(head)
        for word in ("alpha", "beta"):
            client = await sb.exec(["python3", "-c", CLIENT, str(port), word], timeout=30)
            assert client.status == "completed", client
            assert client.stdout == f"echo:{word}\n"
            line = f"served {word}\n".encode()
            with anyio.fail_after(10):
                while server.read(offset).data != line:
                    await anyio.sleep(0.02)
            chunk = server.read(offset)
            assert (chunk.offset, chunk.next_offset, chunk.lossy) == (
                offset,
                offset + len(line),
                False,
            )
            offset = chunk.next_offset
        assert server.status == "running"
        start = time.monotonic()
        result = await server.kill()
        assert time.monotonic() - start < 10
        assert result.status == "cancelled", result
        assert result.error is not None and "kill()" in result.error
        assert "served beta" in result.stdout
        await assert_job_gone(sb, backend, server)
        assert server.read(offset).eof
        assert sb.jobs()[0].status == "cancelled"


async def test_incremental_reads_continue_exactly(workspace: Path, backend: str) -> None:
    script = "for i in $(seq 1 400); do echo line-$i; [ $((i % 100)) = 0 ] && sleep 0.2; done"
    expected = b"".join(f"line-{i}\n".encode() for i in range(1, 401))
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        job = await sb.start(shell=script)
        got = b""
        offset = 0
        reads = 0
        with anyio.fail_after(30):
            while True:
                chunk = job.read(offset, limit=333)
                assert chunk.offset == offset and not chunk.lossy
                assert chunk.next_offset == offset + len(chunk.data)
                assert len(chunk.data) <= 333
                got += chunk.data
                offset = chunk.next_offset
                reads += 1
                if chunk.eof:
                    break
                if not chunk.data:
                    await anyio.sleep(0.01)
        assert got == expected
        assert reads > 10
        result = await job.wait(timeout=10)
        assert result.status == "completed" and result.exit_code == 0
        # line paging: the same lines, 7 at a time, by offset
        lines: list[str] = []
        at = 0
        while True:
            page = job.read_lines(at, limit=7)
            assert len(page.lines) <= 7 and page.offset == at and not page.lossy
            lines += page.lines
            at = page.next_offset
            if page.eof:
                break
        assert lines == [f"line-{i}" for i in range(1, 401)]
        tail = job.read_lines(limit=3)
        assert tail.lines == ["line-398", "line-399", "line-400"]
        assert tail.next_offset == len(expected) and tail.eof and not tail.lossy
        await assert_job_gone(sb, backend, job)


async def test_flood_beyond_the_caps_is_lossy(workspace: Path, backend: str) -> None:
    limits = Limits(grace_s=0.5, drain_s=0.5, max_output=16 * 1024, spill_max=64 * 1024)
    count = 120_000  # ~800 KB of numbered lines: far beyond max_output + spill_max
    expected = b"".join(b"%d\n" % i for i in range(1, count + 1))
    async with Sandbox(workspace, backend=backend, limits=limits) as sb:
        job = await sb.start(["seq", "1", str(count)])
        result = await job.wait(timeout=30)
        assert result.status == "completed", result
        assert job.logs["stdout"].total == len(expected)
        first = job.read(0, limit=1 << 20)
        assert first.lossy
        held = len(expected) - first.offset
        assert limits.max_output <= held <= limits.max_output + limits.spill_max
        assert first.data == expected[first.offset :]
        assert first.next_offset == len(expected) and first.eof
        # an offset inside the held range reads exactly, from disk or memory
        mid = first.offset + 100
        again = job.read(mid, limit=5000)
        assert not again.lossy and again.data == expected[mid : mid + 5000]
        tail = job.read_lines(limit=5)
        assert tail.lines == [str(i) for i in range(count - 4, count + 1)]
        assert not tail.lossy and tail.eof
        lines = job.read_lines(0, limit=3)
        assert lines.lossy and lines.offset == first.offset
        await assert_job_gone(sb, backend, job)


async def test_kill_ends_a_term_ignoring_tree(workspace: Path, backend: str) -> None:
    tok = token()
    script = (
        f"trap '' TERM; setsid sh -c \"trap '' TERM; while :; do sleep {tok}; done\" & "
        f"echo started; while :; do sleep {tok}; done"
    )
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        job = await sb.start(shell=script)
        await wait_for_output(job, b"started\n")
        with anyio.fail_after(10):
            while len(processes_with_arg(tok)) < 2 and backend != "docker":
                await anyio.sleep(0.05)
        start = time.monotonic()
        result = await job.kill()
        elapsed = time.monotonic() - start
        assert result.status == "cancelled", result
        assert result.error is not None and "kill()" in result.error
        assert elapsed < 10
        await assert_job_gone(sb, backend, job, tok)
        assert await job.kill() is result  # idempotent: the result stands


async def test_stdin_round_trip(workspace: Path, backend: str) -> None:
    slow_drain = Limits(grace_s=0.5, drain_s=3.0)  # a job held up by its stdin would wait 2x
    async with Sandbox(workspace, backend=backend, limits=slow_drain) as sb:
        job = await sb.start(["cat"], stdin=True)
        sent = b""
        for i in range(50):
            piece = f"piece {i}\n".encode() * (i + 1)
            await job.write_stdin(piece)
            sent += piece
        await wait_for_output(job, b"piece 49\n" * 50)
        job.close_stdin()
        result = await job.wait(timeout=10)
        assert result.status == "completed", result
        assert job.read(0, limit=1 << 20).data == sent
        with pytest.raises(BrokenPipeError):
            await job.write_stdin(b"late")
        # a job that ends on its own with stdin still open ends promptly
        head = await sb.start(["head", "-n", "1"], stdin=True)
        await head.write_stdin(b"only\nnot this\n")
        start = time.monotonic()
        result = await head.wait(timeout=10)
        assert time.monotonic() - start < slow_drain.drain_s
        assert result.status == "completed" and result.stdout == "only\n"
        with pytest.raises(BrokenPipeError):
            await head.write_stdin(b"late")
        # no stdin asked for: /dev/null, and no writing
        plain = await sb.start(["cat"])
        assert (await plain.wait(timeout=10)).stdout == ""
        with pytest.raises(RuntimeError, match="stdin=True"):
            await plain.write_stdin(b"x")
        for one in (job, head, plain):
            await assert_job_gone(sb, backend, one)


async def test_aclose_ends_every_running_job(workspace: Path, backend: str) -> None:
    tok = token()
    sb = Sandbox(workspace, backend=backend, limits=FAST)
    await sb.__aenter__()
    try:
        quick = await sb.start(["echo", "done"])
        assert (await quick.wait(timeout=10)).status == "completed"
        stubborn = await sb.start(shell=f"trap '' TERM; echo up; while :; do sleep {tok}; done")
        sleeper = await sb.start(["sleep", tok])
        await wait_for_output(stubborn, b"up\n")
        assert {j.status for j in sb.jobs()} == {"completed", "running"}
    finally:
        start = time.monotonic()
        await sb.aclose()
    assert time.monotonic() - start < 15
    for job in (stubborn, sleeper):
        result = await job.wait(timeout=1)
        assert result.status == "cancelled", result
        assert result.error is not None and "closed" in result.error
        assert result.survivors == 0
        if backend != "docker":
            assert_nothing_left(job.id)
        assert_scope_gone(backend, job.id)
    assert not processes_with_arg(tok)
    assert quick.result is not None and quick.result.status == "completed"
    assert stubborn.read_lines().lines == ["up"]
    with pytest.raises(RuntimeError):
        await sb.start(["true"])


async def test_wait_timeout_raises_and_the_job_runs_on(workspace: Path, backend: str) -> None:
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        job = await sb.start(shell="sleep 1.5; echo woke")
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="still running"):
            await job.wait(timeout=0.2)
        assert 0.15 < time.monotonic() - start < 1.2
        assert job.status == "running"
        result = await job.wait(timeout=20)
        assert result.status == "completed" and result.stdout == "woke\n"
        # a job's own wall-clock timeout still works, like exec's
        timed = await sb.start(["sleep", "30"], timeout=0.5)
        result = await timed.wait(timeout=20)
        assert result.status == "timed_out", result
        await assert_job_gone(sb, backend, timed)


def own_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_ended_jobs_hold_no_descriptor_and_are_capped(
    workspace: Path, backend: str, spill_root: Path
) -> None:
    limits = Limits(grace_s=0.5, drain_s=0.5, max_output=1024, spill_max=64 * 1024)
    count = 20_000  # ~110 KB: spills, and rotates its segments
    expected = b"".join(b"%d\n" % i for i in range(1, count + 1))
    async with Sandbox(workspace, backend=backend, limits=limits) as sb:
        sb.max_ended_jobs = 3

        async def batch() -> list[Job]:
            jobs = [await sb.start(["seq", "1", str(count)]) for _ in range(6)]
            for job in jobs:
                assert (await job.wait(timeout=60)).status == "completed", job.result
            return jobs

        for job in await batch():  # warms the backend's connections up, then forgotten
            sb.forget(job)
        assert sb.jobs() == []
        before = own_fds()
        chatty = await batch()
        assert own_fds() <= before + 2  # was + 4 per ended job: each segment's two fds
        assert all(log.open_fds == 0 for job in chatty for log in job.logs.values())
        kept = sorted(chatty, key=lambda j: j.ended_at or 0)[-3:]
        assert sb.jobs() == sorted(kept, key=chatty.index)  # the 3 newest ended ones
        own = sb.spill_dir  # the sandbox's own directory in the spill root
        assert own is not None and own.parent == spill_root
        for job in chatty:
            spilled = (own / f"{job.id}.log").exists()
            assert spilled == (job in kept) and job.released == (job not in kept)
            # what is held stays readable: from the spill (reopened per read) or memory
            held = job.read(0, limit=1 << 20)
            assert held.lossy and held.eof and held.data == expected[held.offset :]
            assert len(held.data) > limits.max_output if job in kept else len(held.data) == 1024
            assert job.read_lines(limit=2).lines == [str(count - 1), str(count)]
        running = await sb.start(["sleep", "30"])
        with pytest.raises(RuntimeError, match="still running"):
            sb.forget(running)
        await running.kill()
        sb.forget(kept[0])
        sb.forget(kept[0])  # idempotent
        assert kept[0] not in sb.jobs() and not (own / f"{kept[0].id}.log").exists()
        assert kept[0].read(0).data == expected[-1024:]
        assert kept[0].result is not None and kept[0].result.status == "completed"


PROFILE_SLEEP = "sleep {tok}\nLOGIN_VAR=from-profile; export LOGIN_VAR\n"


async def test_kill_does_not_wait_for_the_login_snapshot(workspace: Path, backend: str) -> None:
    """The first job of a sandbox takes the login-shell snapshot (a profile that sleeps), a
    second waits for it: kill() ends either at once, the snapshot's processes too."""
    tok = token()
    (workspace / "home").mkdir()
    (workspace / "home" / ".profile").write_text(PROFILE_SLEEP.format(tok=tok))
    (workspace / "home" / ".zprofile").write_text('. "$HOME/.profile"\n')
    home = str(CONTAINER_ROOT / "home") if backend == "docker" else str(workspace / "home")
    async with Sandbox(workspace, backend=backend, limits=FAST, env={"HOME": home}) as sb:
        taking = await sb.start(["echo", "ran"])
        waiting = await sb.start(["echo", "ran"])
        with anyio.fail_after(20):
            while not processes_with_arg(tok):
                await anyio.sleep(0.05)
        for job in (waiting, taking):
            start = time.monotonic()
            result = await job.kill()
            assert time.monotonic() - start < 5, result
            assert result.status == "cancelled" and "kill()" in (result.error or ""), result
            assert result.stdout == ""
        with anyio.fail_after(10):
            while processes_with_arg(tok):
                await anyio.sleep(0.05)


@pytest.fixture(params=["default", "engine"])
def via(request: pytest.FixtureRequest, backend: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Docker runs a command through its supervisor (pipes) or the engine's exec API (a
    socket): stdin is fed differently, so both are tested."""
    if request.param == "engine":
        if backend != "docker":
            pytest.skip("the engine's exec path is docker's")
        monkeypatch.setenv("SANDBOXRUN_DOCKER_SUPERVISOR", "0")
    return str(request.param)


async def test_stdin_is_forwarded_after_the_output_closed(
    workspace: Path, backend: str, via: str
) -> None:
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        job = await sb.start(shell="exec >/dev/null 2>&1; cat >out.txt", stdin=True)
        with anyio.fail_after(10):
            await job.write_stdin(b"hello\n")
            await anyio.sleep(0.5)  # the output is closed by now: forwarding goes on
            await job.write_stdin(b"world\n")
        job.close_stdin()
        result = await job.wait(timeout=10)
        assert result.status == "completed" and result.exit_code == 0, result
        assert (workspace / "out.txt").read_bytes() == b"hello\nworld\n"
        await assert_job_gone(sb, backend, job)


async def test_write_stdin_returns_once_written_or_raises(
    workspace: Path, backend: str, via: str
) -> None:
    big = b"x" * (16 << 20)  # more than any pipe and socket buffers hold
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        # a command that never reads: the write waits, and kill() fails it (nothing is dropped
        # silently)
        tok = token()
        sleeper = await sb.start(["sleep", tok], stdin=True)
        failure: list[BaseException] = []

        async def write() -> None:
            try:
                await sleeper.write_stdin(big)
            except BrokenPipeError as exc:
                failure.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            await anyio.sleep(1.0)
            assert not failure and sleeper.status == "running"  # still waiting: not written
            start = time.monotonic()
            await sleeper.kill()
        assert time.monotonic() - start < 5
        assert len(failure) == 1 and "close_stdin" not in str(failure[0]), failure
        # a command that reads a little and ends: the waiting write fails at once
        head = await sb.start(["head", "-c", "10"], stdin=True)
        with anyio.fail_after(10), pytest.raises(BrokenPipeError) as raised:
            await head.write_stdin(big)
        assert "close_stdin" not in str(raised.value)
        result = await head.wait(timeout=10)
        assert result.status == "completed" and result.stdout == "x" * 10
        # a job that ended by itself: the error says so, not "close_stdin"
        reader = await sb.start(["sh", "-c", "read line; echo got $line"], stdin=True)
        with anyio.fail_after(10):
            await reader.write_stdin(b"one\n")
        assert (await reader.wait(timeout=10)).stdout == "got one\n"
        with pytest.raises(BrokenPipeError, match="ended") as late:
            await reader.write_stdin(b"late\n")
        assert "close_stdin" not in str(late.value)
        reader.close_stdin()
        with pytest.raises(BrokenPipeError, match="close_stdin"):
            await reader.write_stdin(b"later\n")
        for one in (sleeper, head, reader):
            await assert_job_gone(sb, backend, one, tok if one is sleeper else None)
