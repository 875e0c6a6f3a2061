"""One cgroup per docker exec: which processes belong to which run, decided when they spawn.

A container's processes all share the container's cgroup, and an environment marker can be
cleared, or be missing while an exec is still being started (``runc init``). So, where the
engine is local and this host may write the container's cgroup v2 directory (the unified
hierarchy of a pure v2 or hybrid host; root), every exec gets a child cgroup of its own:

1. the exec starts as ``sh -c 'kill -STOP $$; exec "$@"'`` (``stub_argv``): it stops itself
   before anything of the user's command runs;
2. the host moves every process carrying the run's marker out of the container's cgroup into
   the run's cgroup (``RunCgroup.adopt``), waits until the stub has stopped, and continues it;
3. from then on every descendant is born in the run's cgroup, whatever it does to its
   environment, session or parent; nothing inside the container can move it (cgroupfs is
   read-only there); termination signals the cgroup's members, kills with ``cgroup.kill``
   and ends when ``cgroup.events`` says it is unpopulated.

Limits stay the container's: a child cgroup is charged to its parent.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from sandboxrun.supervisor import procfs as proctree

PREFIX = "sandboxrun-"
STUB_ARGV0 = "sandboxrun-start"
STUB = 'kill -STOP $$; exec "$@"'


def stub_argv(command: list[str]) -> list[str]:
    """The exec's argv: stop, then become ``command`` (argv passed positionally, unquoted)."""
    return ["/bin/sh", "-c", STUB, STUB_ARGV0, *command]


def is_stub(pid: int) -> bool:
    """Whether ``pid`` still runs the stub (it has not yet ``exec``'d the command)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:  # noqa: PTH123 - hot path
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return argv[:4] == [b"/bin/sh", b"-c", STUB.encode(), STUB_ARGV0.encode()]


def in_runtime(pid: int) -> bool:
    """Whether ``pid`` is the runtime's ``runc init`` of an exec being started. Read from
    ``stat`` (no lock on its memory): reading its environment takes its mm lock, and polled
    every millisecond that slowed every exec's start by 3-9 ms."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:  # noqa: PTH123 - hot path
            head = f.read(64)
    except OSError:
        return False
    return b"(runc" in head


def unified_dir(pid: int, container_id: str, mount: str = "/sys/fs/cgroup") -> Path | None:
    """The cgroup v2 directory of ``pid`` when it is the container's own (its path names the
    container, as docker's cgroupfs and systemd drivers both do), writable, and lists ``pid``;
    else None (e.g. a hybrid host whose engine leaves the unified hierarchy shared)."""
    path = next((path for names, path in proctree.cgroup_lines(pid) if not names), None)
    if not path or path == "/" or not container_id or container_id not in path:
        return None
    root = mount if Path(mount, "cgroup.controllers").exists() else f"{mount}/unified"
    directory = Path(root + path)
    if pid not in proctree.read_pids(str(directory / "cgroup.procs")):
        return None
    if not os.access(directory, os.W_OK) or not (directory / "cgroup.events").exists():
        return None
    return directory


def populated(directory: Path) -> bool:
    """Whether any process lives in the cgroup (or below): the v2 ``populated`` flag."""
    try:
        text = (directory / "cgroup.events").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unknown: not known to be empty
    return any(line == "populated 1" for line in text.splitlines())


class RunCgroup:
    """The cgroup of one exec, a child of the container's (``base``)."""

    def __init__(self, base: Path, run_id: str) -> None:
        self.base = base
        self.path = base / f"{PREFIX}{run_id}"
        self.marker = run_id

    def create(self) -> None:
        self.path.mkdir(mode=0o755)

    def members(self) -> list[proctree.Proc]:
        """Live processes of the run (zombie leaders with live threads count as alive)."""
        procs = (proctree.read_proc(p) for p in proctree.read_pids(str(self.path / "cgroup.procs")))
        return [
            p
            for p in procs
            if p is not None and (p.state not in ("Z", "X") or proctree.threads_left(p.pid))
        ]

    def adopt(self) -> list[proctree.Proc]:
        """Move every process of the container's own cgroup that carries this run's marker into
        the run's cgroup; return the run's processes now there."""
        for pid in proctree.read_pids(str(self.base / "cgroup.procs")):
            if in_runtime(pid):  # runc's own setup: never ours yet, and not to be slowed down
                continue
            if proctree.marker_of(pid) == self.marker:
                with contextlib.suppress(OSError):  # gone meanwhile
                    (self.path / "cgroup.procs").write_text(str(pid))
        return self.members()

    def populated(self) -> bool:
        return populated(self.path)

    def kill(self) -> None:
        """SIGKILL every member at once, forks in flight too (``cgroup.kill``, Linux 5.14+),
        and each one by pid: ``cgroup.kill`` misses the live threads of a zombie leader (seen
        on Linux 6.18), a kill of the leader's pid does not."""
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1")
        proctree.signal_all(self.members(), signal.SIGKILL)

    def cpu_s(self) -> float | None:
        """CPU time of every process the run ever had (v2 ``cpu.stat``, kept after exit)."""
        try:
            for line in (self.path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def remove(self) -> bool:
        """Remove the (empty) cgroup; False when it is still populated or already gone."""
        try:
            self.path.rmdir()
        except OSError:
            return False
        return True
