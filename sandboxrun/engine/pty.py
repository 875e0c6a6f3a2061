"""The host's end of a run's pseudo-terminal (``docs/terminals.md``): the master the sandbox's
supervisor made inside the sandbox and sent here, checked (``check_master``) and driven by
ioctls, with no round trip: its size (``TIOCSWINSZ``), its foreground process group and session
(``TIOCGPGRP``, ``TIOCGSID``: host pids) and the terminal's own signals (``TIOCSIG``: INT, QUIT
and TSTP only, a kernel rule, delivered even with ISIG off). Other signals go through the
supervisor (``PtyControl.signal``), which sees the sandbox's processes.

A ``PtyControl`` rides in the run's ``ExecRequest`` (``tty``): the caller keeps it, the backend
attaches the master to it once the command runs, ``Stdio.close`` detaches it (the master is
closed then: the terminal is hung up).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import stat
import struct
import termios
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import anyio

from sandboxrun.errors import ConfigError

PTY_MASTER_MAJOR = 5
"""``/dev/ptmx`` and ``/dev/pts/ptmx`` are character device 5:2: every pty master is one."""
PTY_MASTER_MINOR = 2
TIOCSIG = getattr(termios, "TIOCSIG", 0x40045436)
"""``_IOW('T', 0x36, int)``: send a signal to the terminal's foreground process group."""
TIOCGPTN = getattr(termios, "TIOCGPTN", 0x80045430)
"""``_IOR('T', 0x30, unsigned int)``: the pty number of a master (only a master answers)."""
TIOCGSID = getattr(termios, "TIOCGSID", 0x5429)
"""The session a terminal controls (its leader's pid)."""
TERMINAL_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP})
"""The signals ``TIOCSIG`` delivers (others give EINVAL)."""
MAX_SIDE = 10000

Signaller = Callable[[int, str], Awaitable[None]]
"""Sends a signal to a target of the run (``foreground``, ``leader``, ``session``) through the
sandbox's supervisor."""


def check_size(rows: int, cols: int) -> tuple[int, int]:
    """``(rows, cols)`` when both are whole numbers from 1 to ``MAX_SIDE``; else ConfigError."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SIDE:
            raise ConfigError(f"a terminal's {name} must be a whole number from 1 to {MAX_SIDE}")
    return rows, cols


def check_master(fd: int) -> str | None:
    """Why ``fd`` is not a pseudo-terminal master (None when it is): the supervisor lives in
    the sandbox and is never trusted, so a regular file, a socket, a pipe, a terminal's slave
    end or ``/dev/tty`` sent as a master is refused."""
    try:
        st = os.fstat(fd)
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror})"
    if not stat.S_ISCHR(st.st_mode):
        return "it is not a character device"
    if (os.major(st.st_rdev), os.minor(st.st_rdev)) != (PTY_MASTER_MAJOR, PTY_MASTER_MINOR):
        return f"it is character device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}, not ptmx"
    try:
        fcntl.ioctl(fd, TIOCGPTN, b"\0\0\0\0")
    except OSError as exc:
        return f"it does not answer TIOCGPTN ({exc.strerror})"
    return None


def _get_int(fd: int, request: int) -> int | None:
    try:
        raw = fcntl.ioctl(fd, request, b"\0\0\0\0")
    except OSError:
        return None
    value: int = struct.unpack("i", raw)[0]
    return value if value > 0 else None


def set_size(fd: int, rows: int, cols: int) -> None:
    """``TIOCSWINSZ`` on a terminal's master or slave (the foreground gets SIGWINCH)."""
    with contextlib.suppress(OSError):  # (the terminal is being hung up)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def get_modes(fd: int) -> list[Any] | None:
    """A terminal's modes through its master or slave; None once it is gone."""
    try:
        return termios.tcgetattr(fd)
    except termios.error:
        return None


def put_modes(fd: int, modes: list[Any]) -> None:
    with contextlib.suppress(termios.error):
        termios.tcsetattr(fd, termios.TCSANOW, modes)


class TtyLink(Protocol):
    """How the host reaches a run's terminal: through its master (``MasterLink``), or, on
    docker's engine path, where the engine holds the master, through its slave and /proc
    (``engine.pty_slave.SlaveLink``). Every method is synchronous and never blocks."""

    def set_size(self, rows: int, cols: int) -> None: ...

    def modes(self) -> list[Any] | None: ...

    def set_modes(self, modes: list[Any]) -> None: ...

    def foreground(self) -> int | None: ...

    def session(self) -> int | None: ...

    def terminal_signal(self, sig: int) -> bool: ...


