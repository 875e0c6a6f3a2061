"""The per-sandbox runner of the process-group backend (stdlib only; run as a script).

The host program must not become a child subreaper itself: its unrelated orphans would
re-parent to it and have to be reaped there. So each process-group ``Sandbox`` starts this small
runner, which is the subreaper instead. It spawns every command of the sandbox (in a new session),
owns the run's process tree (orphans that double-fork or ``setsid`` re-parent to it), reaps
everything, and kills on request: TERM (+CONT) to the group and every descendant, a grace period,
then KILL repeated until nothing of the run is alive. When the host disappears (its socket end
closes), the runner terminates every run and exits, so nothing is left behind even if the host
is SIGKILLed.

Protocol: a stream socket; every message is a 4-byte big-endian length and a JSON object. The
host attaches the child's stdin/stdout/stderr to ``spawn`` with SCM_RIGHTS (in order).

argv: ``_runner.py SOCKET_FD [CONFINE_PLAN_JSON]``: with a plan the runner first confines itself
(and so every command) with ``_confine.apply``; it usually runs as PID 1 of the sandbox's
namespaces then (``sandboxrun/backends/local/isolation.py``), where its death ends every process of
the sandbox.
``_runner.py --connect SOCKET_PATH``: inside a docker sandbox the runner is the container's main
process and connects to the host's socket through a bind mount (``backends/docker_supervisor``);
when this Python cannot serve (too old), it replaces itself with ``sleep infinity`` and the host
uses the engine's exec path. Commands get the runner's own environment (the image's) under the
spawn's ``env`` when the spawn says ``inherit``, as ``docker exec`` does.

host -> runner: ``spawn {id, argv, env, cwd, grace[, tty {rows, cols}]}`` + 3 fds (none with
``tty``), ``terminate {id, grace}``, ``signal {id, sig, target}`` (``signal_run``),
``shutdown {}``, ``open {id, path, flags, mode[, beneath]}`` (the runner opens the path in
the sandbox's view, with its credentials; with ``beneath`` the path is relative to that
directory and may not leave it: ``open_beneath``).  runner -> host: ``ready {pid, layers}``,
``confine_error {error}``, ``spawned {id, pid[, fds: 1]}`` (+ the terminal's master with
``tty``), ``spawn_error {id, errno, error}``,
``exit {id, status}``, ``terminated {id, survivors, cpu_s, maxrss_kb}``,
``opened {id, kind, size, fds: 1}`` + the fd (a regular file or a directory only),
``open_error {id, errno, error}`` (errno 0: it is something else, a FIFO, a device...).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import selectors
import signal
import socket
import stat
import sys
import time

TYPE_CHECKING = False  # not from typing (~4 ms of the supervisor's start-up)
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING or __package__:  # imported as sandboxrun.supervisor.runner (the host)
    from .procfs import marker_of as run_marker
    from .procfs import stat_fields, threads_left
    from .protocol import (
        HEADER,
        KILL_BUDGET_S,
        MAX_SEND,
        MAX_TEXT,
        ORPHANED_GRACE_S,
        clip,
        recv_fds,
    )
    from .safeopen import MAX_HOPS, open_beneath
    from .spawn import spawn, spawn_tty
else:  # run as a script (the local backends) or imported as ``runner`` (docker's boot code)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from procfs import marker_of as run_marker
    from procfs import stat_fields, threads_left
    from protocol import HEADER, KILL_BUDGET_S, MAX_SEND, MAX_TEXT, ORPHANED_GRACE_S, clip, recv_fds
    from safeopen import MAX_HOPS, open_beneath
    from spawn import spawn, spawn_tty

__all__ = [
    "HEADER",
    "KILL_BUDGET_S",
    "MAX_HOPS",
    "MAX_SEND",
    "MAX_TEXT",
    "ORPHANED_GRACE_S",
    "clip",
    "open_beneath",
]

PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
TICK_S = 0.02
REFRESH_S = 0.5
OOM_FD = -1
"""Our /proc/self/oom_score_adj, opened before we become non-dumpable (``main``)."""


def describe_error(exc: BaseException) -> tuple[int, str]:
    """``(errno, message)`` of a failed request, the message clipped: an OSError's strerror
    and (clipped) file name, anything else its text."""
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
        if exc.filename is not None:  # as given (the host masks secret values in it)
            name = exc.filename
            text += f": {clip(os.fsdecode(name) if isinstance(name, bytes) else str(name), 200)}"
        return exc.errno or 0, clip(text)
    return 0, clip(str(exc) or type(exc).__name__)


WATCHED_LIMITS = tuple(
    getattr(resource, name)
    for name in (
        "RLIMIT_NOFILE",
        "RLIMIT_NPROC",
        "RLIMIT_CPU",
        "RLIMIT_AS",
        "RLIMIT_DATA",
        "RLIMIT_STACK",
        "RLIMIT_FSIZE",
        "RLIMIT_MEMLOCK",
        "RLIMIT_SIGPENDING",
        "RLIMIT_RTTIME",
    )
    if hasattr(resource, name)
)
"""The runner's own limits a command of its uid could lower with ``prlimit`` (or raise, for a
soft one) to starve it: checked before every request (``Runner.tampered``)."""


def own_state() -> tuple[tuple[tuple[int, int], ...], int, int]:
    """The runner's limits (``WATCHED_LIMITS``), nice value and scheduling policy."""
    limits = tuple(resource.getrlimit(which) for which in WATCHED_LIMITS)
    return limits, os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0)


