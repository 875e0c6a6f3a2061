"""The streaming redactor: any chunking gives the one-shot result, nothing more is held back
than must be, and only explicit secret-shaped variables are masked."""

from __future__ import annotations

import itertools
import random
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxrun.engine.capture.redact import MIN_SECRET_BYTES, Redactor, marker, redactor_for
from sandboxrun.engine.capture.spill import SpillDir
from sandboxrun.engine.capture.stream import StreamCapture
from sandboxrun.engine.request import ExecRequest
from sandboxrun.models import Limits, Policy

TOKEN = b"s3cr3t-value-123"
M = b"[masked:API_TOKEN]"


def stream(r: Redactor, chunks: list[bytes]) -> tuple[bytes, list[bytes]]:
    """Everything the redactor lets out, and what each feed returned."""
    outs = [r.feed(c) for c in chunks]
    return b"".join(outs) + r.flush(), outs


def reference(secrets: dict[str, bytes], text: bytes) -> bytes:
    """One-shot masking, the slow obvious way: leftmost, then longest, never rescanning."""
    markers: dict[bytes, bytes] = {}
    for name in sorted(secrets):
        if len(secrets[name]) >= MIN_SECRET_BYTES:
            markers.setdefault(secrets[name], marker(name))
    values = sorted(markers, key=len, reverse=True)
    out, i = bytearray(), 0
    while i < len(text):
        for v in values:
            if text.startswith(v, i):
                out += markers[v]
                i += len(v)
                break
        else:
            out += text[i : i + 1]
            i += 1
    return bytes(out)


def split_at(text: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


# -- one secret ---------------------------------------------------------------------------------


def test_masks_a_value_in_one_chunk() -> None:
    out, _ = stream(Redactor({"API_TOKEN": TOKEN}), [b"token=" + TOKEN + b"\n"])
    assert out == b"token=" + M + b"\n"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 16])
def test_masks_a_value_split_across_chunks(size: int) -> None:
    text = b"a" + TOKEN + b"b" + TOKEN + TOKEN + b"c"
    chunks = [text[i : i + size] for i in range(0, len(text), size)]
    out, _ = stream(Redactor({"API_TOKEN": TOKEN}), chunks)
    assert out == b"a" + M + b"b" + M + M + b"c"


def test_a_value_one_byte_at_a_time_is_never_let_out() -> None:
    r = Redactor({"API_TOKEN": TOKEN})
    outs = [r.feed(bytes([b])) for b in TOKEN]
    assert outs[:-1] == [b""] * (len(TOKEN) - 1)
    assert outs[-1] == M
    assert r.flush() == b""


def test_back_to_back_values() -> None:
    out, _ = stream(Redactor({"API_TOKEN": b"abab"}), [b"abababab", b"ab"])
    assert out == M + M + b"ab"


def test_self_overlapping_value() -> None:
    # "aaaa" in "aaaaaa": leftmost, non-overlapping, like bytes.replace
    for chunks in ([b"aaaaaa"], [b"a"] * 6, [b"aaa", b"aaa"]):
        out, _ = stream(Redactor({"API_TOKEN": b"aaaa"}), chunks)
        assert out == b"aaaaaa".replace(b"aaaa", M)


def test_holds_back_only_what_may_start_a_value() -> None:
    r = Redactor({"API_TOKEN": TOKEN})
    assert r.feed(b"hello\n") == b"hello\n" and r.held == 0
    assert r.feed(b"pass: s3c") == b"pass: " and r.held == 3
    assert r.feed(b"X") == b"s3cX" and r.held == 0
    assert r.feed(b"x" * 100 + TOKEN[:-1]) == b"x" * 100
    assert r.held == len(TOKEN) - 1  # the most ever held: len(longest) - 1
    assert r.flush() == TOKEN[:-1]  # the stream ended: an unfinished value is not a value
    assert r.held == 0


def test_a_later_feed_after_flush_still_masks() -> None:
    r = Redactor({"API_TOKEN": TOKEN})
    assert r.feed(b"x") + r.flush() == b"x"
    assert r.feed(TOKEN) == M


