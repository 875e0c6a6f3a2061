"""The systemd-scope backend on a real systemd (run inside the systemd test host by
scripts/systemd-host.sh, as root and as a lingering user). Outside such a host the probe fails
and these tests skip with the probe's reason; the last test checks that reason here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from helpers import assert_nothing_left, processes_with_arg, wait_until

from sandboxrun import Limits, Policy, Sandbox
from sandboxrun.backends.housekeeping import list_scopes
from sandboxrun.backends.local.isolation import probe_host
from sandboxrun.backends.registry import probe
from sandboxrun.backends.systemd import config as cfg
from sandboxrun.backends.systemd.backend import (
    SystemdScopeBackend,
    manager_env,
    manager_mode,
    unit_active,
)
from sandboxrun.errors import PolicyRefusedError

pytestmark = pytest.mark.anyio

FAST = Limits(grace_s=0.5, drain_s=0.5)
PROBE = probe("systemd-scope")
DEGRADED = Policy(allow_degraded=True)
needs_systemd = pytest.mark.skipif(
    not PROBE.available, reason=f"systemd-scope unavailable here: {PROBE.reason}"
)
if not PROBE.available and "systemd-scope" in os.environ.get(
    "SANDBOXRUN_REQUIRE_BACKENDS", ""
).split(","):
    raise RuntimeError(f"systemd-scope is required but unavailable: {PROBE.reason}")


def unit_gone(run_id: str) -> bool:
    return not unit_active(cfg.unit_name(run_id))


@needs_systemd
async def test_argv_and_env_reach_the_command_unexpanded(workspace: Path) -> None:
    tricky = ["$VAR", "${x}", "%n", "%%", "two words", "line\nbreak", "\\", "'\"", ""]
    env = {"VAR": "expanded", "x": "expanded", "TRICKY": "$VAR ${x} %n %h\nnext"}
    async with Sandbox(workspace, backend="systemd-scope", limits=FAST, env=env) as sb:
        result = await sb.exec(
            [
                sys.executable,
                "-c",
                "import sys, os; print(repr(sys.argv[1:])); print(repr(os.environ['TRICKY']))",
                *tricky,
            ]
        )
    assert result.status == "completed", result
    assert result.stdout == f"{tricky!r}\n{env['TRICKY']!r}\n"


@needs_systemd
async def test_runs_in_its_own_named_scope_that_is_gone_afterwards(workspace: Path) -> None:
    async with Sandbox(workspace, backend="systemd-scope", limits=FAST) as sb:
        result = await sb.exec(shell="cat /proc/self/cgroup; pwd", workdir="sub/dir")
    unit = cfg.unit_name(result.run_id)
    assert result.status == "completed"
    assert f"/{unit}\n" in result.stdout
    assert result.stdout.endswith("/workspace/sub/dir\n")  # (as on every backend)
    assert "cgroup" in result.isolation
    assert wait_until(lambda: unit_gone(result.run_id))


@needs_systemd
async def test_limits_are_applied_or_reported_missing(workspace: Path) -> None:
    limits = Limits(grace_s=0.5, memory_bytes=64 << 20, pids=40, cpus=0.5)
    degraded = Policy(allow_degraded=True)  # a user manager may not apply them: report it
    async with Sandbox(workspace, backend="systemd-scope", limits=limits, policy=degraded) as sb:
        result = await sb.exec(shell="cat /proc/self/cgroup")
    wanted = {"memory-limit", "cpu-limit", "pids-limit"}
    assert result.status == "completed"
    assert wanted <= set(result.isolation) | set(result.missing_guarantees)
    assert not wanted & set(result.isolation) & set(result.missing_guarantees)
    if manager_mode() == "system":  # the system manager applies them (cgroup v1 and v2)
        assert wanted <= set(result.isolation), result.missing_guarantees


FORK_ONCE = """
import os, sys
try:
    pid = os.fork()
except OSError:
    print("refused")
    sys.exit(0)
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print("forked")
"""
FORKER = """
import os, time
made = 0
for _ in range(60):
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        break
    made += 1
