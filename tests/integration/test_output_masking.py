"""Secrets stay out of captured output: the values of secret-shaped variables given explicitly
are masked in the result's text, the spill files and the live output, however the command
splits its writes, also when the run times out; ``mask_output=False`` / ``--no-mask`` opt out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import require_backend

from sandboxrun import Limits, Policy, Sandbox

CLI = [sys.executable, "-m", "sandboxrun"]
VALUE = "s3cr3t-value-123"
MARK = "[masked:API_TOKEN]"
SECRET_ENV = {"API_TOKEN": VALUE}
DEGRADED = Policy(allow_degraded=True)

pytestmark = pytest.mark.anyio

# Prints $API_TOKEN one byte per write, sleeping in between: the value arrives over many reads.
BYTE_BY_BYTE = (
    'v=$API_TOKEN; while [ -n "$v" ]; do rest=${v#?}; printf %s "${v%"$rest"}"; '
    "v=$rest; sleep 0.02; done; echo"
)


@pytest.fixture
def pgroup() -> str:
    return require_backend("process-group")


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


async def test_stdout_is_masked(workspace: Path, pgroup: str) -> None:
    async with Sandbox(workspace, backend=pgroup, policy=DEGRADED, env=SECRET_ENV) as sb:
        result = await sb.exec(sh('printf %s "$API_TOKEN"; echo'))
    assert result.status == "completed"
    assert result.stdout == MARK + "\n"
    assert VALUE not in result.stdout
    assert result.stdout_total_bytes == len(MARK) + 1  # counts the output as delivered


async def test_value_split_across_reads_is_masked(workspace: Path, pgroup: str) -> None:
    chunks: list[bytes] = []
    async with Sandbox(workspace, backend=pgroup, policy=DEGRADED, env=SECRET_ENV) as sb:
        result = await sb.exec(
            sh(f"echo start; {BYTE_BY_BYTE}"), sink=lambda _n, c: chunks.append(c)
        )
    assert result.stdout == f"start\n{MARK}\n"
    assert b"".join(chunks) == f"start\n{MARK}\n".encode()
    assert chunks[0] == b"start\n"  # what cannot start a value is not held back


async def test_stderr_is_masked(workspace: Path, pgroup: str) -> None:
    async with Sandbox(workspace, backend=pgroup, policy=DEGRADED, env=SECRET_ENV) as sb:
        result = await sb.exec(sh(f'echo "err: $API_TOKEN" >&2; {{ {BYTE_BY_BYTE}; }} >&2'))
    assert result.stderr == f"err: {MARK}\n{MARK}\n"
    assert result.stdout == ""


async def test_env_given_per_exec_is_masked(workspace: Path, pgroup: str) -> None:
    async with Sandbox(workspace, backend=pgroup, policy=DEGRADED) as sb:
        result = await sb.exec(sh('echo "$DB_PASSWORD"'), env={"DB_PASSWORD": "hunter2-long"})
    assert result.stdout == "[masked:DB_PASSWORD]\n"


async def test_flood_spill_file_and_live_output_have_no_value(workspace: Path, pgroup: str) -> None:
    lines = 20_000
    limits = Limits(max_output=1000, spill_max=1 << 24)
    live = bytearray()

    def sink(name: str, chunk: bytes) -> None:
        if name == "stdout":
            live.extend(chunk)

    async with Sandbox(
        workspace, backend=pgroup, policy=DEGRADED, limits=limits, env=SECRET_ENV, keep_spill=True
    ) as sb:
        result = await sb.exec(sh(f'yes "x$API_TOKEN" | head -n {lines}'), sink=sink)
    assert result.status == "completed"
    expected = f"x{MARK}\n".encode() * lines
    assert result.stdout_truncated
    assert result.stdout_spill is not None
    spilled = Path(result.stdout_spill).read_bytes()
    assert VALUE.encode() not in spilled
    assert spilled == expected
    assert result.stdout_spill_complete
    assert result.stdout_total_bytes == len(expected)
    assert result.stdout_dropped_bytes == len(expected) - len(
        result.stdout.replace(f"[... {result.stdout_dropped_bytes} bytes omitted ...]", "")
    )
    assert VALUE not in result.stdout
    assert bytes(live) == expected


async def test_non_secret_name_is_not_masked(workspace: Path, pgroup: str) -> None:
    env = {"GREETING": "hello-world-1234", **SECRET_ENV}
    async with Sandbox(workspace, backend=pgroup, policy=DEGRADED, env=env) as sb:
        result = await sb.exec(sh('echo "$GREETING"'))
    assert result.stdout == "hello-world-1234\n"


async def test_mask_output_false_shows_the_value(workspace: Path, pgroup: str) -> None:
    policy = Policy(mask_output=False, allow_degraded=True)
    async with Sandbox(workspace, backend=pgroup, policy=policy, env=SECRET_ENV) as sb:
        result = await sb.exec(sh('echo "$API_TOKEN"'))
    assert result.stdout == VALUE + "\n"


async def test_timed_out_run_keeps_masked_output(workspace: Path, pgroup: str) -> None:
    live = bytearray()
    async with Sandbox(
        workspace, backend=pgroup, policy=DEGRADED, limits=Limits(grace_s=0.5), env=SECRET_ENV
    ) as sb:
        result = await sb.exec(
            sh('echo before; printf "tok=%s\\n" "$API_TOKEN"; printf "end s3cr"; sleep 30'),
            timeout=1.0,
            sink=lambda _n, c: live.extend(c),
        )
    assert result.status == "timed_out"
    # the held-back start of a value is let out when the stream ends: nothing is lost
    assert result.stdout == f"before\ntok={MARK}\nend s3cr"
    assert bytes(live) == result.stdout.encode()


def cli(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "run", "-w", str(workspace), "-b", "process-group", "--allow-degraded", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_cli_masks_env_values(workspace: Path, pgroup: str) -> None:
    script = 'echo "$API_TOKEN"; echo "$API_TOKEN" >&2'
    proc = cli(workspace, "-e", f"API_TOKEN={VALUE}", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == MARK + "\n"
    assert MARK in proc.stderr
    assert VALUE not in proc.stdout + proc.stderr
    js = cli(workspace, "--json", "-e", f"API_TOKEN={VALUE}", "--", "sh", "-c", script)
    data = json.loads(js.stdout)
    assert data["stdout"] == MARK + "\n"
    assert data["stderr"] == MARK + "\n"


def test_cli_no_mask_shows_the_value(workspace: Path, pgroup: str) -> None:
    proc = cli(
        workspace, "--no-mask", "-e", f"API_TOKEN={VALUE}", "--", "sh", "-c", 'echo "$API_TOKEN"'
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == VALUE + "\n"


async def test_a_secret_in_the_command_line_is_masked_in_the_result(
    workspace: Path, pgroup: str
) -> None:
    async with Sandbox(workspace, backend=pgroup, env=SECRET_ENV) as sb:
        result = await sb.exec(["sh", "-c", 'echo "$1" | wc -c', "sh", f"--token={VALUE}"])
        shell = await sb.exec(shell=f"echo {VALUE} >/dev/null; echo done")
    assert result.ok and result.stdout.strip() == str(len(f"--token={VALUE}") + 1)
    assert result.argv[-1] == f"--token={MARK}"
    assert VALUE not in json.dumps(result.argv) and VALUE not in json.dumps(shell.argv)
    assert shell.stdout == "done\n"
