"""Masking secret values in a command's output, as a stream. Pure: no I/O.

``Redactor`` replaces every occurrence of each secret value with ``[masked:NAME]`` in a byte
stream fed in chunks of any size, with the same result as masking the whole stream at once:

- a value split across any number of chunks is still masked: ``feed`` holds back the longest
  end of what it has seen that is still the start of some value (so at most
  ``len(longest value) - 1`` bytes, and nothing when the output does not end that way) and
  returns everything else at once, so live output stays live; ``flush`` returns what is held
  when the stream ends;
- where values overlap or share a prefix, the leftmost occurrence wins, and of those starting
  at the same byte the longest value (``abc`` inside ``abcdef``: only ``abcdef`` is masked when
  both are secrets); a value that occurs back to back is masked each time; a marker is never
  masked again.

Values shorter than ``MIN_SECRET_BYTES`` (and empty ones) are not masked: masking ``1`` or
``on`` would wreck the output and hide nothing. Two names with the same value are masked with
the first name in sorted order.

Which values (``redactor_for``): those of the variables the caller gave explicitly (``env=``,
``--env NAME=VALUE``) whose names are secret-shaped (``env.is_secret_name``), unless the policy
says ``mask_output=False``. Values are encoded as they are passed to the command
(``os.fsencode``). Only the exact bytes are masked, not other spellings of them (base64,
URL-encoded, split by the command with other output in between).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from sandboxrun.env import is_secret_name
from sandboxrun.spec import ExecRequest

MIN_SECRET_BYTES = 4
"""Values shorter than this are not masked."""
_UNSPAN_TRIES = 8


def marker(name: str) -> bytes:
    """What stands in the output for the value of ``name``."""
    return f"[masked:{name}]".encode("utf-8", "backslashreplace")


class Redactor:
    """Streaming masker of ``secrets`` (name -> value) in one byte stream (module docstring)."""

    __slots__ = ("_first", "_held", "_longest", "_markers", "_pattern", "_values", "names")

    def __init__(self, secrets: Mapping[str, bytes]) -> None:
        markers: dict[bytes, bytes] = {}
        names: list[str] = []
        for name in sorted(secrets):
            value = bytes(secrets[name])
            if len(value) >= MIN_SECRET_BYTES:
                markers.setdefault(value, marker(name))
                names.append(name)
        self.names: tuple[str, ...] = tuple(names)
        """The names whose values are masked (sorted)."""
        # Longest first: at each position the alternation takes the first value that matches.
        self._values = sorted(markers, key=len, reverse=True)
        self._markers = markers
        self._longest = len(self._values[0]) if self._values else 0
        self._first = frozenset(v[0] for v in self._values)
        self._pattern = (
            re.compile(b"|".join(re.escape(v) for v in self._values)) if self._values else None
        )
        self._held = b""

    @property
    def held(self) -> int:
        """How many bytes ``feed`` is holding back (they come out of a later feed or ``flush``)."""
        return len(self._held)

    def feed(self, chunk: bytes) -> bytes:
        """The masked output up to where a value may still be starting; the rest is held."""
        if self._pattern is None:
            return chunk
        data = self._held + chunk if self._held else chunk
        if not data:
            return b""
        cut = self._undecided(data, 0)
        if not any(v in data for v in self._values):  # the common case: nothing to mask
            self._held = data[cut:]
            return data if cut == len(data) else data[:cut]
        out, pos = self._mask(data, cut)
        self._held = data[pos:]
        return out

    def flush(self) -> bytes:
        """The end of the stream: everything held, masked."""
        data, self._held = self._held, b""
        if not data or self._pattern is None:
            return data
        out, _ = self._mask(data, len(data))
        return out

    def _mask(self, data: bytes, cut: int) -> tuple[bytes, int]:
        """Mask ``data`` up to the first undecided position; return the output and that position."""
        pattern = self._pattern
        assert pattern is not None
        # The bulk in one C call: up to a position no occurrence spans, the scan of ``data``
        # and that of the prefix alone agree. Then the few bytes left, match by match.
        pos = self._unspanned(data, cut)
        parts = [self._replace(data[:pos])] if pos else []
        while True:
            m = pattern.search(data, pos)
            if m is None or m.start() >= cut:
                parts.append(data[pos:cut])
                return b"".join(parts), cut
            parts.append(data[pos : m.start()])
            parts.append(self._markers[m.group()])
            pos = m.end()
            if pos > cut:  # the match covered the first undecided position: find the next
                cut = self._undecided(data, pos)

    def _replace(self, region: bytes) -> bytes:
        if len(self._values) == 1:  # bytes.replace is the same leftmost, non-overlapping scan
            value = self._values[0]
            return region.replace(value, self._markers[value])
        assert self._pattern is not None
        return self._pattern.sub(self._marker_of, region)

    def _marker_of(self, m: re.Match[bytes]) -> bytes:
        return self._markers[m.group()]

    def _unspanned(self, data: bytes, end: int) -> int:
        """A position at or before ``end`` that no occurrence of a value spans (0 if it takes
        long to find: a value that overlaps itself, repeated)."""
        for _ in range(_UNSPAN_TRIES):
            start = end
            for v in self._values:
                n = len(v)
                p = data.find(v, max(0, end - n + 1), end + n - 1)
                if p != -1 and p < start:
                    start = p
            if start == end:
                return end
            end = start
        return 0

    def _undecided(self, data: bytes, start: int) -> int:
        """The first position from ``start`` whose outcome more data could change: the rest of
        ``data`` from there is a proper prefix of a (longer) value. ``len(data)`` if none."""
        n = len(data)
        first = self._first
        for i in range(max(start, n - self._longest + 1), n):
            if data[i] in first:
                rest = data[i:]
                k = n - i
                for v in self._values:
                    if len(v) > k and v.startswith(rest):
                        return i
        return n


def redactor_for(request: ExecRequest) -> Redactor | None:
    """The redactor of a run's output, or None when there is nothing to mask."""
    if not request.policy.mask_output:
        return None
    secrets = {
        name: os.fsencode(request.env[name])
        for name in request.explicit
        if name in request.env and is_secret_name(name)
    }
    redactor = Redactor(secrets)
    return redactor if redactor.names else None


def mask_argv(argv: list[str], request: ExecRequest) -> list[str]:
    """``argv`` as the result shows it: the values masked in the output are masked here too
    (a command line that carries a secret, such as ``sh -c '...' "$TOKEN"``)."""
    redactor = redactor_for(request)
    if redactor is None:
        return argv
    shown = []
    for item in argv:
        data = os.fsencode(item)
        masked = redactor.feed(data) + redactor.flush()
        shown.append(item if masked == data else os.fsdecode(masked))
    return shown
