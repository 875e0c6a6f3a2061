"""A terminal's screen as a user would see it (``Terminal.screen``): the transcript fed through
a VT100/xterm emulator (pyte, the optional ``sandboxrun[screen]`` extra), rows x cols of text
and the cursor. Pure: bytes in, rows out, no I/O."""

from __future__ import annotations

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


class ScreenState:
    """A pyte screen fed incrementally (split UTF-8 and escape sequences are carried over)."""

    def __init__(self, rows: int, cols: int) -> None:
        try:
            import pyte
        except ImportError:
            raise ConfigError(NO_PYTE) from None
        self._screen: Any = pyte.Screen(cols, rows)
        self._stream: Any = pyte.ByteStream(self._screen)
        self.offset = 0
        self.lossy = False

    def feed(self, data: bytes, next_offset: int, lossy: bool) -> None:
        self._stream.feed(data)
        self.offset = next_offset
        self.lossy = self.lossy or lossy

    def resize(self, rows: int, cols: int) -> None:
        if (self._screen.lines, self._screen.columns) != (rows, cols):
            self._screen.resize(rows, cols)

    def render(self) -> TerminalScreen:
        screen = self._screen
        return TerminalScreen(
            tuple(screen.display), (screen.cursor.y, screen.cursor.x), self.offset, self.lossy
        )
