"""The result contract, the same assertions on every backend: statuses, exit codes, signals,
environment, working-directory mapping, stdin, output accounting and spill, survivors.

``sandboxrun.testing.FakeBackend`` passes it too, scripted by ``scripted`` below (what each of
these commands does, computed from the plan it is given: its env, cwd, stdin and the files):
the engine assembles its results exactly as it does the real backends'."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest
from conformance_helpers import assert_container_clean, assert_scope_gone
from helpers import assert_nothing_left, require_backend

from sandboxrun import Limits, Sandbox
from sandboxrun.engine.launch import Launch
from sandboxrun.models import ExecResult
from sandboxrun.testing import FakeBackend, Reply

pytestmark = pytest.mark.anyio

FAST = Limits(grace_s=0.5, drain_s=0.5)
LINES = "i=0; while [ $i -lt 20000 ]; do printf 'line %06d\\n' $i; i=$((i+1)); done"
ENV_LINE = 'echo "given=$GIVEN passed=$SBR_TEST_PASSED secret=${SBR_TEST_SECRET-unset}"'


@pytest.fixture(params=["process-group", "docker", "systemd-scope", "fake"])
def backend(request: pytest.FixtureRequest) -> str:
    """Every backend, and the fake."""
    return "fake" if request.param == "fake" else require_backend(str(request.param))


def scripted(launch: Launch) -> Reply:
    """What the commands of this module do, for ``FakeBackend``: read from the plan."""
    request, env, cwd = launch.request, launch.env, Path(launch.cwd)
    script = request.script
    if script is not None and script.startswith("echo out; echo err >&2; exit "):
        return Reply("out\n", "err\n", exit_code=int(script.rsplit(" ", 1)[1]))
    if script == ENV_LINE:
        secret = env.get("SBR_TEST_SECRET", "unset")
        return Reply(f"given={env['GIVEN']} passed={env['SBR_TEST_PASSED']} secret={secret}\n")
    if script == "pwd; cat ../../hello.txt":
        return Reply(f"{cwd}\n{(cwd / '../../hello.txt').read_text()}")
    if script == "echo made > sub/new.txt":
        (cwd / "sub" / "new.txt").write_text("made\n")
        return Reply()
    if script == LINES:
        return Reply("".join(f"line {i:06d}\n" for i in range(20000)))
    if script == "echo partial; sleep 30":
        return Reply("partial\n", duration_s=30)
    argv = launch.argv
    if argv == ["sh", "-c", "kill -TERM $$"]:
        return Reply(signal=signal.SIGTERM)
    if argv == ["sh", "-c", "wc -c; :"]:
        return Reply(f"{len(request.stdin or b'')}\n")  # type: ignore[arg-type]
    if argv == ["true"]:
        return Reply()
    path = cwd / argv[0]
    if "/" in argv[0] and path.exists() and not os.access(path, os.X_OK):
        return Reply(spawn_errno=errno.EACCES)
    return Reply(spawn_errno=errno.ENOENT)


async def run(
    workspace: Path, backend: str, *argv: str, limits: Limits = FAST, **kwargs: object
) -> ExecResult:
    chosen = FakeBackend(scripted) if backend == "fake" else backend
    async with Sandbox(workspace, backend=chosen, limits=limits, keep_spill=True) as sb:
        result = await sb.exec(list(argv) if argv else None, **kwargs)  # type: ignore[arg-type]
        await assert_container_clean(sb)
    assert result.backend == backend
    assert result.survivors == 0
    assert_nothing_left(result.run_id)
    assert_scope_gone(backend, result.run_id)
    return result


@pytest.mark.parametrize(("code", "status"), [(0, "completed"), (1, "failed"), (42, "failed")])
async def test_exit_code_is_data(workspace: Path, backend: str, code: int, status: str) -> None:
    result = await run(workspace, backend, shell=f"echo out; echo err >&2; exit {code}")
    assert (result.status, result.exit_code, result.signal) == (status, code, None)
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert result.stdout_total_bytes == 4
    assert not result.timed_out
    assert result.ok is (code == 0)


async def test_killed_by_a_signal_it_sent_itself(workspace: Path, backend: str) -> None:
    result = await run(workspace, backend, "sh", "-c", "kill -TERM $$")
    assert (result.status, result.exit_code, result.signal) == ("failed", None, "SIGTERM")


def spawn_status(result: ExecResult) -> str:
    """The supervisor (local backends, docker's in-container one) sees the exec fail: under the
    login-shell snapshot an argv runs with no shell in between. Docker's engine path execs
    through its start stub, whose ``exec`` fails and exits 126/127, which cannot be told from
    a command that exits so itself (docs/docker.md)."""
    return "failed" if result.backend == "docker" and result.via == "engine" else "spawn_error"


async def test_command_not_found_is_spawn_error_127(workspace: Path, backend: str) -> None:
    result = await run(workspace, backend, "no-such-command-sandboxrun")
    assert result.status == spawn_status(result)
    assert result.exit_code == 127
    assert result.stdout == ""


async def test_not_executable_is_spawn_error_126(workspace: Path, backend: str) -> None:
    script = workspace / "not-exec.sh"
    script.write_text("#!/bin/sh\necho no\n")
    script.chmod(0o644)
    result = await run(workspace, backend, "./not-exec.sh")
    assert result.status == spawn_status(result)
    assert result.exit_code == 126
    assert result.stdout == ""


async def test_environment_is_built_not_inherited(
    workspace: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SBR_TEST_SECRET", "leak")
    monkeypatch.setenv("SBR_TEST_PASSED", "passed on")
    result = await run(
        workspace,
        backend,
        shell=ENV_LINE,
        env={"GIVEN": "a b $c"},
        pass_env=["SBR_TEST_PASSED"],
    )
    assert result.stdout == "given=a b $c passed=passed on secret=unset\n"


async def test_workdir_is_mapped_into_the_sandbox(workspace: Path, backend: str) -> None:
    result = await run(workspace, backend, shell="pwd; cat ../../hello.txt", workdir="sub/dir")
    # on every backend (the local ones bind it there too; the fake is the host's view)
    expected = str(workspace / "sub" / "dir") if backend == "fake" else "/workspace/sub/dir"
    assert result.stdout == f"{expected}\nhello\n"


async def test_writes_in_the_workspace_reach_the_host(workspace: Path, backend: str) -> None:
    result = await run(workspace, backend, shell="echo made > sub/new.txt")
    assert result.status == "completed"
    assert (workspace / "sub" / "new.txt").read_text() == "made\n"


async def test_stdin_bytes_arrive_exactly(workspace: Path, backend: str) -> None:
    data = bytes(range(256)) * 1024
    result = await run(workspace, backend, "sh", "-c", "wc -c; :", stdin=data)
    assert result.stdout.strip() == str(len(data))


async def test_output_accounting_and_spill_are_exact(
    workspace: Path, backend: str, spill_root: Path
) -> None:
    limits = Limits(grace_s=0.5, drain_s=0.5, max_output=1024, spill_max=64 << 20)
    lines = "".join(f"line {i:06d}\n" for i in range(20000))
    result = await run(
        workspace,
        backend,
        shell=LINES,
        limits=limits,
    )
    assert result.status == "completed"
    assert result.stdout_total_bytes == len(lines)
    assert result.stdout_truncated
    assert result.stdout_dropped_bytes == len(lines) - limits.max_output
    assert result.stdout.startswith("line 000000\n")
    assert result.stdout.endswith("line 019999\n")
    assert result.stdout_spill is not None and result.stdout_spill_complete
    assert Path(result.stdout_spill).read_text() == lines
    assert Path(result.stdout_spill).is_relative_to(spill_root)
    assert result.stderr_total_bytes == 0 and result.stderr_spill is None


async def test_timeout_reports_timed_out_with_the_deadline_kept(
    workspace: Path, backend: str
) -> None:
    result = await run(workspace, backend, shell="echo partial; sleep 30", timeout=1)
    assert result.status == "timed_out" and result.timed_out
    assert result.stdout == "partial\n"
    assert 1.0 <= result.duration_s < 1.0 + FAST.grace_s + 2.0
    assert result.exit_code is None


async def test_isolation_and_missing_guarantees_are_disjoint(workspace: Path, backend: str) -> None:
    result = await run(workspace, backend, "true")
    assert result.status == "completed"
    assert result.isolation
    assert not set(result.isolation) & set(result.missing_guarantees)
    assert result.run_id and result.argv
