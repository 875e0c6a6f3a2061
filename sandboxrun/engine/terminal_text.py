"""A terminal's output as plain text for a reader that is not a terminal (an LLM, a log). Pure.

``plain`` removes every ECMA-48 control sequence, whole: CSI (``ESC [`` or the C1 ``U+009B``,
parameters, intermediates, final byte), the strings OSC, DCS, SOS, PM and APC up to their
terminator (BEL or ST, ``ESC \\`` or ``U+009C``: OSC 52 clipboard writes, titles, DCS
passthrough, status queries), two-byte and charset escapes, the other C1 controls and every
C0 control but tab and newline. Then it applies what a terminal would do with carriage
returns and backspaces on each line (``progress 10%\\rprogress 99%`` reads ``progress 99%``),
and decodes UTF-8 (invalid bytes replaced).

It works on a stream cut anywhere: with ``final=False`` an escape sequence or a UTF-8
character that the data ends inside of is left unread (``plain`` says how many bytes it used),
so the next call, from there, sees it whole. A string sequence ends where a terminal would give
it up too (CAN, SUB, an ESC that begins something else); one that never ends loses its opener
once it is longer than ``MAX_STRING`` bytes, or at the stream's end, and what followed is shown
as text. Whatever control is left after that (bytes on either side of a removed sequence that
make a C1 control together) and the bidirectional overrides go in a last pass on the text.
"""

from __future__ import annotations

import re

MAX_STRING = 1 << 16
"""Bytes of an unterminated OSC/DCS/SOS/PM/APC string held back, at most, waiting for its end."""

_CSI = rb"(?:\x1b\[|\xc2\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
_STRING = (
    rb"(?:\x1b[\]PX^_]|\xc2[\x9d\x90\x98\x9e\x9f])(?:[^\x07\x18\x1a\x1b\xc2]|\xc2(?!\x9c))*"
    rb"(?:\x07|\x1b\\|\xc2\x9c|[\x18\x1a]|(?=\x1b))"
)
"""A string sequence to its end: BEL or ST, or where a terminal gives it up (CAN, SUB, or an
ESC that begins something else, left for the next sequence)."""
_TWO = rb"\x1b[\x20-\x2f]*[\x30-\x7e]"
_C1 = rb"\xc2[\x80-\x9f]"
_C0 = rb"[\x00-\x07\x0b-\x0c\x0e-\x1f\x7f]"
SEQUENCES = re.compile(b"|".join((_CSI, _STRING, _TWO, _C1, _C0)), re.DOTALL)
"""Everything ``plain`` removes (``\\r`` and ``\\b`` are applied instead, after; an ESC left
over, one no sequence follows, is a C0 control too)."""
STRING = re.compile(_STRING, re.DOTALL)
_OPEN = re.compile(rb"\x1b[\]PX^_]|\xc2[\x9d\x90\x98\x9e\x9f]")
"""The start of a string sequence (its end is looked for from here)."""
_PARTIAL = re.compile(rb"(?:\x1b\[?|\xc2\x9b)[\x30-\x3f]*[\x20-\x2f]*|\x1b[\x20-\x2f]+|\xc2")
"""A control sequence the data ends inside of (held back unless ``final``)."""


def _open_string(data: bytes, at_end: bool = True) -> int | None:
    """Where the first string sequence that ``data`` does not end begins, or None.
    ``at_end``: nothing is known past ``data`` (an ESC last of all may still begin an ST)."""
    found = _OPEN.search(data)
    while found is not None:
        whole = STRING.match(data, found.start())
        last = at_end and whole is not None and whole.end() == len(data) - 1
        if whole is None or (last and data.endswith(b"\x1b")):
            return found.start()  # (an ESC last of all may still begin its ST)
        found = _OPEN.search(data, whole.end())
    return None


def _utf8_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 character they do not finish."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back
            continue
        need = (
            2
            if byte & 0xE0 == 0xC0
            else 3
            if byte & 0xF0 == 0xE0
            else 4
            if byte & 0xF8 == 0xF0
            else 1
        )
        return back if need > back else 0
    return 0


def _partial(data: bytes) -> int:
    """Where a control sequence that ``data`` ends inside of begins, ``len(data)`` when none."""
    since = max(0, len(data) - 64)
    last = max(data.rfind(b"\x1b", since), data.rfind(b"\xc2", since))
    return last if last >= 0 and _PARTIAL.fullmatch(data, last) else len(data)