def close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def read_stat(pid: int) -> tuple[int, bytes, int] | None:
    """``(ppid, state, starttime)`` of a process, or None when it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else (int(fields[1]), fields[0], int(fields[19]))


def process_table() -> dict[int, tuple[int, bytes, int]]:
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None:
                table[int(name)] = stat
    return table


def namespaces() -> dict[str, int]:
    """Our namespaces' inode numbers: the host compares them with its own (before any command
    ran, this report can be trusted; the host cannot read a non-dumpable process's links)."""
    found = {}
    for kind in ("pid", "mnt", "ipc", "uts", "net", "user"):
        try:
            found[kind] = os.stat(f"/proc/self/ns/{kind}").st_ino
        except OSError:
            pass
    return found


def special(mode: int) -> str:
    """What a file that is neither regular nor a directory is, for a message."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"


class Run:
    def __init__(self, run_id: str, pid: int, grace: float) -> None:
        self.id = run_id
        self.pid = pid
        self.grace = grace
        self.status: int | None = None
        self.members: dict[int, int] = {}  # pid -> starttime, last seen alive
        self.cpu_s = 0.0
        self.maxrss_kb = 0
        self.phase: str | None = None  # None, "term", "kill"
        self.deadline = 0.0
        self.signalled: set[tuple[int, int]] = set()
        self.empty_sweeps = 0

    def account(self, rusage: Any) -> None:
        self.cpu_s += rusage.ru_utime + rusage.ru_stime
        self.maxrss_kb = max(self.maxrss_kb, rusage.ru_maxrss)


class Runner:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.me = os.getpid()
        self.runs: dict[str, Run] = {}
        self.mains: dict[int, Run] = {}
        self.orphans: dict[tuple[int, int], list[str]] = {}
        self.batches: list[tuple[int, int, list[int], bool]] = []
        """Fds received and not yet taken by their request: ``(begin, end, fds, truncated)``
        of each receive that brought some (``fds_of``)."""
        self.received = 0
        """Bytes received from the host so far (``inbuf`` ends there)."""
        self.inbuf = b""
        self.closing = False
        self.last_refresh = 0.0
        self.layers: list[str] = []
        self.state = own_state()
        """Our limits, nice value and scheduling policy as we serve (``tampered``)."""

    # -- messages ---------------------------------------------------------------------------
    def send(self, **msg: Any) -> None:
        data = json.dumps(msg).encode()
        self.send_frame(data if len(data) <= MAX_SEND else self.too_large(msg, len(data)))

    def send_frame(self, data: bytes) -> None:
        try:
            self.sock.sendall(HEADER.pack(len(data)) + data)
        except OSError:
            self.closing = True

    @staticmethod
    def too_large(msg: dict[str, Any], size: int) -> bytes:
        """What is sent instead of a reply over ``MAX_SEND`` bytes: an ``error`` about that
        request (its ``op`` and ``id``, no fd), so the host fails that request alone."""
        why = f"the supervisor's {clip(str(msg.get('op')), 40)} reply was {size} bytes"
        error = {"op": "error", "id": msg.get("id"), "about": msg.get("op"), "error": why}
        return json.dumps(error).encode()

    def receive(self) -> None:
        try:
            # close-on-exec at once: a neighbour's stdio in flight never reaches a command
            data, fds, flags = recv_fds(self.sock, 1 << 16, 16)
        except OSError:
            data, fds, flags = b"", [], 0
        begin = self.received
        self.received += len(data)
        if fds or flags & socket.MSG_CTRUNC:  # (dropped ones: our fd table is full)
            self.batches.append((begin, self.received, fds, bool(flags & socket.MSG_CTRUNC)))
        if not data:
            self.begin_close(orphaned=True)
            return
        self.inbuf += data
        if self.tampered():
            return
        while len(self.inbuf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self.inbuf)
            if len(self.inbuf) < HEADER.size + size:
                break
            start = self.received - len(self.inbuf)
            frame = self.inbuf[HEADER.size : HEADER.size + size]
            self.inbuf = self.inbuf[HEADER.size + size :]
            fds, truncated = self.fds_of(start, start + HEADER.size + size)
            try:
                msg = json.loads(frame)
                if isinstance(msg, dict) and msg.get("op") == "spawn":
                    taken, fds = fds, []  # the spawn owns (and closes) them
                    self.spawn(msg, taken, truncated)
                elif isinstance(msg, dict):
                    self.handle(msg)
            except Exception as exc:  # a bad request never takes the runner (and its runs) down
                sys.stderr.write(f"sandboxrun runner: a request failed: {clip(repr(exc), 200)}\n")
            close_all(fds)  # fds no request of ours takes

    def fds_of(self, start: int, end: int) -> tuple[list[int], bool]:
        """The fds that came with the request at stream bytes ``[start, end)``: a receive ends
        with the segment that carries fds, and the host sends a request's fds with its first
        byte, so a receive's fds are the last request's that begins in it (never another's).
        Fds that came with no request's start are closed."""
        while self.batches and self.batches[0][1] <= start:
            close_all(self.batches.pop(0)[2])
        if self.batches:
            first, last, fds, truncated = self.batches[0]
            if first <= start < last and end >= last:
                self.batches.pop(0)
                return fds, truncated
        return [], False

    def tampered(self) -> bool:
        """Whether a command changed our limits or priority (``prlimit``, ``setpriority``,
        ``sched_setscheduler``: the same uid may, PID 1 or not; a lowered hard limit or a
        higher nice value cannot be undone without privilege, and would starve every run).
        Then we tell the host, kill every run and exit: the host gives the next call a fresh
        sandbox (it also looks for this itself, before each call: ``RunnerClient.probe``)."""
        now = own_state()
        if now == self.state:
            return False
        was = self.state[0]
        changed = [str(w) for i, w in enumerate(WATCHED_LIMITS) if now[0][i] != was[i]]
        if changed:
            why = f"a command changed the supervisor's limits (resources {', '.join(changed)})"
        else:
            why = "a command changed the supervisor's nice value or scheduling policy"
        self.send(op="fatal", error=f"{why}: the sandbox ends")
        self.kill_all()
        os._exit(3)  # as PID 1, our exit also kills whatever else lives in the namespace

    def kill_all(self) -> None:
        """SIGKILL every run's group and every process of it we know (no grace: we end)."""
        for run in list(self.runs.values()):
            try:
                os.killpg(run.pid, signal.SIGKILL)
            except OSError:
                pass
            for pid in [run.pid, *run.members]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def handle(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op == "terminate":
            run = self.runs.get(msg["id"])
            if run is not None:
                self.start_termination(run, float(msg["grace"]))
        elif op == "signal":
            self.signal_run(msg)
        elif op == "shutdown":
            self.begin_close()
        elif op == "open":
            self.open_file(msg)

    def open_file(self, msg: dict[str, Any]) -> None:
        """``open``: the host reads and writes files through an fd opened here, so a path
        resolves in the sandbox's view with its credentials. Only a regular file or a directory
        is passed on (fstat after the O_NONBLOCK open: a FIFO must never block the host)."""
        fd = -1
        try:
            flags, mode, beneath = int(msg["flags"]), int(msg["mode"]), msg.get("beneath")
            if beneath is None:
                extra = os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
                fd = os.open(str(msg["path"]), flags | extra, mode)
            else:
                fd = open_beneath(str(beneath), str(msg["path"]), flags, mode)[0]
            st = os.fstat(fd)
            kind = "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else ""
            if kind:
                self.send_fds([fd], op="opened", id=msg.get("id"), kind=kind, size=st.st_size)
            else:
                why = f"it is {special(st.st_mode)}, not a regular file or a directory"
                self.send(op="open_error", id=msg.get("id"), errno=0, error=why)
        except Exception as exc:  # a bad request must never take the runner (and its runs) down
            code, why = describe_error(exc)
            if isinstance(exc, OSError) and exc.strerror:  # not the path: the host has it
                why = clip(exc.strerror)
            self.send(op="open_error", id=msg.get("id"), errno=code, error=why)
        finally:
            if fd >= 0:
                os.close(fd)

    def send_fds(self, fds: list[int], **msg: Any) -> None:
        data = json.dumps({**msg, "fds": len(fds)}).encode()
        if len(data) > MAX_SEND:  # an error about the request goes instead, without the fds
            self.send_frame(self.too_large(msg, len(data)))
            return
        frame = HEADER.pack(len(data)) + data
        try:
            sent = socket.send_fds(self.sock, [frame], fds)
            self.sock.sendall(frame[sent:])
        except OSError:
            self.closing = True

    def begin_close(self, orphaned: bool = False) -> None:
        self.closing = True
        for run in list(self.runs.values()):
            self.start_termination(run, min(run.grace, ORPHANED_GRACE_S) if orphaned else run.grace)

    # -- spawning and reaping ---------------------------------------------------------------
    def spawn(self, msg: dict[str, Any], stdio: list[int], truncated: bool = False) -> None:
        """Start a run on ``stdio``, the three fds that came with its request (closed here);
        with ``tty {rows, cols}`` (and no fds) on a pseudo-terminal made here, whose master
        goes to the host with ``spawned`` (no copy is kept: the host's is the only one)."""
        restore = None
        master = -1
        tty = msg.get("tty")
        try:
            run_id, grace = msg["id"], float(msg["grace"])  # checked before anything starts
            if not isinstance(run_id, str) or not grace >= 0:
                raise ValueError("a spawn needs a string id and a grace period")
            if truncated:
                raise OSError(errno.EMFILE, "too many open files in the supervisor")
            if len(stdio) != (0 if tty is not None else 3):
                raise OSError(0, "the spawn request came without its three stdio fds")
            env = {**os.environ, **msg["env"]} if msg.get("inherit") else msg["env"]
            restore = self.raise_oom_score(msg.get("oom_score_adj"))
            if tty is not None:
                pid, master = spawn_tty(
                    msg["argv"], env, msg["cwd"], int(tty["rows"]), int(tty["cols"])
                )
            else:
                pid = spawn(msg["argv"], env, msg["cwd"], stdio)
        except Exception as exc:  # a spawn problem must never take the runner (and its runs) down
            code, why = describe_error(exc)
            self.send(op="spawn_error", id=msg.get("id"), errno=code, error=why)
            return
        finally:
            for fd in stdio:
                os.close(fd)
            if restore is not None:
                self.raise_oom_score(restore)
        run = Run(run_id, pid, grace)
        self.runs[run.id] = run
        self.mains[run.pid] = run
        if master < 0:
            self.send(op="spawned", id=run.id, pid=run.pid)
            return
        try:
            self.send_fds([master], op="spawned", id=run.id, pid=run.pid)
        finally:
            os.close(master)

    def signal_run(self, msg: dict[str, Any]) -> None:
        """``signal {id, sig, target}``: ``foreground``, the foreground process group of the
        run's terminal (read from the ``tpgid`` of a process of the run's session, so the
        leader may be gone), ``foreground-spare`` the same unless that is the leader's own
        group (an escalated interrupt that must not hit the shell); ``leader``, its main
        process; ``session``, every process of it. A run that is over gets nothing."""
        run = self.runs.get(msg.get("id"))  # type: ignore[arg-type]
        sig = msg.get("sig")
        if run is None or type(sig) is not int or not 0 < sig < signal.NSIG:
            return
        target = msg.get("target")
        if target == "leader":
            if run.status is None:
                try:
                    os.kill(run.pid, sig)
                except OSError:
                    pass
            return
        members = self.refresh().get(run.id, {})
        if run.status is None:
            members = {run.pid: 0, **members}
        if target == "session":
            for pid in members:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            return
        if target not in ("foreground", "foreground-spare"):
            return
        for pid in members:
            fields = stat_fields(pid)
            if fields is None or len(fields) < 6 or int(fields[3]) != run.pid:
                continue  # (a member that made a session of its own has no say here)
            group = int(fields[5])
            if target == "foreground-spare" and group == run.pid:
                return  # the leader's own group is in the foreground again: spared
            if group > 0:
                try:
                    os.killpg(group, sig)
                except OSError:
                    pass
                return

    @staticmethod
    def raise_oom_score(value: object) -> str | None:
        """Set our ``oom_score_adj`` (the command inherits it) and return the old value, or
        None. Raising it needs no privilege, and going back down to where we started is
        allowed too: commands, not the supervisor, are what the OOM killer picks first. (The
        file is opened once at start: a non-dumpable process's /proc files are root's.)"""
        if OOM_FD < 0 or not isinstance(value, (int, str)):
            return None
        try:
            old = os.pread(OOM_FD, 32, 0).decode().strip()
            os.pwrite(OOM_FD, f"{value}\n".encode(), 0)
        except OSError:
            return None
        return old

    def reap(self) -> None:
        while True:
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            run = self.mains.pop(pid, None)
            if run is not None:
                run.status = status
                run.account(rusage)
                if self.has_children():
                    self.send(op="exit", id=run.id, status=status)
                else:  # nothing else of any run is alive: this run is over
                    self.finish(run, 0)
                continue
            for key, owners in list(self.orphans.items()):
                if key[0] == pid:
                    del self.orphans[key]
                    owner = self.runs.get(owners[0])
                    if owner is not None:
                        owner.account(rusage)

    # -- tracking ---------------------------------------------------------------------------
    def has_children(self) -> bool:
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        return True

    def refresh(self) -> dict[str, dict[int, int]]:
        """Walk /proc: the live members of every run, attributing the runner's orphans."""
        table = process_table()
        kids: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            kids.setdefault(ppid, []).append(pid)
        active = list(self.runs.values())
        roots: dict[str, list[int]] = {r.id: [] for r in active}
        for run in active:
            if run.status is None:
                roots[run.id].append(run.pid)
        previous, self.orphans = self.orphans, {}
        for pid in kids.get(self.me, []):
            if pid in self.mains:
                continue
            key = (pid, table[pid][2])
            owners = previous.get(key) or self.attribute(pid, key[1], active)
            self.orphans[key] = owners
            for owner in owners:
                roots.setdefault(owner, []).append(pid)
        found: dict[str, dict[int, int]] = {}
        for run_id, starts in roots.items():
            members: dict[int, int] = {}
            stack = list(starts)
            while stack:
                pid = stack.pop()
                stat = table.get(pid)
                if stat is None or pid in members:
                    continue
                if stat[1] not in (b"Z", b"X") or threads_left(pid):
                    members[pid] = stat[2]
                stack.extend(kids.get(pid, []))
            found[run_id] = members
            tracked = self.runs.get(run_id)
            if tracked is not None:
                tracked.members = members
        return found

    def attribute(self, pid: int, start: int, active: list[Run]) -> list[str]:
        for run in active:
            if run.members.get(pid) == start:
                return [run.id]
        marker = run_marker(pid)
        if marker is not None and marker in self.runs:
            return [marker]
        return [r.id for r in active] or ["<none>"]

    # -- termination ------------------------------------------------------------------------
    def start_termination(self, run: Run, grace: float) -> None:
        if run.phase is not None:
            return
        if run.status is not None and not self.has_children():
            self.finish(run, 0)
            return
        run.phase = "term" if grace > 0 else "kill"
        run.deadline = time.monotonic() + (grace if grace > 0 else KILL_BUDGET_S)
        self.step(run, self.refresh().get(run.id, {}))

    def signal_members(self, run: Run, members: dict[int, int], sig: int) -> None:
        try:  # the group signal is atomic against fork; members that left it are signalled below
            os.killpg(run.pid, sig)
        except OSError:
            pass
        for pid, start in members.items():
            if sig == signal.SIGKILL or (pid, start) not in run.signalled:
                run.signalled.add((pid, start))
                try:
                    os.kill(pid, sig)
                    if sig == signal.SIGTERM:
                        os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass

    def step(self, run: Run, members: dict[int, int]) -> None:
        """One termination tick. The run is over after two empty sweeps in a row (a process
        caught mid-fork or mid-reparenting can be invisible to one walk of /proc) when the
        main process is reaped and, if it is the only run, the kernel says the runner has no
        child left (a fork chain can outrun every /proc walk, never the kernel's child list)."""
        now = time.monotonic()
        if run.phase == "term" and now >= run.deadline:
            run.phase, run.deadline = "kill", now + KILL_BUDGET_S
        hidden = not members and len(self.runs) == 1 and self.has_children()
        if members or hidden:
            run.empty_sweeps = 0
        else:
            run.empty_sweeps += 1
            if run.status is not None and run.empty_sweeps >= 2:
                self.finish(run, 0)
                return
        if run.phase == "kill" and now >= run.deadline:
            self.finish(run, len(members) or 1)  # never claim 0 for what could not be seen
            return
        self.signal_members(run, members, signal.SIGTERM if run.phase == "term" else signal.SIGKILL)

    def finish(self, run: Run, survivors: int) -> None:
        del self.runs[run.id]
        self.mains.pop(run.pid, None)
        self.send(
            op="terminated",
            id=run.id,
            survivors=survivors,
            cpu_s=run.cpu_s,
            maxrss_kb=run.maxrss_kb,
            status=run.status,
        )

    def tick(self) -> None:
        terminating = [r for r in self.runs.values() if r.phase is not None]
        now = time.monotonic()
        # With one run every orphan is its own: periodic walks only help attribution when
        # several runs share the runner (a walk costs ~2 ms; it must not tax every exec).
        periodic = len(self.runs) > 1 and now - self.last_refresh >= REFRESH_S
        if terminating or periodic:
            self.last_refresh = now
            found = self.refresh()
            for run in terminating:
                if run.id in self.runs:
                    self.step(run, found.get(run.id, {}))
            self.kill_strays()

    def kill_strays(self) -> None:
        """The runner's children all belong to runs; one that belongs to none is killed."""
        for (pid, _start), owners in self.orphans.items():
            if not any(owner in self.runs for owner in owners):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    # -- main loop --------------------------------------------------------------------------
    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        self.state = own_state()  # after confining ourselves: what no command may change
        self.send(op="ready", pid=self.me, layers=self.layers, ns=namespaces())
        listening = True
        while not (self.closing and not self.runs):
            busy = any(r.phase is not None for r in self.runs.values())
            timeout = TICK_S if busy else (REFRESH_S if len(self.runs) > 1 else None)
            for key, _ in sel.select(timeout):
                if key.fileobj is self.sock:
                    self.receive()
                elif key.fileobj == wake_r:
                    while True:
                        try:
                            if not os.read(wake_r, 4096):
                                break
                        except BlockingIOError:
                            break
            if self.closing and listening:
                sel.unregister(self.sock)
                listening = False
            self.reap()
            self.tick()
        self.reap()


def connect(path: str) -> socket.socket:
    """Inside a container: connect to the host's socket (the host unlinks it once we are in).
    A Python too old to serve, or no socket to reach, hands over to ``sleep infinity``: the
    host then runs commands through the engine's exec path."""
    try:
        if not hasattr(socket, "recv_fds") or not hasattr(os, "waitstatus_to_exitcode"):
            raise OSError("this Python is older than 3.9")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
    except OSError as exc:
        sys.stderr.write(f"sandboxrun runner: cannot serve here ({exc}): sleeping\n")
        os.execvp("sleep", ["sleep", "infinity"])  # noqa: S606 - no shell, fixed argv
    return sock


CAP_KILL = 5
_CAP_VERSION_3 = 0x20080522


def keep_only_kill(libc: ctypes.CDLL) -> None:
    """As root in a container with capabilities (a writable root's ``PACKAGE_CAPS``): keep only
    ``CAP_KILL`` in effect here (what a command switched to another uid needs to be ended), so
    that the files API honours mode bits (no ``DAC_OVERRIDE``). The permitted set is kept: a
    root command gets the bounding set at its ``execve`` whatever this process's sets are."""
    if os.geteuid() != 0:
        return
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # (effective, permitted, inheritable) x 2 words
    try:
        if libc.capget(header, data) != 0:
            return
    except AttributeError:  # a libc without capget: nothing to keep in effect then
        return
    data[0] = data[1] & (1 << CAP_KILL)
    data[3] = 0
    if libc.capset(header, data) != 0:
        sys.stderr.write(f"sandboxrun runner: capset failed: {os.strerror(ctypes.get_errno())}\n")


def main() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.stderr.write(f"sandboxrun runner: prctl failed: {os.strerror(ctypes.get_errno())}\n")
        sys.exit(3)
    # PID 1 of the sandbox receives only the signals it has handlers for: a command's
    # `kill -INT 1` must not raise KeyboardInterrupt here and end every run. Handlers (not
    # SIG_IGN, which an exec would pass on to the commands) that do nothing.
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, lambda *_: None)
    # Job-control stops can be ignored too (a stopped supervisor would stop its sandbox);
    # SIGSTOP cannot: as PID 1 of its namespace the kernel keeps it away from us, elsewhere
    # the host sees the stop in /proc and replaces us (``RunnerClient.probe``).
    for number in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
        signal.signal(number, lambda *_: None)
    for number in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(number, lambda *_: None)
    global OOM_FD
    try:
        OOM_FD = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        OOM_FD = -1
    connecting = sys.argv[1] == "--connect"
    if connecting:  # a docker container's supervisor
        keep_only_kill(libc)
    plan = json.loads(sys.argv[2]) if len(sys.argv) > 2 and not connecting else {}
    if not plan.pop("holder", False):  # commands of the same uid cannot read our memory
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # A namespace holder (systemd-scope) stays dumpable: each run's launcher joins its
    # namespaces through its pidfd, which needs ptrace-read access; the commands there are in
    # a Landlock domain of their own, which cannot ptrace the holder.
    sock = connect(sys.argv[2]) if connecting else socket.socket(fileno=int(sys.argv[1]))
    sock.set_inheritable(False)
    runner = Runner(sock)
    if plan:  # confine ourselves: every command inherits it (see sandboxrun/supervisor/confine.py)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import confine as _confine  # type: ignore[import-not-found]

        try:
            runner.layers = _confine.apply(plan)
        except OSError as exc:
            runner.send(op="confine_error", error=f"{exc}")
            sys.exit(3)
    try:
        runner.serve()
    finally:  # even on a bug here: leave nothing of any run alive
        runner.kill_all()


if __name__ == "__main__":
    main()
