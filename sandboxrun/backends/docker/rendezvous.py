"""The supervisor inside a docker sandbox: how it gets there and how the host meets it.

The container's main process is the sandbox's supervisor (``sandboxrun/supervisor/runner.py``,
stdlib
only), the container's PID 1 (out of reach of its commands' signals; or below an image's
entrypoint), started from a private host directory bind-mounted read-only at
``MOUNT``: no image change is needed, only a ``python3`` (3.9+) in the image. It connects to the
host's unix socket in that directory (a path socket works across ``--network none``); the host
accepts one connection, checks that its peer is the container's main process, and unlinks the
socket, the runner's copies and the directory at once, so no sandboxed process can connect later
and nothing is left on the host. Commands then cost a message, not an engine round trip, and
their pipes (passed with SCM_RIGHTS) carry output straight to the host.

When the host goes away (even SIGKILL), the socket's EOF makes the supervisor end every run and
exit; the main process's exit stops the container, and ``AutoRemove`` removes it: nothing is
left without ``sandboxrun clean``. An image without a usable ``python3`` runs
``sleep infinity`` instead and the backend uses the engine's exec path (``ExecResult.via``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import marshal
import os
import select
import socket
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

from sandboxrun import supervisor
from sandboxrun.backends.secrets import supervisor_parent
from sandboxrun.errors import BackendError
from sandboxrun.supervisor import procfs as proctree

MOUNT = "/run/sandboxrun"
SOCKET_NAME = "supervisor.sock"
SCRIPTS = ("runner.py", "protocol.py", "procfs.py", "safeopen.py", "spawn.py")
"""What of ``supervisor/`` the container's supervisor needs (it imports them all before it
connects: the copies are unlinked once it has)."""
PYCACHE = "__pycache__"
"""Beside the copies: their bytecode as this host's Python compiles it (``scripts``). A
container whose ``python3`` has the same cache tag (``cpython-311``) loads it instead of
compiling ~1,500 lines at every start; any other ignores it."""
log = logging.getLogger("sandboxrun")
BOOT = (
    "import os, sys\n"
    "try:\n"
    "    sys.path.insert(0, sys.argv[1])\n"
    "    sys.argv = ['runner', '--connect', sys.argv[1] + '/" + SOCKET_NAME + "']\n"
    "    import runner\n"
    "except BaseException as exc:\n"
    "    sys.stderr.write('sandboxrun: no supervisor here (%r): sleeping\\n' % (exc,))\n"
    "    os.execvp('sleep', ['sleep', 'infinity'])\n"
    "runner.main()\n"
)
"""Imports the runner and runs it; any failure to (a Python too old for its syntax, a module
missing in a minimal image, the script unreadable) hands over to ``sleep infinity``."""
MAIN_COMMAND = [
    "sh",
    "-c",
    'command -v python3 >/dev/null 2>&1 && exec python3 -I -S -c "$1" "$2"; exec sleep infinity',
    "sandboxrun-supervisor",
    BOOT,
    MOUNT,
]
"""The container's main process: the supervisor where the image has a ``python3`` that can
run it, else a ``sleep`` (the engine's exec path is used then)."""
PEERCRED = struct.Struct("3i")


def parent_dir(workspace: Path) -> Path | None:
    """Where the rendezvous directories live: private to the invoker (mode 0700) and outside
    every workspace and every ``TMPDIR`` a sandbox could write (a command of another sandbox
    must never reach one; every sandbox masks it: ``secrets.supervisor_parent``); None when
    it is inside ``workspace`` (the sandbox then runs without a supervisor)."""
    parent = supervisor_parent(os.environ)
    root = Path(os.path.realpath(workspace))
    if Path(os.path.realpath(parent)).is_relative_to(root):
        return None
    return parent


@dataclass(frozen=True)
class Script:
    """One of ``SCRIPTS`` as the rendezvous carries it: its source, and its bytecode as this
    host's Python compiles it (``pyc``: an unchecked-hash ``.pyc`` of exactly that source,
    named ``pyc_name`` in ``__pycache__``; None where this Python has no cache tag)."""

    name: str
    source: bytes
    pyc_name: str | None
    pyc: bytes | None


_COMPILED: dict[bytes, tuple[Script, ...]] = {}
"""``scripts()`` of this process, by a digest of the sources (compiled once, in memory:
nothing of it is kept on the host where a sandbox could reach it)."""


def scripts() -> tuple[Script, ...]:
    """The supervisor's scripts with their bytecode. The code object comes from the package's
    own ``__pycache__`` where Python's rules trust it for that very source (the package's
    directory is as trusted as its sources), else from ``compile`` (~12 ms, once per
    process). A ``.pyc`` of the package's that does not unmarshal is not used: the container's
    import would fail on it instead of falling back to the source."""
    sources = [(name, Path(supervisor.HERE, name).read_bytes()) for name in SCRIPTS]
    digest = hashlib.sha256(b"\0".join(n.encode() + b"\0" + src for n, src in sources)).digest()
    found = _COMPILED.get(digest)
    if found is not None:
        return found
    tag = sys.implementation.cache_tag
    made: list[Script] = []
    for name, source in sources:
        pyc_name = pyc = None
        if tag is not None:
            try:
                code = _package_code(Path(supervisor.HERE, name), source) or compile(
                    source, f"{MOUNT}/{name}", "exec", dont_inherit=True, optimize=0
                )
                header = importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little")
                pyc = header + importlib.util.source_hash(source) + marshal.dumps(code)
                pyc_name = f"{Path(name).stem}.{tag}.pyc"
            except (SyntaxError, ValueError) as exc:
                log.debug("sandboxrun: no bytecode for the supervisor's %s: %s", name, exc)
                pyc_name = pyc = None
        made.append(Script(name, source, pyc_name, pyc))
    _COMPILED[digest] = result = tuple(made)
    return result


def _package_code(path: Path, source: bytes) -> CodeType | None:
    """The code of ``path`` from the package's own ``__pycache__``, when that ``.pyc`` is the
    one Python itself would trust for ``source`` (its hash, or the source file's mtime and
    size) and unmarshals to a code object; else None."""
    try:
        raw = Path(importlib.util.cache_from_source(str(path))).read_bytes()
        info = path.stat()
    except (OSError, ValueError, NotImplementedError):
        return None
    if len(raw) < 16 or raw[:4] != importlib.util.MAGIC_NUMBER:
        return None
    flags = int.from_bytes(raw[4:8], "little")
    if flags & 0b1:
        if raw[8:16] != importlib.util.source_hash(source):
            return None
    elif (
        int.from_bytes(raw[8:12], "little") != int(info.st_mtime) & 0xFFFFFFFF
        or int.from_bytes(raw[12:16], "little") != info.st_size & 0xFFFFFFFF
        or info.st_size != len(source)
    ):
        return None
    try:
        code = marshal.loads(raw[16:])  # noqa: S302 - what importing the package itself does
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def private_dir(parent: Path) -> None:
    """Make ``parent`` (mode 0700, ours, not a symlink) or refuse one that is not."""
    parent.parent.mkdir(parents=True, exist_ok=True)
    with suppress(FileExistsError):
        parent.mkdir(mode=0o700)
    info = parent.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise OSError(f"{parent} is not a directory of ours")
    if info.st_mode & 0o077:
        parent.chmod(0o700)


class Rendezvous:
    """The private host directory the supervisor connects through (one per container).

    Nothing in it is ever given to the container's user: the directory (mode 0755) and the
    runner's copies (0444) stay the invoker's, and only the socket is open to all (0666), inside
    a parent nobody else can enter; in the container, nothing but the supervisor runs before
    it has connected and everything is unlinked."""

    def __init__(self, parent: Path) -> None:
        self._listener: socket.socket | None = None
        self._pycs: list[str] = []
        try:
            private_dir(parent)
            self.dir = Path(tempfile.mkdtemp(prefix="sandbox-", dir=parent))
        except OSError as exc:
            raise BackendError(f"cannot prepare the sandbox's supervisor: {exc}") from exc
        try:
            carried = scripts()
            for each in carried:
                script = self.dir / each.name
                script.write_bytes(each.source)
                script.chmod(0o444)
            self._bytecode(carried)
            listener = self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(self.dir / SOCKET_NAME))
            listener.listen(1)
            listener.setblocking(False)
            (self.dir / SOCKET_NAME).chmod(0o666)
            self.dir.chmod(0o755)  # the import system lists it (inside: only the supervisor)
        except OSError as exc:
            self.close()
            raise BackendError(f"cannot prepare the sandbox's supervisor: {exc}") from exc

    def _bytecode(self, carried: tuple[Script, ...]) -> None:
        """The scripts' bytecode in ``__pycache__`` (0755, each 0444), or none of it: a write
        that fails (a full disk) leaves the sources alone, which the container compiles."""
        compiled = [(s.pyc_name, s.pyc) for s in carried if s.pyc_name and s.pyc is not None]
        if not compiled:
            return
        cache = self.dir / PYCACHE
        try:
            cache.mkdir()
            cache.chmod(0o755)  # (not the umask's)
            for name, code in compiled:
                self._pycs.append(name)
                pyc = cache / name
                pyc.write_bytes(code)
                pyc.chmod(0o444)
        except OSError as exc:
            log.debug("sandboxrun: the supervisor's bytecode not written: %s", exc)
            self._remove_bytecode()

    def _remove_bytecode(self) -> None:
        """Only the names written here (nothing in it is followed or listed)."""
        for name in self._pycs:
            with suppress(OSError):
                (self.dir / PYCACHE / name).unlink()
        self._pycs = []
        with suppress(OSError):
            (self.dir / PYCACHE).rmdir()

    def accept(
        self, timeout_s: float, ours: Callable[[int], bool], gave_up: Callable[[], bool]
    ) -> tuple[socket.socket, int] | None:
        """Wait for the supervisor's connection: our end of it and the supervisor's host pid,
        or None when the container runs without one (``gave_up()``: no usable python3) or
        none came within ``timeout_s``. A peer that is not a process of the container
        (``ours(pid)``) is refused."""
        listener = self._listener
        assert listener is not None
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([listener], [], [], 0.005)
                if ready:
                    conn, _ = listener.accept()
                    pid = PEERCRED.unpack(
                        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
                    )[0]
                    if not ours(pid):
                        conn.close()
                        raise BackendError(
                            f"a process ({pid}) that is not the container's connected to "
                            "the supervisor's socket"
                        )
                    conn.setblocking(False)
                    return conn, pid
                if gave_up():
                    return None
            return None
        finally:
            self.close()

    def close(self) -> None:
        """Remove the socket, the runner's copies and the directory (idempotent)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if hasattr(self, "dir"):
            for name in (SOCKET_NAME, *SCRIPTS):
                with suppress(OSError):
                    (self.dir / name).unlink()
            self._remove_bytecode()
            with suppress(OSError):
                self.dir.rmdir()


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants (host pids, /proc)."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        info = proctree.read_proc(pid)
        if info is None:
            return False
        pid, seen = info.ppid, seen + 1
    return pid == ancestor


def sleeping(pids: set[int]) -> bool:
    """Whether one of ``pids`` is the ``sleep`` a container without a supervisor idles in."""
    return any(main_command_name(pid) == "sleep" for pid in pids)


def main_command_name(pid: int) -> str | None:
    """``comm`` of the container's main process (``sh`` while it starts, then ``python3`` or
    ``sleep``), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
