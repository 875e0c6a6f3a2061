"""Unit tests of sandboxrun.engine.env: the child environment is built, never inherited."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxrun.engine.env import (
    ALLOWLIST,
    DEFAULT_LOCALE,
    DEFAULT_PATH,
    DEFAULTS,
    PROXY_NAMES,
    REDACTED,
    SECRET_WORDS,
    build_env,
    is_secret_name,
    parse_env_assignment,
    redact,
)
from sandboxrun.errors import EnvError, InputError

SENTINEL = "s3cr3t-VALUE-do-not-print"
BASE_HOST = {
    "PATH": "/host/bin:/usr/bin",
    "HOME": "/home/u",
    "USER": "u",
    "LOGNAME": "u",
    "SHELL": "/bin/zsh",
    "LANG": "de_DE.UTF-8",
    "LANGUAGE": "de:en",
    "LC_MESSAGES": "fr_FR.UTF-8",
    "TZ": "Europe/Berlin",
    "TMPDIR": "/tmp/u",
}


# --------------------------------------------------------------------------- allowlist


def test_allowlisted_host_variables_are_copied() -> None:
    env = build_env(BASE_HOST)
    for name, value in BASE_HOST.items():
        assert env[name] == value


@pytest.mark.parametrize(
    "name",
    [
        "TERM",
        "FOO",
        "HOSTNAME",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "BASH_ENV",
        "ENV",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "SSH_AUTH_SOCK",
        "DISPLAY",
        "DBUS_SESSION_BUS_ADDRESS",
        "XDG_RUNTIME_DIR",
        "GIT_DIR",
        "SANDBOXRUN_PATH_PREPEND",
        "HTTP_PROXY",
        "http_proxy",
        "path",
        "home",
    ],
)
def test_other_host_variables_are_not_copied(name: str) -> None:
    env = build_env({name: "host-value"})
    assert env.get(name) != "host-value"


def test_nothing_is_inherited_from_an_empty_host() -> None:
    env = build_env({})
    expected = dict(DEFAULTS) | {
        "PATH": DEFAULT_PATH,
        "LANG": DEFAULT_LOCALE,
        "LC_CTYPE": DEFAULT_LOCALE,
    }
    assert env == expected


def test_every_lc_name_is_copied() -> None:
    host = {"LC_TIME": "en_GB.UTF-8", "LC_NUMERIC": "C", "LC_WEIRD": "x", "LC_ALL": "de_DE.UTF-8"}
    env = build_env(host)
    for name, value in host.items():
        assert env[name] == value


def test_allowlist_and_proxy_names_are_not_secret_shaped() -> None:
    names = list(ALLOWLIST) + list(PROXY_NAMES) + [n.lower() for n in PROXY_NAMES]
    assert not [n for n in names if is_secret_name(n)]
    assert not [n for n in DEFAULTS if is_secret_name(n)]


# --------------------------------------------------------------------------- secrets


@pytest.mark.parametrize(
    "name",
    [
        *SECRET_WORDS,
        *(w.lower() for w in SECRET_WORDS),
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "OPENAI_API_KEY",
        "apikey",
        "ApiKey",
        "MYSQL_PWD_PASSWORD",
        "PGPASSWORD",
        "DB_PASSWD",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "credentials",
        "SSH_PRIVATE_KEY_PATH",
        "NPM_AUTH",
        "AUTHORIZATION",
        "COOKIEJAR",
        "SESSION_ID",
        "XDG_SESSION_TYPE",
        "LC_TOKEN",
        "tokens",
        "MONKEY",  # part of a word counts, by design
    ],
)
def test_secret_shaped_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name", ["PATH", "HOME", "LANG", "LC_ALL", "TERM", "K_E_Y", "TOK_EN", "PASS", "AUT", ""]
)
def test_not_secret_shaped_names(name: str) -> None:
    assert not is_secret_name(name)


def test_secret_shaped_lc_name_is_not_copied_implicitly() -> None:
    env = build_env({"LC_SECRET": SENTINEL, "LC_TIME": "C"})
    assert "LC_SECRET" not in env
    assert env["LC_TIME"] == "C"


@pytest.mark.parametrize("name", ["GITHUB_TOKEN", "api_key", "Session", "MY_PASSWD"])
def test_pass_through_of_a_secret_is_refused(name: str) -> None:
    with pytest.raises(EnvError) as info:
        build_env({name: SENTINEL}, pass_through=[name])
    message = str(info.value)
    assert repr(name) in message
    assert "secret" in message
    assert f"-e {name} (its value from this environment" in message
    assert SENTINEL not in message


def test_pass_through_of_a_secret_is_refused_even_when_absent_on_host() -> None:
    with pytest.raises(EnvError, match="secret"):
        build_env({}, pass_through=["GH_TOKEN"])


def test_explicit_secret_is_the_only_way_in() -> None:
    env = build_env({"GH_TOKEN": "host"}, explicit={"GH_TOKEN": SENTINEL})
    assert env["GH_TOKEN"] == SENTINEL


def test_env_error_is_an_input_error() -> None:
    assert issubclass(EnvError, InputError)


# --------------------------------------------------------------------------- pass-through


def test_pass_through_copies_named_host_variables() -> None:
    host = {"FOO": "1", "BAR": "", "BAZ": "3"}
    env = build_env(host, pass_through=("FOO", "BAR"))
    assert env["FOO"] == "1"
    assert env["BAR"] == ""
    assert "BAZ" not in env


def test_pass_through_of_an_absent_name_is_an_error() -> None:
    with pytest.raises(EnvError, match=r"--pass-env 'NOPE': not set on the host"):
        build_env({"FOO": "1"}, pass_through=["FOO", "NOPE"])


def test_pass_through_beats_defaults() -> None:
    env = build_env({"TERM": "xterm-256color", "PAGER": "less"}, pass_through=["TERM", "PAGER"])
    assert env["TERM"] == "xterm-256color"
    assert env["PAGER"] == "less"


def test_pass_through_of_a_single_string_is_refused() -> None:
    with pytest.raises(EnvError, match="not a single string"):
        build_env({"FOO": "1"}, pass_through="FOO")


@pytest.mark.parametrize("name", ["", "A=B", "A\0B", "="])
def test_pass_through_of_an_invalid_name_is_refused(name: str) -> None:
    with pytest.raises(EnvError, match="--pass-env"):
        build_env({name: "x"}, pass_through=[name])


def test_pass_through_of_a_reserved_name_is_refused() -> None:
    with pytest.raises(EnvError, match="reserved"):
        build_env({"SANDBOXRUN_X": "1"}, pass_through=["SANDBOXRUN_X"])


# --------------------------------------------------------------------------- defaults & explicit


def test_defaults_are_present() -> None:
    env = build_env(BASE_HOST)
    assert env["NO_COLOR"] == "1"
    assert env["TERM"] == "dumb"
    assert env["PAGER"] == "cat"
    assert env["GIT_PAGER"] == "cat"
    assert env["GIT_EDITOR"] == "true"
    assert env["GIT_TERMINAL_PROMPT"] == "0"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONIOENCODING"] == "utf-8"


def test_explicit_wins_over_everything() -> None:
    host = BASE_HOST | {"HTTP_PROXY": "http://p:1", "FOO": "host"}
    explicit = {
        "TERM": "xterm",
        "PATH": "/only",
        "HOME": "/elsewhere",
        "LANG": "C",
        "LC_CTYPE": "POSIX",
        "LC_ALL": "",
        "FOO": "explicit",
        "HTTP_PROXY": "http://explicit:2",
        "NEW": "",
    }
    env = build_env(host, explicit=explicit, pass_through=["FOO"], pass_proxy=True)
    for name, value in explicit.items():
        assert env[name] == value
    assert env["http_proxy"] == "http://p:1"  # only the explicitly named case is overridden


def test_explicit_value_with_odd_characters_is_kept_verbatim() -> None:
    value = "a b\n'\"$HOME `x` \\ ü 🎉 =="
    assert build_env({}, explicit={"V": value})["V"] == value


@pytest.mark.parametrize("name", ["SANDBOXRUN_PATH_PREPEND", "SANDBOXRUN_", "SANDBOXRUN_X"])
def test_reserved_explicit_name_is_refused(name: str) -> None:
    with pytest.raises(EnvError, match="reserved"):
        build_env({}, explicit={name: "x"})


def test_similar_but_unreserved_names_are_allowed() -> None:
    env = build_env({}, explicit={"SANDBOXRUNX": "1", "sandboxrun_x": "2"})
    assert env["SANDBOXRUNX"] == "1"
    assert env["sandboxrun_x"] == "2"


# --------------------------------------------------------------------------- PATH


@pytest.mark.parametrize("host", [{}, {"PATH": ""}])
def test_default_path_when_the_host_has_none(host: dict[str, str]) -> None:
    assert build_env(host)["PATH"] == DEFAULT_PATH


def test_host_path_is_kept() -> None:
    assert build_env({"PATH": "/a:/b"})["PATH"] == "/a:/b"


# --------------------------------------------------------------------------- locale


@pytest.mark.parametrize("name", ["LANG", "LC_CTYPE"])
@pytest.mark.parametrize("value", [None, "", "C", "POSIX"])
def test_lang_and_lc_ctype_are_repaired(name: str, value: str | None) -> None:
    host = {} if value is None else {name: value}
    assert build_env(host)[name] == DEFAULT_LOCALE


@pytest.mark.parametrize("name", ["LANG", "LC_CTYPE", "LC_ALL"])
@pytest.mark.parametrize("value", ["de_DE.UTF-8", "C.UTF-8", "en_US.ISO-8859-1", "c", "C.utf8"])
def test_real_locales_are_kept(name: str, value: str) -> None:
    assert build_env({name: value})[name] == value


@pytest.mark.parametrize("value", ["C", "POSIX"])
def test_lc_all_is_repaired_when_present(value: str) -> None:
    assert build_env({"LC_ALL": value})["LC_ALL"] == DEFAULT_LOCALE


def test_lc_all_is_not_added_when_absent() -> None:
    assert "LC_ALL" not in build_env({"LANG": "C"})


def test_empty_lc_all_is_dropped_so_it_does_not_override_lang() -> None:
    env = build_env({"LC_ALL": "", "LANG": "de_DE.UTF-8"})
    assert "LC_ALL" not in env
    assert env["LANG"] == "de_DE.UTF-8"


def test_other_lc_categories_are_not_rewritten() -> None:
    assert build_env({"LC_MESSAGES": "C"})["LC_MESSAGES"] == "C"


@pytest.mark.parametrize("name", ["LANG", "LC_CTYPE", "LC_ALL"])
@pytest.mark.parametrize("value", ["", "C", "POSIX"])
def test_explicit_locale_is_never_rewritten(name: str, value: str) -> None:
    assert build_env({}, explicit={name: value})[name] == value


def test_pass_through_locale_is_repaired_like_the_allowlisted_copy() -> None:
    assert build_env({"LANG": "C"}, pass_through=["LANG"])["LANG"] == DEFAULT_LOCALE


# --------------------------------------------------------------------------- proxies


def _both(name: str) -> tuple[str, str]:
    return name.upper(), name.lower()


@pytest.mark.parametrize("name", PROXY_NAMES)
def test_proxies_are_not_copied_without_pass_proxy(name: str) -> None:
    env = build_env({name: "v", name.lower(): "w"})
    assert name not in env
    assert name.lower() not in env


@pytest.mark.parametrize("name", PROXY_NAMES)
def test_upper_only_proxy_fills_both_cases(name: str) -> None:
    upper, lower = _both(name)
    env = build_env({upper: "http://u:3128"}, pass_proxy=True)
    assert env[upper] == env[lower] == "http://u:3128"


@pytest.mark.parametrize("name", PROXY_NAMES)
def test_lower_only_proxy_fills_both_cases(name: str) -> None:
    upper, lower = _both(name)
    env = build_env({lower: "http://l:3128"}, pass_proxy=True)
    assert env[upper] == env[lower] == "http://l:3128"


@pytest.mark.parametrize("name", PROXY_NAMES)
def test_lower_case_proxy_wins_when_both_differ(name: str) -> None:
    upper, lower = _both(name)
    env = build_env({upper: "UPPER", lower: "lower"}, pass_proxy=True)
    assert env[upper] == env[lower] == "lower"


def test_empty_lower_case_proxy_still_wins() -> None:
    env = build_env({"HTTP_PROXY": "http://u:1", "http_proxy": ""}, pass_proxy=True)
    assert env["HTTP_PROXY"] == env["http_proxy"] == ""


def test_pass_proxy_adds_nothing_when_the_host_has_no_proxy() -> None:
    assert build_env(BASE_HOST, pass_proxy=True) == build_env(BASE_HOST)


def test_pass_proxy_does_not_copy_other_variables() -> None:
    env = build_env({"SOCKS_PROXY": "x", "GH_TOKEN": "y", "HTTPS_PROXY": "h"}, pass_proxy=True)
    assert "SOCKS_PROXY" not in env
    assert "GH_TOKEN" not in env
    assert env["https_proxy"] == "h"


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("name", ["", "A=B", "=", "A\0B", "\0"])
def test_invalid_explicit_names_are_refused(name: str) -> None:
    with pytest.raises(EnvError) as info:
        build_env({}, explicit={name: SENTINEL})
    assert repr(name) in str(info.value)
    assert SENTINEL not in str(info.value)


def test_nul_in_explicit_value_is_refused_without_showing_it() -> None:
    with pytest.raises(EnvError) as info:
        build_env({}, explicit={"GH_TOKEN": SENTINEL + "\0"})
    assert "'GH_TOKEN'" in str(info.value)
    assert SENTINEL not in str(info.value)


@pytest.mark.parametrize("name", ["HOME", "LC_TIME", "PATH"])
def test_nul_in_copied_host_value_is_refused(name: str) -> None:
    with pytest.raises(EnvError) as info:
        build_env({name: SENTINEL + "\0x"})
    assert repr(name) in str(info.value)
    assert SENTINEL not in str(info.value)


def test_nul_in_passed_through_value_is_refused() -> None:
    with pytest.raises(EnvError, match="'FOO'"):
        build_env({"FOO": "a\0b"}, pass_through=["FOO"])


def test_nul_in_proxy_value_is_refused() -> None:
    with pytest.raises(EnvError, match=r"(?i)proxy"):
        build_env({"http_proxy": "a\0b"}, pass_proxy=True)


def test_invalid_host_lc_name_is_refused() -> None:
    with pytest.raises(EnvError, match="'LC_A=B'"):
        build_env({"LC_A=B": "x"})


def test_invalid_names_not_copied_are_ignored() -> None:
    assert "A=B" not in build_env({"A=B": "x", "": "y", "X\0": "z"})


# --------------------------------------------------------------------------- purity


def test_inputs_are_not_mutated_and_result_is_fresh() -> None:
    host = dict(BASE_HOST) | {"LANG": "C", "HTTP_PROXY": "h", "FOO": "f"}
    explicit = {"A": "1"}
    host_copy, explicit_copy = dict(host), dict(explicit)
    first = build_env(host, explicit=explicit, pass_through=["FOO"], pass_proxy=True)
    first["MUTATED"] = "1"
    second = build_env(host, explicit=explicit, pass_through=["FOO"], pass_proxy=True)
    assert "MUTATED" not in second
    assert host == host_copy
    assert explicit == explicit_copy


def test_default_arguments_are_immutable_and_unshared() -> None:
    first = build_env({})
    first["X"] = "1"
    assert "X" not in build_env({})
    assert isinstance(DEFAULTS, MappingProxyType)


def test_accepts_any_mapping() -> None:
    env = build_env(MappingProxyType({"HOME": "/h"}), explicit=MappingProxyType({"A": "b"}))
    assert env["HOME"] == "/h"
    assert env["A"] == "b"


_names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="=\0"), min_size=1, max_size=20
)
_values = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), max_size=20)


@given(
    host=st.dictionaries(
        st.one_of(_names, st.sampled_from(sorted(ALLOWLIST)), st.just("LC_X")), _values
    ),
    pass_proxy=st.booleans(),
)
def test_property_only_allowlisted_or_default_names_and_no_secrets(
    host: dict[str, str], pass_proxy: bool
) -> None:
    env = build_env(host, pass_proxy=pass_proxy)
    proxies = set(PROXY_NAMES) | {n.lower() for n in PROXY_NAMES}
    allowed = set(ALLOWLIST) | set(DEFAULTS) | {"LC_CTYPE"} | (proxies if pass_proxy else set())
    for name, value in env.items():
        assert name in allowed or name.startswith("LC_")
        assert not is_secret_name(name)
        assert "\0" not in value
    assert env["PATH"]
    assert env["LANG"] not in ("", "C", "POSIX")


# --------------------------------------------------------------------------- parse_env_assignment


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A=B", ("A", "B")),
        ("A=", ("A", "")),
        ("A=b=c", ("A", "b=c")),
        ("A==", ("A", "=")),
        ("GH_TOKEN=x y\nz", ("GH_TOKEN", "x y\nz")),
        ("ÜNÏ=🎉", ("ÜNÏ", "🎉")),
        ("lower=1", ("lower", "1")),
    ],
)
def test_parse_env_assignment(text: str, expected: tuple[str, str]) -> None:
    assert parse_env_assignment(text) == expected


@pytest.mark.parametrize("text", ["", "NAME", SENTINEL])
def test_parse_env_assignment_without_equals(text: str) -> None:
    with pytest.raises(EnvError, match="expected NAME=VALUE") as info:
        parse_env_assignment(text)
    assert SENTINEL not in str(info.value)


@pytest.mark.parametrize("text", ["=value", "=", "A\0=b"])
def test_parse_env_assignment_invalid_name(text: str) -> None:
    with pytest.raises(EnvError, match="--env"):
        parse_env_assignment(text)


def test_parse_env_assignment_nul_in_value() -> None:
    with pytest.raises(EnvError, match="'TOKEN'") as info:
        parse_env_assignment(f"TOKEN={SENTINEL}\0")
    assert SENTINEL not in str(info.value)


# --------------------------------------------------------------------------- redact


def test_redact_hides_secret_shaped_values_only() -> None:
    env = {"GH_TOKEN": SENTINEL, "api_key": SENTINEL, "HOME": "/h", "EMPTY_SECRET": ""}
    out = redact(env)
    assert out == {
        "GH_TOKEN": REDACTED,
        "api_key": REDACTED,
        "HOME": "/h",
        "EMPTY_SECRET": REDACTED,
    }
    assert env["GH_TOKEN"] == SENTINEL  # input untouched


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://user:pw@proxy:3128", f"http://{REDACTED}@proxy:3128"),
        ("https://tok@github.com/o/r.git", f"https://{REDACTED}@github.com/o/r.git"),
        ("http://proxy:3128", "http://proxy:3128"),
        ("mailto:a@b", "mailto:a@b"),
        ("http://proxy/path@x", "http://proxy/path@x"),
    ],
)
def test_redact_hides_url_credentials(value: str, expected: str) -> None:
    assert redact({"https_proxy": value}) == {"https_proxy": expected}


def test_redact_of_a_built_env() -> None:
    env = build_env({"http_proxy": "http://u:p@h:1"}, explicit={"TOKEN": "t"}, pass_proxy=True)
    out = redact(env)
    assert out["TOKEN"] == REDACTED
    assert "u:p" not in out["HTTP_PROXY"] + out["http_proxy"]
    assert out["TERM"] == "dumb"
