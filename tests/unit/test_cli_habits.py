"""The command line's docker and GNU-timeout habits (issue 20), pure parts: ``-e NAME``,
``--env-file``, close-match suggestions, the ``-it`` habit, a shell string given as one word."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxrun.cli.env_input import (
    MAX_ENV_FILE,
    explicit_env,
    parse_env_file,
    parse_env_option,
    read_env_file,
)
from sandboxrun.cli.options import close_options, tty_habit
from sandboxrun.engine.argv import script_hint
from sandboxrun.errors import EnvError

SECRET = "s3cr3t-value-77"
HOST = {"API_TOKEN": SECRET, "EMPTY": "", "PLAIN": "plain"}


# --- -e NAME[=VALUE] ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A=1", ("A", "1")),
        ("A=", ("A", "")),
        ("A==b=c", ("A", "=b=c")),
        ("API_TOKEN", ("API_TOKEN", SECRET)),  # the value of this environment's variable
        ("EMPTY", ("EMPTY", "")),
    ],
)
def test_env_option(text: str, expected: tuple[str, str]) -> None:
    assert parse_env_option(text, HOST) == expected


@pytest.mark.parametrize("text", [SECRET, "NOT_SET", "two words", ""])
def test_env_option_without_value_never_shows_the_word(text: str) -> None:
    with pytest.raises(EnvError) as caught:
        parse_env_option(text, HOST, index=3)
    message = str(caught.value)
    assert message.startswith("--env (the 3rd -e): ")
    if text:
        assert text not in message  # it may be a value typed where a name was meant


def test_env_option_refuses_a_nul_and_an_empty_name() -> None:
    with pytest.raises(EnvError, match="NUL"):
        parse_env_option("A=x\0y", HOST)
    with pytest.raises(EnvError, match="invalid name"):
        parse_env_option("=x", HOST)


# --- --env-file --------------------------------------------------------------------------


def test_env_file_format_is_dockers() -> None:
    text = (
        "# a comment\n"
        "\n"
        "A=1\n"
        "  B=two words  \n"  # leading blanks go, the value is literal to the line's end
        'Q="quoted"\n'  # quotes are part of the value (docker run --env-file)
        "API_TOKEN\n"  # a bare NAME: this environment's value
        "   # indented comment\n"
        "W=crlf\r\n"
        "E=\n"
        "A=again"  # the last line needs no newline; a later one wins in explicit_env
    )
    assert parse_env_file(text, HOST, source="f.env") == [
        ("A", "1"),
        ("B", "two words  "),
        ("Q", '"quoted"'),
        ("API_TOKEN", SECRET),
        ("W", "crlf"),
        ("E", ""),
        ("A", "again"),
    ]


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("A=1\nB C=2\n", 2, "invalid name"),
        ("=v\n", 1, "invalid name"),
        (f"A=1\n\n{SECRET}\n", 3, "takes its value from this environment"),
        ("A=x\0y\n", 1, "NUL"),
    ],
)
def test_env_file_errors_name_the_line_not_the_value(text: str, line: int, what: str) -> None:
    with pytest.raises(EnvError) as caught:
        parse_env_file(text, HOST, source="vars.env")
    message = str(caught.value)
    assert f"--env-file vars.env line {line}" in message and what in message
    assert SECRET not in message and "x\0y" not in message


def test_read_env_file_errors(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match="no such file"):
        read_env_file(tmp_path / "missing.env")
    with pytest.raises(EnvError, match="is a directory"):
        read_env_file(tmp_path)
    big = tmp_path / "big.env"
    big.write_bytes(b"A=" + b"x" * MAX_ENV_FILE)
    with pytest.raises(EnvError, match="larger than 1024 KiB"):
        read_env_file(big)
    latin = tmp_path / "latin.env"
    latin.write_bytes(b"A=1\nB=caf\xe9\n")
    with pytest.raises(EnvError, match="line 2: not UTF-8"):
        read_env_file(latin)


def test_explicit_env_order_files_then_e(tmp_path: Path) -> None:
    one, two = tmp_path / "one.env", tmp_path / "two.env"
    one.write_text("A=one\nB=one\nC=one\n")
    two.write_text("B=two\n")
    got = explicit_env(["C=e", "PLAIN"], [one, two], HOST)
    assert got == {"A": "one", "B": "two", "C": "e", "PLAIN": "plain"}


# --- suggestions and habits --------------------------------------------------------------

KNOWN = ["--timeout", "--max-timeout", "--memory", "--cpus", "--user", "--workspace", "-w"]


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("--bogus", []),  # click suggested --cpus, --user
        ("--tiemout", ["--timeout"]),
        ("--memroy", ["--memory"]),
        ("--time", ["--timeout"]),
        ("--worksapce=x", ["--workspace"]),
        ("--ti", []),  # too short to be a start
        ("--", []),
    ],
)
def test_close_options_are_real(word: str, expected: list[str]) -> None:
    assert close_options(word, KNOWN) == expected


@pytest.mark.parametrize(
    ("words", "habit"),
    [
        (["run", "-it", "bash"], True),
        (["run", "-ti", "bash"], True),
        (["run", "--tty", "bash"], True),
        (["run", "-i", "-t", "5", "cat"], False),
        (["run", "--", "docker", "run", "-it", "x"], False),  # the command's own words
    ],
)
def test_tty_habit(words: list[str], habit: bool) -> None:
    assert tty_habit(words) is habit


@pytest.mark.parametrize(
    ("argv", "hinted"),
    [
        (["ls -la | wc"], True),
        (["echo $HOME"], True),
        (["make&&make install"], True),
        (["./run.sh"], False),
        (["missing-program"], False),
        (["ls", "-la | wc"], False),  # separate words: the program's name is ls
        (None, False),  # a --shell script
        ([], False),
    ],
)
def test_script_hint(argv: list[str] | None, hinted: bool) -> None:
    hint = script_hint(argv)
    assert (hint is not None) is hinted
    if hint:
        assert "--shell" in hint