def _held(data: bytes) -> int:
    """Where the part of ``data`` that may still change meaning begins (an unfinished
    sequence or character), ``len(data)`` when none."""
    cut = min(len(data) - _utf8_tail(data), _partial(data))
    opened = _open_string(data[:cut], at_end=cut == len(data))
    if opened is not None and len(data) - opened <= MAX_STRING:  # waiting for its end
        cut = opened
    return cut


def _overstrike(line: str) -> str:
    """One line as a terminal leaves it: ``\\r`` goes back to its start, ``\\b`` one cell
    back, what follows writes over what was there."""
    if "\r" not in line and "\b" not in line:
        return line
    cells: list[str] = []
    at = 0
    for char in line:
        if char == "\r":
            at = 0
        elif char == "\b":
            at = max(0, at - 1)
        else:
            if at < len(cells):
                cells[at] = char
            else:
                cells.append(char)
            at += 1
    return "".join(cells)


def plain(data: bytes, *, final: bool = True) -> tuple[str, int]:
    """``(text, used)``: the text of ``data[:used]``. With ``final`` every byte is used (an
    unfinished sequence at the end is dropped); else ``used`` stops before one."""
    used = len(data) if final else _held(data)
    body = data[:used]
    opened = _open_string(body, at_end=False)
    if opened is not None:  # never ends (or is longer than MAX_STRING): its opener goes, what
        body = body[:opened] + body[opened + 2 :]  # followed is shown (hidden by nothing)
    if final:
        body = body[: _partial(body)]
    body = SEQUENCES.sub(b"", body).replace(b"\x1b", b"")
    text = body.decode("utf-8", "replace").replace("\r\n", "\n")
    if "\r" in text or "\b" in text:
        text = "\n".join(_overstrike(line) for line in text.split("\n"))
    return _LEFT.sub("", text), used


_LEFT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""What may still be left once the sequences are gone (bytes on either side of a removed one
that make a control together: ``\\xc2`` + ``\\x9b``), and the bidirectional overrides that
reorder what a reader sees (Trojan Source)."""


_ST = rb"(?:\x07|\x1b\\|\xc2\x9c)"
_OSC = rb"(?:\x1b\]|\xc2\x9d)"
DANGEROUS = re.compile(
    b"|".join(
        (
            _OSC + rb"(?:52|50|1337)(?:;.*?)?" + _ST,  # clipboard, font, iTerm2's file/escape
            _OSC + rb"(?:(?!\x07|\x1b\\|\xc2\x9c).)*\?.*?" + _ST,  # a query: its answer is input
            rb"(?:\x1b[PX^_]|\xc2[\x90\x98\x9e\x9f]).*?" + _ST,  # DCS (passthrough), SOS, PM, APC
            rb"(?:\x1b\[|\xc2\x9b)[\x30-\x3f]*[\x20-\x2f]*t",  # window operations and reports
        )
    ),
    re.DOTALL,
)
"""What the interactive filter removes from a terminal's output on its way to the user's."""


class InteractiveFilter:
    """A sandbox terminal's output on its way to the user's own terminal (``sandboxrun
    shell``): what a full-screen program needs (CSI, SGR, cursor, alternate screen, titles) goes
    through; what reaches beyond the window does not: OSC 52 clipboard writes, OSC 50 and 1337,
    every OSC query (its answer would be typed into the sandbox), DCS passthrough to the outer
    terminal, SOS/PM/APC, and CSI ``t`` window operations and reports. Stateful: a sequence cut
    between chunks is held until it is whole (a string longer than ``MAX_STRING`` is dropped)."""

    def __init__(self) -> None:
        self._carry = b""

    def feed(self, chunk: bytes, *, final: bool = False) -> bytes:
        data = self._carry + chunk
        cut = len(data) if final else _held(data)
        body, self._carry = data[:cut], data[cut:]
        opened = _open_string(body, at_end=False)
        if opened is not None:  # never ended within the bound (or the stream did): its opener
            body = body[:opened] + body[opened + 2 :]  # goes, the rest is plain text
        for _ in range(8):  # what a removal joins (``\\xc2`` + a C1 opener) is looked at again
            shown = DANGEROUS.sub(b"", body)
            if shown == body:
                break
            body = shown
        else:
            body = _OPEN.sub(b"", body)  # (a hostile nest: no string opener passes at all)
        if not final:  # what a removal left unfinished at the end waits for the next chunk
            keep = _held(body)
            body, self._carry = body[:keep], body[keep:] + self._carry
        return body
