"""The systemd-scope launcher's wire, both ends in one module: the spec and plan memfds the
host writes (``encode_spec``, ``encode_plan``) and the launcher reads (``decode_spec``,
``decode_plan``); the status frames the launcher writes (``frame``) and the host reads
(``parse_status``); the watchdog's lines (``watch_line``).

The launcher runs once per command, so this module imports only ``os`` at its top (no json,
typing, re, enum, contextlib or dataclasses: they cost ~15 ms a run); the host's ``json`` is
imported inside ``parse_status``.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not from typing: importing typing costs ~15 ms a run
if TYPE_CHECKING:
    from typing import Any


TTY_VAR = "SANDBOXRUN_TTY"
"""``ROWS,COLS`` in the launcher's own environment (never the command's): the command runs on a
new terminal made in the sandbox, whose master goes to the host on the status socket."""
AS_VAR = "SANDBOXRUN_AS"
"""``UID:GID`` in the launcher's own environment: it becomes them (no supplementary group)
before it joins the sandbox (a root invoker's sandbox runs as the workspace's owner)."""


def json_text(text: str) -> str:
    """``text`` as a JSON string, escaped by hand (non-ASCII as \\u escapes)."""
    out = ['"']
    for char in text:
        code = ord(char)
        if 0x20 <= code < 0x7F and char not in '"\\':
            out.append(char)
        elif code > 0xFFFF:  # a surrogate pair
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    out.append('"')
    return "".join(out)


def frame(fd: int, fields: dict[str, str | int]) -> None:
    body = ", ".join(
        f"{json_text(k)}: {v if isinstance(v, int) else json_text(v)}" for k, v in fields.items()
    )
    data = ("\0{" + body + "}\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def decode_spec(data: bytes) -> tuple[bytes, list[bytes], dict[bytes, bytes]]:
    """``(cwd, argv, env)`` from the memfd's bytes (``encode_spec``)."""
    parts = data.split(b"\0")
    cwd, argc = parts[0], int(parts[1])
    argv = parts[2 : 2 + argc]
    env = {}
    for item in parts[2 + argc :]:
        key, _, value = item.partition(b"=")
        env[key] = value
    return cwd, argv, env


def decode_plan(data: bytes) -> dict[str, object]:
    """The plan from the memfd's bytes (``encode_plan``)."""
    parts = [os.fsdecode(p) for p in data.split(b"\0")]
    ns_fd = int(parts[0]) if parts[0] else 0
    at = 1
    count = int(parts[at])
    extra = parts[at + 1 : at + 1 + count]
    at += 1 + count
    flags = parts[at].split()
    at += 1
    count = int(parts[at])
    dirs = parts[at + 1 : at + 1 + count]
    at += 1 + count
    count = int(parts[at])
    files = parts[at + 1 : at + 1 + count]
    landlock = (
        {"dirs": dirs, "files": files, "deny_tcp": "deny_tcp" in flags}
        if "landlock" in flags
        else None
    )
    confine = {"drop_caps": "drop_caps" in flags, "seccomp": "seccomp" in flags}
    confine["landlock"] = landlock  # type: ignore[assignment]
    return {"ns_fd": ns_fd, "ns_extra": extra, "confine": confine}


def encode_spec(argv: list[str], env: dict[str, str], cwd: str) -> bytes:
    """The launcher's memfd: NUL-separated cwd, argc, the argv, then ``KEY=VALUE`` items (no
    NUL can be in any of them: the kernel could not pass it either)."""
    items = [cwd, str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
    encoded = [os.fsencode(item) for item in items]
    if any(b"\0" in item for item in encoded):
        raise ValueError("a NUL byte cannot be passed to a command")
    return b"\0".join(encoded)


def encode_plan(ns_fd: int | None, ns_extra: list[str], confine: dict[str, Any]) -> bytes:
    """The launcher's plan memfd (``decode_plan`` reads it; no ``json`` in the launcher:
    it costs ~10 ms a run): NUL-separated ``ns_fd`` (the launcher's pidfd of the holder), the
    count and names of the extra namespaces to join (``user``, ``net``), the set flags
    (``drop_caps seccomp landlock deny_tcp``), then the count and paths of the writable
    directories, then of the writable files."""
    landlock = confine.get("landlock") or None
    flags = [name for name in ("drop_caps", "seccomp") if confine.get(name)]
    dirs: list[str] = []
    files: list[str] = []
    if landlock:
        flags.append("landlock")
        if landlock.get("deny_tcp"):
            flags.append("deny_tcp")
        dirs, files = list(landlock["dirs"]), list(landlock["files"])
    items = [
        "" if ns_fd is None else str(ns_fd),
        str(len(ns_extra)),
        *ns_extra,
        " ".join(flags),
        str(len(dirs)),
        *dirs,
        str(len(files)),
        *files,
    ]
    encoded = [os.fsencode(item) for item in items]
    if any(b"\0" in item for item in encoded):
        raise ValueError("a NUL byte cannot be in a path")
    return b"\0".join(encoded)


class StatusReport:
    """What the status pipe said: systemd-run's own messages, and the launcher's frames."""

    __slots__ = ("cgroup", "keeper", "launched", "messages", "spawn_error")

    def __init__(
        self,
        messages: str,
        launched: bool,
        cgroup: str | None,
        spawn_error: dict[str, object] | None,
        keeper: int | None = None,
    ) -> None:
        self.messages = messages
        self.launched = launched
        self.cgroup = cgroup
        self.spawn_error = spawn_error
        self.keeper = keeper

    def _fields(self) -> tuple[object, ...]:
        return (self.messages, self.launched, self.cgroup, self.spawn_error, self.keeper)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StatusReport) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((self.messages, self.launched, self.cgroup, self.keeper))

    def __repr__(self) -> str:
        fields = ", ".join(repr(f) for f in self._fields())
        return f"StatusReport({fields})"


def parse_status(data: bytes) -> StatusReport:
    """Split the status pipe's bytes into systemd-run's text and the launcher's frames (the
    host's side: json is imported here, never by the launcher)."""
    import json

    text, *frames = data.split(b"\0")
    launched, cgroup, error, keeper = False, None, None, None
    for raw in frames:
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(message, dict):
            continue
        if message.get("op") == "launched":
            launched = True
            value = message.get("cgroup")
            cgroup = value if isinstance(value, str) else None
            pid = message.get("keeper")
            keeper = pid if isinstance(pid, int) and pid > 0 else None
        elif message.get("op") == "spawn_error":
            error = message
    return StatusReport(text.decode(errors="replace").strip(), launched, cgroup, error, keeper)


def watch_line(sign: str, unit: str) -> bytes:
    """A line for the scope watchdog: ``+unit`` (watch it) or ``-unit`` (its run is over)."""
    assert sign in ("+", "-")
    return f"{sign}{unit}\n".encode()


def read_watch_line(raw: bytes) -> tuple[str, str] | None:
    """``(sign, unit)`` of a watchdog line; None for anything else."""
    line = raw.decode(errors="replace").strip()
    if line[:1] in ("+", "-") and len(line) > 1:
        return line[0], line[1:]
    return None
