"""A terminal's screen as a user would see it (``Terminal.screen``): the transcript fed through
a VT100/xterm emulator (pyte, the optional ``sandboxrun[screen]`` extra), rows x cols of text
and the cursor. Pure: bytes in, rows out, no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sandboxrun.errors import ConfigError

NO_PYTE = (
    "Terminal.screen() renders the terminal with pyte, an optional dependency: "
    "pip install 'sandboxrun[screen]'"
)


@dataclass(frozen=True, slots=True)
class TerminalScreen:
    """What the terminal shows (``Terminal.screen``)."""

    rows: tuple[str, ...]
    """Each row's text, padded to the terminal's width."""
    cursor: tuple[int, int]
    """``(row, col)`` of the cursor, from 0."""
    offset: int
    """The transcript offset the screen shows the terminal at."""
    lossy: bool
    """Part of the transcript was dropped (over the output cap): the screen may be wrong
    until the program redraws it."""

    @property
    def text(self) -> str:
        """The rows, right-trimmed, trailing empty rows left out."""
        lines = [row.rstrip() for row in self.rows]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines)


PRIVATE_MODE = re.compile(rb"\x1b\[\?([0-9;]*)([hl])")
ALTERNATE = {b"47", b"1047", b"1049"}
"""The private modes that switch to the alternate screen (pyte 0.8 has none of them)."""
HELD_MAX = 16
"""A cut-off private-mode sequence at a chunk's end is held back at most this long."""


class ScreenState:
    """A pyte screen fed incrementally (split UTF-8 and escape sequences are carried over),
    with xterm's alternate screen: what a full-screen program drew there is gone once it
    leaves it, and the screen before it is back."""

    def __init__(self, rows: int, cols: int, offset: int = 0) -> None:
        try:
            import pyte
        except ImportError:
            raise ConfigError(NO_PYTE) from None
        self._screen: Any = pyte.Screen(cols, rows)
        self._stream: Any = pyte.ByteStream(self._screen)
        self.offset = offset
        self.lossy = False
        self._held = b""
        self._saved: tuple[list[str], tuple[int, int]] | None = None

    def skip(self, offset: int) -> None:
        """The transcript before ``offset`` is not fed (dropped, or too much to replay)."""
        self.offset, self.lossy, self._held = offset, True, b""

    def feed(self, data: bytes, next_offset: int, lossy: bool) -> None:
        data, self._held = self._held + data, b""
        cut = data.rfind(b"\x1b", max(0, len(data) - HELD_MAX))
        if cut >= 0 and re.fullmatch(rb"\x1b(\[(\?[0-9;]*)?)?", data[cut:]):
            data, self._held = data[:cut], data[cut:]  # maybe a mode switch: held for now
        at = 0
        for found in PRIVATE_MODE.finditer(data):
            if ALTERNATE.isdisjoint(found.group(1).split(b";")):
                continue
            self._stream.feed(data[at : found.end()])
            at = found.end()
            self._switch(entering=found.group(2) == b"h")
        self._stream.feed(data[at:])
        self.offset = next_offset
        self.lossy = self.lossy or lossy

    def _switch(self, *, entering: bool) -> None:
        screen = self._screen
        if entering:
            if self._saved is None:
                self._saved = (list(screen.display), (screen.cursor.y, screen.cursor.x))
            screen.erase_in_display(2)
            return
        saved, self._saved = self._saved, None
        if saved is None:  # not on the alternate screen: nothing to leave
            return
        screen.erase_in_display(2)
        lines, (y, x) = saved
        for row, line in enumerate(lines[: screen.lines]):
            if line.strip():
                screen.cursor_position(row + 1, 1)
                screen.draw(line[: screen.columns].rstrip())
        screen.cursor_position(min(y, screen.lines - 1) + 1, min(x, screen.columns - 1) + 1)

    def resize(self, rows: int, cols: int) -> None:
        if (self._screen.lines, self._screen.columns) != (rows, cols):
            self._screen.resize(rows, cols)

    def render(self) -> TerminalScreen:
        screen = self._screen
        return TerminalScreen(
            tuple(screen.display), (screen.cursor.y, screen.cursor.x), self.offset, self.lossy
        )
