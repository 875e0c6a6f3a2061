"""The code blocks of Markdown documents that tests/docs/test_examples.py executes (pure logic).

A fenced block is run by its language: ``sh``, ``bash``, ``shell`` (the block is a script),
``console`` (its ``$ `` lines are the commands; a line ending in ``\\`` continues on the next;
the rest is output) and ``python``/``py``. Blocks in other languages (none, ``text``, ``ini``,
``yaml``, ``json``...) are not code to run and are not collected.

Markers: HTML comments on the lines just before the opening fence, ``<!-- key: value -->``:

- ``not-run: reason`` the block is not run; the reason is listed (a reason is required);
- ``exit: N`` the exit status the block must end with (default 0);
- ``run: pytest`` a python block that is a pytest test module: run by pytest, which must pass
  at least one test.

An unknown key, a marker without a value or a marker before a block that is never run (another
language) is a ``DocBlockError``, so that a typo cannot skip or weaken a check silently.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

Kind = Literal["shell", "python", "pytest"]

LANGUAGES: dict[str, Kind] = {
    "sh": "shell",
    "bash": "shell",
    "shell": "shell",
    "console": "shell",
    "python": "python",
    "py": "python",
}
MARKER_KEYS = frozenset({"not-run", "exit", "run"})
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
MARKER = re.compile(r"^[ \t]*<!--[ \t]*(?P<key>[A-Za-z][\w-]*)[ \t]*:(?P<value>.*?)-->[ \t]*$")


class DocBlockError(ValueError):
    """A malformed marker or block: the document must be fixed."""


@dataclasses.dataclass(frozen=True)
class DocBlock:
    path: str
    """The document, as given (relative to the repository root)."""
    line: int
    """The line of the opening fence (1-based)."""
    language: str
    kind: Kind
    code: str
    """The code to run: the block dedented (for ``console``: only its commands)."""
    not_run: str | None = None
    """Why the block is not run, or None."""
    exit: int = 0

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def console_commands(text: str) -> str:
    """The commands of a ``console`` block: ``$ `` lines and their ``\\`` continuations."""
    commands: list[str] = []
    continued = False
    for line in text.splitlines():
        if continued:
            commands.append(line)
        elif line.startswith("$ ") or line == "$":
            commands.append(line[2:])
        else:
            continue
        continued = line.endswith("\\")
    return "".join(command + "\n" for command in commands)


def parse_markers(lines: list[str], where: str) -> dict[str, str]:
    """The ``<!-- key: value -->`` lines (consecutive, closest last) before a fence."""
    markers: dict[str, str] = {}
    for line in lines:
        match = MARKER.match(line)
        assert match is not None  # marker_lines_before took only such lines
        key, value = match["key"], match["value"].strip()
        if key not in MARKER_KEYS:
            raise DocBlockError(
                f"{where}: unknown marker {key!r} (known: {', '.join(sorted(MARKER_KEYS))})"
            )
        if not value:
            raise DocBlockError(f"{where}: marker {key!r} needs a value (a reason, a number...)")
        if key in markers:
            raise DocBlockError(f"{where}: marker {key!r} given twice")
        markers[key] = value
    return markers


def marker_lines_before(lines: list[str], index: int) -> list[str]:
    """The consecutive marker-shaped lines just before line ``index`` (no blank between)."""
    start = index
    while start > 0 and MARKER.match(lines[start - 1]):
        start -= 1
    return lines[start:index]


def parse(path: str, text: str) -> list[DocBlock]:
    """Every runnable block of the Markdown ``text`` (``path`` names it in ids and errors)."""
    lines = text.splitlines()
    blocks: list[DocBlock] = []
    consumed: set[int] = set()  # lines of fenced blocks and of the markers before them
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        info = opening["info"].split()
        language = info[0].lower() if info else ""
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            closing = FENCE.match(lines[end])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"]
            ):
                break
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        else:
            raise DocBlockError(f"{path}:{index + 1}: the block is never closed")
        where = f"{path}:{index + 1}"
        before = marker_lines_before(lines, index)
        consumed.update(range(index - len(before), end + 1))
        markers = parse_markers(before, where)
        kind = LANGUAGES.get(language)
        if kind is None:
            if markers:
                raise DocBlockError(
                    f"{where}: markers before a {language or 'plain'} block, which is never run"
                )
            index = end + 1
            continue
        code = "".join(line + "\n" for line in body)
        if language == "console":
            code = console_commands(code)
        run = markers.get("run")
        if run is not None:
            if run != "pytest" or kind != "python":
                raise DocBlockError(f"{where}: 'run: {run}' (only 'run: pytest' on python)")
            kind = "pytest"
        try:
            exit_status = int(markers.get("exit", "0"))
        except ValueError:
            raise DocBlockError(f"{where}: exit must be a number: {markers['exit']!r}") from None
        if not code.strip():
            raise DocBlockError(f"{where}: an empty {language} block")
        blocks.append(
            DocBlock(
                path=path,
                line=index + 1,
                language=language,
                kind=kind,
                code=code,
                not_run=markers.get("not-run"),
                exit=exit_status,
            )
        )
        index = end + 1
    for number, line in enumerate(lines):
        match = MARKER.match(line)
        if match is not None and match["key"] in MARKER_KEYS and number not in consumed:
            raise DocBlockError(
                f"{path}:{number + 1}: a {match['key']!r} marker must be on the line just "
                "before the opening fence of its block"
            )
    return blocks
