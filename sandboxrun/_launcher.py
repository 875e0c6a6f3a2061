"""The in-scope launcher of the systemd-scope backend (stdlib only; run as a script).

``systemd-run --scope`` execs this launcher inside the new scope. systemd never sees the user's
argv or environment (it would expand ``$VAR`` / ``%n`` in some versions and modes): they come in
a private memfd as JSON. The launcher puts the command's pipes on 0/1/2 (systemd-run's own
stdout/stderr are the status pipe, so its messages never mix with the command's output),
reports its cgroup membership on the status fd, resets signal dispositions and mask, changes to
the working directory and ``execve``s. The status fd is close-on-exec, so a successful exec
shows up as EOF; a failed one writes a frame and exits 127 (not found) or 126.

argv: ``_launcher.py SPEC_FD STATUS_FD STDIN_FD STDOUT_FD STDERR_FD``. Frames on the status fd
are a NUL byte, one JSON object and a newline: ``{"op": "launched", "cgroup": "<text of
/proc/self/cgroup>"}`` then, on failure, ``{"op": "spawn_error", "errno": N, "error": "..."}``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys


def frame(fd: int, message: dict[str, object]) -> None:
    data = b"\0" + json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data) :]


def main() -> None:
    spec_fd, status_fd, in_fd, out_fd, err_fd = (int(x) for x in sys.argv[1:6])
    with os.fdopen(spec_fd, "rb") as f:
        spec = json.loads(f.read())
    for source, target in ((in_fd, 0), (out_fd, 1), (err_fd, 2)):
        os.dup2(source, target)
    for fd in {in_fd, out_fd, err_fd}:
        os.close(fd)
    os.set_inheritable(status_fd, False)
    with open("/proc/self/cgroup") as f:  # noqa: PTH123
        frame(status_fd, {"op": "launched", "cgroup": f.read()})
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
