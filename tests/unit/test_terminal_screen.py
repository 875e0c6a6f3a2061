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


@pytest.mark.parametrize("cut", range(0, 14))
def test_the_alternate_screen_is_left_as_it_was_found(cut: int) -> None:
    """``less`` and ``vim`` draw on the alternate screen (1049): once they quit, the shell's
    screen is back, whatever the chunk boundaries (pyte alone keeps their last page)."""
    before = b"$ ls\r\na b\r\n$ less f"
    full = b"\x1b[?1049h\x1b[H\x1b[2Jpage one\x1b[5;1H(END)"
    leave = b"\x1b[?1049l\r\n$ "
    data = full + leave
    state = ScreenState(5, 20)
    state.feed(before, len(before), False)
    state.feed(data[:cut], len(before) + cut, False)
    state.feed(data[cut:], len(before) + len(data), False)
    screen = state.render()
    assert screen.text == "$ ls\na b\n$ less f\n$", screen.rows
    assert "page one" not in screen.text and screen.cursor == (3, 2)


def test_on_the_alternate_screen_only_its_page_shows() -> None:
    state = ScreenState(4, 20)
    state.feed(b"shell text\r\n\x1b[?1049h\x1b[Hpage", 100, False)
    assert state.render().text == "page"


def test_other_private_modes_and_a_lone_leave_change_nothing() -> None:
    screen = render(b"keep\x1b[?25l\x1b[?7h\x1b[?1049l", rows=2, cols=8)
    assert screen.text == "keep" and screen.cursor == (0, 4)
    screen = render(b"keep\x1b[?25l\x1b[?2004h more", rows=2, cols=12)
    assert screen.text == "keep more"


def test_skip_marks_the_screen_lossy_and_moves_on() -> None:
    state = ScreenState(2, 10)
    state.feed(b"\x1b[?10", 5, False)  # a cut-off mode sequence is held...
    state.skip(1000)  # ...and dropped with what was skipped
    state.feed(b"new", 1003, False)
    screen = state.render()
    assert screen.text == "new" and screen.offset == 1003 and screen.lossy
