"""Parsing of human sizes (``512m``, ``2GiB``) and durations. Pure."""

from __future__ import annotations

import re

from sandboxrun.errors import ConfigError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_FACTORS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


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
