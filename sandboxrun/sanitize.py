"""Neutralize terminal control sequences in live output written to a TTY. Pure.

Every C0 control byte except newline and tab, DEL, and the UTF-8 encodings of the C1 controls
(U+0080..U+009F, which some terminals obey like ESC sequences) become visible ``^X`` / ``<U+9B>``
text, so a command cannot move the cursor, retitle the window, hide text or write OSC 52
clipboard payloads through ``sandboxrun run``.
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
