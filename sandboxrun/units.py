"""Parsing and printing of human sizes (``512m``, ``2GiB``) and durations (``90``, ``1.5s``,
``500ms``, ``10m``, ``1h``). Pure."""

from __future__ import annotations

import re

from sandboxrun.errors import ConfigError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_FACTORS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_DURATION = re.compile(r"^\s*(-?)(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_SECONDS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
DURATION_FORMS = "90, 90s, 1.5s, 500ms, 10m or 1h"
"""What a duration looks like, for messages and help."""


def parse_size(text: str, *, what: str = "size") -> int:
    """``"512m"`` -> 536870912. Suffixes k/m/g/t (binary, optional ``b``/``ib``); bare = bytes."""
    match = _SIZE.match(text)
    if match is None:
        raise ConfigError(f"invalid {what} {text!r}: expected a number with a k/m/g/t suffix")
    number, unit, _ = match.groups()
    value = float(number) * _FACTORS[unit.lower()]
    if value != int(value):
        raise ConfigError(f"invalid {what} {text!r}: not a whole number of bytes")
    return int(value)


def parse_duration(text: str, *, what: str = "duration", allow_zero: bool = False) -> float:
    """``"90"``, ``"90s"``, ``"1.5s"``, ``"500ms"``, ``"10m"``, ``"1h"`` -> seconds. A bare
    number is seconds. Negative, not-a-number, infinite, empty and unknown suffixes are refused
    (``ConfigError`` naming ``what``), and zero unless ``allow_zero``."""
    match = _DURATION.match(text)
    if match is None:
        raise ConfigError(f"invalid {what} {text!r}: expected a duration such as {DURATION_FORMS}")
    sign, number, unit = match.groups()
    seconds = float(number) * _SECONDS[(unit or "").lower()]
    if sign and seconds:
        raise ConfigError(f"{what} must not be negative, got {text.strip()!r}")
    if seconds == 0 and not allow_zero:
        raise ConfigError(f"{what} must be more than 0, got {text.strip()!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as the shortest exact duration ``parse_duration`` reads back: ``10s``, ``1.5s``,
    ``500ms``, ``10m``, ``1h``, ``90s``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    if 0 < seconds < 1 and round(seconds * 1000, 6) == int(round(seconds * 1000, 6)):
        return f"{round(seconds * 1000):d}ms"
    return f"{seconds:g}s"


def format_size(size: int) -> str:
    """Bytes in the largest binary unit that holds them exactly: ``64m``, ``1536k``, ``100``."""
    for unit in ("t", "g", "m", "k"):
        factor = _FACTORS[unit]
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)
