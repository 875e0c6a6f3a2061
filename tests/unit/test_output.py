"""Unit tests of the bounded head/tail output buffer (``sandboxrun.engine.capture.buffer``)."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxrun.engine.capture.buffer import HeadTailBuffer, Rendered, omission_marker

MARKER = re.compile(r"\[\.\.\. (\d+) bytes omitted \.\.\.\]")
CHARS = ["é", "€", "😀"]  # 2-, 3- and 4-byte UTF-8


def feed_in(buf: HeadTailBuffer, data: bytes, size: int) -> None:
    for i in range(0, len(data), size):
        buf.feed(data[i : i + size])


def render(data: bytes, max_output: int, size: int | None = None) -> Rendered:
    buf = HeadTailBuffer(max_output)
    feed_in(buf, data, size or max(1, len(data)))
    return buf.render()


def split(text: str) -> tuple[str, int, str]:
    """Split a truncated text into (head part, N, tail part) at its single marker."""
    matches = list(MARKER.finditer(text))
    assert len(matches) == 1, text  # callers never put a marker-like text in the stream
    m = matches[0]
    return text[: m.start()], int(m.group(1)), text[m.end() :]


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def assert_represents(data: bytes, max_output: int, result: Rendered) -> None:
    """``result`` is decode(data[:h]) + marker(N) + decode(data[-k:]) for legal cuts h and k."""
    head_cap = max_output // 2
    tail_cap = max_output - head_cap
    assert result.truncated
    assert result.total_bytes == len(data)
    n = result.dropped_bytes
    candidates = [
        (h, k)
        for h in range(max(0, head_cap - 3), head_cap + 1)
        for k in range(max(0, tail_cap - 3), tail_cap + 1)
        if h + k + n == len(data)
    ]
    expected = {
        decode(data[:h]) + omission_marker(n) + decode(data[len(data) - k :]) for h, k in candidates
    }
    assert result.text in expected


def test_marker() -> None:
    assert omission_marker(5) == "[... 5 bytes omitted ...]"
    assert MARKER.fullmatch(omission_marker(123))


def test_rejects_non_positive_max_output() -> None:
    with pytest.raises(ValueError, match="max_output"):
        HeadTailBuffer(0)


def test_caps_split() -> None:
    buf = HeadTailBuffer(65)
    assert (buf.head_cap, buf.tail_cap, buf.max_output) == (32, 33, 65)


def test_empty_stream() -> None:
    buf = HeadTailBuffer(64)
    buf.feed(b"")
    assert buf.render() == Rendered(text="", total_bytes=0, dropped_bytes=0, truncated=False)
    assert buf.snapshot_bytes() == b""
    assert buf.total_bytes == 0
    assert buf.buffered_bytes == 0


@pytest.mark.parametrize("max_output", [1, 2, 7, 64, 65])
@pytest.mark.parametrize("extra", [-1, 0, 1, None])
@pytest.mark.parametrize("size", [1, 3, 64, 10**6])
def test_edges(max_output: int, extra: int | None, size: int) -> None:
    total = 2 * max_output if extra is None else max_output + extra
    data = bytes(i % 26 + 97 for i in range(total))  # ASCII: no code point to protect
    buf = HeadTailBuffer(max_output)
    feed_in(buf, data, size)
    result = buf.render()
    assert result.total_bytes == buf.total_bytes == total
    if total <= max_output:
        assert result == Rendered(decode(data), total, 0, False)
        assert buf.snapshot_bytes() == data
        return
    head_cap = max_output // 2
    dropped = total - max_output
    expected = (
        decode(data[:head_cap]) + omission_marker(dropped) + decode(data[head_cap + dropped :])
    )
    assert result == Rendered(expected, total, dropped, True)
    with pytest.raises(RuntimeError):
        buf.snapshot_bytes()


def test_exact_accounting_in_marker() -> None:
    data = b"x" * 10_000
    result = render(data, 100, 333)
    head, n, tail = split(result.text)
    assert n == result.dropped_bytes == 10_000 - len(head.encode()) - len(tail.encode())
    assert (len(head), len(tail)) == (50, 50)


@pytest.mark.parametrize("char", CHARS)
def test_head_cut_never_splits_a_code_point(char: str) -> None:
    enc = char.encode()
    head_cap = 32
    for inside in range(1, len(enc)):  # bytes of the char that fit before the head cap
        data = b"a" * (head_cap - inside) + enc + b"b" * 500
        result = render(data, 2 * head_cap, 7)
        head, n, tail = split(result.text)
        assert "\ufffd" not in result.text
        assert head == "a" * (head_cap - inside)
        assert n == len(data) - (head_cap - inside) - len(tail.encode())
    # A code point ending exactly at the cap is kept whole.
    data = b"a" * (head_cap - len(enc)) + enc + b"b" * 500
    head, _, _ = split(render(data, 2 * head_cap).text)
    assert head == "a" * (head_cap - len(enc)) + char


@pytest.mark.parametrize("char", CHARS)
def test_tail_cut_never_splits_a_code_point(char: str) -> None:
    enc = char.encode()
    tail_cap = 32
    for inside in range(1, len(enc)):  # bytes of the char that fall inside the tail
        data = b"a" * 500 + enc + b"b" * (tail_cap - inside)
        result = render(data, 2 * tail_cap, 5)
        head, n, tail = split(result.text)
        assert "\ufffd" not in result.text
        assert tail == "b" * (tail_cap - inside)
        assert n == len(data) - len(head.encode()) - (tail_cap - inside)
    data = b"a" * 500 + enc + b"b" * (tail_cap - len(enc))
    _, _, tail = split(render(data, 2 * tail_cap).text)
    assert tail == char + "b" * (tail_cap - len(enc))


@pytest.mark.parametrize(
    ("ending", "kept"),
    [
        (b"\xff", True),  # invalid byte: not a prefix, decoded as U+FFFD
        (b"a\x80", True),  # stray continuation byte
        (b"\xe0\x80", True),  # E0 needs A0..BF next: invalid, not an incomplete prefix
        (b"\xc3", False),  # incomplete 2-byte sequence: moved back
        (b"\xf0\x9f\x98", False),  # incomplete 4-byte sequence: moved back
    ],
)
def test_head_cut_only_backs_off_valid_incomplete_prefixes(ending: bytes, kept: bool) -> None:
    head = b"a" * (32 - len(ending)) + ending
    result = render(head + b"z" * 100, 64)
    text_head, n, _ = split(result.text)
    if kept:
        assert text_head == decode(head)
        assert n == 100 - 32
    else:
        assert text_head == decode(head[: 32 - len(ending)])
        assert n == 100 - 32 + len(ending)


def test_tail_skips_at_most_three_continuation_bytes() -> None:
    data = b"a" * 100 + b"\x80" * 5 + b"b" * 27  # tail = 5 continuation bytes + 27 b
    result = render(data, 64)
    _, n, tail = split(result.text)
    assert tail == "\ufffd\ufffd" + "b" * 27
    assert n == len(data) - 32 - 29


def test_invalid_nul_and_ansi_preserved() -> None:
    data = b"\x1b[31mred\x1b[0m\x00nul\xff\xfeend"
    result = render(data, 64, 1)
    assert result.text == "\x1b[31mred\x1b[0m\x00nul\ufffd\ufffdend"
    assert not result.truncated
    big = data * 20
    result = render(big, 64, 3)
    head, _, tail = split(result.text)
    assert head.startswith("\x1b[31mred\x1b[0m\x00nul\ufffd\ufffdend")
    assert tail.endswith("\x00nul\ufffd\ufffdend")


@pytest.mark.parametrize("size", [1, 17, 32, 33, 64, 65, 100, 4096, 1 << 20])
def test_memory_never_exceeds_max_output(size: int) -> None:
    buf = HeadTailBuffer(64)
    chunk = bytes(range(256)) * (size // 256 + 1)
    for i in range(300 if size < 4096 else 5):
        buf.feed(chunk[:size])
        assert buf.buffered_bytes <= 64
        assert len(buf._head) <= buf.head_cap
        # The tail deque holds at most the tail plus (part of) one chunk, in few pieces.
        assert buf._tail_bytes <= 2 * buf.tail_cap
        assert buf._tail_bytes < buf.tail_cap + size + 1
        assert len(buf._chunks) <= HeadTailBuffer._COMPACT_AT + 1
        assert buf.total_bytes == size * (i + 1)


def test_huge_chunk_then_small_chunks() -> None:
    data = bytes(i % 251 for i in range(3 << 20))
    buf = HeadTailBuffer(1000)
    buf.feed(data[: 1 << 20])
    buf.feed(data[1 << 20 : (1 << 20) + 1])
    buf.feed(data[(1 << 20) + 1 :])
    assert buf.render() == render(data, 1000)


def test_mutable_chunk_is_copied() -> None:
    chunk = bytearray(b"x" * 50)
    buf = HeadTailBuffer(64)
    buf.feed(chunk)
    buf.feed(chunk)
    chunk[:] = b"y" * 50
    assert buf.render() == render(b"x" * 100, 64)


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=400),
    max_output=st.integers(min_value=1, max_value=80),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_chunking_does_not_matter(data: bytes, max_output: int, cuts: list[int]) -> None:
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    buf = HeadTailBuffer(max_output)
    for lo, hi in itertools.pairwise(bounds):
        buf.feed(data[lo:hi])
        assert buf.buffered_bytes <= max_output
    result = buf.render()
    assert result == render(data, max_output)
    if len(data) <= max_output:
        assert result == Rendered(decode(data), len(data), 0, False)
    else:
        assert_represents(data, max_output, result)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(
        alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\ufffd[]"),
        max_size=200,
    ),
    max_output=st.integers(min_value=1, max_value=80),
    size=st.integers(min_value=1, max_value=50),
)
def test_valid_utf8_is_never_split(text: str, max_output: int, size: int) -> None:
    data = text.encode()
    result = render(data, max_output, size)
    assert "\ufffd" not in result.text
    if not result.truncated:
        assert result.text == text
        return
    head, n, tail = split(result.text)
    assert text.startswith(head)
    assert text.endswith(tail)
    assert n == result.dropped_bytes == len(data) - len(head.encode()) - len(tail.encode())
    assert len(head.encode()) > max_output // 2 - 4
    assert len(tail.encode()) > max_output - max_output // 2 - 4
