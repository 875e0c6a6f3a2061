"""Finding and signalling the processes of one run on this host's /proc, by environment marker.

Used by the docker backend when the engine is local (the exec's processes are visible in our
/proc): every process whose environment carries ``SANDBOXRUN_RUN_ID=<id>``, plus all their
descendants (a child that cleared its environment is still found through its parent).
"""

from __future__ import annotations

import errno
import os
import signal

TYPE_CHECKING = False  # not from typing: the supervisor imports this module too (cheaply)
if TYPE_CHECKING:
    from collections.abc import Mapping
if TYPE_CHECKING or __package__:  # sandboxrun.supervisor.procfs (the host)
    from .protocol import MARKER_VAR
else:  # next to the runner (its directory is on sys.path)
    from protocol import MARKER_VAR

__all__ = ["MARKER_VAR"]


class Proc:
    """One process as ``/proc/<pid>/stat`` showed it (immutable; no dataclasses: the
    supervisor imports this module)."""

    __slots__ = ("pid", "ppid", "start", "state")

    def __init__(self, pid: int, ppid: int, state: str, start: int) -> None:
        self.pid, self.ppid, self.state, self.start = pid, ppid, state, start

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Proc):
            return NotImplemented
        return (self.pid, self.ppid, self.state, self.start) == (
            other.pid,
            other.ppid,
            other.state,
            other.start,
        )

    def __hash__(self) -> int:
        return hash((self.pid, self.ppid, self.state, self.start))

    def __repr__(self) -> str:
        return f"Proc(pid={self.pid}, ppid={self.ppid}, state={self.state!r}, start={self.start})"


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``[0]`` the state, ``[1]``
    the ppid, ``[16]`` the nice value, ``[19]`` the start time, ``[38]`` the policy), or None
    when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()


def read_proc(pid: int) -> Proc | None:
    fields = stat_fields(pid)
    if fields is None:
        return None
    return Proc(pid, int(fields[1]), fields[0].decode(), int(fields[19]))


