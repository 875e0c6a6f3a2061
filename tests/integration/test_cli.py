"""``sandboxrun run`` end to end, as a user runs it: every exit status and the --json shape."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import CLI, cli, processes_with_arg, require_backend, wait_until

from sandboxrun.models import ExecResult

NO_ENGINE = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"}


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
    assert data["stdout"] == "/workspace/sub\n"  # (as on every backend)
    assert data["stderr"] == "e\n"
    assert data["backend"] == "process-group"
    assert data["argv"] == ["sh", "-c", "pwd; echo e >&2"]
    assert data["survivors"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-w", "/nonexistent-ws", "--", "true"], "/nonexistent-ws"),
        (["-C", "../..", "--", "true"], "escapes"),
        (["-e", "NOT_SET_ANYWHERE_X", "--", "true"], "no such variable is set here"),
        (["--env-file", "/nonexistent.env", "--", "true"], "/nonexistent.env: no such file"),
        (["-e", "SANDBOXRUN_X=1", "--", "true"], "SANDBOXRUN_"),
        (["--max-output", "lots", "--", "true"], "--max-output"),
        (["--shell", "--", "echo", "two"], "--shell"),
        (["--pass-env", "GITHUB_TOKEN", "--", "true"], "GITHUB_TOKEN"),
        (["--idle-timeout", "0", "--", "true"], "--idle-timeout must be more than 0"),
    ],
)
def test_input_errors_exit_125_with_one_line(
    workspace: Path, args: list[str], message: str
) -> None:
    proc = cli("run", "-w", str(workspace), *args) if "-w" not in args else cli("run", *args)
    assert proc.returncode == 125, proc.stderr  # sandboxrun's own error, as docker's
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
    """Text mode shows the output live: all of it reached the user, so no truncation notice."""
    proc = cli(
        "run", "-w", str(workspace), "-b", "process-group", "--max-output", "100",
        "--", "sh", "-c", "seq 1 1000; echo err >&2",
    )  # fmt: skip
    assert proc.returncode == 0
    assert proc.stdout == "".join(f"{i}\n" for i in range(1, 1001))
    assert proc.stderr == "err\n"


def test_truncation_is_said_when_output_was_not_shown_live(workspace: Path) -> None:
    args = ["--max-output", "100", "--", "seq", "1", "1000"]
    rc, data = run_json(workspace, *args)
    assert rc == 0 and data["stdout_truncated"] is True
    assert data["stdout_spill"] is None  # removed with the sandbox: the result names no file
    proc = cli("run", "-w", str(workspace), "-b", "process-group", "--json", *args)
    omitted = int(str(data["stdout_dropped_bytes"]))
    assert proc.stderr.splitlines() == [
        f"sandboxrun: stdout truncated ({omitted} bytes omitted, full stream not kept; "
        "--keep-spill keeps it)"
    ]


def test_keep_spill_keeps_and_names_the_full_stream(workspace: Path) -> None:
    full = "".join(f"{i}\n" for i in range(1, 1001))
    proc = cli(
        "run", "-w", str(workspace), "-b", "process-group", "--max-output", "100",
        "--keep-spill", "--", "seq", "1", "1000",
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == full
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandboxrun: stdout kept in /"), lines
    assert Path(lines[0].removeprefix("sandboxrun: stdout kept in ")).read_text() == full
    rc, data = run_json(workspace, "--keep-spill", "--max-output", "100", "--", "seq", "1", "1000")
    assert rc == 0 and Path(str(data["stdout_spill"])).read_text() == full


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


# -- issue 11: a CLI that behaves like `docker run` and GNU `timeout` --------------------------


def test_version() -> None:
    proc = cli("--version")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "sandboxrun 0.1.0\n", "")


def assert_one_error_line(stderr: str, message: str) -> None:
    """sandboxrun's one error style: one ``sandboxrun: error:`` line, at most a hint after it,
    never typer's boxes or click's ``Usage:``/``Error:`` lines."""
    lines = stderr.splitlines()
    assert 1 <= len(lines) <= 2, stderr
    assert lines[0].startswith("sandboxrun: error: "), stderr
    assert message in lines[0], stderr
    assert not any(line.startswith("sandboxrun:") for line in lines[1:]), stderr
    assert "Usage:" not in stderr and "Error:" not in stderr and "╭" not in stderr


@pytest.mark.parametrize(
    ("args", "message", "kind", "option"),
    [
        (["--bogus", "--", "true"], "no such option: --bogus", "UsageError", None),
        (["-b", "nope", "--", "true"], "'nope' is not one of", "UsageError", "--backend"),
        ([], "missing argument 'COMMAND", "UsageError", None),
        (["-t", "10x", "--", "true"], "invalid --timeout '10x'", "ConfigError", "--timeout"),
        (["--pids", "0", "--", "true"], "--pids must be at least 1", "ConfigError", "--pids"),
        (["-w", "/nonexistent-ws", "--", "true"], "/nonexistent-ws", "WorkspaceError", None),
        (["-e", "NOT_SET_X", "--", "true"], "no such variable", "EnvError", "--env"),
    ],
)
def test_json_usage_and_input_errors_are_one_json_object(
    workspace: Path, args: list[str], message: str, kind: str, option: str | None
) -> None:
    where = [] if "-w" in args else ["-w", str(workspace)]
    proc = cli("run", *where, "-b", "process-group", "--json", *args)
    assert proc.returncode == 125
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    error = json.loads(lines[0])["error"]
    assert (error["type"], error["exit_status"], error.get("option")) == (kind, 125, option)
    assert message in error["message"]
    assert_one_error_line(proc.stderr, message)


def test_json_after_the_command_is_the_commands(workspace: Path) -> None:
    """``--json`` after COMMAND is COMMAND's argument: a usage error then prints no JSON."""
    proc = cli("run", "-w", str(workspace), "--bogus", "--", "echo", "--json")
    assert proc.returncode == 125 and proc.stdout == ""


