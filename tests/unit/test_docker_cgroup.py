"""The docker exec start stub on a real ``sh`` and the cgroup helpers' parsing."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandboxrun.backends.docker.cgroup import is_stub, populated, stub_argv
from sandboxrun.supervisor import procfs as proctree


def wait_state(pid: int, state: str, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        proc = proctree.read_proc(pid)
        if proc is not None and proc.state == state:
            return True
        time.sleep(0.005)
    return False


def test_the_stub_stops_itself_then_becomes_the_command_verbatim() -> None:
    argv = ["printf", "%s|", "a b", "$x", "", "*", "-n"]
    proc = subprocess.Popen(stub_argv(argv), stdout=subprocess.PIPE)
    try:
        assert wait_state(proc.pid, "T"), "the stub did not stop itself"
        assert is_stub(proc.pid)
        time.sleep(0.1)
        assert proctree.read_proc(proc.pid).state == "T"  # type: ignore[union-attr]
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=5)
    finally:
        proc.kill()
        proc.wait()
    assert out == b"a b|$x||*|-n|"
    assert proc.returncode == 0


def test_is_stub_is_false_once_the_command_runs_and_for_other_processes() -> None:
    proc = subprocess.Popen(stub_argv(["sleep", "5"]))
    try:
        assert wait_state(proc.pid, "T")
        os.kill(proc.pid, signal.SIGCONT)
        end = time.monotonic() + 5
        while is_stub(proc.pid) and time.monotonic() < end:
            time.sleep(0.005)
        assert not is_stub(proc.pid)
        assert proctree.alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not is_stub(os.getpid())
    assert not is_stub(2**22 + 12345)  # no such process


def test_populated_reads_the_v2_flag(tmp_path: Path) -> None:
    assert not populated(tmp_path / "gone")
    (tmp_path / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert not populated(tmp_path)
    (tmp_path / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    assert populated(tmp_path)


class SlowStub:
    """A run cgroup whose one member (a stub) takes ``delay`` seconds to stop itself."""

    def __init__(self, delay: float) -> None:
        self.ready = time.monotonic() + delay

    def adopt(self) -> list[proctree.Proc]:
        state = "T" if time.monotonic() >= self.ready else "S"
        return [proctree.Proc(pid=4242, ppid=1, state=state, start=1)]


def test_a_stub_slow_to_stop_is_waited_for_and_continued(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a tiny CPU share the stub may take seconds to reach ``kill -STOP``: giving up on it
    would leave it stopped forever (a ``true`` would then time out)."""
    from sandboxrun.backends.docker import engine_exec as docker_run

    continued: list[tuple[list[int], int]] = []
    monkeypatch.setattr(docker_run, "is_stub", lambda pid: True)
    monkeypatch.setattr(
        proctree, "signal_all", lambda procs, sig: continued.append(([p.pid for p in procs], sig))
    )
    run = object.__new__(docker_run.DockerRun)
    run.tty = None  # (no __init__: a plain exec)
    start = time.monotonic()
    run._adopt(SlowStub(1.5))  # type: ignore[arg-type]
    assert time.monotonic() - start >= 1.5
    assert continued == [([4242], signal.SIGCONT)]


def test_a_stub_continued_by_someone_else_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sandboxrun.backends.docker import engine_exec as docker_run

    monkeypatch.setattr(docker_run, "is_stub", lambda pid: False)  # it already runs the command
    run = object.__new__(docker_run.DockerRun)
    run.tty = None  # (no __init__: a plain exec)
    start = time.monotonic()
    run._adopt(SlowStub(60))  # type: ignore[arg-type]
    assert time.monotonic() - start < 1
