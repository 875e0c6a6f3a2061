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
        self._reading = False
        self._activity = anyio.Event()

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
        parent.setblocking(False)
        self._sock = parent
        with anyio.move_on_after(READY_TIMEOUT_S):
            await self.wait_for(lambda: self._ready)
        if not self._ready or self._dead:
            await self.close()
            raise BackendError(f"the process-group runner did not start: {self._dead or 'timeout'}")

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
        assert self._sock is not None
        await anyio.wait_readable(self._sock)
        try:
            data = self._sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lose(f"runner connection failed: {exc}")
            return
        if not data:
            self._lose("the runner exited unexpectedly")
            return
        self._inbuf += data
        while len(self._inbuf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._inbuf)
            if len(self._inbuf) < HEADER.size + size:
                break
            msg = json.loads(self._inbuf[HEADER.size : HEADER.size + size])
            self._inbuf = self._inbuf[HEADER.size + size :]
            self._dispatch(msg)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
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

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Ask the runner to finish (it terminates whatever still runs) and reap it. Bounded."""
        proc = self._proc
        if proc is None:
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