def test_json_refusal_and_unavailable_backend_are_json_errors(workspace: Path) -> None:
    marker = workspace / "ran"
    proc = cli(
        "run", "-w", str(workspace), "-b", "process-group", "--json", "--", "touch", str(marker),
        env=NO_BWRAP,
    )  # fmt: skip
    assert proc.returncode == 125
    error = json.loads(proc.stdout)["error"]
    assert (error["type"], error["exit_status"], error["backend"]) == (
        "PolicyRefusedError", 125, "process-group",
    )  # fmt: skip
    assert "network-none" in error["missing"]
    assert_one_error_line(proc.stderr, "refusing to run")
    assert not marker.exists()
    proc = cli("run", "-w", str(workspace), "-b", "docker", "--json", "--", "true", env=NO_ENGINE)
    assert proc.returncode == 125
    error = json.loads(proc.stdout)["error"]
    assert (error["type"], error["backend"]) == ("SandboxUnavailableError", "docker")
    assert_one_error_line(proc.stderr, "docker")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus", "--", "true"], "no such option: --bogus"),
        (["--cpus", "abc", "--", "true"], "invalid --cpus 'abc'"),
        (["--network", "maybe", "--", "true"], "invalid value for '--network'"),
        ([], "missing argument 'COMMAND"),
        (["-t", "0", "--", "true"], "--timeout must be more than 0"),
        (["--grace", "-1", "--", "true"], "--grace must not be negative"),
        (["--pids", "0", "--", "true"], "--pids must be at least 1"),
        (["--cpus", "0", "--", "true"], "--cpus must be more than 0"),
        (["--cpus", "9999", "--", "true"], "--cpus 9999 is more than this host's"),
        (["--memory", "100", "--", "true"], "--memory must be at least 6m"),
        (["--max-timeout", "10m", "-t", "9999", "--", "true"], "is above the maximum of 10m"),
    ],
)
def test_errors_have_one_style_and_name_the_option(
    workspace: Path, args: list[str], message: str
) -> None:
    proc = cli("run", "-w", str(workspace), "-b", "process-group", *args)
    assert proc.returncode == 125
    assert proc.stdout == ""
    assert_one_error_line(proc.stderr, message)
    assert "timeout_s" not in proc.stderr and "grace_s" not in proc.stderr


