"""The one masking and sanitizing pass over what sandboxrun says itself (issue 17, findings 4
and 5), as pure logic: ``sanitize.clean_text`` / ``escape_json_controls`` over every code
point, one-shot masking (``Redactor.mask``, ``mask_text``, ``mask_model``), the ``sandboxrun``
logger's filter, the CLI's writers and its scan of ``-e`` values before parsing."""

from __future__ import annotations

import gc
import json
import logging
import os
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxrun.cli import report
from sandboxrun.cli.options import assignments_in
from sandboxrun.engine.capture.redact import (
    LOG_MASK,
    Redactor,
    SecretBook,
    mask_model,
    redactor_of,
    secret_pairs,
)
from sandboxrun.engine.sanitize import TerminalSanitizer, clean_text, escape_json_controls
from sandboxrun.models import Denial, ExecResult, Policy

VALUE = "tok-SeCrEt-9876"
MARK = "[masked:API_TOKEN]"
EVERY_CHAR = "".join(chr(c) for c in range(0x110000))
"""Every code point, lone surrogates included (what ``os.fsdecode`` makes of odd bytes)."""


def is_control(code: int) -> bool:
    return (code < 0x20 and code not in (0x09, 0x0A)) or 0x7F <= code <= 0x9F


def reference_clean(ch: str) -> str:
    code = ord(ch)
    if code == 0x7F:
        return "^?"
    if code < 0x20 and code not in (0x09, 0x0A):
        return "^" + chr(code + 0x40)
    if 0x80 <= code <= 0x9F:
        return f"<U+{code:02X}>"
    return ch


# -- sanitize --------------------------------------------------------------------------------


def test_clean_text_over_every_code_point() -> None:
    cleaned = clean_text(EVERY_CHAR)
    assert cleaned == "".join(reference_clean(c) for c in EVERY_CHAR)
    assert not any(is_control(ord(c)) for c in cleaned)


def test_clean_text_shows_controls_as_the_live_output_does() -> None:
    for code in range(0x800):  # one- and two-byte UTF-8: every C0, DEL and C1
        ch = chr(code)
        sanitizer = TerminalSanitizer()
        live = sanitizer.feed(ch.encode()) + sanitizer.flush()
        assert clean_text(ch).encode() == live, hex(code)


def test_clean_text_keeps_ordinary_text_as_the_same_object() -> None:
    text = "sandboxrun: denied: ünïcödé, tabs\tand\nnewlines \udcff"
    assert clean_text(text) == text
    plain = "x" * 100
    assert clean_text(plain) is plain


def test_escape_json_controls_over_every_code_point() -> None:
    chars = [c for c in EVERY_CHAR if not 0xD800 <= ord(c) <= 0xDFFF]
    text = json.dumps(chars, ensure_ascii=False)
    escaped = escape_json_controls(text)
    assert json.loads(escaped) == chars  # the same value for a parser
    assert not any(is_control(ord(c)) for c in escaped)
    assert escape_json_controls('{"a":"\x7f\x80\x9f\xa0"}') == '{"a":"\\u007f\\u0080\\u009f\xa0"}'


# -- one-shot masking ------------------------------------------------------------------------


def small_bytes(alphabet: bytes, min_size: int, max_size: int) -> st.SearchStrategy[bytes]:
    return st.lists(st.sampled_from(alphabet), min_size=min_size, max_size=max_size).map(bytes)


SECRETS = st.dictionaries(
    st.sampled_from(["API_TOKEN", "DB_PASSWORD", "GH_TOKEN"]),
    small_bytes(b"ab\x1b-", 1, 6),
    max_size=3,
)


@given(SECRETS, small_bytes(b"ab\x1b-[]", 0, 60))
def test_mask_is_the_stream_fed_whole(secrets: dict[str, bytes], data: bytes) -> None:
    whole = Redactor(secrets)
    stream = Redactor(secrets)
    assert whole.mask(data) == stream.feed(data) + stream.flush()


def test_mask_leaves_a_streams_held_bytes_alone() -> None:
    redactor = Redactor({"API_TOKEN": VALUE.encode()})
    assert redactor.feed(b"out: tok-SeC") == b"out: "
    assert redactor.mask(f"x {VALUE}".encode()) == f"x {MARK}".encode()
    assert redactor.feed(b"rEt-9876!") + redactor.flush() == MARK.encode() + b"!"


def test_mask_text_handles_every_kind_of_str() -> None:
    redactor = Redactor({"API_TOKEN": VALUE.encode()})
    assert redactor.mask_text(f"a {VALUE} b") == f"a {MARK} b"
    odd = f"\udcff{VALUE}\udc80"  # bytes that are not UTF-8, as os.fsdecode gives them
    assert redactor.mask_text(odd) == f"\udcff{MARK}\udc80"
    unencodable = f"\ud800{VALUE}"  # a surrogate that stands for no byte
    assert redactor.mask_text(unencodable) == f"\ud800{MARK}"
    same = "nothing to mask"
    assert redactor.mask_text(same) is same
    binary = Redactor({"API_TOKEN": b"\xff\xfe-secret"})
    assert binary.mask_text(os.fsdecode(b"x\xff\xfe-secret")) == f"x{MARK}"


