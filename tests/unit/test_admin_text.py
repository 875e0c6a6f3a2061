"""What ``sandboxrun ps`` and ``clean`` print (``sandboxrun.cli.admin_text``): pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxrun.cli.admin_text import (
    EMPTY,
    HEADER,
    format_age,
    format_bytes,
    ps_cells,
    ps_table,
    spill_line,
)

NOW = 1_700_000_000.0
CONTAINER = {
    "kind": "container",
    "id": "0123456789abcdef0123",
    "name": "sandboxrun-abc",
    "status": "Up 5 minutes",
    "owner_pid": 4242,
    "owner_host": "box",
    "created": int(NOW - 300),
    "owner_alive": True,
}
SCOPE = {
    "kind": "scope",
    "id": "sandboxrun-x.scope",
    "name": "sandboxrun-x.scope",
    "status": "active",
    "owner_pid": None,
    "owner_host": "box",
    "created": None,
    "owner_alive": False,
}


def test_empty_table_is_the_header_and_the_empty_state() -> None:
    lines = ps_table([], NOW)
    assert lines == ["ID  NAME  KIND  STATUS  OWNER  OWNER ALIVE  AGE", EMPTY]
    assert EMPTY == "no sandboxes running"


def test_rows_line_up_under_the_header() -> None:
    lines = ps_table([CONTAINER, SCOPE], NOW)
    assert len(lines) == 3 and EMPTY not in lines
    header = lines[0]
    assert header.split() == ["ID", "NAME", "KIND", "STATUS", "OWNER", "OWNER", "ALIVE", "AGE"]
    for title in HEADER:  # every cell starts where its title does
        at = header.index(title)
        assert all(line[at - 1 : at] in {"", " "} for line in lines[1:])
    assert lines[1].split("  ")[0] == "0123456789ab"
    assert "sandboxrun-abc" in lines[1] and "4242@box" in lines[1]
    age, alive = header.index("AGE"), header.index("OWNER ALIVE")
    assert lines[1][age:] == "5m" and lines[1][alive:].startswith("yes  ")
    assert lines[2][age:] == "-" and lines[2][alive:].startswith("no  ")
    assert lines[2].startswith("-  ")
    assert all(line == line.rstrip() for line in lines)


def test_cells() -> None:
    assert ps_cells(CONTAINER, NOW) == (
        "0123456789ab",
        "sandboxrun-abc",
        "container",
        "Up 5 minutes",
        "4242@box",
        "yes",
        "5m",
    )
    assert ps_cells(SCOPE, NOW)[4:] == ("?", "no", "-")
    assert ps_cells({**CONTAINER, "created": 0}, NOW)[-1] == "-"  # unknown: not 54 years


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (-5, "0s"), (0, "0s"), (59.9, "59s"), (60, "1m"), (3599, "59m"),
     (3600, "1h"), (86399, "23h"), (86400, "1d"), (10 * 86400, "10d")],
)  # fmt: skip
def test_format_age(seconds: float | None, text: str) -> None:
    assert format_age(seconds) == text


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
     (64 << 20, "64.0 MiB"), (1 << 30, "1.0 GiB"), (3 << 40, "3072.0 GiB")],
)  # fmt: skip
def test_format_bytes(size: int, text: str) -> None:
    assert format_bytes(size) == text


def test_spill_line() -> None:
    line = spill_line(Path("/c/spill"), 2, 3 << 20, 1, 512, ("24h", "1g"))
    assert line == (
        "spill: removed 2 directories (3.0 MiB) from /c/spill; 1 in use, 512 B left "
        "(caps: age 24h, total 1g)"
    )
    one = spill_line(Path("/s"), 1, 10, 0, 0, ("off", "off"), complete=False)
    assert "removed 1 directory (10 B)" in one and one.endswith("stopped early, run it again")
