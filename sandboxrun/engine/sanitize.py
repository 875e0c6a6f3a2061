"""Neutralize terminal control sequences. Pure.

Every C0 control byte except newline and tab, DEL, and the UTF-8 encodings of the C1 controls
(U+0080..U+009F, which some terminals obey like ESC sequences) become visible ``^X`` / ``<U+9B>``
text, so a command cannot move the cursor, retitle the window, hide text or write OSC 52
clipboard payloads through ``sandboxrun run``:

- ``TerminalSanitizer``: the command's live output, as bytes, when it goes to a terminal;
- ``clean_text``: every line sandboxrun writes itself (errors, warnings, denial evidence, the
  final line, log records), always: they quote the command's output and error text;
- ``escape_json_controls``: JSON text with DEL and C1 written as ``\\u`` escapes (JSON
  escapes C0 itself), the same value for a parser, inert on a terminal.
"""

from __future__ import annotations

import re

_C0 = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")
_C1 = re.compile(rb"\xc2([\x80-\x9f])")


def _caret(match: re.Match[bytes]) -> bytes:
    code = match.group()[0]
    return b"^?" if code == 0x7F else b"^" + bytes([code + 0x40])


def _c1(match: re.Match[bytes]) -> bytes:
    return f"<U+{match.group(1)[0]:02X}>".encode()


class TerminalSanitizer:
    """Stateful (a ``\\xc2`` lead byte may end one chunk and its C1 byte start the next)."""

    def __init__(self) -> None:
        self._carry = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._carry + chunk
        self._carry = b""
        if data.endswith(b"\xc2"):
            data, self._carry = data[:-1], b"\xc2"
        return _C1.sub(_c1, _C0.sub(_caret, data))

    def flush(self) -> bytes:
        carry, self._carry = self._carry, b""
        return carry


_C0_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_C1_TEXT = re.compile("[\x80-\x9f]")
_JSON_CONTROLS = re.compile("[\x7f-\x9f]")


def _caret_text(match: re.Match[str]) -> str:
    code = ord(match.group())
    return "^?" if code == 0x7F else "^" + chr(code + 0x40)


def _c1_text(match: re.Match[str]) -> str:
    return f"<U+{ord(match.group()):02X}>"


def clean_text(text: str) -> str:
    """``text`` with its control characters shown as ``TerminalSanitizer`` shows them (C0 but
    tab and newline, DEL: ``^X``; C1: ``<U+9B>``); everything else, lone surrogates (bytes that
    are not UTF-8) included, as it is."""
    if text.isprintable():  # the common case (tab and newline are not printable: checked below)
        return text
    return _C1_TEXT.sub(_c1_text, _C0_TEXT.sub(_caret_text, text))


def escape_json_controls(text: str) -> str:
    """JSON text (from ``json.dumps``, which escapes C0 itself) with DEL and the C1 controls
    written as ``\\u007f`` ... ``\\u009f``: the same value for any parser (those characters only
    occur inside strings), and no byte a terminal obeys."""
    return _JSON_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