class MasterLink:
    """A terminal through its master ``fd`` (owned by the caller): ioctls only."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def set_size(self, rows: int, cols: int) -> None:
        set_size(self.fd, rows, cols)

    def modes(self) -> list[Any] | None:
        return get_modes(self.fd)  # (a master's ioctls reach its slave's modes)

    def set_modes(self, modes: list[Any]) -> None:
        put_modes(self.fd, modes)

    def foreground(self) -> int | None:
        return _get_int(self.fd, termios.TIOCGPGRP)

    def session(self) -> int | None:
        return _get_int(self.fd, TIOCGSID)

    def terminal_signal(self, sig: int) -> bool:
        try:
            fcntl.ioctl(self.fd, TIOCSIG, sig)
        except OSError:
            return False
        return True


class PtyControl:
    """A run's terminal as its owner drives it: the size it asked for, and, while the command
    runs, the way to reach it (``attach``). Every method is synchronous but ``signal``; none
    blocks."""

    def __init__(self, rows: int = 24, cols: int = 80, term: str = "xterm-256color") -> None:
        self.rows, self.cols = check_size(rows, cols)
        self.term = term
        self.link: TtyLink | None = None
        self.ended = False
        """The terminal was detached: it is gone."""
        self.ready = anyio.Event()
        """Set once the terminal is attached, or the run ended without one."""
        self.leader: int | None = None
        """The session leader (the command) as a pid of this host, once attached."""
        self._signaller: Signaller | None = None
        self._sent_size = (self.rows, self.cols)

    def spawn_options(self) -> dict[str, int]:
        """What the supervisor's ``spawn`` gets: the size the terminal starts with."""
        self._sent_size = (self.rows, self.cols)
        return {"rows": self.rows, "cols": self.cols}

    def attach(self, master: int | TtyLink, signaller: Signaller) -> None:
        """The command runs on the terminal whose master is ``master`` (the caller owns the
        fd), or that ``master`` (a ``TtyLink``) reaches."""
        link = MasterLink(master) if isinstance(master, int) else master
        self.link, self._signaller = link, signaller
        self.leader = link.session()
        if (self.rows, self.cols) != self._sent_size:  # resized while it was being spawned
            link.set_size(self.rows, self.cols)
        self.ready.set()

    def detach(self) -> None:
        """The run is over (its master is being closed): nothing more reaches it."""
        self.link, self._signaller, self.ended, self.leader = None, None, True, None
        self.ready.set()

    def resize(self, rows: int, cols: int) -> None:
        self.rows, self.cols = check_size(rows, cols)
        if self.link is not None:
            self.link.set_size(self.rows, self.cols)

    def modes(self) -> list[Any] | None:
        """The terminal's modes (``termios.tcgetattr``), or None once it is gone."""
        return None if self.link is None else self.link.modes()

    def set_modes(self, modes: list[Any]) -> None:
        """Put the terminal's modes back to ``modes`` (what a command changed: echo, ^C)."""
        if self.link is not None:
            self.link.set_modes(modes)

    def at_prompt(self) -> bool:
        """The session leader's own group holds the foreground (no /proc walk)."""
        group = self.foreground()
        return group is not None and group == self.session()

    def foreground(self) -> int | None:
        """The terminal's foreground process group, as a pid of this host; None when it has
        none (the session is gone) or the run is over."""
        return None if self.link is None else self.link.foreground()

    def session(self) -> int | None:
        """The session the terminal controls (its leader's pid on this host), or None."""
        return None if self.link is None else self.link.session()

    def terminal_signal(self, sig: int) -> bool:
        """INT, QUIT or TSTP to the foreground group as the line discipline would send it for
        ^C, ^\\ or ^Z (also in raw mode). False when the terminal is gone."""
        if sig not in TERMINAL_SIGNALS:
            raise ValueError(
                f"TIOCSIG sends only INT, QUIT and TSTP, not {signal.Signals(sig).name}"
            )
        return False if self.link is None else self.link.terminal_signal(sig)

    async def signal(self, sig: int, target: str, *, spare_leader: bool = False) -> bool:
        """``sig`` to ``target`` (``foreground``, ``leader``, ``session``) through the
        supervisor; ``spare_leader``: never to the session leader's own group (the
        foreground changed back to the shell meanwhile). False when the run is over."""
        signaller = self._signaller
        if signaller is None:
            return False
        await signaller(sig, f"{target}-spare" if spare_leader else target)
        return True


def host_signaller(control: PtyControl) -> Signaller:
    """Signals for a terminal whose processes this host can signal itself (a scope's: the
    same user; docker's engine path: root), without a supervisor (``signal_session``)."""

    async def send(sig: int, target: str) -> None:
        session = control.session()
        if session is not None:
            signal_session(session, control.foreground(), sig, target)

    return send


def signal_session(session: int, group: int | None, sig: int, target: str) -> None:
    """``sig`` to ``target`` of the terminal whose session is ``session`` and whose foreground
    is ``group``: ``leader``, ``session``, ``foreground`` or ``foreground-spare`` (not when the
    foreground is the leader's own group). Only processes of the session are signalled, each
    through a pidfd after its ``stat`` was read: a group number the terminal still names after
    its group is gone, or a pid reused meanwhile, reaches nobody outside the sandbox."""
    for pid, pgrp in session_members(session):
        if target == "leader" and pid != session:
            continue
        if target in ("foreground", "foreground-spare"):
            if group is None or pgrp != group:
                continue
            if target == "foreground-spare" and group == session:
                return
        _signal_checked(pid, session, sig)


def _signal_checked(pid: int, session: int, sig: int) -> None:
    """``sig`` to ``pid`` through a pidfd, if it is still a process of ``session``."""
    from sandboxrun.supervisor.procfs import stat_fields

    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        fields = stat_fields(pid)  # read after the pidfd: the pid is that process's now
        if fields is not None and len(fields) > 3 and int(fields[3]) == session:
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)


def session_members(session: int) -> list[tuple[int, int]]:
    """``(pid, process group)`` of the live processes of ``session`` on this host."""
    return live_processes(session=session)


def live_processes(
    *, session: int | None = None, group: int | None = None
) -> list[tuple[int, int]]:
    """``(pid, process group)`` of this host's live processes (one walk of /proc, zombies
    left out) in ``session`` and, or, ``group``."""
    from sandboxrun.supervisor.procfs import stat_fields

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if fields is None or len(fields) < 4 or fields[0] in (b"Z", b"X"):
            continue
        pgrp, sid = int(fields[2]), int(fields[3])
        if (session is None or sid == session) and (group is None or pgrp == group):
            found.append((int(entry.name), pgrp))
    return sorted(found)
