"""``terminal_text.plain``: a terminal's output as text for a reader that is not a terminal.
Every control sequence goes whole (OSC 52 clipboard writes, title and status queries, DCS
passthrough, CSI in both its 7-bit and C1 forms, charset escapes), what a terminal would do with
``\\r`` and ``\\b`` is applied, and a stream cut at any byte reads the same in pieces as whole."""

from __future__ import annotations

import pytest

from sandboxrun.engine.terminal_text import MAX_STRING, plain

HOSTILE = (
    b"\x1b]52;c;SGVsbG8gY2xpcGJvYXJk\x07"  # OSC 52: write the clipboard (BEL)
    b"\x1b]52;c;c2Vjb25k\x1b\\"  # OSC 52 ended by ST
    b"\x1b]0;a title\x07"  # the window title
    b"\x1bP+q544e\x1b\\"  # DCS: a termcap query
    b"\x1bPtmux;\x1b\x1b]52;c;eA==\x07\x1b\\"  # DCS passthrough (tmux) carrying OSC 52
    b"\x1b[6n\x1b[>c\x1b[21t"  # cursor, device attribute and title reports asked for
    b"\xc2\x9b31mred\xc2\x9b0m "  # CSI as the C1 control U+009B
    b"\xc2\x9d0;c1 title\xc2\x9c"  # OSC as C1, ended by the C1 ST
    b"\xc2\x85\xc2\x8d"  # other C1 controls (NEL, RI)
    b"\x1b(0\x1b)B\x1b7\x1b8\x1bc"  # charset, save/restore cursor, reset
    b"\x1b[?1049h\x1b[2J\x1b[H\x1b[?2004h"  # alternate screen, clear, home, bracketed paste
    b"\x00\x01\x07\x0b\x0c\x0e\x1f\x7f"  # C0 controls and DEL
    b"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82\n"  # UTF-8: 2, 3 and 4 bytes
)
EXPECTED = "red café € \U0001f642\n"


def test_every_kind_of_sequence_goes_whole() -> None:
    text, used = plain(HOSTILE)
    assert used == len(HOSTILE)
    assert text == EXPECTED
    for leftover in ("\x1b", "\x9b", "\x9d", "\x07", "SGVs", "title", "544e", "eA=="):
        assert leftover not in text


def pieces(data: bytes, cuts: list[int]) -> str:
    """``data`` read as a reader of a growing stream would: every call ends at the next cut,
    starts where the last one stopped (``used``), the last one is final."""
    out, start = [], 0
    for end in [*cuts, len(data)]:
        if end < start:
            continue
        text, used = plain(data[start:end], final=end == len(data))
        out.append(text)
        start += used
    return "".join(out)


@pytest.mark.parametrize("cut", range(len(HOSTILE) + 1))
def test_a_stream_cut_at_any_byte_reads_as_the_whole(cut: int) -> None:
    assert pieces(HOSTILE, [cut]) == EXPECTED


def test_a_stream_cut_at_every_byte_reads_as_the_whole() -> None:
    assert pieces(HOSTILE, list(range(len(HOSTILE)))) == EXPECTED


def test_an_unfinished_sequence_is_held_back_until_final() -> None:
    for tail in (
        b"\x1b",
        b"\x1b[",
        b"\x1b[3",
        b"\x1b[?20",
        b"\x1b(",
        b"\xc2",
        b"\xc2\x9b1",
        b"\x1b]52;c;abc",
        b"\xc3",
        b"\xe2\x82",
        b"\xf0\x9f\x99",
    ):
        text, used = plain(b"ok" + tail, final=False)
        assert (text, used) == ("ok", 2), tail
        text, used = plain(b"ok" + tail, final=True)
        assert used == 2 + len(tail)
        assert text in ("ok", "ok\ufffd", "ok52;c;abc"), (tail, text)  # (an opener only goes)


def test_a_string_that_never_ends_loses_its_opener_and_hides_nothing() -> None:
    data = b"before\x1b]52;c;" + b"A" * (MAX_STRING + 10)
    text, used = plain(data, final=False)
    assert used == len(data) and text == "before52;c;" + "A" * (MAX_STRING + 10)
    assert plain(b"\x1b]\nline1\nline2")[0] == "\nline1\nline2"


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        (b"A\xc2\x1b[0m\x9b31mRED", "A31mRED"),  # a removal joins \xc2 and \x9b: C1 CSI
        (b"\xc2\x07\x9b2J", "2J"),
        (b"A\xc2\x00\x9d0;title\xc2\x9c", "A0;title"),
        (b"before\x1b]0;t\x1b[0m visible\x07 after", "before visible after"),  # ESC ends it
        (b"a\x1b]0;x\x18b", "ab"),  # CAN ends it
        ("x\u202egnp.exe\u2066y".encode(), "xgnp.exey"),  # bidirectional overrides
    ],
)
def test_what_a_removal_joins_and_what_ends_a_string(data: bytes, shown: str) -> None:
    assert plain(data)[0] == shown
    for cut in range(len(data) + 1):  # in pieces a lone \xc2 is invalid: U+FFFD, no control
        text = pieces(data, [cut])
        assert text.replace("\ufffd", "") == shown, (cut, text)


def test_carriage_return_and_backspace_do_what_a_terminal_does() -> None:
    assert plain(b"progress 10%\rprogress 99%\r\n")[0] == "progress 99%\n"
    assert plain(b"abc\bX\n")[0] == "abX\n"
    assert plain(b"long line\rshort\n")[0] == "shortline\n"
    assert plain(b"\b\bx")[0] == "x"
    assert plain(b"a\r\nb\r\n")[0] == "a\nb\n"


def test_tab_and_newline_stay_and_invalid_utf8_is_replaced() -> None:
    assert plain(b"a\tb\n\xff\xfe")[0] == "a\tb\n\ufffd\ufffd"


SCREEN = (
    b"a\x1b[31mred\x1b[0m\x1b]0;title\x07"  # kept: SGR, a title
    b"\x1b]52;c;SGVs\x07\x1b]52;c;eA==\x1b\\"  # dropped: clipboard writes
    b"\x1bP+q544e\x1b\\\x1bPtmux;\x1b\x1b]52;c;eA==\x07\x1b\\"  # dropped: DCS, passthrough
    b"\x1b]11;?\x07\x1b]1337;File=x\x07\x1b[21t\x1b[8;1;1t"  # dropped: queries, iTerm, window
    b"\xc2\x1b]52;c;x\x07\x9d52;c;SGVs\x07"  # a removal that joins a C1 OSC 52
    b"z\x1b[?1049h\x1b[2J\x1b[H"  # kept: alternate screen, clear, home
)


def test_the_interactive_filter_keeps_the_screen_and_drops_what_reaches_beyond() -> None:
    from sandboxrun.engine.terminal_text import InteractiveFilter

    whole = InteractiveFilter().feed(SCREEN, final=True)
    assert whole.startswith(b"a\x1b[31mred\x1b[0m\x1b]0;title\x07")
    assert whole.endswith(b"z\x1b[?1049h\x1b[2J\x1b[H")
    for gone in (b"52;", b"544e", b"tmux", b"11;?", b"1337", b"21t", b"8;1;1t", b"\x9d"):
        assert gone not in whole, gone
    for cut in range(len(SCREEN) + 1):
        split = InteractiveFilter()
        out = split.feed(SCREEN[:cut]) + split.feed(SCREEN[cut:], final=True)
        for gone in (b"52;", b"544e", b"1337", b"21t", b"\x9d"):
            assert gone not in out, (cut, gone, out)