def test_several_values_of_one_name_are_all_masked() -> None:
    redactor = Redactor([("API_TOKEN", b"first-value"), ("API_TOKEN", b"second-value")])
    assert redactor.names == ("API_TOKEN",)
    assert redactor.mask_text("first-value second-value") == f"{MARK} {MARK}"


def test_secret_pairs_keeps_secret_shaped_encodable_names() -> None:
    pairs = [("API_TOKEN", VALUE), ("GREETING", "hello-world"), ("PASSWORD", "\ud800x")]
    assert secret_pairs(pairs) == [("API_TOKEN", VALUE.encode())]
    assert redactor_of(secret_pairs([("API_KEY", "abc")])) is None  # too short to mask


def result(**fields: object) -> ExecResult:
    base: dict[str, object] = {
        "status": "spawn_error",
        "exit_code": 127,
        "duration_s": 0.1,
        "backend": "process-group",
        "argv": [f"./{VALUE}"],
        "run_id": "r",
    }
    return ExecResult.model_validate({**base, **fields})


def test_mask_model_masks_every_string_but_the_policies_it_keeps() -> None:
    wider = Policy(network="on", mask=(f"/x/{VALUE}",))
    denial = Denial(
        kind="network", evidence=f"curl: {VALUE}", message=f"refused {VALUE}", escalate_to=wider
    )
    original = result(
        error=f"[Errno 2] No such file or directory: './{VALUE}'",
        warnings=[f"snapshot failed ({VALUE})", "plain"],
        stdout=VALUE,
        stderr_spill=f"/spill/{VALUE}",
        fallback_reason=f"why {VALUE}",
        denial=denial,
        escalated_from=wider,
    )
    redactor = Redactor({"API_TOKEN": VALUE.encode()})
    masked = mask_model(original, redactor, keep=(Policy,))
    shown = masked.model_dump_json(exclude={"denial": {"escalate_to"}, "escalated_from": True})
    assert VALUE not in shown
    assert masked.error == f"[Errno 2] No such file or directory: './{MARK}'"
    assert masked.argv == [f"./{MARK}"]
    assert masked.warnings == [f"snapshot failed ({MARK})", "plain"]
    assert masked.denial is not None and masked.denial.evidence == f"curl: {MARK}"
    assert masked.denial.escalate_to is wider and masked.escalated_from is wider  # kept exact
    everything = mask_model(original, redactor)
    assert VALUE not in everything.model_dump_json()
    assert original.error is not None and VALUE in original.error  # a copy: not changed
    assert mask_model(original, None) is original
    clean = result(argv=["true"])
    assert mask_model(clean, redactor) is clean


# -- the sandboxrun logger -------------------------------------------------------------------


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            self.format(record)
            seen.append(record)

    logger = logging.getLogger("sandboxrun")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield seen
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_log_records_are_masked_while_the_book_lives(records: list[logging.LogRecord]) -> None:
    log = logging.getLogger("sandboxrun")
    book, other = SecretBook(), SecretBook()
    book.note(secret_pairs([("API_TOKEN", VALUE)]))
    other.note(secret_pairs([("API_TOKEN", "another-one")]))
    LOG_MASK.watch(book)
    LOG_MASK.watch(other)
    log.warning("quoting %s and %s", VALUE, "another-one")
    assert records[-1].getMessage() == f"quoting {MARK} and {MARK}"
    try:
        raise RuntimeError(f"boom {VALUE}")
    except RuntimeError:
        log.debug("failed", exc_info=True)
    assert records[-1].exc_text is not None
    assert VALUE not in records[-1].exc_text and f"boom {MARK}" in records[-1].exc_text
    del book, other
    gc.collect()
    log.warning("quoting %s", VALUE)  # its sandbox is gone: nothing to mask with
    assert records[-1].getMessage() == f"quoting {VALUE}"


def test_log_records_carry_no_control_character(records: list[logging.LogRecord]) -> None:
    logging.getLogger("sandboxrun").warning("profile said %s", "\x1b]0;x\x07\u009b\r")
    assert records[-1].getMessage() == "profile said ^[]0;x^G<U+9B>^M"


def test_a_record_that_cannot_be_formatted_is_let_through(
    records: list[logging.LogRecord],
) -> None:
    record = logging.LogRecord("sandboxrun", logging.WARNING, "f", 1, "%d", ("x",), None)
    assert LOG_MASK.filter(record)
    assert record.msg == "%d"


# -- the CLI's writers -----------------------------------------------------------------------


@pytest.fixture
def secrets() -> Iterator[None]:
    report.use_secrets({"API_TOKEN": VALUE, "GREETING": "hello-world"})
    yield
    report.use_secrets(None)


