"""``engine.terminal_screen``: the transcript rendered as a user would see it (pyte)."""

from __future__ import annotations

import pytest

from sandboxrun.engine.terminal_screen import ScreenState, TerminalScreen


def render(*parts: bytes, rows: int = 5, cols: int = 20) -> TerminalScreen:
    state = ScreenState(rows, cols)
    offset = 0
    for part in parts:
        offset += len(part)
        state.feed(part, offset, False)
    return state.render()


def test_plain_lines_and_the_cursor() -> None:
    screen = render(b"hello\r\nworld")
    assert screen.rows[0] == "hello".ljust(20) and screen.rows[1].rstrip() == "world"
    assert screen.cursor == (1, 5) and screen.text == "hello\nworld"
    assert len(screen.rows) == 5 and screen.offset == 12


def test_a_full_screen_redraw_shows_only_what_is_left() -> None:
    screen = render(b"old text\r\n" * 3, b"\x1b[2J\x1b[3;4Hnew")
    assert screen.text == "\n\n   new", screen.rows


@pytest.mark.parametrize("cut", range(1, 9))
def test_utf8_and_escapes_split_anywhere(cut: int) -> None:
    data = "caf\u00e9 \x1b[1;31mred\x1b[0m \u2603".encode()
    assert render(data[:cut], data[cut:]).rows[0].rstrip() == "caf\u00e9 red \u2603"


def test_a_resize_keeps_what_fits() -> None:
    state = ScreenState(3, 10)
    state.feed(b"abcdefghij", 10, False)
    state.resize(2, 4)
    assert state.render().rows == ("abcd", "    ")


def test_lossy_is_sticky() -> None:
    state = ScreenState(2, 4)
    state.feed(b"a", 1, True)
    state.feed(b"b", 2, False)
    assert state.render().lossy
