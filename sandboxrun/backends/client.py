"""Host side of the process-group runner (see ``sandboxrun/supervisor/runner.py`` for the protocol).

One ``RunnerClient`` per process-group sandbox: it starts the runner, and routes the runner's
messages to per-run ``Channel`` objects while callers wait (``wait_for``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sandboxrun import supervisor
from sandboxrun.engine.pty import check_master
from sandboxrun.errors import BackendError
from sandboxrun.supervisor.procfs import stat_fields
from sandboxrun.supervisor.protocol import HEADER, MAX_FDS, MAX_FRAME, recv_fds

if TYPE_CHECKING:
    from sandboxrun.backends.local.isolation import LocalPlan

RUNNER = Path(supervisor.HERE, "runner.py")
READY_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 30.0
SEND_TIMEOUT_S = 10.0
"""How long sending one request may wait for the supervisor to read it (a large spawn)."""
REQUEST_TIMEOUT_S = 5.0
"""How long a request the supervisor answers at once (``open``) may wait for its reply: that
call then fails. A supervisor is declared dead only on evidence (``probe``, a cut frame): one
starved of memory or CPU answers late, and its sandbox goes on."""
PROBE_EVERY_S = 0.25
"""While a caller waits and nothing arrives, the supervisor's process is looked at this often
(``probe``): a stopped one (``SIGSTOP``) is declared dead at once."""
_HEAD = re.compile(rb'\{"op": "([a-z_]{1,32})", "id": "([A-Za-z0-9_.-]{1,200})"')
"""The start of every supervisor frame that answers a request: the frame of an oversized or
malformed reply is still that request's (``_fail_request``)."""