@pytest.mark.parametrize("value", [b"", b"1", b"ab", b"abc"])
def test_short_values_are_not_masked(value: bytes) -> None:
    r = Redactor({"API_TOKEN": value})
    assert r.names == ()
    assert r.feed(b"abc 1 abc") == b"abc 1 abc"
    assert r.held == 0


def test_minimum_length_value_is_masked() -> None:
    assert MIN_SECRET_BYTES == 4
    out, _ = stream(Redactor({"API_TOKEN": b"abcd"}), [b"xabcdx"])
    assert out == b"x" + M + b"x"


def test_no_secrets_is_a_pass_through() -> None:
    r = Redactor({})
    chunk = b"anything" * 10
    assert r.feed(chunk) is chunk
    assert r.flush() == b""


def test_clean_chunk_is_returned_without_copy() -> None:
    r = Redactor({"API_TOKEN": TOKEN})
    chunk = b"y" * 65536
    assert r.feed(chunk) is chunk


def test_binary_and_non_utf8_values() -> None:
    value = b"\xff\x00\xfe\x80secret"
    out, _ = stream(Redactor({"KEY": value}), [b"\x00\xff", value[:3], value[3:] + b"\xff"])
    assert out == b"\x00\xff[masked:KEY]\xff"


def test_marker_is_not_masked_again() -> None:
    # the value occurs inside its own marker: the marker stays as it is
    out, _ = stream(Redactor({"API_TOKEN": b"masked"}), [b"a masked b"])
    assert out == b"a " + M + b" b"


# -- several secrets ----------------------------------------------------------------------------


def test_longest_match_first_for_prefix_sharing_values() -> None:
    secrets = {"SHORT_KEY": b"abcd", "LONG_KEY": b"abcdefgh"}
    for chunks in ([b"abcdefgh abcdx"], [b"abcd", b"efgh abcd", b"x"], [b"a"] * 5):
        text = b"".join(chunks)
        out, _ = stream(Redactor(secrets), chunks)
        assert out == reference(secrets, text)
    out, _ = stream(Redactor(secrets), [b"abcd", b"efgh"])
    assert out == b"[masked:LONG_KEY]"


def test_shorter_value_inside_an_unfinished_longer_one_at_the_end() -> None:
    secrets = {"SHORT_KEY": b"abcd", "LONG_KEY": b"abcdefgh"}
    r = Redactor(secrets)
    assert r.feed(b"abcdef") == b""  # could still become LONG_KEY
    assert r.flush() == b"[masked:SHORT_KEY]ef"


def test_value_that_is_a_substring_of_another() -> None:
    secrets = {"INNER_TOKEN": b"cdef", "OUTER_TOKEN": b"abcdefgh"}
    text = b"abcdefgh cdef abcdefgX"
    for size in range(1, len(text) + 1):
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        out, _ = stream(Redactor(secrets), chunks)
        assert out == b"[masked:OUTER_TOKEN] [masked:INNER_TOKEN] ab[masked:INNER_TOKEN]gX"


def test_overlapping_values_leftmost_wins() -> None:
    secrets = {"A_KEY": b"abcd", "B_KEY": b"cdXY"}
    for chunks in ([b"abcdXY"], [b"ab", b"cd", b"XY"], [b"abc", b"dXY"]):
        out, _ = stream(Redactor(secrets), chunks)
        assert out == b"[masked:A_KEY]XY"
    out, _ = stream(Redactor(secrets), [b"zcdX", b"Y"])
    assert out == b"z[masked:B_KEY]"
    r = Redactor(secrets)
    assert r.feed(b"abcdX") == b"[masked:A_KEY]X"  # "cdX" was undecided until A_KEY matched
    assert r.held == 0


def test_same_value_two_names_uses_the_first_name() -> None:
    r = Redactor({"Z_TOKEN": b"same-value", "A_TOKEN": b"same-value"})
    assert r.names == ("A_TOKEN", "Z_TOKEN")
    assert r.feed(b"same-value") == b"[masked:A_TOKEN]"


# -- property: any chunking equals the one-shot result ------------------------------------------

ALPHABET = b"ab-c"  # tiny: values and text collide, overlap and share prefixes all the time


