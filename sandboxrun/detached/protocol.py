"""The keeper's wire format: one JSON object per line, bytes as base64 (pure logic, no I/O).

Client to keeper: ``{"op": "exec", ...}`` (then ``{"op": "stdin", "b64": ...}`` frames,
``{"op": "eof"}`` and, to stop the run, ``{"op": "cancel"}``), ``{"op": "info"}``,
``{"op": "rm", "force": bool}``, ``{"op": "read_file", "path", "max_bytes"}`` (answered by
``{"chunk": "file", "b64"}`` frames, then ``{"file": {"size"}}``), ``{"op": "write_file",
"path", "size", "mode", "parents"}`` then ``{"b64"}`` frames of ``size`` bytes in all
(answered by ``{"written": {"size"}}``), ``{"op": "list_dir", "path", "max_entries"}``
(``{"entries": [...]}`` frames, then ``{"listed": {"count"}}``). Keeper to client:
``{"out": "stdout"|"stderr", "b64": ...}`` and ``{"credit": n}`` (stdin taken) while an exec
runs, ``{"removing": {"within_s": s}}`` when an ``rm`` is taken, then one final frame:
``{"result": ...}``, ``{"info": ...}``, ``{"removed": ...}`` or
``{"error": {"type": ..., "message": ...}}``."""

from __future__ import annotations

import base64
import binascii
import json
from contextlib import suppress
from typing import Any

from sandboxrun.errors import SandboxrunError

MAX_LINE = 1 << 20
"""The longest frame taken (output and stdin travel in chunks well below it)."""
CHUNK = 64 << 10
"""The largest piece of output or stdin one frame carries."""
STDIN_WINDOW = 1 << 20
"""The stdin bytes a client may send ahead of what the command took: the keeper gives credit
(``{"credit": n}`` frames) as it writes them to the command."""


WRITE_MAX = 64 << 20
"""The most bytes one ``write_file`` through a keeper takes (held until they are written)."""


class ProtocolError(SandboxrunError):
    """A frame that is not one of the protocol's."""


def encode(frame: dict[str, Any]) -> bytes:
    """One frame as a line."""
    line = json.dumps(frame, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise ProtocolError(f"frame of {len(line)} bytes exceeds {MAX_LINE}")
    return line


def data_frame(key: str, value: str, data: bytes) -> bytes:
    """A frame carrying bytes: ``{key: value, "b64": ...}``."""
    return encode({key: value, "b64": base64.b64encode(data).decode()})


def data_of(frame: dict[str, Any]) -> bytes:
    """The bytes a frame carries (``ProtocolError`` when they are not valid base64)."""
    raw = frame.get("b64")
    if not isinstance(raw, str):
        raise ProtocolError("a data frame without its 'b64' string")
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("a data frame whose 'b64' is not base64") from None


def decode(line: bytes) -> dict[str, Any]:
    """One line (with or without its newline) as a frame: a JSON object, else
    ``ProtocolError``."""
    if len(line) > MAX_LINE:
        raise ProtocolError(f"frame of {len(line)} bytes exceeds {MAX_LINE}")
    try:
        frame = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("a frame that is not JSON") from None
    if not isinstance(frame, dict):
        raise ProtocolError("a frame that is not a JSON object")
    return frame


class Lines:
    """Splits a byte stream into frames (``feed`` returns the complete ones)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        frames: list[dict[str, Any]] = []
        while True:
            end = self._buf.find(b"\n")
            if end < 0:
                if len(self._buf) > MAX_LINE:
                    raise ProtocolError(f"a frame longer than {MAX_LINE} bytes")
                return frames
            line = bytes(self._buf[:end])
            del self._buf[: end + 1]
            frames.append(decode(line))

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buf)


def error_frame(exc: BaseException) -> bytes:
    """The final frame for an error (a file error's ``path`` and ``errno`` too)."""
    error: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    for attr in ("path", "errno", "size", "limit"):
        value = getattr(exc, attr, None)
        if isinstance(value, str | int) and not isinstance(value, bool):
            error[attr] = value
    return encode({"error": error})


def raise_error(frame: dict[str, Any]) -> None:
    """Raise the error an ``{"error": ...}`` frame carries, as the class of sandboxrun's error
    tree it names (``SandboxrunError`` for any other)."""
    from sandboxrun import errors

    error = frame.get("error")
    if not isinstance(error, dict):
        return
    kind = getattr(errors, str(error.get("type")), None)
    message = str(error.get("message", "the keeper failed"))
    found: SandboxrunError = SandboxrunError(message)
    if isinstance(kind, type) and issubclass(kind, errors.SandboxFileError):
        # as raised in the keeper: its class, path and errno (TooLarge's size and limit)
        found = kind.__new__(kind)
        path, number = str(error.get("path", "")), error.get("errno")
        errors.SandboxFileError.__init__(
            found, message, path, number if isinstance(number, int) else None
        )
        for attr in ("size", "limit"):
            if isinstance(error.get(attr), int):
                setattr(found, attr, error[attr])
    elif isinstance(kind, type) and issubclass(kind, SandboxrunError):
        with suppress(TypeError):  # (one whose constructor takes more than the message)
            found = kind(message)
    raise found
