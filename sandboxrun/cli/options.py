"""Validation of ``sandboxrun run``'s limit options, before anything touches an engine. Pure:
every message names the option as the user typed it (``--memory must be at least 6m``), never
a field of ``Limits``.

Also, for errors that happen before the command's own code runs (an unknown option, a bad
value, a missing COMMAND): whether a command line asked for ``--json`` (``json_requested``),
and the ``-e`` values its messages must mask (``assignments_in``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from sandboxrun.errors import ConfigError
from sandboxrun.units import format_duration, format_size, parse_duration, parse_size

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_GRACE_S = 3.0
MAX_GRACE_S = 600.0
MIN_MAX_OUTPUT = 64
MIN_MEMORY = 6 * 1024**2
"""Docker's smallest memory limit (6 MiB); smaller ones cannot run anything anywhere."""
MIN_DISK = 1 << 20
"""``Limits.disk_bytes``' floor (1 MiB)."""
MIN_CPUS = 0.01
"""These mirror ``sandboxrun.models`` (``Limits``' defaults and floors; a unit test keeps them
equal) so that validating options imports no pydantic."""


@dataclass(frozen=True)
class RunLimits:
    """``run``'s limit options, validated; ``Limits(**vars(...))`` takes them as they are."""

    timeout_s: float
    max_timeout_s: float | None
    idle_timeout_s: float | None
    grace_s: float
    max_output: int
    spill_max: int
    memory_bytes: int | None
    cpus: float | None
    pids: int | None
    disk_bytes: int | None = None


def check_timeout(timeout: str | None, max_timeout: str | None) -> tuple[float, float | None]:
    """``(timeout_s, max_timeout_s)``. Any timeout is accepted unless an operator set a cap
    (``--max-timeout``, ``SANDBOXRUN_MAX_TIMEOUT``): above it, it is refused, never clamped.
    The default timeout is 120 s, or the cap when that is lower."""
    cap = None if max_timeout is None else parse_duration(max_timeout, what="--max-timeout")
    if timeout is None:
        return (DEFAULT_TIMEOUT_S if cap is None else min(DEFAULT_TIMEOUT_S, cap)), cap
    seconds = parse_duration(timeout, what="--timeout")
    if cap is not None and seconds > cap:
        raise ConfigError(
            f"--timeout {timeout.strip()} is above the maximum of {format_duration(cap)} "
            f"(--max-timeout or SANDBOXRUN_MAX_TIMEOUT); a larger --max-timeout allows it"
        )
    return seconds, cap


def check_grace(grace: str) -> float:
    seconds = parse_duration(grace, what="--grace", allow_zero=True)
    if seconds > MAX_GRACE_S:
        raise ConfigError(f"--grace must be at most {format_duration(MAX_GRACE_S)}, got {grace!r}")
    return seconds


def check_byte_size(text: str, option: str, minimum: int) -> int:
    size = parse_size(text, what=option)
    if size < minimum:
        raise ConfigError(
            f"{option} must be at least {format_size(minimum)}, got {text.strip()!r} "
            f"({size} bytes; a bare number is bytes)"
        )
    return size


def check_cpus(text: str, host_cpus: int | None) -> float:
    """A positive, finite number of CPUs, at least ``MIN_CPUS``, at most the host's."""
    try:
        cpus = float(text)
    except ValueError:
        raise ConfigError(f"invalid --cpus {text!r}: expected a number of CPUs (1, 0.5)") from None
    if not math.isfinite(cpus):
        raise ConfigError(f"invalid --cpus {text!r}: expected a finite number of CPUs")
    if cpus <= 0:
        raise ConfigError(f"--cpus must be more than 0, got {text.strip()!r}")
    if cpus < MIN_CPUS:
        raise ConfigError(
            f"--cpus must be at least {MIN_CPUS} (a hundredth of a CPU), got {text!r}"
        )
    if host_cpus is not None and cpus > host_cpus:
        raise ConfigError(f"--cpus {cpus:g} is more than this host's {host_cpus} CPUs")
    return cpus


def check_pids(text: str) -> int:
    try:
        pids = int(text)
    except ValueError:
        raise ConfigError(
            f"invalid --pids {text!r}: expected a whole number of processes"
        ) from None
    if pids < 1:
        raise ConfigError(f"--pids must be at least 1, got {text.strip()!r}")
    return pids