def test_top_level_errors_have_the_same_style() -> None:
    proc = cli("nosuchcommand")
    assert proc.returncode == 125
    assert_one_error_line(proc.stderr, "no such command 'nosuchcommand'")


def test_any_timeout_runs_unless_an_operator_set_a_cap(workspace: Path) -> None:
    # issue 20: `-t 30m` was refused (exit 2) unless --max-timeout was raised
    rc, data = run_json(workspace, "-t", "30m", "--", "true")
    assert (rc, data["status"]) == (0, "completed")
    marker = workspace / "ran"
    capped = {**os.environ, "SANDBOXRUN_MAX_TIMEOUT": "10m"}  # an operator's cap
    proc = cli("run", "-w", str(workspace), "-b", "process-group", "-t", "9999",
               "--", "touch", str(marker), env=capped)  # fmt: skip
    assert proc.returncode == 125
    assert "--timeout 9999 is above the maximum of 10m" in proc.stderr
    assert "SANDBOXRUN_MAX_TIMEOUT" in proc.stderr
    assert not marker.exists()
    proc = cli("run", "-w", str(workspace), "-b", "process-group", "--max-timeout", "3h",
               "-t", "9999", "--", "touch", str(marker), env=capped)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()


def test_durations_with_units(workspace: Path) -> None:
    start = time.monotonic()
    proc = cli("run", "-w", str(workspace), "-b", "process-group", "-t", "1500ms",
               "--grace", "200ms", "--", "sleep", "30")  # fmt: skip
    assert proc.returncode == 124
    assert time.monotonic() - start < 15
    assert proc.stderr.splitlines()[-1] == "sandboxrun: timed out after 1.5s"
    rc, data = run_json(workspace, "-t", "10m", "--idle-timeout", "1m", "--", "true")
    assert (rc, data["status"]) == (0, "completed")


def test_run_help_documents_every_option() -> None:
    proc = cli("run", "--help")
    assert proc.returncode == 0
    assert "Usage: sandboxrun run [OPTIONS] [--] COMMAND [ARGS]..." in proc.stdout
    body = proc.stdout.split("Options:", 1)[1]
    entries: list[list[str]] = []
    for line in body.splitlines():
        if line.startswith("  -"):
            entries.append([line.strip()])
        elif line.startswith("    ") and entries:
            entries[-1].append(line.strip())
    assert len(entries) >= 30
    for entry in entries:
        signature, _, help_text = entry[0].partition("  ")
        text = " ".join([help_text.strip(), *entry[1:]]).strip()
        assert text, f"{signature}: no help"
        takes_value = len(signature.split(", ")[-1].split()) > 1  # "--timeout DURATION"
        if takes_value:
            assert "default" in text, f"{signature}: no default in {text!r}"
    assert "stdin is closed" in " ".join(proc.stdout.split())  # without -i (however wrapped)


def containers_created_by(pid: int, since: float) -> list[str]:
    """Containers the process ``pid`` created since ``since`` (the engine's events, filtered
    by sandboxrun's owner label: other sessions' containers do not count)."""
    from sandboxrun.backends.docker import api as dockerapi

    client = dockerapi.connect(10)
    try:
        events = client.events(
            since=int(since) - 1,
            until=int(time.time()) + 1,
            decode=True,
            filters={"type": "container", "event": "create",
                     "label": f"sandboxrun.owner_pid={pid}"},
        )  # fmt: skip
        return [str(event["id"]) for event in events]
    finally:
        client.close()