print(made)
"""


@needs_systemd
async def test_strict_with_limits_refuses_only_what_the_manager_cannot_apply(
    workspace: Path,
) -> None:
    limits = Limits(grace_s=0.5, pids=40, memory_bytes=64 << 20)
    policy = Policy(access="danger-full-access", network="on", strict=True)
    wanted = {"pids-limit", "memory-limit"}
    async with Sandbox(workspace, backend="systemd-scope", policy=policy, limits=limits) as sb:
        backend = sb.backend
        assert isinstance(backend, SystemdScopeBackend)
        applied = backend.applied_limits
        assert applied is not None
        if applied == wanted:
            result = await sb.exec(["true"])
            assert result.status == "completed"
            assert result.missing_guarantees == []
        else:
            with pytest.raises(PolicyRefusedError) as info:
                await sb.exec(["true"])
            for name in wanted - applied:
                assert name in str(info.value)
    if manager_mode() == "system":
        assert applied == wanted


@needs_systemd
async def test_pids_limit_stops_a_fork_bomb(workspace: Path) -> None:
    limits = Limits(grace_s=0.5, drain_s=0.5, pids=20)
    async with Sandbox(  # a user manager may not apply it: then the test skips
        workspace, backend="systemd-scope", limits=limits, policy=DEGRADED
    ) as sb:
        result = await sb.exec([sys.executable, "-c", FORKER], timeout=20)
    if "pids-limit" not in result.isolation:
        pytest.skip(f"this manager does not apply TasksMax: {result.missing_guarantees}")
    assert result.status == "completed", result
    assert 0 < int(result.stdout) < 20  # the launcher and the forker count too
    assert result.survivors == 0
    assert_nothing_left(result.run_id)


@needs_systemd
async def test_pids_limit_of_one_still_runs_a_command(workspace: Path) -> None:
    """No room for the keeper: the run goes on without it, and nothing leaks to stderr."""
    limits = Limits(grace_s=0.5, pids=1)
    async with Sandbox(  # a user manager may not apply it: then the test skips
        workspace, backend="systemd-scope", limits=limits, policy=DEGRADED
    ) as sb:
        result = await sb.exec(["echo", "one"])
        forked = await sb.exec([sys.executable, "-c", FORK_ONCE])
    assert (result.status, result.stdout, result.stderr) == ("completed", "one\n", "")
    if "pids-limit" in forked.isolation:
        assert forked.stdout == "refused\n"  # the limit holds, keeper or not
    assert result.survivors == forked.survivors == 0


@needs_systemd
async def test_memory_hog_is_oom_killed(workspace: Path) -> None:
    limits = Limits(grace_s=0.5, memory_bytes=64 << 20)
    async with Sandbox(  # a user manager may not apply it: then the test skips
        workspace, backend="systemd-scope", limits=limits, policy=DEGRADED
    ) as sb:
        result = await sb.exec([sys.executable, "-c", "x = b'a' * (400 << 20); print('survived')"])
    if "memory-limit" not in result.isolation:
        pytest.skip(f"this manager does not apply MemoryMax: {result.missing_guarantees}")
    assert result.status == "oom_killed", result
    assert result.signal == "SIGKILL"
    assert "survived" not in result.stdout


@needs_systemd
async def test_cpu_time_counts_an_orphan(workspace: Path) -> None:
    script = "(setsid sh -c 'i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done' &) ; sleep 3"
    async with Sandbox(workspace, backend="systemd-scope", limits=FAST) as sb:
        result = await sb.exec(shell=script)
    assert result.status == "completed"
    assert result.cpu_s is not None
    assert result.cpu_s > 0.2  # the orphan's busy loop, not only the sleeping main process


@needs_systemd
@pytest.mark.parametrize("delay", [0.0, 0.001, 0.005, 0.02, 0.1])
async def test_cancel_around_scope_creation_leaves_nothing(workspace: Path, delay: float) -> None:
    tok = f"{os.getpid()}{int(delay * 1000)}.5"
    async with Sandbox(workspace, backend="systemd-scope", limits=FAST) as sb:
        with anyio.move_on_after(delay):
            await sb.exec(shell=f"trap '' TERM; (setsid sleep {tok} &); sleep {tok}")
        result = sb.last_result
    assert result is not None
    assert result.status == "cancelled"
    assert result.survivors == 0
    assert wait_until(lambda: not processes_with_arg(tok), 3)
    assert wait_until(lambda: unit_gone(result.run_id), 3)


@needs_systemd
async def test_systemd_run_failure_is_sandbox_error_with_its_message(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit name that is taken (a real scope holds it) makes systemd-run itself fail."""
    taken = f"taken{os.getpid()}"
    holder = subprocess.Popen(
        cfg.systemd_run_argv(
            "systemd-run",
            manager_mode(),
            cfg.unit_name(taken),
            "test",
            Limits(),
            ["sleep", "60"],
        ),
        env=manager_env(manager_mode()),
    )
    try:
        assert wait_until(lambda: not unit_gone(taken))
        monkeypatch.setattr("sandboxrun.api.request.new_run_id", lambda: taken)
        async with Sandbox(workspace, backend="systemd-scope", limits=FAST) as sb:
            result = await sb.exec(["echo", "never"])
        assert result.status == "sandbox_error"
        assert result.error is not None
        assert "systemd-run could not start the scope" in result.error
        assert "already" in result.error.lower()
        assert result.stdout == ""
    finally:
        holder.kill()
        holder.wait()


