"""``sandboxrun run`` end to end, as a user runs it: every exit status and the --json shape."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import processes_with_arg, wait_until

from sandboxrun.models import ExecResult

CLI = [sys.executable, "-m", "sandboxrun"]


NO_ENGINE = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def cli(
    *args: str, cwd: Path | None = None, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        check=False,
        env=env,
    )


def run_json(workspace: Path, *args: str) -> tuple[int, dict[str, object]]:
    proc = cli("run", "-w", str(workspace), "-b", "process-group", "--json", *args)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    return proc.returncode, json.loads(lines[0])


@pytest.mark.parametrize(
    ("args", "code", "status"),
    [
        (["--", "true"], 0, "completed"),
        (["--", "sh", "-c", "exit 3"], 3, "failed"),
        (["-t", "0.5", "--grace", "0.2", "--", "sleep", "30"], 124, "timed_out"),
        (["--", "./not-executable"], 126, "spawn_error"),
        (["--", "no-such-command-abc"], 127, "spawn_error"),
        (["--", "sh", "-c", "kill -TERM $$"], 128 + 15, "failed"),
        (["--shell", "--", "exit 7"], 7, "failed"),
    ],
)
def test_exit_status_and_json(workspace: Path, args: list[str], code: int, status: str) -> None:
    (workspace / "not-executable").write_text("echo\n")
    rc, data = run_json(workspace, *args)
    assert rc == code
    assert data["status"] == status
    assert set(data) == set(ExecResult.model_fields)
    ExecResult.model_validate(data)


def test_json_holds_output_and_facts(workspace: Path) -> None:
    rc, data = run_json(workspace, "-C", "sub", "--", "sh", "-c", "pwd; echo e >&2")
    assert rc == 0
    assert data["stdout"] == f"{(workspace / 'sub').resolve()}\n"
    assert data["stderr"] == "e\n"
    assert data["backend"] == "process-group"
    assert data["argv"] == ["sh", "-c", "pwd; echo e >&2"]
    assert data["survivors"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-w", "/nonexistent-ws", "--", "true"], "/nonexistent-ws"),
        (["-C", "../..", "--", "true"], "escapes"),
        (["-e", "NOEQUALS", "--", "true"], "NAME=VALUE"),
        (["-e", "SANDBOXRUN_X=1", "--", "true"], "SANDBOXRUN_"),
        (["--max-output", "lots", "--", "true"], "--max-output"),
        (["--shell", "--", "echo", "two"], "--shell"),
        (["--pass-env", "GITHUB_TOKEN", "--", "true"], "GITHUB_TOKEN"),
        (["--idle-timeout", "0", "--", "true"], "invalid --idle-timeout"),
    ],
)
def test_input_errors_exit_2_with_one_line(workspace: Path, args: list[str], message: str) -> None:
    proc = cli("run", "-w", str(workspace), *args) if "-w" not in args else cli("run", *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


def test_idle_timeout_exits_124_and_says_so(workspace: Path) -> None:
    args = ["--idle-timeout", "1", "--grace", "0.2", "--", "sh", "-c", "echo a; sleep 30"]
    rc, data = run_json(workspace, *args)
    assert (rc, data["status"], data["timeout_kind"]) == (124, "timed_out", "idle")
    assert data["error"] == "no output for 1s (idle timeout)"
    assert float(str(data["duration_s"])) < 10
    proc = cli("run", "-w", str(workspace), "-b", "process-group", *args)
    assert proc.returncode == 124
    assert proc.stdout == "a\n"
    assert "no output for 1s (idle timeout)" in proc.stderr


def test_unavailable_backend_exits_125(workspace: Path) -> None:
    start = time.monotonic()
    proc = cli("run", "-w", str(workspace), "-b", "docker", "--", "true", env=NO_ENGINE)
    assert proc.returncode == 125
    assert "docker" in proc.stderr
    assert time.monotonic() - start < 5  # "within a few seconds": the probe fails fast, no retry


NO_BWRAP = {**os.environ, "SANDBOXRUN_BWRAP": "/nonexistent/bwrap"}
"""A host where the local isolation layer has no namespaces (no bubblewrap)."""


def test_strict_refuses_and_runs_nothing(workspace: Path) -> None:
    marker = workspace / "ran"
    proc = cli(
        "run", "-w", str(workspace), "-b", "process-group", "--strict", "--allow-degraded",
        "--", "touch", str(marker), env=NO_BWRAP,
    )  # fmt: skip
    assert proc.returncode == 125
    assert "network-none" in proc.stderr
    assert "read-only-root" in proc.stderr
    assert "--strict" in proc.stderr
    assert not marker.exists()


def test_missing_guarantees_refuse_by_default(workspace: Path) -> None:
    marker = workspace / "ran"
    proc = cli(
        "run", "-w", str(workspace), "-b", "process-group", "--", "touch", str(marker),
        env=NO_BWRAP,
    )  # fmt: skip
    assert proc.returncode == 125
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "--allow-degraded" in proc.stderr and "bubblewrap" in proc.stderr
    assert not marker.exists()


def test_allow_degraded_missing_guarantees_are_one_warning(workspace: Path) -> None:
    proc = cli(
        "run", "-w", str(workspace), "-b", "process-group", "--allow-degraded",
        "--", "echo", "hi", env=NO_BWRAP,
    )  # fmt: skip
    assert proc.returncode == 0
    assert proc.stdout == "hi\n"
    warnings = [line for line in proc.stderr.splitlines() if "cannot enforce" in line]
    assert len(warnings) == 1
    assert "network-none" in warnings[0]


def test_live_output_and_summary_line(workspace: Path) -> None:
    proc = cli(
        "run", "-w", str(workspace), "-b", "process-group", "--max-output", "100",
        "--", "sh", "-c", "seq 1 1000; echo err >&2",
    )  # fmt: skip
    assert proc.returncode == 0
    assert proc.stdout == "".join(f"{i}\n" for i in range(1, 1001))
    summary = [line for line in proc.stderr.splitlines() if "truncated" in line]
    assert len(summary) == 1
    assert "stdout truncated" in summary[0]


def test_dry_run_prints_argv_and_runs_nothing(workspace: Path) -> None:
    marker = workspace / "ran"
    proc = cli(
        "run", "-w", str(workspace), "-b", "process-group", "--dry-run", "--shell",
        "--", f"touch {marker}",
    )  # fmt: skip
    assert proc.returncode == 0
    assert "touch" in proc.stdout
    assert proc.stdout.startswith("/")  # the absolute login shell
    assert " -lc " in proc.stdout
    assert not marker.exists()


def test_ctrl_c_cancels_kills_and_exits_130(workspace: Path) -> None:
    proc = subprocess.Popen(
        [*CLI, "run", "-w", str(workspace), "-b", "process-group", "--json", "--grace", "0.5",
         "--shell", "--", "echo partial; (setsid sleep 5432.75 &); sleep 5432.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: bool(processes_with_arg("5432.5")), 10)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 130
    data = json.loads(out)
    assert data["status"] == "cancelled"
    assert data["stdout"] == "partial\n"
    assert not processes_with_arg("5432.5")
    assert not processes_with_arg("5432.75")


def test_escape_sequences_are_neutralized_on_a_tty(workspace: Path) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # child: the CLI with a terminal as stdout
        os.execv(
            sys.executable,
            [*CLI, "run", "-w", str(workspace), "-b", "process-group", "--",
             "printf", r"a\033]0;pwned\007b\033[2Jc"],
        )  # fmt: skip
    chunks = []
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    screen = b"".join(chunks)
    assert b"\x1b" not in screen
    assert b"a^[]0;pwned^Gb^[[2Jc" in screen


def test_doctor_reports_every_backend() -> None:
    proc = cli("doctor", "--json", env=NO_ENGINE)
    report = json.loads(proc.stdout)
    rows = report["backends"]
    assert [r["backend"] for r in rows] == ["docker", "systemd-scope", "process-group"]
    by_name = {r["backend"]: r for r in rows}
    assert by_name["process-group"]["available"] is True
    assert "own-session" in by_name["process-group"]["isolation"]
    assert by_name["docker"]["available"] is False
    assert by_name["docker"]["reason"]
    layers = {row["layer"]: row for row in report["local_layers"]}
    assert set(layers) == {"namespaces (bubblewrap)", "landlock", "seccomp"}
    assert all(row["available"] or row["reason"] for row in layers.values())


def test_doctor_names_the_missing_layer_and_how_to_get_it() -> None:
    proc = cli("doctor", env={**NO_ENGINE, "SANDBOXRUN_BWRAP": "/nonexistent/bwrap"})
    line = next(x for x in proc.stdout.splitlines() if "bubblewrap" in x)
    assert "unavailable" in line and "apt-get install bubblewrap" in line
    pg = next(x for x in proc.stdout.splitlines() if x.startswith("process-group"))
    assert "network-none" not in pg and "landlock" in pg


def test_stalled_terminal_does_not_stall_the_deadline(workspace: Path) -> None:
    """Nobody reads our terminal (Ctrl-S): the timeout must still fire on time. (A pipe nobody
    reads holds the CLI like it holds ``cat``: see test_live_output.py.)"""
    master, slave = pty.openpty()
    start = time.monotonic()
    proc = subprocess.Popen(
        [*CLI, "run", "-w", str(workspace), "-b", "process-group", "-t", "2", "--grace", "0.5",
         "--", "yes"],
        stdout=slave, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(slave)
    try:
        rc = proc.wait(timeout=30)
        elapsed = time.monotonic() - start
    finally:
        proc.kill()
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        proc.stderr.close()
        os.close(master)
    assert rc == 124, err
    assert elapsed < 2 + 0.5 + 5 + 5  # deadline, grace, the bounded flush, interpreter start
    assert "not shown" in err


def test_second_ctrl_c_still_prints_the_result(workspace: Path) -> None:
    proc = subprocess.Popen(
        [*CLI, "run", "-w", str(workspace), "-b", "process-group", "--json", "--grace", "1",
         "--shell", "--", "trap '' TERM; echo partial; sleep 6543.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: bool(processes_with_arg("6543.5")), 10)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert json.loads(out)["status"] == "cancelled"
    assert not processes_with_arg("6543.5")