def _spawn_runner(
    sock: socket.socket, plan: LocalPlan | None, holder: bool = False
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-I", "-S", str(RUNNER), str(sock.fileno())]
    pinned: dict[str, int] = {}
    if plan is not None and not plan.off:
        argv.append(json.dumps({**plan.confine(), "holder": holder}))
        if plan.namespaces:
            pinned = plan.pin_mounts()  # the mounts' sources, bound by fd (no swap after a check)
            argv = plan.bwrap_argv(argv, pinned)
    ids = None if plan is None else plan.run_as  # a root invoker's: the workspace owner's
    try:
        return subprocess.Popen(
            argv,
            pass_fds=[sock.fileno(), *pinned.values()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env={},  # the runner needs nothing from the host environment (secrets stay out)
            start_new_session=True,  # terminal signals (Ctrl-C) go to the host only
            user=None if ids is None else ids[0],
            group=None if ids is None else ids[1],
            extra_groups=None if ids is None else [],
        )
    finally:
        for fd in pinned.values():  # bwrap has its own copies (it closes them once bound)
            os.close(fd)


@dataclass
class FdBatch:
    """The fds of one receive: stream bytes ``[begin, end)`` came with them."""

    begin: int
    end: int
    fds: list[int]
    truncated: bool
    """The kernel dropped some (MSG_CTRUNC: this process is out of fds)."""


@dataclass
class Channel:
    """Messages the runner sent about one run."""

    run_id: str
    spawned: dict[str, Any] | None = None
    exited: dict[str, Any] | None = None
    terminated: dict[str, Any] | None = None
    lost: bool = False
    tty: bool = False
    """The run asked for a terminal: its ``spawned`` must bring the master, one fd."""
    master: int | None = None
    """The terminal's master, checked (``engine.pty.check_master``), until the run takes it."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number the host accepts")


INT_FIELDS = ("pid", "status", "survivors", "errno", "maxrss_kb", "size")
"""Integer fields of runner messages: non-negative (a wait status fits 16 bits)."""


def valid_message(msg: object) -> bool:
    """The shape every runner message must have before any field of it is used: a JSON
    object with a string ``op``, a string ``id`` if any, non-negative integers where the
    protocol has counts (``status`` a 16-bit wait status), finite non-negative ``cpu_s``,
    and ``ns`` a mapping of names to integers."""
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        return False
    if "id" in msg and not isinstance(msg["id"], str):
        return False
    for name in INT_FIELDS:
        value = msg.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return False
        if name == "status" and value > 0xFFFF:
            return False
    cpu = msg.get("cpu_s")
    if cpu is not None and (
        isinstance(cpu, bool) or not isinstance(cpu, int | float) or not 0 <= cpu < 1e12
    ):
        return False
    ns = msg.get("ns")
    if ns is not None and not (
        isinstance(ns, dict) and all(isinstance(v, int) for v in ns.values())
    ):
        return False
    layers = msg.get("layers")
    return layers is None or (isinstance(layers, list) and all(isinstance(x, str) for x in layers))


def _own_state(pid: int, fields: list[bytes]) -> tuple[bytes, bytes] | None:
    """``/proc/<pid>/limits`` and the nice value and policy of its ``stat`` ``fields`` (anyone
    may read both, also of a non-dumpable process), or None when they cannot be read now."""
    try:
        limits = Path(f"/proc/{pid}/limits").read_bytes()
    except OSError:
        return None
    return (limits, fields[16] + b" " + fields[38]) if len(fields) > 38 else None


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with suppress(OSError):
            os.close(fd)


class RunnerClient:
    def __init__(self, plan: LocalPlan | None = None, *, holder: bool = False) -> None:
        self._plan = plan
        self._holder = holder
        """Only holds the sandbox's namespaces for others to join (systemd-scope)."""
        self.layers: list[str] = []
        """What the runner applied to itself (``_confine.apply``), from its ``ready``."""
        self.namespaces: dict[str, int] = {}
        """The runner's namespace inodes (``kind -> inode``), from its ``ready``."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._channels: dict[str, Channel] = {}
        self._send_lock = anyio.Lock(fast_acquire=True)  # free: taken without a loop turn
        self._ready = False
        self._dead: str | None = None
        self._inbuf = b""
        self._batches: list[FdBatch] = []
        """Fds received and not yet claimed by their frame (``fds: n`` in it), oldest first."""
        self._received = 0
        """Bytes received from the supervisor so far (``_inbuf`` ends there)."""
        self._reading = False
        self._activity = anyio.Event()
        self._opens: dict[str, dict[str, Any] | None] = {}
        """``open`` requests waiting for their reply (``open_path``), by request id."""
        self._open_seq = 0
        self._skip = 0
        """Bytes still to discard of an oversized frame (it failed its request alone)."""
        self._watch_fd: int | None = None
        """A pidfd of the supervisor's process (``watch``): probed while callers wait, and
        killed through when the supervisor is declared dead."""
        self._watch_pid = 0
        self._watch_state: tuple[bytes, bytes] | None = None
        """The watched process's limits and scheduling as it started serving (``probe``)."""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def layers_in_force(self) -> list[str]:
        """The isolation layers of the sandbox this runner is PID 1 of, each checked
        (``isolation.verified_layers``); none without a plan."""
        if self._plan is None:
            return []
        from sandboxrun.backends.local.isolation import verified_layers

        return verified_layers(self._plan, self.inner_pid(), self.layers, self.namespaces)

    def inner_pid(self) -> int | None:
        """The host pid of the runner itself: under bubblewrap, bwrap's one child (PID 1 of
        the sandbox's namespaces); else the process we started."""
        if self._proc is None:
            return None
        if self._plan is None or not self._plan.namespaces:
            return self._proc.pid
        try:
            pid = self._proc.pid
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return None
        return int(kids[0]) if len(kids) == 1 else None

    async def start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = _spawn_runner(child, self._plan, self._holder)
        except OSError as exc:
            parent.close()
            raise BackendError(f"cannot start the process-group runner: {exc}") from exc
        except BaseException:  # a refusal (a mount's source changed): nothing is left open
            parent.close()
            raise
        finally:
            child.close()
        await self._await_ready(parent, "the process-group runner")
        self.watch(self.inner_pid() or self._proc.pid)

    async def attach(self, sock: socket.socket, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Serve a runner that connected by itself (inside a docker sandbox): ``sock`` is our
        end. Raises ``BackendError`` when it does not say ready within ``timeout_s``."""
        await self._await_ready(sock, "the sandbox's supervisor", timeout_s)

    async def _await_ready(
        self, sock: socket.socket, what: str, timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        sock.setblocking(False)
        self._sock = sock
        with anyio.move_on_after(timeout_s):
            await self.wait_for(lambda: self._ready)
        if not self._ready or self._dead:
            await self.close()
            raise BackendError(f"{what} did not start: {self._dead or 'timeout'}")

    def watch(self, pid: int | None) -> None:
        """Watch the supervisor's process ``pid`` (seen from this host): while callers wait it
        is probed (``probe``), and declaring the supervisor dead kills it."""
        if pid is None or pid <= 0 or self._watch_fd is not None:
            return
        try:
            self._watch_fd = os.pidfd_open(pid)
        except OSError:
            return
        self._watch_pid = pid
        fields = stat_fields(pid)
        self._watch_state = None if fields is None else _own_state(pid, fields)

    def probe(self, deep: bool = False) -> None:
        """Declare the supervisor dead when its process has exited or is stopped (state ``T``
        or ``t`` in ``/proc``: a command sent it SIGSTOP, or it is traced): it would never
        answer again, and every caller would wait until its deadline. ``deep`` (before a call
        uses it): also when a command changed its limits, nice value or scheduling policy
        (``/proc/<pid>/limits`` and ``stat``, as it started serving)."""
        fd = self._watch_fd
        if fd is None or self._dead:
            return
        if select.select([fd], [], [], 0)[0]:  # the pidfd: exited (a zombie too)
            self.declare_dead("the sandbox's supervisor exited")
            return
        fields = stat_fields(self._watch_pid)
        if fields is None:  # unreadable now (this process out of fds): the pidfd says it lives
            return
        if fields[0] in (b"T", b"t"):
            self.declare_dead(
                "the sandbox's supervisor was stopped (a command sent it SIGSTOP, or traced it)"
            )
        elif deep and self._watch_state is not None:
            now = _own_state(self._watch_pid, fields)
            if now is not None and now != self._watch_state:
                self.declare_dead(
                    "a command changed the sandbox's supervisor's limits or priority "
                    "(prlimit, setpriority): it would starve every run"
                )

    def declare_dead(self, reason: str) -> None:
        """The supervisor will not answer: every waiter is released with ``reason``, and its
        process is killed from here (with it, on a sandbox whose init it is, everything of
        the sandbox; what survives it is found by the runs' markers)."""
        self._lose(reason)
        if self._watch_fd is not None:
            with suppress(OSError):
                signal.pidfd_send_signal(self._watch_fd, signal.SIGKILL)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds, reading and routing runner messages meanwhile.

        There is no background reader: whichever waiter finds nobody reading becomes the
        reader for one batch of messages, then everybody re-checks. Cancellation-safe: a
        batch is received synchronously once the socket is readable."""
        while not predicate() and not self._dead:
            if self._reading:
                await self._activity.wait()
                continue
            self._reading = True
            try:
                await self._read_batch()
            finally:
                self._reading = False
                self._activity.set()
                self._activity = anyio.Event()

    async def _read_batch(self) -> None:
        """Receive what is there (fds too), and route every complete frame; with nothing to
        receive for ``PROBE_EVERY_S``, probe the supervisor. It may live inside the sandbox
        (docker) and is never trusted: a frame over ``MAX_FRAME`` bytes or one that is not a
        valid message fails the request its head names (``_fail_frame``; the stream stays in
        step by the frame's length), a frame whose fds were dropped (this process out of
        fds) fails its request with EMFILE; what names no request, or fds no frame came
        with, end the connection as lost, never the host."""
        assert self._sock is not None
        readable = False
        with anyio.move_on_after(PROBE_EVERY_S if self._watch_fd is not None else None):
            await anyio.wait_readable(self._sock)
            readable = True
        if not readable:
            self.probe()
            return
        try:
            data, fds, flags = recv_fds(self._sock, 1 << 16, MAX_FDS)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lose(f"runner connection failed: {exc}")
            return
        begin = self._received
        self._received += len(data)
        if fds or flags & socket.MSG_CTRUNC:  # (dropped ones: this process is out of fds)
            self._batches.append(
                FdBatch(begin, self._received, fds, bool(flags & socket.MSG_CTRUNC))
            )
        if not data:
            self._lose("the runner exited unexpectedly")
            return
        self._inbuf += data
        while not self._dead:
            if self._skip:
                dropped = len(self._inbuf[: self._skip])
                self._inbuf, self._skip = self._inbuf[dropped:], self._skip - dropped
            if self._skip or len(self._inbuf) < HEADER.size:
                break
            start = self._received - len(self._inbuf)  # the frame's first byte in the stream
            (size,) = HEADER.unpack_from(self._inbuf)
            if size > MAX_FRAME:  # its request fails; the bytes are read and dropped
                if len(self._inbuf) < HEADER.size + min(size, 256):
                    break  # the head names the request: wait for it
                head = self._inbuf[HEADER.size : HEADER.size + 256]
                self._inbuf, self._skip = self._inbuf[HEADER.size :], size
                _close_fds(self._fds_of(start, start + HEADER.size + size).fds)
                if not self._fail_frame(head, f"a reply of {size} bytes (at most {MAX_FRAME})"):
                    break
                continue
            if len(self._inbuf) < HEADER.size + size:
                break
            frame = self._inbuf[HEADER.size : HEADER.size + size]
            self._inbuf = self._inbuf[HEADER.size + size :]
            batch = self._fds_of(start, start + HEADER.size + size)
            if self._dead:
                break
            try:
                msg = json.loads(frame, parse_constant=_no_constant)
            except (ValueError, RecursionError):
                msg = None
            if not valid_message(msg):
                _close_fds(batch.fds)
                if not self._fail_frame(frame[:256], "a malformed reply"):
                    break
                continue
            assert isinstance(msg, dict)
            wanted = msg.get("fds", 0)
            if not isinstance(wanted, int) or wanted < 0 or wanted > MAX_FDS:
                _close_fds(batch.fds)
                self._lose("the runner sent a message without the fds it names")
                break
            if wanted < len(batch.fds):
                _close_fds(batch.fds)
                self._lose("the runner sent fds no message claims")
                break
            if wanted > len(batch.fds):  # dropped on the way (this process is out of fds)
                _close_fds(batch.fds)
                code, why = (
                    (errno.EMFILE, "too many open files in this process")
                    if batch.truncated
                    else (0, "the supervisor's reply came without the descriptor it names")
                )
                if not self._fail_request(msg["op"], msg.get("id"), why, code):
                    self._lose("the runner sent a message without the fds it names")
                    break
                continue
            msg["_fds"] = batch.fds
            if msg["op"] != "opened" and not self._brings_master(msg):
                _close_fds(msg.pop("_fds"))  # only an open reply or a terminal's spawn has fds
                msg["_fds"] = []
            try:
                self._dispatch(msg)
            except Exception as exc:  # a message of the wrong shape: the runner is not trusted
                _close_fds(msg.get("_fds", []))
                self._lose(f"the runner sent a message the host cannot use: {exc!r}")
                break
        if self._batches and not self._inbuf and not self._skip and not self._dead:
            # every frame begun is read: fds still here came with no frame's first byte
            self._lose("the runner sent fds no message claims")

    def _brings_master(self, msg: dict[str, Any]) -> bool:
        """``msg`` is the ``spawned`` of a run that asked for a terminal (its fd, if any, is
        examined in ``_spawned``)."""
        if msg["op"] != "spawned":
            return False
        channel = self._channels.get(msg.get("id", ""))
        return channel is not None and channel.tty and channel.spawned is None

    def _spawned(self, channel: Channel, msg: dict[str, Any]) -> None:
        """A run's ``spawned`` (or ``spawn_error``). A terminal's must bring exactly one fd,
        a pty master: anything else is refused and closed, and the run, which did start, fails
        as a spawn error the caller ends (``_host``: it is still running)."""
        fds: list[int] = msg.get("_fds", [])
        msg["_fds"] = []  # (taken here: a master is kept in ``channel.master``)
        if not channel.tty or msg["op"] != "spawned":
            _close_fds(fds)
            channel.spawned = msg
            return
        why = "it sent none" if not fds else "it sent several" if len(fds) > 1 else None
        if why is None:
            why = check_master(fds[0])
        if why is not None:
            _close_fds(fds)
            error = f"the sandbox's supervisor sent no terminal master for the run ({why})"
            channel.spawned = {"op": "spawn_error", "id": channel.run_id, "errno": 0}
            channel.spawned.update(error=error, _host=True)
            return
        channel.master = fds[0]
        channel.spawned = msg

    def _fds_of(self, start: int, end: int) -> FdBatch:
        """The fds that came with the frame at stream bytes ``[start, end)``. A receive ends
        with the kernel's segment that carries fds, and the supervisor sends a frame's fds
        with its first byte (one frame per ``sendmsg``): a receive's fds are the last frame's
        that begins in it. Never another frame's (an fd of the wrong file handed to a caller);
        fds that came with no frame's start end the connection."""
        while self._batches and self._batches[0].end <= start:
            self._lose("the runner sent fds no message claims")  # closes them
        if self._batches:
            first = self._batches[0]
            if first.begin <= start < first.end and end >= first.end:
                return self._batches.pop(0)
        return FdBatch(start, start, [], False)

    def _fail_frame(self, head: bytes, what: str) -> bool:
        """A frame that cannot be used: the request its head names fails alone (the caller
        closed the fds it came with). False when no request can be named: the connection is
        lost (nobody could be told)."""
        found = _HEAD.match(head)
        if found is None:
            self._lose(f"the supervisor sent {what} that names no request")
            return False
        op, rid = found.group(1).decode(), found.group(2).decode()
        self._fail_request(op, rid, f"the supervisor sent {what}")
        return True

    def _fail_request(self, op: str, rid: object, why: str, code: int = 0) -> bool:
        """The reply to request ``rid`` cannot be used: an ``open`` waiting for it gets an
        error, a spawn not yet answered a spawn error; any other message of a run loses that
        run alone (it is found by its marker and killed). False when ``rid`` names nothing."""
        if not isinstance(rid, str):
            return False
        if rid in self._opens and self._opens[rid] is None:
            error = {"op": "open_error", "id": rid, "errno": code, "error": why, "_fds": []}
            self._opens[rid] = error
            return True
        channel = self._channels.get(rid)
        if channel is not None and channel.spawned is None:  # (_host: it may be running)
            channel.spawned = {"op": "spawn_error", "id": rid, "errno": code, "error": why}
            channel.spawned["_host"] = op == "spawned"
        elif channel is not None and op != "spawned":
            channel.lost = True
        return True  # a request nobody waits for (any more) needs no answer

    def _dispatch(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op == "error":  # the supervisor's own word that its reply would not fit
            self._fail_request(str(msg.get("about")), msg.get("id"), str(msg.get("error")))
            return
        if op in ("opened", "open_error"):
            self._route_open(msg)
            return
        if op == "ready":
            self._ready = True
            self.layers = list(msg.get("layers") or [])
            self.namespaces = dict(msg.get("ns") or {})
            return
        if op == "fatal":  # it ends itself (a command changed its limits or priority)
            self.declare_dead(f"the sandbox's supervisor ended: {msg.get('error')}")
            return
        if op == "confine_error":
            self._lose(f"the runner could not confine itself: {msg.get('error')}")
            return
        channel = self._channels.get(msg.get("id", ""))
        if channel is None:
            _close_fds(msg.get("_fds", []))
            return
        if op in ("spawned", "spawn_error"):
            if channel.spawned is None:
                self._spawned(channel, msg)
            else:  # (a second answer to one spawn: the first stands)
                _close_fds(msg.get("_fds", []))
        elif op == "exit":
            channel.exited = msg
        elif op == "terminated":
            channel.terminated = msg
            channel.exited = channel.exited or msg

    def _lose(self, reason: str) -> None:
        self._dead = self._dead or reason
        for batch in self._batches:
            _close_fds(batch.fds)
        self._batches = []
        for channel in self._channels.values():
            channel.lost = True

    @property
    def dead(self) -> str | None:
        return self._dead

    async def _send(self, msg: dict[str, Any], fds: list[int] | None = None) -> None:
        if self._dead or self._sock is None:
            raise BackendError(self._dead or "runner not started")
        data = json.dumps(msg).encode()
        frame = memoryview(HEADER.pack(len(data)) + data)
        deadline = time.monotonic() + SEND_TIMEOUT_S
        async with self._send_lock:
            if self._dead or self._sock is None:  # (lost while this request waited its turn)
                raise BackendError(self._dead or "runner not started")
            first, full = True, False
            try:
                while frame:  # send at once; wait for room only once the socket is full
                    if full and not await self._writable(deadline):
                        raise BackendError(
                            self._dead
                            or "the sandbox's supervisor did not take a request within "
                            f"{SEND_TIMEOUT_S:g} s"
                        )
                    try:
                        if first and fds:
                            sent = socket.send_fds(self._sock, [frame], fds)
                        else:
                            sent = self._sock.send(frame)
                    except BlockingIOError:
                        full = True
                        continue
                    except OSError as exc:
                        self._lose(f"runner connection failed: {exc}")
                        raise BackendError(f"runner connection failed: {exc}") from exc
                    first, full = False, True  # what is left did not fit: wait for room
                    frame = frame[sent:]
            except BaseException:
                if not first and frame:  # cut off mid-frame: the stream cannot be resumed
                    self.declare_dead("a request to the sandbox's supervisor was cut off")
                raise

    async def _writable(self, deadline: float) -> bool:
        """Wait until the socket takes more bytes; while it does not (a supervisor that does not
        read: stopped, or slow), probe it. False when it was declared dead or ``deadline``
        passed."""
        assert self._sock is not None
        while not self._dead:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with anyio.move_on_after(min(left, PROBE_EVERY_S)):
                await anyio.wait_writable(self._sock)
                return True
            self.probe()
        return False

    def open_channel(self, run_id: str, *, tty: bool = False) -> Channel:
        channel = Channel(run_id, tty=tty)
        self._channels[run_id] = channel
        return channel

    def close_channel(self, run_id: str) -> None:
        channel = self._channels.pop(run_id, None)
        if channel is not None and channel.master is not None:  # (never taken by its run)
            _close_fds([channel.master])
            channel.master = None

    async def spawn(self, channel: Channel, request: dict[str, Any], fds: list[int]) -> None:
        await self._send({"op": "spawn", "id": channel.run_id, **request}, fds)

    async def terminate(self, run_id: str, grace_s: float) -> None:
        await self._send({"op": "terminate", "id": run_id, "grace": grace_s})

    async def signal(self, run_id: str, sig: int, target: str) -> None:
        """``sig`` to ``target`` of the run (``runner.Runner.signal_run``); no answer."""
        await self._send({"op": "signal", "id": run_id, "sig": sig, "target": target})

    def _route_open(self, msg: dict[str, Any]) -> None:
        """An ``open`` reply to its waiter; the fds of one nobody waits for (any more) are
        closed here."""
        rid = msg.get("id")
        if isinstance(rid, str) and rid in self._opens and self._opens[rid] is None:
            self._opens[rid] = msg
            return
        _close_fds(msg.get("_fds", []))

    async def open_path(
        self, path: str, flags: int, mode: int = 0o644, *, beneath: str | None = None
    ) -> tuple[int, str, int]:
        """Have the runner open ``path`` in the sandbox's view (``_runner.py``: ``open``) and
        return ``(fd, kind, size)``: the caller owns the fd, of a regular file (``"file"``) or a
        directory (``"dir"``). With ``beneath``, ``path`` is relative to that directory and may
        not leave it (EXDEV). The runner's refusal is raised as ``OSError`` (errno-mapped:
        ``FileNotFoundError``...; errno 0 for a FIFO, a device...); ``BackendError`` when the
        runner is lost. Cancellation-safe: a reply that arrives too late has its fd closed."""
        self._open_seq += 1
        rid = f"open-{self._open_seq}"
        request: dict[str, Any] = {"op": "open", "id": rid, "path": path, "flags": flags}
        request["mode"] = mode
        if beneath is not None:
            request["beneath"] = beneath
        self._opens[rid] = None
        reply: dict[str, Any] | None = None
        try:
            with anyio.move_on_after(REQUEST_TIMEOUT_S):
                await self._send(request)
                await self.wait_for(lambda: self._opens.get(rid) is not None)
            reply = self._opens.get(rid)
        finally:
            late = self._opens.pop(rid, None)
            if reply is None and late is not None:
                _close_fds(late.get("_fds", []))
        if reply is None:  # slow (starved of memory or CPU) is not dead: this call fails
            raise BackendError(
                self._dead
                or f"the sandbox's supervisor did not answer within {REQUEST_TIMEOUT_S:g} s"
            )
        fds: list[int] = reply.get("_fds", [])
        if reply["op"] == "open_error":
            _close_fds(fds)
            code = reply.get("errno")
            text = str(reply.get("error") or "cannot open")
            if isinstance(code, int) and code > 0:
                raise OSError(code, text, path)
            raise OSError(0, text, path)
        kind, size = reply.get("kind"), reply.get("size")
        if len(fds) != 1 or kind not in ("file", "dir") or not isinstance(size, int):
            _close_fds(fds)
            raise BackendError("the runner sent a malformed open reply")
        return fds[0], kind, size

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Ask the runner to finish (it terminates whatever still runs) and reap it. Bounded."""
        try:
            await self._close(timeout_s)
        finally:
            if self._watch_fd is not None:
                os.close(self._watch_fd)
                self._watch_fd = None

    async def _close(self, timeout_s: float) -> None:
        proc = self._proc
        if proc is None:  # attached (docker): the container's removal ends the runner
            if self._sock is not None:
                with suppress(BackendError):
                    await self._send({"op": "shutdown"})
                self._sock.close()
                self._sock = None
            self._lose("the sandbox was closed")
            return
        with suppress(BackendError):
            await self._send({"op": "shutdown"})
        pidfd = os.pidfd_open(proc.pid)
        try:
            with anyio.move_on_after(timeout_s):
                await anyio.wait_readable(pidfd)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        finally:
            os.close(pidfd)
            if self._sock is not None:
                self._sock.close()
            self._proc = None
