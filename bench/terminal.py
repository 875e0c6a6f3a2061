"""Terminals: a keystroke's echo, ``Shell.run("true")`` and bulk output through a sandbox's
terminal, each against the same work over a local ``pty.openpty()`` in the same run.

- **echo**: ``cat`` on the terminal; one byte written, its echo read back (the line
  discipline's), ``BENCH_N`` (default 300) times. Target p50 <= 1 ms through the supervisor.
- **shell**: ``Shell.run("true")``, ``BENCH_N`` times, against the same marker protocol typed
  into a local bash on a local pty. Target p50 <= 3 ms.
- **bulk**: ``BENCH_MB`` (default 100) MB printed on the terminal and read to its end. Target
  >= 50 MB/s.

The backend is ``BENCH_BACKEND`` (default process-group; docker through its supervisor).
Reported: p50s and ratios to the local pty (sandboxrun / local), and MB/s of both.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Any

import anyio
from _common import emit, env_int, machine, quiet_logs, rounded, summary, temp_workspace

from sandboxrun import Limits, Sandbox

MARKER = re.compile(rb"\x1b\]133;D;\d+;(\w*)\x07")


class LocalPty:
    """``argv`` on a pty of this process (the baseline): write, and read until a predicate."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, env=env
        )
        os.close(slave)
        os.set_blocking(self.master, False)
        self.buf = b""

    async def until(self, done: Any) -> None:
        while not done(self.buf):
            try:
                data = os.read(self.master, 1 << 16)
            except BlockingIOError:
                await anyio.wait_readable(self.master)
                continue
            except OSError:
                return
            if not data:
                return
            self.buf += data

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self.master)


async def local_echo(n: int) -> list[float]:
    pty = LocalPty(["cat"])
    times = []
    for _ in range(n):
        want = len(pty.buf) + 1
        began = time.perf_counter()
        os.write(pty.master, b"x")
        await pty.until(lambda buf, want=want: len(buf) >= want)
        times.append(time.perf_counter() - began)
    pty.close()
    return times


async def local_shell(n: int) -> list[float]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PS1": "",
        "TERM": "dumb",
        "PROMPT_COMMAND": 'printf "\\033]133;D;%s;%s\\007" "$?" "${k-}"',
    }
    pty = LocalPty(["bash", "--noediting", "--norc", "--noprofile", "-i"], env)
    await pty.until(lambda buf: MARKER.search(buf) is not None)
    os.write(pty.master, b"k=s; stty -echo\r")
    await pty.until(lambda buf: b";s\x07" in buf)
    times = []
    for i in range(n):
        key = f"k{i}".encode()
        began = time.perf_counter()
        os.write(pty.master, b"k=" + key + b"; eval $'true'\r")
        await pty.until(lambda buf, key=key: b";" + key + b"\x07" in buf[-64:])
        times.append(time.perf_counter() - began)
    pty.close()
    return times


async def local_bulk(size: int) -> float:
    pty = LocalPty(["head", "-c", str(size), "/dev/zero"])
    began = time.perf_counter()
    got = 0
    while True:
        try:
            data = os.read(pty.master, 1 << 16)
        except BlockingIOError:
            await anyio.wait_readable(pty.master)
            continue
        except OSError:
            break
        if not data:
            break
        got += len(data)
    spent = time.perf_counter() - began
    pty.close()
    assert got == size, got
    return spent


async def measure(backend: str, n: int, size: int) -> dict[str, Any]:
    with temp_workspace() as ws:
        limits = Limits(grace_s=0.5, drain_s=0.5)
        async with Sandbox(ws, backend=backend, limits=limits) as sb:
            term = await sb.open_terminal(["cat"])
            echo = []
            offset = 0
            for _ in range(n):
                began = time.perf_counter()
                await term.write(b"x")
                chunk = await term.next_output(offset)
                offset = chunk.next_offset
                echo.append(time.perf_counter() - began)
            await term.close()
            sh = await sb.open_shell()
            shell = []
            for _ in range(n):
                began = time.perf_counter()
                result = await sh.run("true")
                shell.append(time.perf_counter() - began)
                assert result.exit_code == 0
            await sh.close()
            bulk_term = await sb.open_terminal(["head", "-c", str(size), "/dev/zero"])
            began = time.perf_counter()
            done = await bulk_term.wait(600)
            bulk = time.perf_counter() - began
            assert done.stdout_total_bytes == size, done.stdout_total_bytes
    local = {
        "echo": await local_echo(n),
        "shell": await local_shell(n),
        "bulk": await local_bulk(size),
    }
    ours = {"echo": summary(echo), "shell": summary(shell)}
    theirs = {"echo": summary(local["echo"]), "shell": summary(local["shell"])}  # type: ignore[arg-type]
    mb = size / 1e6
    return {
        "bench": "terminal",
        "backend": backend,
        "n": n,
        "echo_p50_ms": ours["echo"]["p50_ms"],
        "echo_local_p50_ms": theirs["echo"]["p50_ms"],
        "echo_ratio": rounded(ours["echo"]["p50_ms"] / theirs["echo"]["p50_ms"], 2),
        "shell_true_p50_ms": ours["shell"]["p50_ms"],
        "shell_local_p50_ms": theirs["shell"]["p50_ms"],
        "shell_ratio": rounded(ours["shell"]["p50_ms"] / theirs["shell"]["p50_ms"], 2),
        "bulk_mb_s": rounded(mb / bulk, 1),
        "bulk_local_mb_s": rounded(mb / float(local["bulk"]), 1),  # type: ignore[arg-type]
        "targets": {"echo_p50_ms": 1.0, "shell_true_p50_ms": 3.0, "bulk_mb_s": 50.0},
        "machine": machine(),
    }


def main() -> None:
    quiet_logs()
    backend = os.environ.get("BENCH_BACKEND", "process-group")
    emit(anyio.run(measure, backend, env_int("BENCH_N", 300), env_int("BENCH_MB", 100) * 10**6))


if __name__ == "__main__":
    main()
