"""Durations, sizes and ``run``'s option checks (pure): every message names the option."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxrun.cli import options
from sandboxrun.cli.options import (
    RunLimits,
    check_run_limits,
    json_requested,
    option_named,
)
from sandboxrun.errors import ConfigError
from sandboxrun.models import MAX_GRACE_S, MIN_CPUS, Limits
from sandboxrun.units import format_duration, format_size, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0), ("90s", 90.0), ("1.5s", 1.5), ("10m", 600.0), ("1h", 3600.0),
        ("500ms", 0.5), ("0.5", 0.5), (".5", 0.5), ("2.", 2.0), (" 7s ", 7.0), ("3S", 3.0),
        ("2H", 7200.0), ("1.5m", 90.0), ("250MS", 0.25), ("5 s", 5.0),
    ],
)  # fmt: skip
def test_durations_accepted(text: str, seconds: float) -> None:
    assert parse_duration(text, what="--timeout") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-1", "--timeout must not be negative, got '-1'"),
        ("-2s", "--timeout must not be negative"),
        ("0", "--timeout must be more than 0, got '0'"),
        ("0s", "--timeout must be more than 0"),
        ("0ms", "--timeout must be more than 0"),
        ("-0", "--timeout must be more than 0"),
        ("nan", "invalid --timeout 'nan': expected a duration such as 90, 90s"),
        ("inf", "invalid --timeout 'inf'"),
        ("infinity", "invalid --timeout"),
        ("10x", "invalid --timeout '10x'"),
        ("", "invalid --timeout ''"),
        ("   ", "invalid --timeout"),
        ("s", "invalid --timeout"),
        ("1e3", "invalid --timeout"),
        ("10 m s", "invalid --timeout"),
        ("1h30m", "invalid --timeout"),
        ("+5", "invalid --timeout"),
        ("0x10", "invalid --timeout"),
        ("1,5s", "invalid --timeout"),
    ],
)
def test_durations_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_duration(text, what="--timeout")


def test_zero_duration_only_where_allowed() -> None:
    assert parse_duration("0", what="--grace", allow_zero=True) == 0
    assert parse_duration("0s", what="--grace", allow_zero=True) == 0
    with pytest.raises(ConfigError, match="--grace must not be negative"):
        parse_duration("-1", what="--grace", allow_zero=True)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (10, "10s"), (1.5, "1.5s"), (0.5, "500ms"), (0.001, "1ms"), (0.0005, "0.0005s"),
        (60, "1m"), (90, "90s"), (600, "10m"), (3600, "1h"), (5400, "90m"), (7200, "2h"),
        (9999, "9999s"), (120, "2m"), (3, "3s"), (61.5, "61.5s"),
    ],
)  # fmt: skip
def test_format_duration_reads_back(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("size", "text"),
    [(64 << 20, "64m"), (6 << 20, "6m"), (1536 << 10, "1536k"), (1 << 30, "1g"), (100, "100"),
     (1024, "1k"), (1025, "1025"), (0, "0"), (3 << 40, "3t")],
)  # fmt: skip
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


DEFAULTS: dict[str, str | None] = {
    "timeout": None,
    "max_timeout": None,
    "idle_timeout": None,
    "grace": "3s",
    "max_output": "64k",
    "spill_max": "64m",
    "memory": None,
    "cpus": None,
    "pids": None,
}


def checked(host_cpus: int | None = 4, **given: str | None) -> RunLimits:
    args: dict[str, Any] = {**DEFAULTS, **given}
    return check_run_limits(host_cpus=host_cpus, **args)


def test_defaults_are_the_limits_defaults() -> None:
    found = checked()
    assert Limits(**vars(found)) == Limits()
    assert (options.MAX_GRACE_S, options.MIN_CPUS) == (MAX_GRACE_S, MIN_CPUS)
    assert found.memory_bytes is found.cpus is found.pids is found.idle_timeout_s is None


def test_values_are_converted() -> None:
    found = checked(
        timeout="10m", idle_timeout="500ms", grace="0", max_output="1m", spill_max="0",
        memory="6m", cpus="0.5", pids="8",
    )  # fmt: skip
    assert found == RunLimits(
        timeout_s=600, max_timeout_s=None, idle_timeout_s=0.5, grace_s=0, max_output=1 << 20,
        spill_max=0, memory_bytes=6 << 20, cpus=0.5, pids=8,
    )  # fmt: skip


def test_any_timeout_is_accepted_without_an_operators_cap() -> None:
    # issue 20: `-t 30m` was refused unless --max-timeout was raised; the default is 120 s
    assert checked(timeout="30m") == checked(timeout="1800")
    assert checked(timeout="30m").timeout_s == 1800 and checked(timeout="30m").max_timeout_s is None
    assert checked(timeout="100h").timeout_s == 360000
    assert checked().timeout_s == 120


def test_timeout_above_an_operators_cap_is_refused_naming_both_options() -> None:
    with pytest.raises(ConfigError) as caught:
        checked(timeout="9999", max_timeout="10m")
    message = str(caught.value)
    assert message.startswith("--timeout 9999 is above the maximum of 10m")
    assert "SANDBOXRUN_MAX_TIMEOUT" in message and "--max-timeout" in message
    assert checked(timeout="9999", max_timeout="3h").timeout_s == 9999
    assert checked(timeout="10m", max_timeout="10m").timeout_s == 600  # the cap itself


def test_lower_cap_lowers_the_default_timeout_and_refuses_above_it() -> None:
    assert (checked(max_timeout="1m").timeout_s, checked(max_timeout="1m").max_timeout_s) == (
        60,
        60,
    )
    assert checked(max_timeout="1h").timeout_s == 120
    with pytest.raises(ConfigError, match="above the maximum of 1m"):
        checked(max_timeout="1m", timeout="61")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"timeout": "0"}, "--timeout must be more than 0"),
        ({"timeout": "10x"}, "invalid --timeout '10x'"),
        ({"max_timeout": "0"}, "--max-timeout must be more than 0"),
        ({"idle_timeout": "0"}, "--idle-timeout must be more than 0"),
        ({"idle_timeout": "nan"}, "invalid --idle-timeout"),
        ({"grace": "-1"}, "--grace must not be negative"),
        ({"grace": "11m"}, "--grace must be at most 10m"),
        ({"memory": "1k"}, "--memory must be at least 6m, got '1k' (1024 bytes"),
        ({"memory": "100"}, "--memory must be at least 6m, got '100' (100 bytes; a bare number"),
        ({"memory": "lots"}, "invalid --memory 'lots'"),
        ({"max_output": "10"}, "--max-output must be at least 64"),
        ({"spill_max": "x"}, "invalid --spill-max"),
        ({"cpus": "0"}, "--cpus must be more than 0"),
        ({"cpus": "-1"}, "--cpus must be more than 0"),
        ({"cpus": "0.001"}, "--cpus must be at least 0.01"),
        ({"cpus": "64"}, "--cpus 64 is more than this host's 4 CPUs"),
        ({"cpus": "nan"}, "invalid --cpus 'nan'"),
        ({"cpus": "inf"}, "invalid --cpus 'inf'"),
        ({"cpus": "two"}, "invalid --cpus 'two'"),
        ({"pids": "0"}, "--pids must be at least 1"),
        ({"pids": "-3"}, "--pids must be at least 1"),
        ({"pids": "1.5"}, "invalid --pids '1.5'"),
    ],
)  # fmt: skip
def test_bad_values_name_the_option(given: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        checked(4, **given)
    assert str(caught.value).startswith(message)
    assert "_s" not in str(caught.value).replace("_size", "")  # never a Limits field name
    assert option_named(str(caught.value)) == "--" + next(iter(given)).replace("_", "-")


def test_cpus_without_a_host_count_has_no_upper_bound() -> None:
    assert checked(host_cpus=None, cpus="64").cpus == 64
    assert checked(host_cpus=4, cpus="4").cpus == 4


def test_option_named() -> None:
    assert option_named("--memory must be at least 6m") == "--memory"
    assert option_named("invalid --cpus 'x': expected") == "--cpus"
    assert option_named("workspace '/x' does not exist") is None
    assert option_named("--shell takes exactly one COMMAND") == "--shell"


VALUE_OPTIONS = {"-w", "--workspace", "-t", "--timeout", "-e", "--env", "-C"}


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["--json", "--", "true"], True),
        (["-t", "5", "--json", "true"], True),
        (["--timeout=5", "--json", "true"], True),
        (["-e", "--json", "true"], False),  # the value of -e
        (["-w", "--json"], False),
        (["--", "echo", "--json"], False),  # the command's own argument
        (["echo", "--json"], False),  # options end at COMMAND
        (["--bogus", "--json"], True),  # an unknown option does not hide it
        (["-iw", "DIR", "--json"], True),  # -w's value is the next word
        (["-wDIR", "--json"], True),  # -w's value is attached
        (["-i", "--json"], True),
        (["-", "--json"], False),  # '-' is a word (stdin), not an option
        ([], False),
        (["--jso"], False),
        (["-t"], False),
    ],
)
def test_json_requested(args: list[str], wanted: bool) -> None:
    assert json_requested(args, VALUE_OPTIONS) is wanted
