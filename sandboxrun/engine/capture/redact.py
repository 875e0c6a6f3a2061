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

Beyond the output, everything sandboxrun itself says goes through the same values (issue 17):
``mask_model`` masks every string of a result (``Sandbox`` returns results masked: ``error``,
``warnings``, the denial's evidence, ``argv``, ...), the CLI masks its lines and its JSON
(``sandboxrun.cli.report``), and ``LOG_MASK``, a filter on the ``sandboxrun`` logger, masks
every record with the values of every live ``Sandbox`` (``SecretBook``) and neutralizes its
control characters (``sanitize.clean_text``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from sandboxrun.engine.env import is_secret_name
from sandboxrun.engine.sanitize import clean_text

if TYPE_CHECKING:
    from pydantic import BaseModel

    from sandboxrun.engine.request import ExecRequest

    Model = TypeVar("Model", bound=BaseModel)

MIN_SECRET_BYTES = 4
"""Values shorter than this are not masked."""
_UNSPAN_TRIES = 8


def marker(name: str) -> bytes:
    """What stands in the output for the value of ``name``."""
    return f"[masked:{name}]".encode("utf-8", "backslashreplace")


_CUT_MARK = "\u2026(".encode()
_CUT = re.compile(re.escape(_CUT_MARK) + rb"\d+ bytes\)")
"""How sandboxrun marks a string it cut (``_runner.clip``): ``…(1200008 bytes)``."""


class Redactor:
    """Streaming masker of ``secrets`` (name -> value) in one byte stream (module docstring)."""

    __slots__ = ("_first", "_held", "_longest", "_markers", "_pattern", "_values", "names")

    def __init__(self, secrets: Mapping[str, bytes] | Iterable[tuple[str, bytes]]) -> None:
        """``secrets``: name -> value, or ``(name, value)`` pairs (a name may then come with
        several values: each is masked with that name)."""
        pairs = secrets.items() if isinstance(secrets, Mapping) else secrets
        markers: dict[bytes, bytes] = {}
        names: list[str] = []
        for name, raw in sorted((name, bytes(value)) for name, value in pairs):
            if len(raw) >= MIN_SECRET_BYTES:
                markers.setdefault(raw, marker(name))
                if name not in names:
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

    def mask(self, data: bytes) -> bytes:
        """``data`` masked whole, as one stream fed and flushed (what is held is untouched).
        A string cut by sandboxrun (``…(N bytes)``, the supervisor's bound) may end inside a
        value: the start of a value just before the cut is masked too."""
        if self._pattern is None or not data:
            return data
        out, _ = self._mask(data, len(data))
        if _CUT_MARK not in out:
            return out
        pieces, last = [], 0
        for cut in _CUT.finditer(out):
            pieces += [self._tail_masked(out[last : cut.start()]), cut.group()]
            last = cut.end()
        return b"".join([*pieces, out[last:]])

    def _tail_masked(self, head: bytes) -> bytes:
        """``head`` with its longest end that begins some value (cut off there) masked."""
        best, value = 0, b""
        for candidate in self._values:
            for size in range(min(len(candidate) - 1, len(head)), best, -1):
                if head.endswith(candidate[:size]):
                    best, value = size, candidate
                    break
        return head[: len(head) - best] + self._markers[value] if best else head

    def mask_text(self, text: str) -> str:
        """``text`` masked: encoded as the values are (``os.fsencode``: lone surrogates are the
        bytes they stand for), masked, decoded the same way; ``text`` itself when unchanged."""
        if self._pattern is None or not text:
            return text
        try:
            data = os.fsencode(text)
        except UnicodeEncodeError:  # a surrogate that stands for no byte: kept as it is
            data = text.encode("utf-8", "surrogatepass")
            masked = self.mask(data)
            return text if masked == data else masked.decode("utf-8", "surrogatepass")
        masked = self.mask(data)
        return text if masked == data else os.fsdecode(masked)

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


def secret_pairs(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, bytes]]:
    """The ``(name, value)`` pairs whose names are secret-shaped, values encoded as the command
    gets them (one that cannot be encoded is left out: it cannot reach a command either)."""
    found = []
    for name, value in pairs:
        if is_secret_name(name):
            try:
                found.append((name, os.fsencode(value)))
            except UnicodeEncodeError:
                continue
    return found


def redactor_of(secrets: Mapping[str, bytes] | Iterable[tuple[str, bytes]]) -> Redactor | None:
    """A redactor of ``secrets``, or None when none of them is long enough to be masked."""
    redactor = Redactor(secrets)
    return redactor if redactor.names else None


def redactor_for(request: ExecRequest) -> Redactor | None:
    """The redactor of a run's output, or None when there is nothing to mask."""
    if not request.policy.mask_output:
        return None
    env = request.env
    return redactor_of(secret_pairs((name, env[name]) for name in request.explicit if name in env))


def mask_argv(argv: list[str], request: ExecRequest) -> list[str]:
    """``argv`` as the result shows it: the values masked in the output are masked here too
    (a command line that carries a secret, such as ``sh -c '...' "$TOKEN"``)."""
    redactor = redactor_for(request)
    if redactor is None:
        return argv
    return [redactor.mask_text(item) for item in argv]


def mask_model(model: Model, redactor: Redactor | None, *, keep: tuple[type, ...] = ()) -> Model:
    """``model`` (a result, a denial) with every string in it masked: fields, list items and
    nested models, except models of the types in ``keep`` (``Sandbox`` keeps the ``Policy`` of
    a denial's ``escalate_to`` exact: it is what an escalation runs under). The same object
    when nothing changed."""
    if redactor is None:
        return model
    from sandboxrun.engine.results import rewrite  # (not at import: the CLI's start stays light)

    masked = _masked(model, redactor, keep, rewrite)
    return model if masked is model else masked  # type: ignore[no-any-return]


def _masked(
    value: Any, redactor: Redactor, keep: tuple[type, ...], rewrite: Callable[[Any, Any], Any]
) -> Any:
    if isinstance(value, str):
        return redactor.mask_text(value)
    if isinstance(value, list | tuple):
        items = [_masked(item, redactor, keep, rewrite) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return type(value)(items)
    fields = getattr(type(value), "model_fields", None)
    if fields is None or isinstance(value, keep):
        return value
    update = {}
    for name in fields:
        old = getattr(value, name)
        new = _masked(old, redactor, keep, rewrite)
        if new is not old:
            update[name] = new
    return rewrite(value, update)


class SecretBook:
    """The secret values one owner (a ``Sandbox``) was given, for ``LOG_MASK``: it masks them
    in log records while the owner lives (``LOG_MASK.watch``)."""

    __slots__ = ("__weakref__", "pairs")

    def __init__(self) -> None:
        self.pairs: set[tuple[str, bytes]] = set()

    def note(self, secrets: Iterable[tuple[str, bytes]]) -> None:
        """Add ``secrets``, ``(name, value)`` pairs (``secret_pairs``)."""
        self.pairs.update(secrets)


class LogMasking(logging.Filter):
    """The filter of the ``sandboxrun`` logger: each record's message (and traceback) masked
    with the values of every live ``SecretBook``, its control characters neutralized
    (``sanitize.clean_text``: a log read on a terminal must not obey a command's escapes).
    Records are never dropped."""

    def __init__(self) -> None:
        super().__init__("sandboxrun")
        self._books: weakref.WeakSet[SecretBook] = weakref.WeakSet()
        self._lock = threading.Lock()

    def watch(self, book: SecretBook) -> None:
        with self._lock:
            self._books.add(book)

    def redactor(self) -> Redactor | None:
        """A redactor of every value in the live books (None: no value to mask)."""
        with self._lock:
            pairs = {pair for book in self._books for pair in list(book.pairs)}
        redactor = Redactor(pairs)
        return redactor if redactor.names else None

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot be formatted is the logging module's to report
            return True
        redactor = self.redactor()
        shown = clean_text(redactor.mask_text(message) if redactor else message)
        if shown != message:
            record.msg, record.args = shown, None
        if record.exc_info and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = clean_text(redactor.mask_text(text) if redactor else text)
        return True


LOG_MASK = LogMasking()
logging.getLogger("sandboxrun").addFilter(LOG_MASK)