@settings(max_examples=400, deadline=None)
@given(
    value=st.binary(min_size=0, max_size=8).map(lambda b: bytes(ALPHABET[x % 4] for x in b)),
    text=st.binary(max_size=80).map(lambda b: bytes(ALPHABET[x % 4] for x in b)),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=20),
)
def test_property_one_secret_equals_bytes_replace(
    value: bytes, text: bytes, cuts: list[int]
) -> None:
    out, _ = stream(Redactor({"API_TOKEN": value}), split_at(text, cuts))
    expected = text.replace(value, M) if len(value) >= MIN_SECRET_BYTES else text
    assert out == expected


@settings(max_examples=400, deadline=None)
@given(
    values=st.lists(
        st.binary(min_size=1, max_size=7).map(lambda b: bytes(ALPHABET[x % 4] for x in b)),
        min_size=1,
        max_size=4,
    ),
    text=st.binary(max_size=80).map(lambda b: bytes(ALPHABET[x % 4] for x in b)),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=20),
)
def test_property_several_secrets_equal_one_shot(
    values: list[bytes], text: bytes, cuts: list[int]
) -> None:
    secrets = {f"K{i}_TOKEN": v for i, v in enumerate(values)}
    r = Redactor(secrets)
    longest = max((len(v) for v in values if len(v) >= MIN_SECRET_BYTES), default=0)
    outs = []
    for chunk in split_at(text, cuts):
        outs.append(r.feed(chunk))
        assert r.held <= max(longest - 1, 0)
    out = b"".join(outs) + r.flush()
    assert out == reference(secrets, text)


def test_random_secrets_text_and_splits() -> None:
    rng = random.Random(9)
    for _ in range(3000):
        alphabet = rng.choice([b"ab", b"abc", b"xyz01-", bytes(range(256))])
        values = [
            bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
            for _ in range(rng.randint(1, 3))
        ]
        pieces = [
            rng.choice(values) if values and rng.random() < 0.3 else bytes([rng.choice(alphabet)])
            for _ in range(rng.randint(0, 60))
        ]
        text = b"".join(pieces)
        secrets = {f"S{i}_SECRET": v for i, v in enumerate(values)}
        cuts = [rng.randint(0, len(text)) for _ in range(rng.randint(0, 15))]
        out, _ = stream(Redactor(secrets), split_at(text, cuts))
        assert out == reference(secrets, text), (values, text, cuts)
        if len(values) == 1 and len(values[0]) >= MIN_SECRET_BYTES:
            assert out == text.replace(values[0], marker("S0_SECRET"))


def test_emits_everything_it_need_not_hold() -> None:
    """Liveness: after each feed, what is held is exactly the longest end of the stream so far
    that is a proper prefix of a value (and not part of a finished match)."""
    rng = random.Random(3)
    values = [b"abcab", b"bca-x"]
    secrets = {"A_KEY": values[0], "B_KEY": values[1]}
    for _ in range(500):
        r = Redactor(secrets)
        seen = b""
        for _ in range(rng.randint(1, 20)):
            chunk = bytes(rng.choice(b"abc-x") for _ in range(rng.randint(0, 6)))
            r.feed(chunk)
            seen += chunk
            assert r.held <= 4
            if r.held:
                assert any(v.startswith(seen[-r.held :]) for v in values)


# -- which values: redactor_for -----------------------------------------------------------------


def request(env: dict[str, str], explicit: set[str], policy: Policy | None = None) -> ExecRequest:
    return ExecRequest(
        run_id="r1",
        argv=["true"],
        script=None,
        env=env,
        path_prepend=[],
        workdir=Path("/tmp"),
        workdir_rel=PurePosixPath("."),
        stdin=None,
        timeout_s=10.0,
        limits=Limits(),
        policy=policy or Policy(),
        explicit=frozenset(explicit),
    )


