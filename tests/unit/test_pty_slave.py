"""``engine.pty_slave``: a terminal reached through its slave and /proc (docker's engine path),
against real pseudo-terminals and processes of this host (no docker needed)."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator

import pytest

from sandboxrun.engine.pty_slave import SlaveLink, check_slave, open_slave
from sandboxrun.supervisor.procfs import read_proc


@pytest.fixture
def session() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A shell leading its own session on a fresh terminal; yields it and the master."""
    master, slave = pty.openpty()

    def take_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        ["sh", "-c", "trap 'exit 7' INT; while :; do sleep 0.05; done"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=take_terminal,
    )
    os.close(slave)
    try:
        yield proc, master
    finally:
        proc.kill()
        proc.wait()
        os.close(master)


def link_to(proc: subprocess.Popen[bytes]) -> SlaveLink:
    known = read_proc(proc.pid)
    assert known is not None
    return SlaveLink(open_slave(proc.pid), proc.pid, known.start)


def test_only_a_slave_is_a_slave(session: tuple[subprocess.Popen[bytes], int]) -> None:
    _, master = session
    assert check_slave(master) is not None
    r, w = os.pipe()
    try:
        assert check_slave(r) == "it is not a pseudo-terminal's slave"
    finally:
        os.close(r)
        os.close(w)


def test_a_process_whose_input_is_no_terminal_is_refused() -> None:
    proc = subprocess.Popen(["sleep", "30"], stdin=subprocess.PIPE)
    try:
        with pytest.raises(OSError, match="not a pseudo-terminal's slave"):
            open_slave(proc.pid)
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdin is not None
        proc.stdin.close()


def test_size_session_foreground_and_signals(session: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, master = session
    link = link_to(proc)
    try:
        link.set_size(33, 101)
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(master, termios.TIOCGWINSZ, bytes(8)))
        assert (rows, cols) == (33, 101)
        assert link.session() == proc.pid and link.foreground() == proc.pid
        modes = link.modes()
        assert modes is not None and modes[3] & termios.ECHO
        assert link.terminal_signal(signal.SIGINT)
        assert proc.wait(10) == 7  # the foreground group got it
        deadline = time.monotonic() + 5
        while not link.exited() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert link.exited() and link.session() is None and link.foreground() is None
        assert not link.terminal_signal(signal.SIGINT)
    finally:
        link.release()
        link.release()  # idempotent
    assert link.fd is None and link.modes() is None


def test_a_reused_pid_is_not_the_leader(session: tuple[subprocess.Popen[bytes], int]) -> None:
    """A leader known by a start time it does not have (its pid reused) is gone."""
    proc, _ = session
    known = read_proc(proc.pid)
    assert known is not None
    link = SlaveLink(open_slave(proc.pid), proc.pid, known.start + 1)
    try:
        assert link.exited() and link.session() is None and link.foreground() is None
        assert not link.terminal_signal(signal.SIGINT)
        assert proc.poll() is None  # nothing was signalled
    finally:
        link.release()
