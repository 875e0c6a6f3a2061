"""The clients of a detached sandbox's keeper (blocking sockets, standard library only: the
CLI's ``exec`` costs milliseconds): ``create`` starts a keeper, ``connect`` talks to one,
``listing`` finds them. A keeper is trusted only when its socket's peer is this uid or root."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from sandboxrun.detached import protocol
from sandboxrun.detached.place import Place, ensure_dir, names_in, place, runtime_dir
from sandboxrun.errors import ConfigError, InputError, NoSuchSandbox, SandboxrunError

READY_S = 120.0
"""How long ``create`` waits for a keeper to open its sandbox (an image's first start)."""
GONE_S = 30.0
"""How long ``rm`` waits for a keeper that said nothing to have exited."""
ANSWER_S = 10.0
"""How long a keeper gets to answer a request at all."""


def held(lock: Path) -> bool:
    """Whether a keeper holds ``lock`` (it lives)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def forget(where: Place) -> None:
    """Remove what a dead keeper left (its state, socket, log, lock), holding its lock
    meanwhile: a keeper alive, or starting right now, keeps its files."""
    try:
        fd: int | None = os.open(where.lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
        for path in (where.state, where.socket, where.log, where.lock):
            with suppress(FileNotFoundError):
                path.unlink()
    finally:
        if fd is not None:
            os.close(fd)


def take_lock(where: Place) -> int:
    """The lock of ``where``, held (an fd), or ``InputError`` when a keeper holds it. A lock
    file removed between its open and its lock (``forget``) is opened again: a lock held on
    a file no longer there would let a second keeper take the name."""
    for _ in range(20):
        fd = os.open(where.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InputError(
                f"a sandbox named {where.name} exists (sandboxrun rm {where.name})"
            ) from None
        held_st = os.fstat(fd)
        try:
            now = where.lock.stat()
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held_st.st_dev, held_st.st_ino):
            return fd
        os.close(fd)
    raise SandboxrunError(f"could not take sandbox {where.name}'s lock (it keeps being removed)")


class Connection:
    """One connection to a keeper: ``send`` frames, ``frames`` back."""

    def __init__(self, where: Place, timeout: float | None = 10.0) -> None:
        import socket
        import struct

        self.where = where
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(os.fsencode(where.socket))
        except (FileNotFoundError, ConnectionRefusedError):
            self.sock.close()
            if not held(where.lock):
                forget(where)
                raise NoSuchSandbox(f"no sandbox named {where.name} (sandboxrun ls)") from None
            raise SandboxrunError(
                f"sandbox {where.name}'s keeper does not answer (starting or ending): "
                f"try again, or `sandboxrun rm --force {where.name}`"
            ) from None
        except PermissionError:
            self.sock.close()
            raise ConfigError(f"not allowed to attach to sandbox {where.name}") from None
        creds = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        uid = struct.unpack("3i", creds)[1]
        if uid not in (os.getuid(), 0):
            self.sock.close()
            raise ConfigError(
                f"sandbox {where.name}'s socket is served by uid {uid}, not by you: not trusted"
            )
        self.lines = protocol.Lines()
        self.ready: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def send(self, frame: dict[str, Any] | bytes) -> None:
        data = frame if isinstance(frame, bytes) else protocol.encode(frame)
        with self.lock:
            self.sock.sendall(data)

    def next(self) -> dict[str, Any]:
        """The next frame (``SandboxrunError`` when the keeper went away first)."""
        while not self.ready:
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                raise SandboxrunError(
                    f"sandbox {self.where.name}'s keeper did not answer"
                ) from None
            except OSError as exc:
                data, why = b"", exc.strerror
            else:
                why = "it closed the connection"
            if not data:
                raise SandboxrunError(f"lost sandbox {self.where.name}'s keeper ({why})")
            self.ready.extend(self.lines.feed(data))
        return self.ready.pop(0)

    def final(self, key: str) -> dict[str, Any]:
        """The one answer frame of a request: its ``key``'s object (errors raised)."""
        frame = self.next()
        protocol.raise_error(frame)
        value = frame.get(key)
        if not isinstance(value, dict):
            raise protocol.ProtocolError(f"expected {key!r}, got {sorted(frame)}")
        return value

    def close(self) -> None:
        with suppress(OSError):
            self.sock.close()

    def shutdown(self) -> None:
        """End the connection at once, also under a thread blocked reading it."""
        import socket

        with suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.close()


def connect(name: str, directory: Path | None = None, timeout: float | None = 10.0) -> Connection:
    return Connection(place(name, directory), timeout)


def info(name: str, directory: Path | None = None) -> dict[str, Any]:
    conn = connect(name, directory)
    try:
        conn.send({"op": "info"})
        return conn.final("info")
    finally:
        conn.close()


FILES_S = 120.0
"""How long a file operation through a keeper may go without a frame."""


def read_file(name: str, directory: Path | None, path: str, max_bytes: int) -> bytes:
    """``Sandbox.read_file`` through the keeper (its errors, typed)."""
    conn = connect(name, directory, FILES_S)
    try:
        conn.send({"op": "read_file", "path": path, "max_bytes": max_bytes})
        data = bytearray()
        while True:
            frame = conn.next()
            protocol.raise_error(frame)
            if "chunk" in frame:
                data += protocol.data_of(frame)
                if len(data) > max_bytes:
                    raise protocol.ProtocolError("the keeper sent more than max_bytes")
            elif isinstance(frame.get("file"), dict):
                return bytes(data)
            else:
                raise protocol.ProtocolError(f"expected the file, got {sorted(frame)}")
    finally:
        conn.close()


def write_file(
    name: str, directory: Path | None, path: str, data: bytes, mode: int, parents: bool
) -> None:
    """``Sandbox.write_file`` through the keeper (at most ``protocol.WRITE_MAX`` bytes)."""
    if len(data) > protocol.WRITE_MAX:
        raise InputError(f"write_file takes at most {protocol.WRITE_MAX} bytes through a keeper")
    conn = connect(name, directory, FILES_S)
    try:
        head = {"op": "write_file", "path": path, "size": len(data), "mode": mode}
        conn.send({**head, "parents": parents})
        for at in range(0, len(data), protocol.CHUNK):
            conn.send(protocol.data_frame("op", "data", data[at : at + protocol.CHUNK]))
        conn.final("written")
    finally:
        conn.close()


def list_dir(
    name: str, directory: Path | None, path: str, max_entries: int
) -> list[dict[str, Any]]:
    """``Sandbox.list_dir`` through the keeper: the entries as mappings."""
    conn = connect(name, directory, FILES_S)
    try:
        conn.send({"op": "list_dir", "path": path, "max_entries": max_entries})
        rows: list[dict[str, Any]] = []
        while True:
            frame = conn.next()
            protocol.raise_error(frame)
            if isinstance(frame.get("entries"), list):
                rows += frame["entries"]
            elif isinstance(frame.get("listed"), dict):
                return rows
            else:
                raise protocol.ProtocolError(f"expected entries, got {sorted(frame)}")
    finally:
        conn.close()


def listing(directory: Path | None = None) -> list[dict[str, Any]]:
    """What every live keeper here says of itself; what dead ones left is removed."""
    base = ensure_dir(directory or runtime_dir(), create=False)
    found: list[dict[str, Any]] = []
    for name in names_in(base):
        try:
            found.append(info(name, base))
        except NoSuchSandbox:
            continue
        except SandboxrunError as exc:
            found.append({"name": name, "error": str(exc)})
    return found


def remove(name: str, directory: Path | None = None, *, force: bool = False) -> dict[str, Any]:
    """Remove a sandbox and wait until its keeper is gone. The keeper says at once how long
    ending may take (its commands' grace included) and is waited for that long. ``force``:
    commands running are ended; a keeper that does not answer (stopped, still starting, hung)
    is killed (its sandbox then goes by the backend's owner-death cleanup), and what it left
    is removed."""
    where = place(name, directory)
    answer: dict[str, Any] = {}
    within = GONE_S
    try:
        conn: Connection | None = Connection(where, timeout=ANSWER_S)
    except NoSuchSandbox:
        raise
    except SandboxrunError:
        if not force:
            raise
        conn = None
    taken = False
    if conn is not None:
        try:
            conn.send({"op": "rm", "force": force})
            removing = conn.final("removing")
            taken = True
            within = float(removing.get("within_s") or GONE_S) + ANSWER_S
            conn.sock.settimeout(within)
            answer = conn.final("removed")
        except SandboxrunError:
            if not force or taken:
                raise
        finally:
            conn.close()
    deadline = time.monotonic() + (within if taken else GONE_S)
    while held(where.lock) and time.monotonic() < deadline:
        if force and not taken:
            _kill_keeper(where)
        time.sleep(0.02)
    if held(where.lock):
        raise SandboxrunError(f"sandbox {name}'s keeper did not exit within {GONE_S:g} s")
    forget(where)
    return answer


def _kill_keeper(where: Place) -> None:
    """SIGKILL the keeper whose pid its lock file holds (written first thing, while the lock
    is held: a pid read there while the lock is held is the keeper's)."""
    try:
        pid = int(where.lock.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    if pid > 1 and held(where.lock):
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def create(
    sandbox: Mapping[str, Any],
    *,
    name: str | None = None,
    ttl_s: float | None = None,
    idle_ttl_s: float | None = None,
    directory: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Start a keeper for a sandbox made of ``sandbox`` (``Sandbox``'s keyword arguments as
    JSON: ``policy`` and ``limits`` as mappings) and wait until it serves: its info. The
    sandbox's own errors (a missing image, a refused guarantee) are raised as they are."""
    from sandboxrun.detached.place import new_name

    base = ensure_dir(directory or runtime_dir(), create=True)
    for ttl, option in ((ttl_s, "--ttl"), (idle_ttl_s, "--idle-ttl")):
        if ttl is not None and not ttl > 0:
            raise InputError(f"{option} must be more than 0 seconds")
    where = place(name or new_name(), base)
    where.check_socket_path()
    lock = take_lock(where)
    try:
        os.ftruncate(lock, 0)  # a dead keeper's pid is never read as this one's
        config = {
            "dir": str(base),
            "name": where.name,
            "lock_fd": lock,
            "ttl_s": ttl_s,
            "idle_ttl_s": idle_ttl_s,
            "sandbox": dict(sandbox),
        }
        log = os.open(where.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            keeper = subprocess.Popen(
                [sys.executable, "-m", "sandboxrun.cli.keeper"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                pass_fds=(lock,),
                start_new_session=True,
                cwd="/",
                env=dict(os.environ if env is None else env),
            )
        finally:
            os.close(log)
        assert keeper.stdin is not None and keeper.stdout is not None
        with keeper.stdin:
            keeper.stdin.write(json.dumps(config).encode())
        keeper.wait()  # the keeper forked: this one returns at once
        try:
            line = _read_ready(keeper.stdout, READY_S)
        finally:
            keeper.stdout.close()  # (given up: the keeper's ready line fails, and it ends)
    finally:
        os.close(lock)  # the keeper holds it now (or it is released: nothing lives)
    if not line or b'"error"' in line[:10]:
        _released(where, GONE_S)  # the keeper is on its way out: what it made goes first
    if not line:
        tail = _tail(where.log)
        forget(where)
        raise SandboxrunError(
            f"sandbox {where.name}'s keeper ended without a word" + (f": {tail}" if tail else "")
        )
    frame = protocol.decode(line)
    if "error" in frame:
        forget(where)
        protocol.raise_error(frame)
    ready = frame.get("ready")
    if not isinstance(ready, dict):
        raise protocol.ProtocolError(f"expected 'ready', got {sorted(frame)}")
    return ready


def _released(where: Place, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while held(where.lock) and time.monotonic() < deadline:
        time.sleep(0.02)


def _read_ready(out: Any, timeout: float) -> bytes:
    import select

    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([out], [], [], left)[0]:
            raise SandboxrunError(f"the keeper did not open its sandbox within {timeout:g} s")
        chunk = os.read(out.fileno(), 1 << 16)
        if not chunk:
            break
        data += chunk
    return data


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run_exec(
    conn: Connection,
    request: dict[str, Any],
    out: Callable[[str, bytes], None],
    stdin: Callable[[], bytes] | None = None,
) -> dict[str, Any]:
    """One exec over ``conn``: ``out(name, chunk)`` for the output as it comes; ``stdin``, a
    blocking read returning b"" at EOF, fed from a thread within the keeper's credit. The
    final frame (``result``, ``exit``, ``notes``)."""
    conn.send({"op": "exec", **request, "stdin": stdin is not None})
    credit = _Credit(protocol.STDIN_WINDOW)
    if stdin is not None:
        threading.Thread(target=_feed, args=(conn, stdin, credit), daemon=True).start()
    try:
        while True:
            frame = conn.next()
            if "out" in frame:
                out(str(frame["out"]), protocol.data_of(frame))
                continue
            if "credit" in frame:
                credit.give(int(frame["credit"]))
                continue
            protocol.raise_error(frame)
            if "result" not in frame:
                raise protocol.ProtocolError(f"expected 'result', got {sorted(frame)}")
            return frame
    finally:
        credit.close()


class _Credit:
    """The stdin bytes the client may still send (``take`` blocks until there are some)."""

    def __init__(self, window: int) -> None:
        self.left = window
        self.closed = False
        self.cond = threading.Condition()

    def take(self, want: int) -> int:
        with self.cond:
            while self.left <= 0 and not self.closed:
                self.cond.wait()
            if self.closed:
                return 0
            got = min(want, self.left)
            self.left -= got
            return got

    def give(self, n: int) -> None:
        with self.cond:
            self.left += n
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


def _feed(conn: Connection, read: Callable[[], bytes], credit: _Credit) -> None:
    with suppress(OSError, ValueError):
        while True:
            data = read()
            if not data:
                conn.send({"op": "eof"})
                return
            while data:
                n = credit.take(min(len(data), protocol.CHUNK))
                if not n:
                    return  # the exec is over
                conn.send(protocol.data_frame("op", "stdin", data[:n]))
                data = data[n:]
