"""Starting one command, for the runner: ``subprocess.Popen(start_new_session=True,
close_fds=True)`` (vfork, every descriptor but the three stdio closed, SIGPIPE and SIGXFSZ
back to their defaults) with the program found along the command's own ``PATH`` by a lookup
per directory instead of an ``execve`` per directory. Inside a container whose image is mapped
through FUSE (fuse-overlayfs) each failed ``execve`` costs about 40 µs, and a command found in
``/usr/bin`` under the usual ``PATH`` paid three of them before it ran.

The outcome is ``Popen``'s own search (``execvp``'s, but ELOOP goes on too): directories
without the name are passed over, so are those where it cannot run (EACCES, a missing
interpreter: ENOENT from the exec); the error reported is the first real failure, else the
last ENOENT, named by the command's own ``argv[0]``. A relative PATH entry is looked up in
the command's working directory, where the exec would look. A failure that is not the exec's
(the working directory, a fork refused at the process limit) is raised as it is, never taken
for a reason to try the next directory. A missing
working directory fails naming it, as ``Popen`` does.

``os.posix_spawn`` was measured too: no faster than ``Popen``'s vfork once the path is known,
and glibc (2.36) leaves its two internal signals (32, 33) ignored in the child, where an exec
keeps them ignored: a command's ``SigIgn`` would differ from a ``docker exec``'s.

``spawn_tty`` starts a command on a new pseudo-terminal made here, in the sandbox's own devpts
(runc's answer to terminals in containers): the command is its session's leader with the
terminal as its controlling one, and the caller gets the master (``docs/terminals.md``).

Stdlib only, Python 3.9 syntax (it runs in the sandbox).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import subprocess
import termios

TYPE_CHECKING = False  # not from typing: the runner imports this module before it connects
if TYPE_CHECKING:
    from collections.abc import Callable

SKIP = (errno.ENOENT, errno.ENOTDIR)
"""Errors on a PATH entry after which ``execvp`` tries the next one and forgets this one."""


def candidates(name: str, env: dict[str, str]) -> list[str]:
    """Where ``name`` is looked for: itself when it names a directory, else in every
    directory of ``env``'s PATH (the default path without one), in order."""
    if os.path.dirname(name):
        return [name]
    return [os.path.join(folder, name) for folder in os.get_exec_path(env)]


MAX_SIDE = 10000
"""The most rows or columns a terminal may be given (the kernel keeps 16 bits)."""


def set_size(fd: int, rows: int, cols: int) -> None:
    """``TIOCSWINSZ``: the terminal of ``fd`` (master or slave) is ``rows`` x ``cols``."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_terminal() -> None:
    """In the child, after ``setsid``: the terminal on fd 0 becomes its controlling one."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def spawn_tty(
    argv: list[str], env: dict[str, str], cwd: str, rows: int, cols: int
) -> tuple[int, int]:
    """Start ``argv`` on a new pseudo-terminal of ``rows`` x ``cols`` as the leader of a new
    session it controls; ``(pid, master)``: the caller owns the master (close-on-exec) and
    reaps the pid. Errors as ``spawn``; nothing is left open when it fails."""
    if not (0 < rows <= MAX_SIDE and 0 < cols <= MAX_SIDE):
        raise ValueError(f"a terminal of {rows} x {cols} cannot be made")
    master, slave = os.openpty()
    try:
        os.set_inheritable(master, False)
        set_size(master, rows, cols)
        pid = spawn(argv, env, cwd, [slave, slave, slave], _take_terminal)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)  # the command holds it now: EOF on the master once it is gone
    return pid, master


def spawn(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    stdio: list[int],
    before_exec: Callable[[], None] | None = None,
) -> int:
    """Start ``argv`` on ``stdio`` (in, out, err) in a new session, in ``cwd``; its pid, for
    the caller to reap (``Popen`` never does). Raises ``OSError`` as ``execvp`` would fail,
    ``ValueError`` for an argument or variable no exec can carry. ``before_exec``: run in the
    child after ``setsid`` (``Popen``'s ``preexec_fn``: a fork, not a vfork)."""
    found = candidates(argv[0], env) if argv else []
    if len(found) <= 1:
        return _start(argv, None, env, cwd, stdio, before_exec)
    first: OSError | None = None
    last: OSError | None = None
    for path in found:
        try:  # (a relative entry is looked up where the command will be: in cwd)
            os.stat(os.path.join(cwd, path))
        except (FileNotFoundError, NotADirectoryError) as exc:
            last = _named(exc.errno or errno.ENOENT, argv[0])
            continue
        except OSError:
            pass  # EACCES on the way, a loop...: the exec tells its own errno
        try:
            return _start(argv, path, env, cwd, stdio, before_exec)
        except OSError as exc:
            if exc.filename != path:  # not the exec (the cwd, a fork, a full fd table): as is
                raise
            last = _named(exc.errno or 0, argv[0])
            if last.errno not in SKIP and first is None:
                first = last
    raise first or last or _named(errno.ENOENT, argv[0])


def _named(code: int, name: str) -> OSError:
    return OSError(code, os.strerror(code), name)


def _start(
    argv: list[str],
    executable: str | None,
    env: dict[str, str],
    cwd: str,
    stdio: list[int],
    before_exec: Callable[[], None] | None = None,
) -> int:
    proc = subprocess.Popen(
        argv,
        executable=executable,
        stdin=stdio[0],
        stdout=stdio[1],
        stderr=stdio[2],
        env=env,
        cwd=cwd,
        start_new_session=True,
        close_fds=True,
        preexec_fn=before_exec,
    )
    proc.returncode = 0  # the caller reaps it (wait4): Popen must never wait for it itself
    return proc.pid