@pytest.mark.usefixtures("secrets")
def test_say_masks_and_neutralizes(capsys: pytest.CaptureFixture[str]) -> None:
    report.say(f"sandboxrun: denied: x (curl: \x1b]52;c;aGk=\x07{VALUE}\u009b hello-world)")
    report.say("sandboxrun: re-run? ", end="")
    err = capsys.readouterr().err
    assert err == f"sandboxrun: denied: x (curl: ^[]52;c;aGk=^G{MARK}<U+9B> hello-world)\n" + (
        "sandboxrun: re-run? "
    )


@pytest.mark.usefixtures("secrets")
def test_json_lines_are_masked_valid_and_inert() -> None:
    line = report.error_json("WorkspaceError", f"workdir '{VALUE}\x1b\x9b\udcff'", 2)
    data = json.loads(line)
    assert data["error"]["message"] == f"workdir '{MARK}\x1b\x9b\udcff'"  # the same text
    assert not any(is_control(ord(c)) for c in line)
    shown = report.result_json(result(error=f"./{VALUE}", stderr="\x1b[31m\x85"))
    parsed = ExecResult.model_validate_json(shown)
    assert parsed.error == f"./{MARK}" and parsed.stderr == "\x1b[31m\x85"
    assert VALUE not in shown and not any(is_control(ord(c)) for c in shown)


@pytest.mark.usefixtures("secrets")
def test_dry_run_line_exact_to_a_pipe_neutralized_to_a_terminal() -> None:
    text = f"echo {VALUE} '\x1b]0;x\x07' \udcff"
    assert report.show_argv(text, terminal=False) == f"echo {MARK} '\x1b]0;x\x07' ".encode() + (
        b"\xff\n"
    )
    assert report.show_argv(text, terminal=True) == f"echo {MARK} '^[]0;x^G' \\udcff\n".encode()


def test_no_secrets_no_masking(capsys: pytest.CaptureFixture[str]) -> None:
    report.use_secrets(None)
    report.say(VALUE)
    assert capsys.readouterr().err == VALUE + "\n"
    report.use_secrets([("API_TOKEN", VALUE)])
    assert report.mask(VALUE) == MARK
    report.use_secrets([])
    assert report.mask(VALUE) == VALUE


# -- the -e values of a command line before it is parsed -------------------------------------


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        (["run", "-e", "API_TOKEN=v1", "--", "true"], [("API_TOKEN", "v1")]),
        (["run", "--env", "A_KEY=v=2", "true"], [("A_KEY", "v=2")]),
        (["run", "--env=API_TOKEN=v3", "true"], [("API_TOKEN", "v3")]),
        (["run", "-eAPI_TOKEN=v4", "true"], [("API_TOKEN", "v4")]),
        (["run", "-ie", "API_TOKEN=v5", "true"], [("API_TOKEN", "v5")]),
        (["run", "-ieAPI_TOKEN=v6", "true"], [("API_TOKEN", "v6")]),
        (["run", "--no-mask", "-e", "API_TOKEN=v7", "true"], []),
        (["run", "-e", "API_TOKEN=v8", "--", "sh", "--no-mask"], [("API_TOKEN", "v8")]),
        (["run", "--", "true"], []),
    ],
)
def test_assignments_in(argv: list[str], found: list[tuple[str, str]]) -> None:
    pairs = assignments_in(argv)
    for pair in found:
        assert pair in pairs
    assert found or not secret_pairs(pairs)


def test_assignments_feed_the_masking() -> None:
    argv = ["run", "-e", f"API_TOKEN={VALUE}", "-e", "API_TOKEN=second-one", "--network", "x"]
    report.use_secrets(assignments_in(argv))
    try:
        assert report.mask(f"'{VALUE}' 'second-one'") == f"'{MARK}' '{MARK}'"
    finally:
        report.use_secrets(None)


def test_a_value_cut_off_by_the_supervisor_is_masked_to_its_start() -> None:
    """A string the supervisor cut (``…(N bytes)``) may end inside a value: its start is
    masked too; the cut marker stays; a string not cut keeps a lone prefix as it is."""
    from sandboxrun.engine.capture.redact import Redactor

    masking = Redactor({"API_TOKEN": b"tok-SeCrEt-9876", "DB_PASSWORD": b"hunter2-x"})
    cut = "\u2026(207 bytes)"
    assert masking.mask_text("aaa tok-SeC" + cut) == "aaa [masked:API_TOKEN]" + cut
    assert masking.mask_text("aaa t" + cut) == "aaa [masked:API_TOKEN]" + cut
    assert masking.mask_text("x hunter2-" + cut + " tok-" + cut) == (
        "x [masked:DB_PASSWORD]" + cut + " [masked:API_TOKEN]" + cut
    )
    assert masking.mask_text("aaa tok-SeC") == "aaa tok-SeC"  # not cut: not the value
    assert masking.mask_text("aaa zzz" + cut) == "aaa zzz" + cut
    assert masking.mask_text("tok-SeCrEt-9876" + cut) == "[masked:API_TOKEN]" + cut