def check_run_limits(
    *,
    timeout: str | None,
    max_timeout: str | None,
    idle_timeout: str | None,
    grace: str,
    max_output: str,
    spill_max: str,
    memory: str | None,
    cpus: str | None,
    pids: str | None,
    host_cpus: int | None,
    disk: str | None = None,
) -> RunLimits:
    """Every limit option of ``run``, validated (``ConfigError`` naming the first bad one).
    ``host_cpus``: the CPUs ``--cpus`` may ask for at most (None: no upper bound)."""
    timeout_s, max_timeout_s = check_timeout(timeout, max_timeout)
    return RunLimits(
        timeout_s=timeout_s,
        max_timeout_s=max_timeout_s,
        idle_timeout_s=(
            None if idle_timeout is None else parse_duration(idle_timeout, what="--idle-timeout")
        ),
        grace_s=check_grace(grace),
        max_output=check_byte_size(max_output, "--max-output", MIN_MAX_OUTPUT),
        spill_max=parse_size(spill_max, what="--spill-max"),
        memory_bytes=None if memory is None else check_byte_size(memory, "--memory", MIN_MEMORY),
        cpus=None if cpus is None else check_cpus(cpus, host_cpus),
        pids=None if pids is None else check_pids(pids),
        disk_bytes=None if disk is None else check_byte_size(disk, "--disk", MIN_DISK),
    )


def json_requested(args: Sequence[str], value_options: Collection[str]) -> bool:
    """Whether the options of a command's ``args`` (the words after its name) hold ``--json``.
    ``value_options``: the option names that take a value (their next word is that value, not
    an option). Options end at ``--`` or at the first word that is not an option (COMMAND)."""
    words = iter(args)
    for word in words:
        if word == "--" or not word.startswith("-") or word == "-":
            return False
        if word == "--json":
            return True
        if word.startswith("--"):
            if "=" not in word and word in value_options:
                next(words, None)
            continue
        for at in range(1, len(word)):  # a cluster of short options: -iw DIR, -wDIR
            if f"-{word[at]}" in value_options:
                if at == len(word) - 1:
                    next(words, None)
                break
    return False


def assignments_in(args: Sequence[str]) -> list[tuple[str, str]]:
    """Every ``NAME=VALUE`` a command line may be giving with ``-e``/``--env``, before it is
    parsed: each word, and what follows ``--env=``, ``-e`` or an ``e`` in a cluster of short
    options (``-ie``, ``-eNAME=V``), that has an ``=``; none when ``--no-mask`` comes before
    ``--``. More than ``-e`` gave (the command's own words too): they only decide what error
    text masks, and of them only secret-shaped names count (``redact.secret_pairs``)."""
    words = list(args)
    options = words[: words.index("--")] if "--" in words else words
    if "--no-mask" in options:
        return []
    found: list[tuple[str, str]] = []
    for word in words:
        candidates = [word, word.removeprefix("--env=")]
        if word.startswith("-") and not word.startswith("--"):
            candidates += [word[at + 1 :] for at in range(1, len(word)) if word[at] == "e"]
        for text in candidates:
            name, sep, value = text.partition("=")
            if sep and name and (name, value) not in found:
                found.append((name, value))
    return found


_OPTION = re.compile(r"^(?:invalid )?(--[a-z][a-z-]*)\b")


def option_named(message: str) -> str | None:
    """The option an error message is about, when it starts by naming one (``--memory must
    be ...``, ``invalid --cpus ...``), for the ``--json`` error object; else None."""
    match = _OPTION.match(message)
    return None if match is None else match.group(1)


TTY_HABIT = (
    "-t is --timeout here (a DURATION), not docker's terminal flag: for an interactive shell "
    "use `sandboxrun shell [COMMAND]`; -i alone forwards stdin"
)
DOCKER_HABITS = {
    "--rm": "sandboxrun run always removes its sandbox when the command ends: drop --rm",
    "-d": "sandboxrun run waits for its command and removes the sandbox when it ends",
    "--detach": "sandboxrun run waits for its command and removes the sandbox when it ends",
    "-u": "the user is --user UID[:GID]",
    "--pids-limit": "the process limit is --pids N",
    "--tty": TTY_HABIT,
    "-it": TTY_HABIT,
    "-ti": TTY_HABIT,
}
"""What ``docker run``'s options that ``run`` lacks are here, for the error naming one."""


def close_options(word: str, known: Collection[str]) -> list[str]:
    """The options a mistyped ``word`` may have meant, best first: those it is the start of
    (``--time`` -> ``--timeout``) and those within a small edit of it (``--tiemout``,
    ``--memroy``); none rather than a far one (``--bogus`` suggests nothing)."""
    import difflib

    bare = word.lstrip("-").split("=", 1)[0].lower()
    if not bare:
        return []
    names = {name.lstrip("-"): name for name in known if name.startswith("--")}
    starts = [names[n] for n in sorted(names) if len(bare) >= 3 and n.startswith(bare)]
    near = [names[n] for n in difflib.get_close_matches(bare, list(names), n=3, cutoff=0.75)]
    return list(dict.fromkeys([*starts, *near]))[:3]


def tty_habit(words: Sequence[str]) -> bool:
    """Whether the options of a command's ``words`` (before ``--``) use docker's ``-it``/``-ti``
    or ``--tty``: here ``-t`` is ``--timeout`` and takes the next word as its DURATION."""
    options = words[: list(words).index("--")] if "--" in words else words
    return any(word in ("-it", "-ti", "--tty") for word in options)
