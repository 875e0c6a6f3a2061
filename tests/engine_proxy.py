"""A unix-socket HTTP proxy in front of the real Docker engine socket, for hostile engine tests.

It forwards every byte both ways and understands just enough HTTP/1.1 (request heads and
``Content-Length`` bodies, client side only) to misbehave on purpose:

* ``stall_deletes``: ``DELETE .../containers/...`` requests are never forwarded nor answered
  (the first ``stall_deletes`` of them; ``-1``: all), as an engine that hangs on removal;
* ``coalesce_exec_start``: the response head of ``POST .../exec/.../start`` is held until the
  first body bytes arrive and both are sent in one write (what a proxy or a busy engine does;
  at most ``HOLD_S``: an exec that waits for its caller before writing gets the head alone);
* ``strip_limits``: ``POST .../containers/create`` loses its CPU, memory and pids limits, as an
  engine that silently ignores them.

Use: ``with EngineProxy(tmp_path / "proxy.sock", stall_deletes=-1) as proxy:`` and point
``DOCKER_HOST`` at ``proxy.url``. Only the engine named by the real ``DOCKER_HOST`` is reached.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import socket
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

DELETE_CONTAINER = re.compile(rb"^DELETE (/v[0-9.]+)?/containers/[^/ ?]+[ ?]")
EXEC_START = re.compile(rb"^POST (/v[0-9.]+)?/exec/[^/ ]+/start[ ?]")
CREATE = re.compile(rb"^POST (/v[0-9.]+)?/containers/create[ ?]")
HOLD_S = 2.0
"""How long an exec-start response head is held waiting for body bytes."""
LIMIT_FIELDS = ("NanoCpus", "CpuQuota", "CpuPeriod", "Memory", "MemorySwap", "PidsLimit")


def real_engine_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        raise RuntimeError(f"the engine is not reached through a unix socket: {host}")
    return host.removeprefix("unix://")


class EngineProxy:
    def __init__(
        self,
        path: Path,
        *,
        stall_deletes: int = 0,
        coalesce_exec_start: bool = False,
        strip_limits: bool = False,
    ) -> None:
        self.path = path
        self.upstream = real_engine_socket()
        self.stall_deletes = stall_deletes
        self.coalesce_exec_start = coalesce_exec_start
        self.strip_limits = strip_limits
        self.stalled: list[bytes] = []
        """Request lines held forever."""
        self.coalesced = 0
        """Exec-start responses whose head was sent together with body bytes."""
        self.requests: list[bytes] = []
        """Every request line forwarded or held, in order."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._threads: list[threading.Thread] = []
        self._open: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def __enter__(self) -> Self:
        self._server.bind(str(self.path))
        self._server.listen(64)
        self._spawn(self._accept)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._server.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        for thread in self._threads:
            thread.join(5)
        self.path.unlink(missing_ok=True)

    # -- plumbing -----------------------------------------------------------------------------
    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(self.upstream)
            with self._lock:
                self._open += [client, engine]
            state: dict[str, bool] = {"exec_start": False}
            self._spawn(self._requests, client, engine, state)
            self._spawn(self._responses, engine, client, state)

    def _requests(
        self, client: socket.socket, engine: socket.socket, state: dict[str, bool]
    ) -> None:
        """Client -> engine, one request at a time until the connection is hijacked."""
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = client.recv(65536)
                    if not data:
                        engine.shutdown(socket.SHUT_WR)
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                while len(buf) < length:
                    data = client.recv(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                with self._lock:
                    self.requests.append(head.split(b"\r\n")[0])
                if DELETE_CONTAINER.match(head) and self._stall_this():
                    self.stalled.append(head.split(b"\r\n")[0])
                    self._stop.wait()  # never forwarded, never answered
                    return
                if CREATE.match(head) and self.strip_limits:
                    head, body = self._without_limits(head, body)
                hijack = bool(EXEC_START.match(head))
                if hijack:
                    state["exec_start"] = self.coalesce_exec_start
                engine.sendall(head + b"\r\n\r\n" + body)
                if hijack:  # raw stream (stdin) from now on
                    if buf:
                        engine.sendall(buf)
                    self._pump(client, engine)
                    return
        except OSError:
            return

    def _stall_this(self) -> bool:
        with self._lock:
            if self.stall_deletes == 0:
                return False
            if self.stall_deletes > 0:
                self.stall_deletes -= 1
            return True

    @staticmethod
    def _without_limits(head: bytes, body: bytes) -> tuple[bytes, bytes]:
        config = json.loads(body)
        for field in LIMIT_FIELDS:
            config.get("HostConfig", {}).pop(field, None)
        body = json.dumps(config).encode()
        lines = [
            line
            for line in head.split(b"\r\n")
            if line.partition(b":")[0].strip().lower() != b"content-length"
        ]
        lines.append(b"Content-Length: %d" % len(body))
        return b"\r\n".join(lines), body

    def _responses(
        self, engine: socket.socket, client: socket.socket, state: dict[str, bool]
    ) -> None:
        """Engine -> client: raw, except the exec-start response head when coalescing."""
        held = b""
        try:
            while True:
                if held and not select.select([engine], [], [], HOLD_S)[0]:
                    client.sendall(held)  # no body came: never hold the head for ever
                    held, state["exec_start"] = b"", False
                    continue
                data = engine.recv(65536)
                if not data:
                    if held:
                        client.sendall(held)
                    client.shutdown(socket.SHUT_WR)
                    return
                if state["exec_start"]:
                    held += data
                    _head, sep, rest = held.partition(b"\r\n\r\n")
                    if not sep or not rest:
                        continue  # hold the head until body bytes follow it
                    state["exec_start"] = False
                    data, held = held, b""
                    self.coalesced += 1
                client.sendall(data)
        except OSError:
            return

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            data = src.recv(65536)
            if not data:
                dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(data)
