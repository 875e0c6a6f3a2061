"""``sandboxrun exec``'s words parsed without typer (pure logic): typer builds its options
through pydantic, ~150 ms, which would make a 3 ms command cost 50 times that. Words this
parser does not take as plainly valid (help, an unknown option, a missing value) go to typer,
so that every error reads as any other command's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

VALUED = {
    "-t": "timeout",
    "--timeout": "timeout",
    "--idle-timeout": "idle_timeout",
    "-C": "workdir",
    "--workdir": "workdir",
    "-e": "env",
    "--env": "env",
}
FLAGS = {"--shell": "shell", "-i": "interactive", "--interactive": "interactive", "--json": "json"}


@dataclass
class ExecArgs:
    name: str
    command: list[str]
    timeout: str | None = None
    idle_timeout: str | None = None
    workdir: str | None = None
    env: list[str] = field(default_factory=list)
    shell: bool = False
    interactive: bool = False
    json: bool = False


def parse(words: Sequence[str]) -> ExecArgs | None:
    """The words after ``exec``: options, NAME, then COMMAND (a ``--`` before NAME or right
    after it is dropped). None when typer should parse them instead."""
    values: dict[str, str | None] = {}
    env: list[str] = []
    flags: set[str] = set()
    at = 0
    while at < len(words):
        word = words[at]
        if word == "--":
            at += 1
            break
        if not word.startswith("-") or word == "-":
            break
        key, eq, inline = word.partition("=")
        if key in VALUED and (not eq or key.startswith("--")):
            if eq:
                value = inline
            elif at + 1 < len(words):
                at += 1
                value = words[at]
            else:
                return None  # a missing value: typer says so
            if VALUED[key] == "env":
                env.append(value)
            else:
                values[VALUED[key]] = value
        elif word in FLAGS:
            flags.add(FLAGS[word])
        else:
            return None  # -h, --help, an unknown or combined option: typer's
        at += 1
    rest = list(words[at:])
    if len(rest) < 2:
        return None  # no NAME or no COMMAND: typer says which
    name, command = rest[0], rest[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        return None
    return ExecArgs(
        name=name,
        command=command,
        timeout=values.get("timeout"),
        idle_timeout=values.get("idle_timeout"),
        workdir=values.get("workdir"),
        env=env,
        shell="shell" in flags,
        interactive="interactive" in flags,
        json="json" in flags,
    )
