from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxrun.backends.docker.demux import FrameDecoder, FrameError


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(payload)) + payload


def decode(chunks: list[bytes]) -> dict[str, bytes]:
    out = {"stdout": b"", "stderr": b""}

    def emit(name: str, data: bytes) -> None:
        assert data, "empty pieces must not be emitted"
        out[name] += data

    dec = FrameDecoder(emit)
    for chunk in chunks:
        dec.feed(chunk)
    assert not dec.mid_frame
    return out


def test_simple_frames() -> None:
    data = frame(1, b"out") + frame(2, b"err") + frame(1, b"more")
    assert decode([data]) == {"stdout": b"outmore", "stderr": b"err"}


def test_empty_payload_frame() -> None:
    assert decode([frame(1, b""), frame(2, b"x")]) == {"stdout": b"", "stderr": b"x"}


def test_byte_by_byte() -> None:
    data = frame(1, b"hello") + frame(2, b"\x00\xff") + frame(1, bytes(70000))
    assert decode([data[i : i + 1] for i in range(len(data))]) == {
        "stdout": b"hello" + bytes(70000),
        "stderr": b"\x00\xff",
    }


def test_unknown_stream_is_an_error() -> None:
    dec = FrameDecoder(lambda n, d: None)
    with pytest.raises(FrameError, match="unknown stream id 7"):
        dec.feed(frame(7, b"x"))


def test_truncated_stream_is_reported() -> None:
    dec = FrameDecoder(lambda n, d: None)
    dec.feed(frame(1, b"abcdef")[:10])
    assert dec.mid_frame
    dec2 = FrameDecoder(lambda n, d: None)
    dec2.feed(b"\x01\x00\x00")
    assert dec2.mid_frame


@given(
    st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=300)), max_size=20),
    st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=30),
)
def test_any_chunking_gives_the_same_streams(
    frames: list[tuple[int, bytes]], cuts: list[int]
) -> None:
    data = b"".join(frame(s, p) for s, p in frames)
    chunks, pos, i = [], 0, 0
    while pos < len(data):
        size = cuts[i % len(cuts)]
        chunks.append(data[pos : pos + size])
        pos += size
        i += 1
    expected = {
        "stdout": b"".join(p for s, p in frames if s == 1),
        "stderr": b"".join(p for s, p in frames if s == 2),
    }
    assert decode(chunks) == expected
