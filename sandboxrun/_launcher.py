"""The in-scope launcher of the systemd-scope backend (stdlib only; run as a script).

``systemd-run --scope`` execs this launcher inside the new scope. systemd never sees the user's
argv or environment (it would expand ``$VAR`` / ``%n`` in some versions and modes): they come in
a private memfd as JSON. The launcher puts the command's pipes on 0/1/2 (systemd-run's own
stdout/stderr are the status pipe, so its messages never mix with the command's output),
reports its cgroup membership on the status fd, resets signal dispositions and mask, changes to
the working directory and ``execve``s. The status fd is close-on-exec, so a successful exec
shows up as EOF; a failed one writes a frame and exits 127 (not found) or 126.

Before the exec it double-forks a *keeper*: a process that stays in the scope until the host
closes ``HOLD_FD``, so that the scope's cgroup (and its OOM and CPU accounting) still exists when
the command's last process has exited; systemd removes an emptied scope within milliseconds.

argv: ``_launcher.py SPEC_FD STATUS_FD STDIN_FD STDOUT_FD STDERR_FD HOLD_FD``. Frames on the
status fd are a NUL byte, one JSON object and a newline: ``{"op": "launched", "cgroup": "<text
of /proc/self/cgroup>", "keeper": PID}`` then, on failure, ``{"op": "spawn_error", "errno": N,
"error": "..."}``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import sys


def frame(fd: int, message: dict[str, object]) -> None:
    data = b"\0" + json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data) :]


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


def main() -> None:
    passed = [int(x) for x in sys.argv[1:7]]
    # move every passed fd above the stdio range first: one of them may be 0, 1 or 2
    spec_fd, status_fd, in_fd, out_fd, err_fd, hold_fd = (
        fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in passed
    )
    for fd in set(passed):
        if fd > 2:
            os.close(fd)
    with os.fdopen(spec_fd, "rb") as f:
        spec = json.loads(f.read())
    for source, target in ((in_fd, 0), (out_fd, 1), (err_fd, 2)):
        os.dup2(source, target)  # dup2 clears close-on-exec on the target
    for fd in (in_fd, out_fd, err_fd):
        os.close(fd)
    keeper = start_keeper(hold_fd)
    os.close(hold_fd)
    with open("/proc/self/cgroup") as f:  # noqa: PTH123
        frame(status_fd, {"op": "launched", "cgroup": f.read(), "keeper": keeper})
    for number in range(1, signal.NSIG):
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(number, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    argv, env = spec["argv"], spec["env"]
    try:
        os.chdir(spec["cwd"])
        os.execvpe(argv[0], argv, env)  # noqa: S606
    except OSError as exc:
        code = 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126
        error = f"{argv[0]}: {os.strerror(exc.errno or 0)}"
        frame(status_fd, {"op": "spawn_error", "errno": exc.errno, "error": error})
        os._exit(code)


if __name__ == "__main__":
    main()