def test_memory_below_dockers_minimum_is_refused_before_any_container(workspace: Path) -> None:
    require_backend("docker")
    since = time.time()
    refused = subprocess.run(
        [*CLI, "run", "-w", str(workspace), "-b", "docker", "--memory", "1k", "--", "true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 125
    assert refused.stderr.startswith("sandboxrun: error: --memory must be at least 6m")
    assert len(refused.stderr.splitlines()) == 1
    proc = subprocess.Popen(
        [*CLI, "run", "-w", str(workspace), "-b", "docker", "--memory", "1k", "--", "true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    proc.communicate(timeout=60)
    accepted = subprocess.Popen(  # the control: a valid run's container is seen
        [*CLI, "run", "-w", str(workspace), "-b", "docker", "--memory", "64m", "--", "true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    accepted.communicate(timeout=60)
    assert accepted.returncode == 0
    assert containers_created_by(proc.pid, since) == []
    assert len(containers_created_by(accepted.pid, since)) == 1


def test_without_i_stdin_is_closed(workspace: Path) -> None:
    proc = subprocess.run(
        [*CLI, "run", "-w", str(workspace), "-b", "process-group", "--", "cat"],
        input="hi\n", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, "")


@pytest.mark.parametrize("backend_name", ["process-group", "docker"])
def test_interactive_streams_stdin(workspace: Path, backend_name: str) -> None:
    """``-i`` forwards stdin as it arrives: ``head -n1`` answers and ends while our end of
    the pipe is still open (a CLI that read stdin whole first would wait for EOF forever)."""
    require_backend(backend_name)
    proc = subprocess.Popen(
        [*CLI, "run", "-w", str(workspace), "-b", backend_name, "-i", "--", "head", "-n1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"first\n")
        proc.stdin.flush()
        rc = proc.wait(timeout=60)  # stdin still open
        out = proc.stdout.read()
    finally:
        proc.kill()
        proc.stdin.close()
        proc.stdout.close()
        assert proc.stderr is not None
        proc.stderr.close()
    assert (rc, out) == (0, b"first\n")


def test_interactive_endless_producer_and_whole_file(workspace: Path, tmp_path: Path) -> None:
    producer = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        proc = subprocess.run(
            [*CLI, "run", "-w", str(workspace), "-b", "process-group", "-i", "--", "head", "-n2"],
            stdin=producer.stdout, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        producer.kill()
        producer.wait()
        assert producer.stdout is not None
        producer.stdout.close()
    assert (proc.returncode, proc.stdout) == (0, b"y\ny\n")
    data = tmp_path / "data"
    data.write_bytes(os.urandom(3_000_000))
    with data.open("rb") as source:  # a regular file: not pollable, read straight away
        proc = subprocess.run(
            [*CLI, "run", "-w", str(workspace), "-b", "process-group", "-i", "--",
             "sha256sum"],
            stdin=source, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    assert proc.returncode == 0
    assert proc.stdout.split()[0].decode() == hashlib.sha256(data.read_bytes()).hexdigest()


def test_out_of_memory_ends_with_one_line(workspace: Path) -> None:
    require_backend("docker")
    proc = cli("run", "-w", str(workspace), "-b", "docker", "--memory", "32m", "--grace", "0.2",
               "--", "tail", "/dev/zero")  # fmt: skip
    assert proc.returncode == 137
    assert proc.stderr.splitlines() == [
        "sandboxrun: killed: out of memory (limit 32m); a larger --memory allows more"
    ]


def test_ctrl_c_in_text_mode_ends_with_cancelled(workspace: Path) -> None:
    proc = subprocess.Popen(
        [*CLI, "run", "-w", str(workspace), "-b", "process-group", "--grace", "0.5",
         "--shell", "--", "echo started; sleep 7654.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: bool(processes_with_arg("7654.5")), 10)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert err.splitlines() == ["sandboxrun: cancelled"]
    assert not processes_with_arg("7654.5")
