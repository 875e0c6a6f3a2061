"""Terminals: a command on a pseudo-terminal made inside the sandbox (``Sandbox.open_terminal``,
``docs/terminals.md``).

A ``Terminal`` is a background job (``sandboxrun.api.jobs``) whose streams are a terminal's: the
same run, isolation and termination as every command, one output log with byte offsets (the
terminal's transcript, ``stdout``), and input written to the terminal. The sandbox's supervisor
makes the terminal inside the sandbox and sends its master here (``engine.pty``), so the size,
the foreground process group and the terminal's own signals are ioctls on this host, with no
round trip; other signals go through the supervisor. It ends with its sandbox.
"""

from __future__ import annotations

import re
import signal as signals
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio

from sandboxrun.api.jobs import Job, JobChunk, JobLines
from sandboxrun.engine.pty import PtyControl, live_processes
from sandboxrun.engine.request import ExecRequest, StdinStream
from sandboxrun.engine.terminal_screen import ScreenState, TerminalScreen
from sandboxrun.engine.terminal_text import plain
from sandboxrun.errors import ConfigError, SandboxrunError
from sandboxrun.models import BackendName, ExecResult

__all__ = ["Foreground", "OutputWait", "Terminal", "TerminalScreen", "TerminalText"]

MAX_TERMINALS = 16
"""``Sandbox.max_terminals``' default: terminals open at once in one sandbox."""
WRITE_TIMEOUT_S = 10.0
SCREEN_REPLAY = 256 * 1024
"""At most this much of the transcript (or 16 bytes a cell) is fed to draw the screen: more
came since the last ``screen()``, and only its end is (``lossy``). pyte draws ~0.3 MB/s."""
SCREEN_CHUNK = 64 * 1024
MAX_SCREEN_CELLS = 1_000_000
MAX_SIZES = 1024
"""Resizes ``screen`` still has to replay, at most (the oldest go first)."""
INTERRUPT_TRIES = 3
INTERRUPT_WAIT_S = 0.15
"""How long one ^C is given to bring the terminal's foreground back to the shell."""
POLL_S = 0.002
SEARCH_OVERLAP = 4096
"""Characters before the new text that ``wait_output``'s pattern is searched in again."""
SignalTarget = Literal["foreground", "leader", "session"]
Interrupted = Literal["sent", "interrupted", "killed", "ended", "failed"]


@dataclass(frozen=True, slots=True)
class Foreground:
    """The terminal's foreground process group, seen from this host (``Terminal.foreground``)."""

    pgid: int
    """The group's id: a pid of this host."""
    pids: tuple[int, ...]
    """Its live processes (this host's pids)."""
    comm: str
    """The name of its leader (or of one of its processes, the leader gone)."""
    is_leader: bool
    """The session leader's own group (the shell, idle at its prompt)."""


@dataclass(frozen=True, slots=True)
class TerminalText:
    """A part of the transcript as plain text (``Terminal.text``)."""

    text: str
    offset: int
    next_offset: int
    """Where the next call continues: an escape sequence or UTF-8 character still unfinished
    at the end is left for it."""
    lossy: bool
    eof: bool


