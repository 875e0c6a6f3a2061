"""The explicit variables of a command line, with docker's habits: ``-e NAME=VALUE``, ``-e
NAME`` (the value of this environment's NAME) and ``--env-file FILE`` (``docker run``'s
format); ``-e`` wins over a file, a later one over an earlier one. Each of them is explicit:
secret-shaped names are allowed and their values masked in the output like any ``-e``.

Messages never show a value; a word without ``=`` is not shown either (it may be a value
typed where a name was meant), only where it was (``-e`` number N, FILE line N).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from sandboxrun.engine.env import validate_name, validate_value
from sandboxrun.errors import EnvError

MAX_ENV_FILE = 1024 * 1024
"""An env file larger than this is refused (it is read whole, into argv-sized places)."""


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _from_host(name: str, host: Mapping[str, str], where: str) -> tuple[str, str]:
    if not name or any(c.isspace() for c in name) or "\0" in name:
        raise EnvError(f"{where}: expected NAME=VALUE or a NAME (the word is not shown)")
    if name not in host:
        raise EnvError(
            f"{where}: a NAME without '=' takes its value from this environment, and no such "
            "variable is set here (the name is not shown: it may be a value)"
        )
    value = host[name]
    validate_value(name, value)
    return name, value


def parse_env_option(text: str, host: Mapping[str, str], *, index: int = 1) -> tuple[str, str]:
    """``-e NAME=VALUE`` -> ``(NAME, VALUE)`` (split on the first ``=``); ``-e NAME`` ->
    ``(NAME, host[NAME])``. ``index``: which ``-e`` of the command line it is (1-based)."""
    name, sep, value = text.partition("=")
    if not sep:
        return _from_host(text, host, f"--env (the {_ordinal(index)} -e)")
    validate_name(name, what="--env")
    validate_value(name, value)
    return name, value


def parse_env_file(text: str, host: Mapping[str, str], *, source: str) -> list[tuple[str, str]]:
    """The variables of an env file in ``docker run --env-file``'s format: one ``NAME=VALUE``
    per line, the value taken literally (quotes included) to the end of the line; a line
    holding only ``NAME`` takes this environment's value; blank lines and lines starting with
    ``#`` (after leading blanks) are skipped; a trailing CR is dropped. ``source``: the file's
    name, for messages."""
    found: list[tuple[str, str]] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r").lstrip()
        if not line or line.startswith("#"):
            continue
        where = f"--env-file {source} line {number}"
        name, sep, value = line.partition("=")
        if not sep:
            found.append(_from_host(line.rstrip(), host, where))
            continue
        if not name or any(c.isspace() for c in name) or "\0" in name:
            raise EnvError(f"{where}: invalid name (empty, or contains a blank or NUL)")
        if "\0" in value:
            raise EnvError(f"{where}: the value of {name!r} contains a NUL byte")
        found.append((name, value))
    return found


def read_env_file(path: Path) -> str:
    """The text of an env file: UTF-8, at most ``MAX_ENV_FILE`` bytes (``-`` is not stdin:
    the command's stdin may be forwarded with ``-i``)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_ENV_FILE + 1)
    except FileNotFoundError:
        raise EnvError(f"--env-file {path}: no such file") from None
    except IsADirectoryError:
        raise EnvError(f"--env-file {path}: is a directory, not a file") from None
    except OSError as exc:
        raise EnvError(f"--env-file {path}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_ENV_FILE:
        raise EnvError(f"--env-file {path}: larger than {MAX_ENV_FILE // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise EnvError(f"--env-file {path} line {line}: not UTF-8") from None


def explicit_env(
    env: Sequence[str], env_files: Sequence[Path], host: Mapping[str, str]
) -> dict[str, str]:
    """The explicit variables of ``--env-file`` (in order) and then ``-e`` (in order): a later
    one wins."""
    out: dict[str, str] = {}
    for path in env_files:
        out.update(parse_env_file(read_env_file(path), host, source=str(path)))
    for index, item in enumerate(env, start=1):
        name, value = parse_env_option(item, host, index=index)
        out[name] = value
    return out
