"""What ``sandboxrun ps`` and ``clean`` print: the table of managed sandboxes and the spill
pruning line. Pure formatting, no engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

EMPTY = "no sandboxes running"
HEADER = ("ID", "NAME", "KIND", "STATUS", "OWNER", "OWNER ALIVE", "AGE")


def format_age(seconds: float | None) -> str:
    """``42s``, ``5m``, ``3h``, ``2d`` (whole units, rounded down); ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def format_bytes(size: int) -> str:
    """``512 B``, ``1.5 KiB``, ``64.0 MiB``, ``1.0 GiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def ps_cells(row: Mapping[str, object], now: float) -> tuple[str, ...]:
    """One ``ps --json`` row as table cells (the order of ``HEADER``)."""
    container = row.get("kind") == "container"
    created = row.get("created")
    age = now - created if isinstance(created, int | float) and created > 0 else None
    pid, host = row.get("owner_pid"), row.get("owner_host") or "?"
    return (
        str(row.get("id", ""))[:12] if container else "-",
        str(row.get("name", "")),
        str(row.get("kind", "")),
        str(row.get("status", "")),
        f"{pid}@{host}" if pid is not None else "?",
        "yes" if row.get("owner_alive") else "no",
        format_age(age),
    )


def ps_table(rows: Sequence[Mapping[str, object]], now: float) -> list[str]:
    """The header, then one line per row (columns as wide as their widest cell, two spaces
    apart), or the header and ``no sandboxes running``."""
    cells = [HEADER, *(ps_cells(row, now) for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    lines = [line.rstrip() for line in lines]
    return lines if rows else [*lines, EMPTY]


def spill_line(
    root: Path,
    removed: int,
    freed: int,
    in_use: int,
    left: int,
    caps: tuple[str, str],
    *,
    complete: bool = True,
    dry_run: bool = False,
) -> str:
    """``clean``'s line about the spill root: what went (``dry_run``: would go), what stays,
    under which caps."""
    noun = "directory" if removed == 1 else "directories"
    age, total = caps
    verb = "would remove" if dry_run else "removed"
    return (
        f"spill: {verb} {removed} {noun} ({format_bytes(freed)}) from {root}; "
        f"{in_use} in use, {format_bytes(left)} left (caps: age {age}, total {total})"
        + ("" if complete else "; stopped early, run it again")
    )