def test_redactor_for_takes_explicit_secret_shaped_names_only() -> None:
    env = {
        "API_TOKEN": "s3cr3t-value-123",
        "db_password": "hunter2-long",
        "GREETING": "hello-world-1234",
        "GH_TOKEN": "from-the-host-not-explicit",
        "SHORT_KEY": "abc",
    }
    r = redactor_for(request(env, {"API_TOKEN", "db_password", "GREETING", "SHORT_KEY"}))
    assert r is not None
    assert r.names == ("API_TOKEN", "db_password")
    out = r.feed(b"s3cr3t-value-123 hunter2-long hello-world-1234 from-the-host-not-explicit abc")
    assert out + r.flush() == (
        b"[masked:API_TOKEN] [masked:db_password] hello-world-1234 from-the-host-not-explicit abc"
    )


def test_redactor_for_none_without_secrets_or_when_disabled() -> None:
    env = {"API_TOKEN": "s3cr3t-value-123", "GREETING": "hello-world-1234"}
    assert redactor_for(request(env, {"GREETING"})) is None
    assert redactor_for(request(env, set())) is None
    assert redactor_for(request({"API_TOKEN": "abc"}, {"API_TOKEN"})) is None
    off = Policy(mask_output=False)
    assert redactor_for(request(env, {"API_TOKEN"}, off)) is None


def test_redactor_for_encodes_like_the_command_sees_it() -> None:
    value = "caf\u00e9-\udcff-secret"  # non-ASCII and an undecodable byte (surrogateescape)
    r = redactor_for(request({"MY_SECRET": value}, {"MY_SECRET"}))
    assert r is not None
    assert r.feed(b"caf\xc3\xa9-\xff-secret!") == b"[masked:MY_SECRET]!"


# -- in the capture: buffer, spill and sink all see masked bytes --------------------------------


def test_capture_masks_buffer_spill_and_sink(tmp_path: Path) -> None:
    seen: list[bytes] = []
    capture = StreamCapture(
        "stdout",
        max_output=64,
        spill_max=1 << 20,
        spill_dir=SpillDir(tmp_path, "run"),
        sink=lambda _name, chunk: seen.append(chunk),
        redactor=Redactor({"API_TOKEN": TOKEN}),
    )
    data = (b"line " + TOKEN + b"\n") * 50 + b"end " + TOKEN[:5]
    for i in range(0, len(data), 7):
        capture.feed(data[i : i + 7])
    report = capture.report()  # the stream ended: the held-back bytes come out
    capture.close()
    masked = (b"line " + M + b"\n") * 50 + b"end " + TOKEN[:5]
    assert b"".join(seen) == masked
    assert report.spill is not None
    assert Path(report.spill).read_bytes() == masked
    assert report.total_bytes == len(masked)  # accounting counts the masked stream
    assert report.spill_complete
    assert report.truncated and TOKEN.decode() not in report.text
    assert report.text.endswith("end " + TOKEN[:5].decode())


def test_capture_flushes_held_bytes_on_close(tmp_path: Path) -> None:
    capture = StreamCapture("stderr", 1024, 0, None, redactor=Redactor({"API_TOKEN": TOKEN}))
    capture.feed(b"partial s3cr")
    assert capture.total_bytes == len(b"partial ")
    capture.close()
    capture.close()
    assert capture.report().text == "partial s3cr"
    assert capture.total_bytes == len(b"partial s3cr")


def test_capture_without_redactor_is_unchanged() -> None:
    capture = StreamCapture("stdout", 1024, 0, None)
    capture.feed(TOKEN)
    assert capture.report().text == TOKEN.decode()


@pytest.mark.parametrize(
    "secrets",
    [
        {"API_TOKEN": TOKEN},
        {"A_KEY": b"aaaa"},
        {"A_KEY": b"aaaa", "B_KEY": b"aaab", "C_KEY": b"ab-s3cr3t"},
    ],
)
def test_big_chunks_with_many_matches(secrets: dict[str, bytes]) -> None:
    rng = random.Random(5)
    words = [*secrets.values(), b"a", b"b", b"-", b"s3cr3t", b"\n"]
    text = b"".join(rng.choice(words) for _ in range(40_000))
    expected = reference(secrets, text)
    for size in (4096, 65536, 65537):
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        out, _ = stream(Redactor(secrets), chunks)
        assert out == expected
