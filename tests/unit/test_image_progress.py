"""The progress display: plain lines per phase off a terminal, a live line on one, raw lines only
with -v, the log's last lines on failure."""

from __future__ import annotations

import io

import pytest

from sandboxrun.image.progress import Display, is_live_terminal


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plain(verbose: bool = False, tail_lines: int = 20) -> tuple[Display, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    return (
        Display(
            "image build",
            verbose=verbose,
            stream=out,
            live=False,
            clock=clock,
            tail_lines=tail_lines,
        ),
        out,
        clock,
    )


def test_plain_prints_one_line_per_phase_with_elapsed_seconds() -> None:
    display, out, clock = plain()
    display.phase("step 1/3 FROM x")
    clock.now += 12.7
    display.phase("step 1/3 FROM x", "cached")  # a detail: nothing printed off a terminal
    display.phase("step 2/3 RUN apt-get update", "Get:1 http://deb.debian.org")
    clock.now += 63
    display.phase("step 3/3 LABEL a=b")
    display.done("made t:1 with the legacy builder")
    assert out.getvalue().splitlines() == [
        "sandboxrun: image build: step 1/3 FROM x (0s)",
        "sandboxrun: image build: step 2/3 RUN apt-get update (12s)",
        "sandboxrun: image build: step 3/3 LABEL a=b (1m15s)",
        "sandboxrun: image build: made t:1 with the legacy builder in 1m15s",
    ]


def test_raw_lines_only_with_verbose() -> None:
    display, out, _ = plain()
    display.raw("Removing intermediate container 1")
    display.note("reusing t:1")
    assert out.getvalue() == "sandboxrun: image build: reusing t:1\n"
    display, out, _ = plain(verbose=True)
    display.raw("Removing intermediate container 1")
    assert out.getvalue() == "Removing intermediate container 1\n"


def test_the_legacy_deprecation_notice_only_with_verbose() -> None:
    notice = "DEPRECATED: The legacy builder is deprecated and will be removed in a future release."
    display, out, _ = plain()
    display.raw(notice)
    display.failed()
    assert out.getvalue() == ""  # not shown, not in the failure tail either
    display, out, _ = plain(verbose=True)
    display.raw(notice)
    assert out.getvalue() == notice + "\n"


def test_failure_shows_the_last_lines() -> None:
    display, out, _ = plain(tail_lines=3)
    display.phase("step 3/4 RUN make")
    for n in range(10):
        display.raw(f"line {n}")
    display.raw("   ")  # blank lines are not worth a place in the tail
    display.failed()
    assert out.getvalue().splitlines() == [
        "sandboxrun: image build: step 3/4 RUN make (0s)",
        "sandboxrun: image build: the last 3 lines of the log:",
        "  | line 7",
        "  | line 8",
        "  | line 9",
    ]


def test_failure_with_verbose_does_not_repeat_the_lines() -> None:
    display, out, _ = plain(verbose=True)
    display.raw("line 1")
    display.failed()
    assert out.getvalue() == "line 1\n"


def test_failure_without_any_line() -> None:
    display, out, _ = plain()
    display.failed()
    assert out.getvalue() == ""


def test_live_display_on_a_terminal() -> None:
    out, clock = io.StringIO(), Clock()
    display = Display("image build", stream=out, live=True, clock=clock)
    assert display.live
    display.phase("step 1/2 FROM x")
    display.raw("a raw line that -v would show")
    clock.now += 5
    display.phase("step 2/2 RUN make", "cc -c main.c")
    display.note("rebuilding t:1: its build context changed")
    clock.now += 2
    display.done("made t:1 with BuildKit")
    text = out.getvalue()
    # the finished phases stay, with their durations; notes too; no raw line without -v
    assert "  step 1/2 FROM x (5s)" in text
    assert "  step 2/2 RUN make (2s)" in text
    assert "sandboxrun: image build: rebuilding t:1: its build context changed" in text
    assert text.rstrip().endswith("sandboxrun: image build: made t:1 with BuildKit in 7s")
    assert "a raw line" not in text
    assert "sandboxrun: image build: step 1/2 FROM x (0s)" not in text  # not the plain lines


def test_live_verbose_shows_raw_lines_above() -> None:
    out = io.StringIO()
    with Display("image bootstrap", verbose=True, stream=out, live=True) as display:
        display.phase("debootstrap: retrieving packages", "#1 adduser")
        display.raw("I: Retrieving adduser 3.134")
    assert "I: Retrieving adduser 3.134" in out.getvalue()


def test_closed_stream_does_not_fail() -> None:
    out = io.StringIO()
    display = Display("image build", stream=out, live=False)
    out.close()
    display.phase("step 1/1 FROM x")
    display.done("made x")


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("term", "live"), [("xterm-256color", True), ("dumb", False)])
def test_a_terminal_is_live_unless_dumb(
    monkeypatch: pytest.MonkeyPatch, term: str, live: bool
) -> None:
    monkeypatch.setenv("TERM", term)
    assert is_live_terminal(FakeTty()) is live
    assert is_live_terminal(io.StringIO()) is False
    closed = io.StringIO()
    closed.close()
    assert is_live_terminal(closed) is False
