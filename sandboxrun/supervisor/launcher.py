"""The in-scope launcher of the systemd-scope backend (stdlib only; run as a script).

``systemd-run --scope`` execs this launcher inside the new scope. systemd never sees the user's
argv or environment (it would expand ``$VAR`` / ``%n`` in some versions and modes): they come in
a private memfd (NUL-separated: cwd, argc, argv..., KEY=VALUE...). The launcher puts the
command's pipes on 0/1/2 (systemd-run's own stdout/stderr are the status pipe, so its messages
never mix with the command's output), reports its cgroup membership on the status fd, resets
signal dispositions and mask, changes to the working directory and ``execve``s. The status fd
is close-on-exec, so a successful exec shows up as EOF; a failed one writes a frame and exits
127 (not found) or 126.

Before the exec it double-forks a *keeper*: a process that stays in the scope until the host
closes ``HOLD_FD``, so that the scope's cgroup (and its OOM and CPU accounting) still exists when
the command's last process has exited; systemd removes an emptied scope within milliseconds.

With ``SANDBOXRUN_TTY=ROWS,COLS`` in its own environment (``launchwire.TTY_VAR``; never the
command's) the command runs on a new terminal the launcher makes once it is in the sandbox's
namespaces (``take_terminal``); the status fd is then a socket, and the terminal's master goes
to the host on it with a ``terminal`` frame.

argv: ``_launcher.py SPEC_FD STATUS_FD STDIN_FD STDOUT_FD STDERR_FD HOLD_FD [PLAN_FD]``. With
``PLAN_FD`` (a memfd: ``systemd_config.encode_plan``) the launcher joins the
namespaces of the sandbox's holder (PID 1 of them: a pidfd of it is passed too, its number in
the plan), forks the command there and
mirrors its end (``mirror``); the command confines itself first (``_confine.apply``). Frames on the
status fd are a NUL byte, one JSON object and a newline: ``{"op": "launched", "cgroup": "<text
of /proc/self/cgroup>", "keeper": PID}`` then, on failure, ``{"op": "spawn_error", "errno": N,
"error": "..."}``.

It imports only builtin modules (no json, re, enum or contextlib: they cost ~15 ms a run).
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys

TYPE_CHECKING = False  # not from typing: importing typing costs ~15 ms a run
if TYPE_CHECKING:
    import signal
else:  # the C module: `signal` imports enum, functools, collections (~5 ms a run)
    import _signal as signal
if TYPE_CHECKING or __package__:  # imported as sandboxrun.supervisor.launcher (the host's tests)
    from .launchwire import AS_VAR, TTY_VAR, decode_plan, decode_spec, frame, json_text
else:  # run as a script: its wire module is next to it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from launchwire import AS_VAR, TTY_VAR, decode_plan, decode_spec, frame, json_text

__all__ = ["AS_VAR", "TTY_VAR", "decode_plan", "decode_spec", "frame", "json_text"]


MAX_NAME = 2000
"""Characters of a command's name quoted in a spawn error at most (the supervisor's bound)."""


def read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def keep(hold_fd: int) -> None:
    """The keeper's life: its own session, deaf to the signals a command sends its group,
    no fd but the hold pipe; gone at its EOF."""
    try:
        os.setsid()
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(number, signal.SIG_IGN)
        os.closerange(0, hold_fd)
        os.closerange(hold_fd + 1, 65536)
        os.read(hold_fd, 1)
    finally:
        os._exit(0)


def start_keeper(hold_fd: int) -> int:
    """Fork a keeper that stays in the scope until ``hold_fd`` reaches EOF, so the scope's
    cgroup, with its accounting, outlives the command until the host has read it. Forked twice,
    so that it is not the command's child; when ``TasksMax`` leaves no room for the middle
    process (a pids limit of 1), once. Returns its pid, or 0 when there is none."""
    r, w = os.pipe()
    try:
        middle = os.fork()
    except OSError:
        middle = -1
    if middle == 0:
        try:
            keeper = os.fork()
        except OSError:
            os._exit(1)
        if keeper:
            os.write(w, str(keeper).encode())
            os._exit(0)
        keep(hold_fd)
    os.close(w)
    if middle > 0:
        os.waitpid(middle, 0)
    with os.fdopen(r, "rb") as f:
        text = f.read()
    if text.isdigit():
        return int(text)
    try:
        keeper = os.fork()
    except OSError:
        return 0
    if keeper == 0:
        keep(hold_fd)
    return keeper


CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000


def enter_sandbox(plan: dict[str, object]) -> None:
    """Join the namespaces of the sandbox's holder (one set per sandbox, see
    ``sandboxrun/backends/local/isolation.py``) in one ``setns`` on its pidfd: user first where
    there is
    one, then mount (which also moves root and cwd there), IPC, UTS, network, PID (for the
    children forked after it)."""
    import ctypes

    pidfd = int(plan["ns_fd"])  # type: ignore[call-overload]
    flags = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
    extra = plan.get("ns_extra") or ()  # which of user/net the holder has its own of
    for kind, flag in (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET)):
        if kind in extra:  # type: ignore[operator]
            flags |= flag
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(pidfd, flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot enter the sandbox's namespaces: {os.strerror(err)}")
    os.close(pidfd)


def mirror(pid: int) -> None:
    """Outlive the command in the sandbox's PID namespace and end as it ended: the host
    waits for this process. Deaf to the polite signals a termination sends the whole scope
    (the command gets them); KILL ends both."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):  # the command's pipes must reach EOF when it is done
        os.dup2(null, target)
    os.close(null)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        died_of = os.WTERMSIG(status)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        try:
            if died_of not in (signal.SIGKILL, signal.SIGSTOP):  # they cannot be caught
                signal.signal(died_of, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.kill(os.getpid(), died_of)
        except (OSError, ValueError):
            pass
        os._exit(128 + died_of)
    os._exit(os.WEXITSTATUS(status))


def take_terminal(status_fd: int, size: str) -> None:
    """Make a terminal here (in the sandbox's devpts, once its namespaces are joined), make it
    our controlling terminal and our 0/1/2, and send its master to the host with a
    ``terminal`` frame on the status socket (no copy is kept)."""
    import socket
    import struct
    import termios

    rows, cols = (int(x) for x in size.split(","))
    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    if os.getsid(0) != os.getpid():
        os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for target in (0, 1, 2):
        os.dup2(slave, target)
    os.close(slave)
    sock = socket.socket(fileno=os.dup(status_fd))
    try:
        socket.send_fds(sock, [b'\0{"op": "terminal"}\n'], [master])
    finally:
        sock.close()
        os.close(master)


def terminal_for_command(status_fd: int, size: str) -> None:
    """``take_terminal``, or a spawn error and exit 126 (the command never runs without it).
    Without namespaces the launcher is already a session leader (systemd-run ``--scope``
    execs in place, started in a new session), with no controlling terminal yet."""
    try:
        take_terminal(status_fd, size)
    except Exception as exc:
        error = f"cannot make the command's terminal: {exc}"
        frame(
            status_fd, {"op": "spawn_error", "errno": getattr(exc, "errno", 0) or 0, "error": error}
        )
        os._exit(126)


def main() -> None:
    passed = [int(x) for x in sys.argv[1:7]]
    plan: dict[str, object] = {}
    if len(sys.argv) > 7:  # a confined sandbox: its plan in a memfd (see isolation.py)
        plan_fd = int(sys.argv[7])
        plan = decode_plan(read_all(plan_fd))
        os.close(plan_fd)
    # move every passed fd above the stdio range first: one of them may be 0, 1 or 2
    spec_fd, status_fd, in_fd, out_fd, err_fd, hold_fd = (
        fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in passed
    )
    for fd in set(passed):
        if fd > 2:
            os.close(fd)
    cwd, argv, env = decode_spec(read_all(spec_fd))
    os.close(spec_fd)
    for source, target in ((in_fd, 0), (out_fd, 1), (err_fd, 2)):
        os.dup2(source, target)  # dup2 clears close-on-exec on the target
    for fd in (in_fd, out_fd, err_fd):
        os.close(fd)
    keeper = start_keeper(hold_fd)
    os.close(hold_fd)
    with open("/proc/self/cgroup") as f:
        frame(status_fd, {"op": "launched", "cgroup": f.read(), "keeper": keeper})
    for number in range(1, signal.NSIG):
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    tty = os.environ.get(TTY_VAR)
    ids = os.environ.get(AS_VAR)
    if ids:  # the keeper (above) stays ours; the command and the mirror are the owner's
        uid, _, gid = ids.partition(":")
        try:
            os.setgroups([])
            os.setresgid(int(gid), int(gid), int(gid))
            os.setresuid(int(uid), int(uid), int(uid))
        except (OSError, ValueError) as exc:  # never run the command as root instead
            frame(
                status_fd, {"op": "spawn_error", "errno": 0, "error": f"cannot become {ids}: {exc}"}
            )
            os._exit(126)
    if plan:
        try:
            if plan.get("ns_fd"):
                enter_sandbox(plan)
                child = os.fork()
                if child:
                    os.close(status_fd)
                    mirror(child)
            if tty:
                terminal_for_command(status_fd, tty)
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import confine as _confine  # type: ignore[import-not-found]

            _confine.apply(plan["confine"])
        except OSError as exc:  # never run the command unconfined
            error = f"cannot confine the command: {exc}"
            frame(status_fd, {"op": "spawn_error", "errno": exc.errno or 0, "error": error})
            os._exit(126)
    elif tty:
        terminal_for_command(status_fd, tty)
    failed_on = cwd  # a missing working directory is named as such, never as the program
    try:
        os.chdir(cwd)
        failed_on = argv[0]
        os.execvpe(argv[0], argv, env)  # noqa: S606
    except OSError as exc:
        code = 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126
        name = os.fsdecode(failed_on)
        if len(name) > MAX_NAME:  # the frame stays small: the name cut, its size said
            name = f"{name[:MAX_NAME]}\u2026({len(failed_on)} bytes)"
        what = "the working directory " if failed_on is cwd else ""
        error = f"{what}{name}: {os.strerror(exc.errno or 0)}"
        frame(status_fd, {"op": "spawn_error", "errno": exc.errno or 0, "error": error})
        os._exit(code)


if __name__ == "__main__":
    main()