@needs_systemd
async def test_strict_refuses_what_a_scope_cannot_give(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOXRUN_BWRAP", "/nonexistent/bwrap")  # no local namespaces here
    probe_host.cache_clear()
    try:
        policy = Policy(access="read-only", strict=True, allow_degraded=True)
        with pytest.raises(PolicyRefusedError) as info:
            async with Sandbox(workspace, backend="systemd-scope", policy=policy) as sb:
                await sb.exec(["true"])
    finally:
        monkeypatch.undo()
        probe_host.cache_clear()
    for missing in ("read-only-workspace", "read-only-root", "network-none"):
        assert missing in str(info.value)


def start_host(
    workspace: Path, tmp_path: Path, tok: str, access: str = "workspace-write"
) -> tuple[subprocess.Popen[str], int]:
    """A sandboxrun program whose run is live; returns it and its scope watchdog's pid."""
    script = tmp_path / "host.py"
    script.write_text(
        "import anyio, sys\n"
        "from sandboxrun import Sandbox, Limits, Policy\n"
        "async def main():\n"
        f"    async with Sandbox({str(workspace)!r}, backend='systemd-scope',\n"
        f"                       policy=Policy(access={access!r}),\n"
        "                       limits=Limits(grace_s=0.5)) as sb:\n"
        "        print('watchdog', sb.backend.watchdog.pid, flush=True)\n"
        f"        await sb.exec(shell='(setsid sleep {tok} &); echo started; sleep {tok}',"
        " sink=lambda n, b: print('live', flush=True))\n"
        "anyio.run(main)\n"
    )
    host = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    assert host.stdout is not None
    watchdog = int(host.stdout.readline().split()[1])
    assert host.stdout.readline().startswith("live")
    return host, watchdog


def crash(host: subprocess.Popen[str], watchdog: int) -> None:
    """SIGKILL the sandboxrun program and its scope watchdog: nobody is left to clean up."""
    try:
        os.kill(watchdog, signal.SIGKILL)
    finally:
        host.kill()
        host.wait()
        assert host.stdout is not None
        host.stdout.close()


def units_of(owner: int) -> list[str]:
    """Active sandboxrun units started by the process ``owner``."""
    return [scope.unit for scope in list_scopes() if scope.owner_pid == owner]


@needs_systemd
def test_scopes_of_a_sigkilled_sandboxrun_are_stopped_by_its_watchdog(
    workspace: Path, tmp_path: Path
) -> None:
    tok = f"{os.getpid()}.71"
    host, _ = start_host(workspace, tmp_path, tok)
    try:
        assert wait_until(lambda: len(processes_with_arg(tok)) == 2)
        assert len(units_of(host.pid)) == 1
    finally:
        host.kill()
        host.wait()
        assert host.stdout is not None
        host.stdout.close()
    assert wait_until(lambda: not processes_with_arg(tok), 10)
    assert wait_until(lambda: not units_of(host.pid), 5), units_of(host.pid)


@needs_systemd
def test_clean_stops_units_of_a_crashed_sandboxrun(workspace: Path, tmp_path: Path) -> None:
    """With the watchdog killed too, an unconfined run's scope (``danger-full-access``: no
    PID namespace dies with the owner) outlives its owner until ``clean``."""
    tok = f"{os.getpid()}.77"
    host, watchdog = start_host(workspace, tmp_path, tok, access="danger-full-access")
    crash(host, watchdog)
    time.sleep(0.5)
    assert wait_until(lambda: len(processes_with_arg(tok)) == 2)  # the scope outlives its owner...
    leftover = units_of(host.pid)
    assert len(leftover) == 1
    ps = subprocess.run(
        [sys.executable, "-m", "sandboxrun", "ps"], capture_output=True, text=True, check=False
    )
    row = next(line for line in ps.stdout.splitlines() if leftover[0] in line)
    header = ps.stdout.splitlines()[0]
    assert header.split() == ["ID", "NAME", "KIND", "STATUS", "OWNER", "OWNER", "ALIVE", "AGE"]
    assert row.split()[5] == "no", ps.stdout  # OWNER ALIVE: the owner is gone
    clean = subprocess.run(
        [sys.executable, "-m", "sandboxrun", "clean"], capture_output=True, text=True, check=False
    )
    assert clean.returncode == 0, clean.stderr
    assert "stopped" in clean.stdout
    assert wait_until(lambda: not processes_with_arg(tok), 5)  # ...until clean stops it
    assert wait_until(lambda: not units_of(host.pid), 5), units_of(host.pid)


@needs_systemd
def test_a_crashed_confined_sandbox_leaves_nothing_even_without_watchdog(
    workspace: Path, tmp_path: Path
) -> None:
    """Under the isolation layer the run lives in the sandbox's PID namespace, whose holder
    dies with the owner: owner and watchdog SIGKILLed, nothing of the run is left."""
    tok = f"{os.getpid()}.78"
    host, watchdog = start_host(workspace, tmp_path, tok)
    crash(host, watchdog)
    assert wait_until(lambda: not processes_with_arg(tok), 5), processes_with_arg(tok)
    assert wait_until(lambda: not units_of(host.pid), 5), units_of(host.pid)


def test_probe_reason_is_exact_without_systemd() -> None:
    if Path("/run/systemd/system").is_dir():
        pytest.skip("systemd is running here")
    assert not PROBE.available
    assert PROBE.reason
    known = ("booted with systemd", "Failed to connect to bus", "not found on PATH", "offline")
    assert any(k in PROBE.reason for k in known), PROBE.reason
