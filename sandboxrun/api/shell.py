"""A persistent shell for agents (``Sandbox.open_shell``, ``docs/terminals.md``): one bash on a
terminal in the sandbox, where ``cd``, variables and functions persist from one ``run`` to the
next, and each command's end, exit code and output are known exactly.

How a command's end is known: bash prints ``ESC ] 133 ; D ; <exit code> ; <key> BEL`` before
each prompt (``PROMPT_COMMAND``), where the key is fresh for every command and lives in a shell
variable that is never exported, so no program the command starts finds it in its
environment; and a marker counts only while the terminal's foreground group is the shell's own
(a program still in the foreground cannot be at a prompt). The shell is in the sandbox's trust
domain: code it evaluates itself (a sourced script, a trap), or a process of its uid that reads
its memory or the terminal's input, can print a valid marker (docs/terminals.md).

Each command is typed as one line, ``eval $'…'`` with every
control byte escaped, so no command can leave the shell at a continuation prompt (an unmatched
quote or backtick is a syntax error, exit code 2); a long command is typed in pieces into a
variable first (a terminal line holds 4,095 bytes). Echo is off: the output is the command's.
A command that outlives its timeout is interrupted (``Terminal.interrupt``: ^C, then KILL of
its group); its partial output is kept and the shell goes on, or is restarted (``restarted``)
when it does not come back.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from sandboxrun.api.terminal import Terminal
from sandboxrun.engine.capture.buffer import omission_marker
from sandboxrun.engine.terminal_text import plain
from sandboxrun.errors import BackendError

__all__ = ["Shell", "ShellResult"]

SHELL_ENV = {
    "TERM": "dumb",
    "NO_COLOR": "1",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "",
    "PS1": "",
    "PS2": "",
    "PROMPT_COMMAND": 'printf "\\033]133;D;%s;%s\\007" "$?" "${__sandboxrun_key-}"',
}
"""The shell's environment (over the sandbox's): no pager, no colour, no prompt but the
marker (Codex's and inspect's choices, and OSC 133's ``D`` for the end of a command)."""
LINE_BYTES = 3000
"""The most bytes one typed line carries (a canonical terminal line holds 4,095)."""
MARKER = re.compile(rb"\x1b\]133;D;(\d{1,3});([0-9a-f]*)\x07")
START_TIMEOUT_S = 30.0
RECOVER_S = 5.0
"""How long an interrupted command's shell is given to come back to its prompt."""
MAX_OUTPUT = 1 << 20
"""``run``'s default ``max_output``: bytes of output returned (the newest, the rest counted)."""


@dataclass(frozen=True, slots=True)
class ShellResult:
    """What one ``Shell.run`` did."""

    output: str
    """The command's output as plain text (``Terminal.text``: no escape sequence)."""
    exit_code: int | None
    """Its exit status as the shell saw it (``$?``: 128+n for a signal); None when the shell
    had to be restarted."""
    timed_out: bool
    interrupted: bool
    """It was interrupted (^C, or its foreground group killed): it outlived ``timeout``."""
    lossy: bool
    """Some of its output is not here: dropped by the terminal's log, or beyond ``max_output``
    (``omitted_bytes``)."""
    offset: int
    """Where its output starts in the terminal's transcript (``Shell.terminal``)."""
    next_offset: int
    omitted_bytes: int = 0
    restarted: bool = False
    """The shell did not come back after the interrupt and was replaced: its state is lost."""


def escape(command: str) -> str:
    """``command`` as the body of a bash ``$'…'`` string: backslash, quote and every control
    byte (C0, DEL) escaped, so the typed line is one line and no byte is a terminal's special
    character (^C, ^D, ^U, ^V, ^W, ^Z, ^S, erase)."""
    out = []
    for char in command:
        code = ord(char)
        if char in ("\\", "'"):
            out.append("\\" + char)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        else:
            out.append(char)
    return "".join(out)


def pieces(command: str, limit: int = LINE_BYTES) -> list[str]:
    """``command`` escaped and cut into parts of at most ``limit`` bytes (never inside an
    escape: cut between characters of the command)."""
    parts: list[str] = []
    current: list[str] = []
    size = 0
    for char in command:
        escaped = escape(char)
        n = len(escaped.encode("utf-8", "surrogateescape"))
        if current and size + n > limit:
            parts.append("".join(current))
            current, size = [], 0
        current.append(escaped)
        size += n
    parts.append("".join(current))
    return parts


class Shell:
    """A persistent bash in a sandbox (``Sandbox.open_shell``)."""

    def __init__(self, terminal: Terminal, reopen: Callable[[], Awaitable[Terminal]]) -> None:
        self.terminal = terminal
        self._reopen = reopen
        self._at = 0
        """Transcript offset after the last marker taken: the next command's output starts."""
        self._scanned = 0
        self._modes: list[Any] | None = None

    @property
    def busy(self) -> bool:
        """A program (not the shell) holds the terminal's foreground."""
        fg = self.terminal.foreground()
        return fg is not None and not fg.is_leader

    async def start(self) -> None:
        """Wait for the shell's first prompt, then turn echo and history off."""
        if await self._marker(None, START_TIMEOUT_S) is None:
            raise BackendError(
                f"the shell did not reach its prompt within {START_TIMEOUT_S:g} s: "
                f"{self.terminal.text(0).text[-500:]!r}"
            )
        key = secrets.token_hex(8)
        await self.terminal.write(
            f"__sandboxrun_key={key}; stty -echo; set +o history; unset HISTFILE\r"
        )
        settled = await self._marker(key, START_TIMEOUT_S)
        if settled is None:
            raise BackendError("the shell did not take its settings (stty -echo)")
        self._at = settled[2]  # (the settings line was echoed: echo was still on)
        self._modes = self.terminal.control.modes()
        """The terminal's modes at the prompt, echo off: put back before every command (one
        may turn echo on, or make ``e`` its interrupt character)."""

    async def run(
        self, command: str, timeout: float = 120.0, *, max_output: int = MAX_OUTPUT
    ) -> ShellResult:
        """Run ``command`` in the shell (its ``cd`` and variables stay for the next) and
        return when the shell is back at its prompt, or after ``timeout`` seconds, when it is
        interrupted (``timed_out``, ``interrupted``; the output so far is kept)."""
        if self.terminal.done:
            raise BrokenPipeError("the shell has ended: restart() it")
        deadline = time.monotonic() + timeout
        if self._modes is not None:
            self.terminal.control.set_modes(self._modes)
        key = secrets.token_hex(8)
        parts = pieces(command)
        start = self._at
        typed: tuple[int, int, int] | None = None
        try:
            for i, part in enumerate(parts[:-1]):  # long: into a variable, a line at a time
                assign = "=" if i == 0 else "+="
                await self._type(
                    f"__sandboxrun_key={key}; __sandboxrun_cmd{assign}$'{part}'", deadline
                )
                typed = await self._marker(key, deadline - time.monotonic())
                if typed is None:  # never run a command with a piece missing
                    return await self._lost(start, timed_out=not self.terminal.done)
                self._at = start = typed[2]
            last = parts[-1]
            if len(parts) > 1:
                line = (
                    f"__sandboxrun_cmd+=$'{last}'; __sandboxrun_key={key}; "
                    'eval "$__sandboxrun_cmd"'
                )
            else:
                line = f"__sandboxrun_key={key}; eval $'{last}'"
            await self._type(line, deadline)
        except (TimeoutError, BrokenPipeError):  # a line half typed: the shell cannot be trusted
            return await self._lost(start, timed_out=not self.terminal.done)
        found = await self._marker(key, deadline - time.monotonic())
        timed_out = interrupted = False
        if found is None and not self.terminal.done:
            timed_out = True
            interrupted = await self.terminal.interrupt() in ("interrupted", "killed", "sent")
            found = await self._marker(key, RECOVER_S)
        if found is None:
            return await self._lost(start, timed_out=timed_out, interrupted=interrupted)
        output, lossy, omitted = self._output(start, found[0], max_output)
        self._at = found[2]
        return ShellResult(
            output,
            found[1],
            timed_out,
            interrupted,
            lossy or omitted > 0,
            start,
            found[0],
            omitted,
        )

    async def _lost(self, start: int, *, timed_out: bool, interrupted: bool = False) -> ShellResult:
        """The command's end was not seen (the shell exited, or did not come back): what it
        printed, and a fresh shell for the next command."""
        end = max(start, self._scanned)
        output, lossy, omitted = self._output(start, end, MAX_OUTPUT)
        await self.restart()
        return ShellResult(
            output,
            None,
            timed_out,
            interrupted,
            lossy or omitted > 0,
            start,
            end,
            omitted,
            restarted=True,
        )

    async def _type(self, line: str, deadline: float) -> None:
        await self.terminal.write(line + "\r", timeout=max(0.1, deadline - time.monotonic()))

    async def _marker(self, key: str | None, within: float) -> tuple[int, int, int] | None:
        """The next marker with ``key`` (None: any) printed while the shell held the
        foreground: ``(start, exit code, end)`` offsets in the transcript; None after
        ``within`` seconds (or when the terminal ended)."""
        term = self.terminal
        deadline = time.monotonic() + max(0.0, within)
        pos = self._scanned = max(self._scanned, self._at)
        while True:
            changed = term._changed  # (the terminal's wake-up, set on output and on its end)
            chunk = term.read(pos, 1 << 20)
            if chunk.lossy:
                pos = chunk.offset
            data = chunk.data
            at_prompt = term.control.at_prompt()  # once per chunk: a flood of markers is cheap
            for found in MARKER.finditer(data) if at_prompt else ():
                if key is None or found.group(2).decode() == key:
                    self._scanned = chunk.offset + found.end()
                    return chunk.offset + found.start(), int(found.group(1)), self._scanned
            keep = data.rfind(b"\x1b", max(0, len(data) - 64))  # a marker still arriving
            pos = chunk.offset + (keep if keep >= 0 else len(data))
            self._scanned = pos
            if term.done:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with anyio.move_on_after(left):
                await changed.wait()

    def _output(self, start: int, end: int, max_output: int) -> tuple[str, bool, int]:
        """The plain text of transcript bytes ``[start, end)``: the newest ``max_output`` of
        them, an omission marker for the rest; whether the log had lost some."""
        begin = max(start, end - max_output)
        parts, pos, lossy = [], begin, False
        while pos < end:
            chunk = self.terminal.read(pos, min(1 << 20, end - pos))
            lossy = lossy or chunk.lossy
            if not chunk.data:
                break
            parts.append(chunk.data)
            pos = chunk.next_offset
        data = b"".join(parts)[: max(0, end - begin)]
        text = plain(data)[0]
        omitted = begin - start
        if omitted:
            text = omission_marker(omitted) + "\n" + text
        return text, lossy, omitted

    async def send(self, data: bytes | str) -> None:
        """Type ``data`` as it is (an answer to a prompt: ``"y\\n"``, a password)."""
        await self.terminal.write(data)

    async def read_new(self, idle: float = 0.5, timeout: float = 30.0) -> str:
        """The text that came since the last command's end, once nothing new came for
        ``idle`` seconds (what a program that waits for input printed)."""
        seen = await self.terminal.wait_output(self._at, idle=idle, timeout=timeout)
        return seen.output.text

    async def restart(self) -> None:
        """A fresh shell in place of this one (its state is lost); the old one is closed."""
        old = self.terminal
        await old.close()
        self.terminal = await self._reopen()
        self._at = self._scanned = 0
        await self.start()

    async def close(self) -> None:
        await self.terminal.close()
