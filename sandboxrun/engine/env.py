"""Building the child environment. Pure: the host environment is always an argument.

The child environment is *built*, never inherited. In increasing precedence:

1. host variables on the allowlist (``ALLOWLIST`` and names starting with ``ALLOW_PREFIXES``),
   except secret-shaped names (``is_secret_name``), which are never copied implicitly;
2. ``PATH`` falls back to ``DEFAULT_PATH`` when the host has none (or an empty one);
3. proxy and CA variables (``PROXY_NAMES``, both cases) when ``pass_proxy`` is true;
4. host variables named in ``pass_through`` (``--pass-env NAME``);
5. locale repair: ``LANG`` and ``LC_CTYPE`` (always) and ``LC_ALL`` (only if present) become
   ``C.UTF-8`` when unset, empty, ``C`` or ``POSIX``; an *empty* ``LC_ALL`` is dropped instead,
   because the C library treats it as unset and rewriting it would override the host's ``LANG``;
6. ``DEFAULTS`` (non-interactive, uncoloured, unbuffered) for names still unset;
7. ``explicit`` (``--env NAME=VALUE``) wins over everything and is never rewritten.

Proxy variables are made consistent across cases: when only one case is set on the host both
cases get its value; when both are set and differ, the lower-case value wins for both (curl
only honours lower-case ``http_proxy``, so it is the one the host's tools were really using).

Error messages name variables with ``repr`` and never show a value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from sandboxrun.errors import EnvError

ALLOWLIST: frozenset[str] = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR"}
)
"""Host variables copied when present. ``TERM`` is deliberately absent (see ``DEFAULTS``)."""
ALLOW_PREFIXES: tuple[str, ...] = ("LC_",)
"""Host variables whose names start with one of these are copied too (locale categories)."""

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_LOCALE = "C.UTF-8"
DEFAULTS: Mapping[str, str] = MappingProxyType(
    {
        "NO_COLOR": "1",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "GIT_EDITOR": "true",
        "GIT_TERMINAL_PROMPT": "0",
        "PYTHONUNBUFFERED": "1",
        "PYTHONIOENCODING": "utf-8",
    }
)
PROXY_NAMES: tuple[str, ...] = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "FTP_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
)
"""Upper-case spellings; each is handled together with its lower-case twin."""
SECRET_WORDS: tuple[str, ...] = (
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "PRIVATE",
    "AUTH",
    "COOKIE",
    "SESSION",
)
RESERVED_PREFIX = "SANDBOXRUN_"
REDACTED = "<redacted>"

_SECRET = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_LOCALE_UNSET = ("", "C", "POSIX")
_EMPTY: Mapping[str, str] = MappingProxyType({})


def is_secret_name(name: str) -> bool:
    """Whether ``name`` contains a secret word anywhere, in any case (``GH_TOKEN``, ``apikey``)."""
    return _SECRET.search(name) is not None


def validate_name(name: str, *, what: str = "environment variable") -> None:
    """Raise ``EnvError`` unless ``name`` is non-empty and free of ``=`` and NUL."""
    if not name or "=" in name or "\0" in name:
        raise EnvError(f"{what} {name!r}: invalid name (empty, or contains '=' or NUL)")


def validate_value(name: str, value: str) -> None:
    """Raise ``EnvError`` (naming the variable, never showing the value) if it holds a NUL."""
    if "\0" in value:
        raise EnvError(f"environment variable {name!r}: value contains a NUL byte")


def parse_env_assignment(text: str) -> tuple[str, str]:
    """``--env NAME=VALUE`` -> ``(NAME, VALUE)``, split on the first ``=``."""
    name, sep, value = text.partition("=")
    if not sep:
        # The text is not echoed: without '=' it may well be the secret value itself.
        raise EnvError("--env: expected NAME=VALUE (the argument has no '=')")
    validate_name(name, what="--env")
    validate_value(name, value)
    return name, value


def redact(env: Mapping[str, str]) -> dict[str, str]:
    """A copy for logs: secret-shaped names' values and URL credentials (``user:pw@``) hidden."""
    return {
        name: REDACTED if is_secret_name(name) else _URL_USERINFO.sub(REDACTED + "@", value)
        for name, value in env.items()
    }


def _allowlisted(name: str) -> bool:
    return name in ALLOWLIST or name.startswith(ALLOW_PREFIXES)


def _proxy_vars(host: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for upper in PROXY_NAMES:
        lower = upper.lower()
        value = host.get(lower, host.get(upper))
        if value is not None:
            out[upper] = out[lower] = value
    return out


def _check_pass_through(host: Mapping[str, str], pass_through: Sequence[str]) -> None:
    if isinstance(pass_through, str):
        raise EnvError("pass_through must be a sequence of names, not a single string")
    for name in pass_through:
        validate_name(name, what="--pass-env")
        if name.startswith(RESERVED_PREFIX):
            raise EnvError(f"--pass-env {name!r}: the {RESERVED_PREFIX}* prefix is reserved")
        if is_secret_name(name):
            raise EnvError(
                f"--pass-env {name!r}: the name looks like a secret and is never passed "
                f"implicitly; pass it explicitly with -e {name} (its value from this "
                "environment, masked in the output)"
            )
        if name not in host:
            raise EnvError(f"--pass-env {name!r}: not set on the host")


def _repair_locale(env: dict[str, str]) -> None:
    if env.get("LC_ALL") == "":
        del env["LC_ALL"]
    for name in ("LANG", "LC_CTYPE", "LC_ALL"):
        if (name != "LC_ALL" or name in env) and env.get(name, "") in _LOCALE_UNSET:
            env[name] = DEFAULT_LOCALE


def build_env(
    host: Mapping[str, str],
    *,
    explicit: Mapping[str, str] = _EMPTY,
    pass_through: Sequence[str] = (),
    pass_proxy: bool = False,
) -> dict[str, str]:
    """The complete environment of the child (see the module docstring for the rules)."""
    for name in explicit:
        validate_name(name, what="--env")
        if name.startswith(RESERVED_PREFIX):
            raise EnvError(f"--env {name!r}: the {RESERVED_PREFIX}* prefix is reserved")
    _check_pass_through(host, pass_through)

    env = {n: v for n, v in host.items() if _allowlisted(n) and not is_secret_name(n)}
    if not env.get("PATH"):
        env["PATH"] = DEFAULT_PATH
    if pass_proxy:
        env.update(_proxy_vars(host))
    env.update((name, host[name]) for name in pass_through)
    _repair_locale(env)
    for name, value in DEFAULTS.items():
        env.setdefault(name, value)
    env.update(explicit)

    for name, value in env.items():
        validate_name(name)
        validate_value(name, value)
    return env
