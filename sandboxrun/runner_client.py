"""Host side of the process-group runner (see ``sandboxrun/_runner.py`` for the protocol).

One ``RunnerClient`` per process-group sandbox: it starts the runner, and routes the runner's
messages to per-run ``Channel`` objects while callers wait (``wait_for``).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from sandboxrun.errors import BackendError

if TYPE_CHECKING:
    from sandboxrun.isolation import LocalPlan

HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 20
"""The largest frame the host accepts from a runner (its replies are small)."""
MAX_FDS = 8
RUNNER = Path(__file__).with_name("_runner.py")
READY_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 30.0


def _spawn_runner(
    sock: socket.socket, plan: LocalPlan | None, holder: bool = False
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-I", "-S", str(RUNNER), str(sock.fileno())]
    if plan is not None and not plan.off:
        argv.append(json.dumps({**plan.confine(), "holder": holder}))
        if plan.namespaces:
            argv = plan.bwrap_argv(argv)
    return subprocess.Popen(
        argv,
        pass_fds=[sock.fileno()],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        env={},  # the runner needs nothing from the host environment (secrets stay out)
        start_new_session=True,  # terminal signals (Ctrl-C) go to the host only
    )


@dataclass
class Channel:
    """Messages the runner sent about one run."""

    run_id: str
    spawned: dict[str, Any] | None = None
    exited: dict[str, Any] | None = None
    terminated: dict[str, Any] | None = None
    lost: bool = False


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
        self._send_lock = anyio.Lock()
        self._ready = False
        self._dead: str | None = None
        self._inbuf = b""
        self._fds: list[int] = []
        """Fds received and not yet claimed by a message (``fds: n`` in a frame)."""
        self._reading = False
        self._activity = anyio.Event()
        self._opens: dict[str, dict[str, Any] | None] = {}
        """``open`` requests waiting for their reply (``open_path``), by request id."""
        self._open_seq = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def layers_in_force(self) -> list[str]:
        """The isolation layers of the sandbox this runner is PID 1 of, each checked
        (``isolation.verified_layers``); none without a plan."""
        if self._plan is None:
            return []
        from sandboxrun.isolation import verified_layers

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
        finally:
            child.close()
        await self._await_ready(parent, "the process-group runner")

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
        """Receive what is there (fds too), and route every complete frame. The supervisor
        may live inside the sandbox (docker): a frame over ``MAX_FRAME`` bytes, one that is
        not a JSON object with a string ``op``, or fds beyond what frames claim end the
        connection as lost, never the host."""
        assert self._sock is not None
        await anyio.wait_readable(self._sock)
        try:
            data, fds, _flags, _addr = socket.recv_fds(
                self._sock, 1 << 16, MAX_FDS, socket.MSG_CMSG_CLOEXEC
            )
        except BlockingIOError:
            return
        except OSError as exc:
            self._lose(f"runner connection failed: {exc}")
            return
        self._fds.extend(fds)
        if not data:
            self._lose("the runner exited unexpectedly")
            return
        self._inbuf += data
        while len(self._inbuf) >= HEADER.size and not self._dead:
            (size,) = HEADER.unpack_from(self._inbuf)
            if size > MAX_FRAME:
                self._lose(f"the runner sent a frame of {size} bytes (at most {MAX_FRAME})")
                break
            if len(self._inbuf) < HEADER.size + size:
                break
            frame = self._inbuf[HEADER.size : HEADER.size + size]
            self._inbuf = self._inbuf[HEADER.size + size :]
            try:
                msg = json.loads(frame, parse_constant=_no_constant)
            except (ValueError, RecursionError):
                msg = None
            if not valid_message(msg):
                self._lose("the runner sent a malformed message")
                break
            assert isinstance(msg, dict)
            wanted = msg.get("fds", 0)
            if not isinstance(wanted, int) or not 0 <= wanted <= len(self._fds):
                self._lose("the runner sent a message without the fds it names")
                break
            msg["_fds"], self._fds = self._fds[:wanted], self._fds[wanted:]
            if msg["op"] != "opened":  # only an ``open`` reply carries an fd for the host
                _close_fds(msg.pop("_fds"))
                msg["_fds"] = []
            try:
                self._dispatch(msg)
            except Exception as exc:  # a message of the wrong shape: the runner is not trusted
                _close_fds(msg.get("_fds", []))
                self._lose(f"the runner sent a message the host cannot use: {exc!r}")
                break
        if self._fds and (not self._inbuf or len(self._fds) > MAX_FDS):
            # fds travel with their frame's first byte: with no frame pending, nobody claims them
            self._lose("the runner sent fds no message claims")

    def _dispatch(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op in ("opened", "open_error"):
            self._route_open(msg)
            return
        if op == "ready":
            self._ready = True
            self.layers = list(msg.get("layers") or [])
            self.namespaces = dict(msg.get("ns") or {})
            return
        if op == "confine_error":
            self._lose(f"the runner could not confine itself: {msg.get('error')}")
            return
        channel = self._channels.get(msg.get("id", ""))
        if channel is None:
            return
        if op in ("spawned", "spawn_error"):
            channel.spawned = msg
        elif op == "exit":
            channel.exited = msg
        elif op == "terminated":
            channel.terminated = msg
            channel.exited = channel.exited or msg

    def _lose(self, reason: str) -> None:
        self._dead = self._dead or reason
        for fd in self._fds:
            with suppress(OSError):
                os.close(fd)
        self._fds = []
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
        async with self._send_lock:
            first = True
            while frame:
                await anyio.wait_writable(self._sock)
                try:
                    if first and fds:
                        sent = socket.send_fds(self._sock, [frame], fds)
                    else:
                        sent = self._sock.send(frame)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    self._lose(f"runner connection failed: {exc}")
                    raise BackendError(f"runner connection failed: {exc}") from exc
                first = False
                frame = frame[sent:]

    def open_channel(self, run_id: str) -> Channel:
        channel = Channel(run_id)
        self._channels[run_id] = channel
        return channel

    def close_channel(self, run_id: str) -> None:
        self._channels.pop(run_id, None)

    async def spawn(self, channel: Channel, request: dict[str, Any], fds: list[int]) -> None:
        await self._send({"op": "spawn", "id": channel.run_id, **request}, fds)

    async def terminate(self, run_id: str, grace_s: float) -> None:
        await self._send({"op": "terminate", "id": run_id, "grace": grace_s})

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
            await self._send(request)
            await self.wait_for(lambda: self._opens.get(rid) is not None)
            reply = self._opens.get(rid)
        finally:
            late = self._opens.pop(rid, None)
            if reply is None and late is not None:
                _close_fds(late.get("_fds", []))
        if reply is None:
            raise BackendError(self._dead or "the runner did not answer the open request")
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