def has_marker(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def marker_of(pid: int) -> str | None:
    """The run id in a process's environment marker, or None (none, or unreadable)."""
    prefix = f"{MARKER_VAR}=".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(prefix):
                    return item[len(prefix) :].decode(errors="replace")
    except OSError:
        pass
    return None


def owner_by_marker(pid: int, table: Mapping[int, Proc]) -> str | None:
    """The run of ``pid``'s nearest ancestor (itself first) with a run marker, walking only
    through ``table``; None when no process on the way carries one."""
    seen: set[int] = set()
    while pid in table and pid not in seen:
        seen.add(pid)
        mark = marker_of(pid)
        if mark is not None:
            return mark
        pid = table[pid].ppid
    return None


def process_table() -> dict[int, Proc]:
    table: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            proc = read_proc(int(name))
            if proc is not None:
                table[proc.pid] = proc
    return table


def threads_left(pid: int) -> bool:
    """A zombie thread-group leader whose other threads still run is alive."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def members(
    run_id: str,
    *,
    init_pid: int | None = None,
    keep: frozenset[int] = frozenset(),
    roots: tuple[int, ...] = (),
) -> list[Proc]:
    """Live processes of the run: marked ones and ``roots``, and all their descendants.

    With ``init_pid`` (a container's init, which inherits every orphan of every exec), the
    init's children that carry no marker, or this run's, are the run's too (a daemon that
    cleared its environment and double-forked); children in ``keep`` (the container's own
    main process) and those marked by another run are not."""
    needle = f"{MARKER_VAR}={run_id}".encode()
    table = process_table()
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found = {pid for pid in table if has_marker(pid, needle)}
    found.update(pid for pid in roots if pid in table)  # e.g. the exec's own pid
    if init_pid is not None:
        for pid in children.get(init_pid, []):
            if pid not in keep and marker_of(pid) in (None, run_id):
                found.add(pid)
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return [table[pid] for pid in found if table[pid].state not in ("Z", "X") or threads_left(pid)]


def signal_all(procs: list[Proc], sig: int) -> None:
    """Signal each process if it is still the same process (start time unchanged)."""
    for proc in procs:
        current = read_proc(proc.pid)
        if current is None or current.start != proc.start:
            continue
        try:
            os.kill(proc.pid, sig)
            if sig == signal.SIGTERM:
                os.kill(proc.pid, signal.SIGCONT)
        except OSError:
            pass


def cgroup_lines(pid: int) -> list[tuple[str, str]]:
    """``(controllers, path)`` of each line of ``/proc/PID/cgroup`` (controllers ``""``: the
    v2 / unified hierarchy; v1 ones comma-joined, as mounted), or ``[]`` when unreadable."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return []
    return parse_cgroup_lines(text)


def parse_cgroup_lines(text: str) -> list[tuple[str, str]]:
    """``cgroup_lines`` of a ``/proc/PID/cgroup`` text. Pure."""
    lines = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            lines.append((parts[1], parts[2]))
    return lines


def cgroup_procs_file(pid: int) -> str | None:
    """The ``cgroup.procs`` file of ``pid``'s cgroup (v2, or v1's pids/memory hierarchy) as
    seen from here, or None. Every process of a container, exec'd ones too, is listed in it."""
    paths: dict[str, str] = {}
    for controllers, path in cgroup_lines(pid):
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    candidates = []
    if "" in paths:
        candidates += [f"/sys/fs/cgroup{paths['']}", f"/sys/fs/cgroup/unified{paths['']}"]
    for name in ("pids", "memory"):
        if name in paths:
            candidates.append(f"/sys/fs/cgroup/{name}{paths[name]}")
    for directory in candidates:
        procs = f"{directory.rstrip('/')}/cgroup.procs"
        if pid in read_pids(procs):
            return procs
    return None


def read_pids(procs_file: str) -> set[int]:
    try:
        with open(procs_file) as f:
            return {int(line) for line in f if line.strip()}
    except OSError:
        return set()


IN_TRANSIT = "\0in-transit"
"""The owner of an unmarked process whose ancestry leaves the container: an exec being started."""


def cgroup_members(
    procs_file: str,
    run_id: str,
    *,
    base: frozenset[int],
    others: frozenset[str],
    roots: tuple[int, ...] = (),
) -> list[Proc]:
    """Live processes of one exec among a container's cgroup members (exact: forks and env
    clearing cannot hide from a cgroup). ``base``: the container's own processes (init first
    among them). With other execs running, each process goes to the run of its nearest marked
    ancestor; unmarked orphans of the init are claimed by this run; unmarked processes whose
    parent is outside the container (``runc init`` of an exec still starting) by nobody.
    ``roots`` (the exec's own main process) are this run's whatever their environment."""
    table = {p.pid: p for p in map(read_proc, read_pids(procs_file) - base) if p is not None}
    live = [p for p in table.values() if p.state not in ("Z", "X") or threads_left(p.pid)]
    if not others:
        return live
    owners: dict[int, str | None] = {pid: run_id for pid in roots if pid in table}

    def owner(pid: int) -> str | None:
        chain = []
        while pid in table and pid not in owners:
            chain.append(pid)
            mark = marker_of(pid)
            if mark is not None:
                owners[pid] = mark
                break
            pid = table[pid].ppid
        if pid in owners:
            found = owners[pid]
        elif pid in base:  # an unmarked orphan of the container's init: claimed
            found = None
        else:  # unmarked, under the engine (an exec still being started): nobody's yet
            found = IN_TRANSIT
        for link in chain:
            owners[link] = owners.get(link, found)
        return owners.get(chain[0]) if chain else found

    return [p for p in live if owner(p.pid) not in others and owner(p.pid) != IN_TRANSIT]


def oom_kills(pid: int) -> int | None:
    """The OOM-kill counter of ``pid``'s memory cgroup (v1 ``memory.oom_control`` or v2
    ``memory.events``), or None where it cannot be read."""
    name = oom_file(pid)
    return None if name is None else read_oom(name)


def oom_file(pid: int) -> str | None:
    """The file holding ``pid``'s memory cgroup's OOM-kill counter, or None (a container's
    stays the same: find it once, read it with ``read_oom`` per run)."""
    files = []
    for controllers, path in cgroup_lines(pid):
        if "memory" in controllers.split(","):
            files.append(f"/sys/fs/cgroup/memory{path}/memory.oom_control")
        elif controllers == "":
            files.append(f"/sys/fs/cgroup{path}/memory.events")
    for name in files:
        if read_oom(name) is not None:
            return name
    return None


def read_oom(name: str) -> int | None:
    try:
        with open(name) as f:
            return oom_count(f.read())
    except OSError:
        return None


def oom_count(content: str) -> int | None:
    """The ``oom_kill`` counter of v1 ``memory.oom_control`` or v2 ``memory.events`` text."""
    for row in content.splitlines():
        key, _, value = row.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def signal_bits(*signals: int) -> int:
    """The ``SigPnd`` mask of ``signals``."""
    bits = 0
    for sig in signals:
        bits |= 1 << (sig - 1)
    return bits


def death_pending(status: bytes, deaths: int = SIGKILL_BIT) -> bool:
    """Whether a ``/proc/PID/status`` text shows one of ``deaths`` (a signal mask; SIGKILL by
    default) queued for the process, its own or its thread group's: it is already doomed,
    though it may not have run to its exit yet (a busy or preempted CPU)."""
    for line in status.splitlines():
        key, _, value = line.partition(b":")
        if key in (b"SigPnd", b"ShdPnd"):
            try:
                if int(value.strip() or b"0", 16) & deaths:
                    return True
            except ValueError:
                continue
    return False


def status_mask(status: bytes, *keys: bytes) -> int:
    """The union of the hexadecimal signal masks under ``keys`` (``SigIgn``, ``SigCgt``...)
    of a ``/proc/PID/status`` text; all bits set when one is missing or malformed (a mask
    not read is never taken for "none")."""
    found: dict[bytes, int] = {}
    for line in status.splitlines():
        key, _, value = line.partition(b":")
        if key in keys:
            try:
                found[key] = int(value.strip(), 16)
            except ValueError:
                return -1
    if len(found) != len(keys):
        return -1
    union = 0
    for bits in found.values():
        union |= bits
    return union


def default_deaths(pid: int, candidates: int) -> int:
    """Which of ``candidates`` (a signal mask) would end ``pid`` if it got them now: neither
    ignored, caught nor blocked by it (none when its status cannot be read)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:
        return 0
    return candidates & ~status_mask(status, b"SigIgn", b"SigCgt", b"SigBlk")


def living(pid: int, deaths: int = SIGKILL_BIT) -> bool:
    """Whether ``pid`` lives and will go on living: neither gone nor a zombie
    (:func:`alive`), nor holding one of ``deaths`` it has not acted on yet. A process that
    sent ``kill -9`` and exited is followed at once by this answer, not a moment later."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:
        return alive(pid)
    for line in status.splitlines():
        if line.startswith(b"State:"):
            if line[6:].strip()[:1] in (b"Z", b"X"):
                return False
            break
    return not death_pending(status, deaths)


def alive(pid: int) -> bool:
    """Whether ``pid`` lives (a zombie does not). With this process out of fds (EMFILE), the
    kernel is asked without one: a process is never taken for dead (its sandbox recreated)
    because we could not open its ``stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return data[data.rfind(b")") + 2 :][:1] not in (b"Z", b"X")