@dataclass(frozen=True, slots=True)
class OutputWait:
    """What ``Terminal.wait_output`` saw, and why it returned."""

    output: TerminalText
    reason: Literal["pattern", "idle", "eof", "timeout"]
    match: re.Match[str] | None = None


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` on this host (one walk of /proc)."""
    return [pid for pid, _ in live_processes(group=pgid)]


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_bytes().decode("utf-8", "replace").strip()
    except OSError:
        return None


class Terminal:
    """A command on a terminal in a sandbox. ``id`` is its run id; ``done`` once it has ended
    (``result``). See ``docs/terminals.md``."""

    def __init__(
        self,
        request: ExecRequest,
        *,
        backend: BackendName,
        on_end: Callable[[Terminal], None] | None = None,
    ) -> None:
        assert request.tty is not None and isinstance(request.stdin, StdinStream)
        self.control: PtyControl = request.tty
        self._changed = anyio.Event()
        self._last_output = time.monotonic()
        self._on_end = on_end
        self._screen: ScreenState | None = None
        self._written = 0  # transcript bytes so far
        self._sizes: list[tuple[int, int, int]] = [(0, self.control.rows, self.control.cols)]
        """``(transcript offset, rows, cols)``: the size from each offset on (``screen``)."""
        self.job = Job(
            request,
            backend=backend,
            stdin=request.stdin,
            sink=self._note,
            on_end=self._ended,
        )
        self.id = self.job.id

    def __repr__(self) -> str:
        return f"<Terminal {self.id} {self.job.status} {self.control.rows}x{self.control.cols}>"

    def _note(self, _name: str, chunk: bytes) -> None:
        self._written += len(chunk)
        self._last_output = time.monotonic()
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def _ended(self, _job: Job) -> None:
        self._wake()
        if self._on_end is not None:
            self._on_end(self)

    @property
    def pid(self) -> int | None:
        """The session leader (the command) as a pid of this host, while the terminal lives."""
        return self.control.leader

    @property
    def size(self) -> tuple[int, int]:
        """``(rows, cols)``."""
        return self.control.rows, self.control.cols

    @property
    def done(self) -> bool:
        return self.job.done

    @property
    def result(self) -> ExecResult | None:
        return self.job.result

    # -- input ------------------------------------------------------------------------------
    async def write(self, data: bytes | str, timeout: float | None = WRITE_TIMEOUT_S) -> None:
        """Type ``data`` (str as UTF-8): returns once the terminal has taken all of it. A
        program that does not read fills the terminal's input queue: after ``timeout``
        seconds ``TimeoutError`` (what was taken stays typed, the rest is still being
        written). ``BrokenPipeError`` once the terminal is gone."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        with anyio.move_on_after(timeout) as scope:
            await self.job.write_stdin(raw)
        if scope.cancelled_caught:
            raise TimeoutError(
                f"terminal {self.id} did not take the input within {timeout:g} s "
                "(its program does not read it)"
            )

    # -- output -----------------------------------------------------------------------------
    def read(self, offset: int = 0, limit: int = 65536) -> JobChunk:
        """Raw transcript bytes from ``offset`` (escape sequences included), as ``Job.read``."""
        return self.job.read(offset, limit)

    async def next_output(self, offset: int = 0, limit: int = 65536) -> JobChunk:
        """Raw transcript bytes from ``offset`` as soon as there are some (or the end: ``eof``
        with no data): for a reader that follows the terminal live."""
        while True:
            changed = self._changed
            chunk = self.job.read(offset, limit)
            if chunk.data or chunk.eof:
                return chunk
            await changed.wait()

    def read_lines(self, offset: int | None = None, limit: int = 100) -> JobLines:
        return self.job.read_lines(offset, limit)

    def text(self, offset: int = 0, limit: int = 1 << 20) -> TerminalText:
        """The transcript from ``offset`` as plain text (``engine.terminal_text.plain``: every
        escape sequence and control removed, carriage returns and backspaces applied)."""
        chunk = self.job.read(offset, limit)
        final = chunk.eof
        text, used = plain(chunk.data, final=final)
        if not used and chunk.data and len(chunk.data) >= limit:  # held back past the limit
            text, used = plain(chunk.data, final=True)
        end = chunk.offset + used
        return TerminalText(
            text, chunk.offset, end, chunk.lossy, chunk.eof and end == chunk.next_offset
        )

    def screen(self) -> TerminalScreen:
        """The terminal as a user would see it now: its rows x cols rendered from the
        transcript by a terminal emulator (pyte: ``pip install 'sandboxrun[screen]'``, else
        ``ConfigError``). Full-screen programs (``top``, ``vim``, ``less``) read here, not in
        ``text``. Each call feeds what came since the last."""
        rows, cols = self.control.rows, self.control.cols
        if rows * cols > MAX_SCREEN_CELLS:
            raise ConfigError(
                f"screen() renders at most {MAX_SCREEN_CELLS:,} cells, not {rows} x {cols}"
            )
        budget = max(SCREEN_REPLAY, rows * cols * 16)
        state = self._screen
        if state is None or self._written - state.offset > budget:
            start = max(0, self._written - budget)  # the last of it draws the screen
            state = self._screen = ScreenState(*self._sizes[0][1:])  # (resized below)
            if start:
                state.skip(start)
        while True:
            sizes = self._sizes  # what was drawn after a resize is drawn at the new size
            while len(sizes) > 1 and sizes[1][0] <= state.offset:
                sizes.pop(0)
            state.resize(*sizes[0][1:])
            end = sizes[1][0] if len(sizes) > 1 else None
            limit = SCREEN_CHUNK if end is None else min(SCREEN_CHUNK, end - state.offset)
            chunk = self.job.read(state.offset, limit)
            if chunk.offset > state.offset:  # dropped from the log: on from what it holds
                state.skip(chunk.offset)
                continue
            if not chunk.data:
                return state.render()
            state.feed(chunk.data, chunk.next_offset, chunk.lossy)

    async def wait_output(
        self,
        after: int = 0,
        *,
        pattern: str | re.Pattern[str] | None = None,
        idle: float | None = None,
        timeout: float = 30.0,
    ) -> OutputWait:
        """Wait until the text from ``after`` matches ``pattern``, or (``idle``) no output came
        for that many seconds, or the terminal ended, or ``timeout`` passed; never raises for
        any of them (``reason`` says which)."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        since = time.monotonic()
        parts: list[str] = []
        cursor, first, lossy, searched = after, None, False, 0
        while True:
            changed = self._changed
            while True:  # what came since the last look, whatever its size
                piece = self.text(cursor)
                first = piece.offset if first is None else first
                lossy = lossy or piece.lossy
                if piece.next_offset == cursor:
                    break
                parts.append(piece.text)
                cursor = piece.next_offset
            text = "".join(parts)
            out = TerminalText(text, first, cursor, lossy, piece.eof)
            if regex is not None:  # the new text, and enough before it for a match across
                found = regex.search(text, max(0, searched - SEARCH_OVERLAP))
                searched = len(text)
                if found is not None:
                    return OutputWait(out, "pattern", found)
            if piece.eof or self.done:
                return OutputWait(out, "eof")
            now = time.monotonic()
            wake = deadline
            if idle is not None:
                quiet_since = max(self._last_output, since)
                if now - quiet_since >= idle:
                    return OutputWait(out, "idle")
                wake = min(wake, quiet_since + idle)
            if now >= deadline:
                return OutputWait(out, "timeout")
            with anyio.move_on_after(wake - now):
                await changed.wait()

    # -- the terminal -----------------------------------------------------------------------
    async def resize(self, rows: int, cols: int) -> None:
        """The terminal is ``rows`` x ``cols`` from now on (its foreground gets SIGWINCH)."""
        self.control.resize(rows, cols)
        sizes = self._sizes
        if sizes[-1][0] == self._written:  # no output since the last resize: it is replaced
            sizes.pop()
        sizes.append((self._written, rows, cols))
        if len(sizes) > MAX_SIZES:
            del sizes[1 : len(sizes) - MAX_SIZES + 1]

    def foreground(self) -> Foreground | None:
        """The terminal's foreground process group, or None once the terminal is gone."""
        pgid, session = self.control.foreground(), self.control.session()
        if pgid is None:
            return None
        pids = group_members(pgid)
        name = _comm(pgid) or next((n for n in map(_comm, pids) if n), "")
        return Foreground(pgid, tuple(pids), name, pgid == session)

    async def signal(self, sig: int | str, target: SignalTarget = "foreground") -> bool:
        """Send ``sig`` (a number or a name: ``"INT"``, ``"SIGKILL"``) to the terminal's
        foreground process group (INT, QUIT and TSTP as the terminal itself sends them: also
        in raw mode), its session leader, or every process of its session. False when the
        terminal is gone."""
        number = _signal_number(sig)
        if target == "foreground" and number in (signals.SIGINT, signals.SIGQUIT, signals.SIGTSTP):
            return self.control.terminal_signal(number)
        if target not in ("foreground", "leader", "session"):
            raise ValueError(f"target must be foreground, leader or session, not {target!r}")
        try:
            return await self.control.signal(number, target)
        except SandboxrunError:
            return False

    async def interrupt(self, grace: float = 1.0) -> Interrupted:
        """^C for the foreground job, made sure of: with a job in the foreground (not the
        shell), INT is sent until the foreground changes (up to 3 times: a ^C that lands
        before the job's program runs is lost), then its group is killed and ``grace``
        seconds given for that. ``sent``: the shell itself was in the foreground (INT went
        to it once); ``interrupted``; ``killed``; ``ended``: the terminal is gone; ``failed``:
        the job still holds the foreground."""
        control = self.control
        group, session = control.foreground(), control.session()
        if self.done or group is None:
            return "ended"
        if group == session:
            control.terminal_signal(signals.SIGINT)
            return "sent"
        for _ in range(INTERRUPT_TRIES):
            if not control.terminal_signal(signals.SIGINT):
                return "ended"
            if await self._back_to(session, INTERRUPT_WAIT_S):
                return "interrupted"
        for _ in range(INTERRUPT_TRIES):  # (a job may hand the foreground to another group)
            with suppress(SandboxrunError):
                await control.signal(signals.SIGKILL, "foreground", spare_leader=True)
            if await self._back_to(session, grace / INTERRUPT_TRIES):
                return "killed"
        return "failed"

    async def _back_to(self, session: int | None, within: float) -> bool:
        """Whether the session leader's own group holds the foreground again (or the
        terminal is gone) within ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            now_group = self.control.foreground()
            if self.done or now_group is None or now_group == session:
                return True
            if time.monotonic() >= deadline:
                return False
            await anyio.sleep(POLL_S)

    # -- lifetime ---------------------------------------------------------------------------
    async def wait(self, timeout: float | None = None) -> ExecResult:
        """The result once the session leader has exited and nothing of the terminal's run is
        left (its output drained); ``TimeoutError`` after ``timeout`` (it runs on)."""
        return await self.job.wait(timeout)

    async def close(self) -> ExecResult:
        """Hang up (SIGHUP to every process of the session), then end the run like a job's
        ``kill``: TERM, grace, KILL of everything it started, whatever its group or session.
        Idempotent; the result is ``cancelled`` when it was still running."""
        if not self.done:
            with suppress(SandboxrunError):
                await self.control.signal(signals.SIGHUP, "session")
            return await self.job.kill("closed: Terminal.close() ended the terminal")
        return await self.job.wait()

    def release(self) -> None:
        self.job.release()


def _signal_number(sig: int | str) -> int:
    if isinstance(sig, int) and not isinstance(sig, bool):
        number = sig
    elif isinstance(sig, str):
        name = sig.upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        try:
            number = int(signals.Signals[name])
        except KeyError:
            raise ValueError(f"no signal is called {sig!r}") from None
    else:
        raise ValueError(f"a signal is a number or a name, not {sig!r}")
    if not 0 < number < signals.NSIG:
        raise ValueError(f"{number} is not a signal number")
    return number
