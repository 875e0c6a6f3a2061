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
import logging
import os
import py_compile
import select
import shutil
import socket
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from sandboxrun import supervisor
from sandboxrun.engine.capture.spill import default_spill_root
from sandboxrun.errors import BackendError
from sandboxrun.supervisor import procfs as proctree

MOUNT = "/run/sandboxrun"
SOCKET_NAME = "supervisor.sock"
SCRIPTS = ("runner.py", "protocol.py", "procfs.py", "safeopen.py", "spawn.py")
"""What of ``supervisor/`` the container's supervisor needs (it imports them all before it
connects: the copies are unlinked once it has)."""
PYCACHE = "__pycache__"
"""Beside the copies: their bytecode as this host's Python compiles it (``bytecode``). A
container whose ``python3`` has the same cache tag (``cpython-311``) loads it instead of
compiling ~1,500 lines at every start (~12 ms of the supervisor's start-up); any other
ignores it."""
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
    must never reach one): ``/run/sandboxrun-supervisor`` for root, else
    ``$XDG_RUNTIME_DIR/sandboxrun-supervisor``, else ``~/.cache/sandboxrun/supervisor``;
    None when that is inside ``workspace`` (the sandbox then runs without a supervisor)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.geteuid() == 0:
        parent = Path("/run/sandboxrun-supervisor")
    elif runtime.startswith("/") and Path(runtime).is_dir():
        parent = Path(runtime) / "sandboxrun-supervisor"
    else:
        parent = default_spill_root().parent / "supervisor"
    root = Path(os.path.realpath(workspace))
    if Path(os.path.realpath(parent)).is_relative_to(root):
        return None
    return parent


def bytecode(parent: Path) -> list[tuple[str, bytes]]:
    """The supervisor's scripts compiled by this Python: ``(name in __pycache__, .pyc)``
    each, unchecked-hash (the copies beside them are the same sources). Compiled once per
    host and sandboxrun version, kept in ``parent`` (private to the invoker) as
    ``bytecode-<cache tag>-<digest of the sources>``; empty when this cannot be done (the
    container then compiles the sources itself, as it always could)."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return []
    try:
        sources = [Path(supervisor.HERE, name) for name in SCRIPTS]
        digest = hashlib.sha256()
        for source in sources:
            digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
        names = [f"{source.stem}.{tag}.pyc" for source in sources]
        store = parent / f"bytecode-{tag}-{digest.hexdigest()[:24]}"
        found = _read_store(store, names)
        if found is not None:
            return found
        private_dir(parent)
        fresh = Path(tempfile.mkdtemp(prefix=".bytecode-", dir=parent))
        try:
            for source, name in zip(sources, names, strict=True):
                py_compile.compile(
                    str(source),
                    cfile=str(fresh / name),
                    dfile=f"{MOUNT}/{source.name}",
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                )
            fresh.rename(store)  # (at once; another process's may be there first)
        except OSError:
            if not store.is_dir():
                raise
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
        return _read_store(store, names) or []
    except (OSError, py_compile.PyCompileError) as exc:
        log.debug("sandboxrun: the supervisor's bytecode: %s", exc)
        return []


def _read_store(store: Path, names: list[str]) -> list[tuple[str, bytes]] | None:
    try:
        return [(name, (store / name).read_bytes()) for name in names]
    except OSError:
        return None


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
        try:
            private_dir(parent)
            self.dir = Path(tempfile.mkdtemp(prefix="sandbox-", dir=parent))
        except OSError as exc:
            raise BackendError(f"cannot prepare the sandbox's supervisor: {exc}") from exc
        try:
            for name in SCRIPTS:
                script = self.dir / name
                shutil.copyfile(Path(supervisor.HERE, name), script)
                script.chmod(0o444)
            compiled = bytecode(parent)
            if compiled:
                (self.dir / PYCACHE).mkdir(mode=0o755)
                for name, code in compiled:
                    pyc = self.dir / PYCACHE / name
                    pyc.write_bytes(code)
                    pyc.chmod(0o444)
            listener = self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(self.dir / SOCKET_NAME))
            listener.listen(1)
            listener.setblocking(False)
            (self.dir / SOCKET_NAME).chmod(0o666)
            self.dir.chmod(0o755)  # the import system lists it (inside: only the supervisor)
        except OSError as exc:
            self.close()
            raise BackendError(f"cannot prepare the sandbox's supervisor: {exc}") from exc

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
            with suppress(OSError):
                for pyc in (self.dir / PYCACHE).iterdir():
                    with suppress(OSError):
                        pyc.unlink()
                (self.dir / PYCACHE).rmdir()
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
