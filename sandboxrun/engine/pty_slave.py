"""A run's terminal reached through its slave end and /proc (``engine.pty.TtyLink``): docker's
engine path, where the engine makes the terminal and keeps its master to itself.

The host (root, the engine local) opens the slave from ``/proc/<leader>/fd/0`` while the run's
start stub is stopped, before anything of the command runs (``open_slave``), and checks it is a
pseudo-terminal's slave. With it: the size (``TIOCSWINSZ`` on a slave resizes the terminal and
sends its foreground SIGWINCH) and the modes. The foreground group and the session come from
the leader's ``/proc/<pid>/stat`` (``tpgid``, ``session``: host pids), the leader recognised by
its start time; the terminal's own signals are sent to the foreground group's processes of the
session through pidfds (``engine.pty.signal_session``), as ``TIOCSIG`` would.

The held slave would keep the terminal's output open after its command, so ``release`` closes
it once the leader has exited (``exited``): from then on the terminal has no foreground.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Any

from sandboxrun.engine.pty import get_modes, put_modes, set_size, signal_session
from sandboxrun.supervisor.procfs import stat_fields

PTY_SLAVE_MAJORS = range(136, 144)
"""``UNIX98_PTY_SLAVE_MAJOR`` and the majors after it: every pty slave is one of them."""


def _is_slave(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in PTY_SLAVE_MAJORS


def check_slave(fd: int) -> str | None:
    """Why ``fd`` is not a pseudo-terminal's slave (None when it is)."""
    try:
        st = os.fstat(fd)
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror})"
    return None if _is_slave(st) else "it is not a pseudo-terminal's slave"


def open_slave(leader: int) -> int:
    """The terminal on ``leader``'s standard input, opened without becoming this process's
    controlling terminal: only once what it names is a pty slave, and the same one once open
    (nothing else is ever opened as this host's user). ``OSError`` otherwise."""
    path = f"/proc/{leader}/fd/0"
    before = Path(path).stat()
    if not _is_slave(before):
        raise OSError("the command's standard input is not a pseudo-terminal's slave")
    fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        why = check_slave(fd)
        if why is None and os.fstat(fd).st_rdev != before.st_rdev:
            why = "it changed while it was opened"
    except BaseException:
        os.close(fd)
        raise
    if why is not None:
        os.close(fd)
        raise OSError(f"the command's standard input is not its terminal: {why}")
    return fd


class SlaveLink:
    """A terminal through its slave ``fd`` (owned here) and its session ``leader``'s /proc."""

    def __init__(self, fd: int, leader: int, start: int) -> None:
        """``start``: the leader's start time, read before ``fd`` was opened."""
        self.fd: int | None = fd
        self.leader = leader
        self._start: int | None = start
        self.pidfd: int | None = None
        with contextlib.suppress(OSError):
            self.pidfd = os.pidfd_open(leader)
        if self.pidfd is not None and self.exited():  # the pidfd is another process's
            os.close(self.pidfd)
            self.pidfd, self._start = None, None

    def _leader_stat(self) -> list[bytes] | None:
        """The leader's stat fields while it lives (not a zombie, the same start time)."""
        if self._start is None:
            return None
        fields = stat_fields(self.leader)
        if fields is None or len(fields) < 20 or fields[0] in (b"Z", b"X"):
            return None
        return fields if int(fields[19]) == self._start else None

    def exited(self) -> bool:
        """Whether the session leader has exited."""
        return self._leader_stat() is None

    def release(self) -> None:
        """Close the held slave (the leader is gone, or the run is): idempotent."""
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        pidfd, self.pidfd = self.pidfd, None
        if pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(pidfd)

    def set_size(self, rows: int, cols: int) -> None:
        if self.fd is not None:
            set_size(self.fd, rows, cols)

    def modes(self) -> list[Any] | None:
        return None if self.fd is None else get_modes(self.fd)

    def set_modes(self, modes: list[Any]) -> None:
        if self.fd is not None:
            put_modes(self.fd, modes)

    def session(self) -> int | None:
        """The leader, while it lives (a terminal loses its session with its leader)."""
        fields = self._leader_stat()
        return self.leader if fields is not None and int(fields[3]) == self.leader else None

    def foreground(self) -> int | None:
        fields = self._leader_stat()
        if fields is None or int(fields[3]) != self.leader:
            return None
        group = int(fields[5])  # tpgid: the foreground group of the leader's terminal
        return group if group > 0 else None

    def terminal_signal(self, sig: int) -> bool:
        group = self.foreground()
        if group is None:
            return False
        signal_session(self.leader, group, sig, "foreground")
        return True
