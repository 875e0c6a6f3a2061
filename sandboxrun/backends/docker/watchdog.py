"""The owner's watchdog of a sandbox container without a supervisor (the engine's exec path).

With a supervisor in the container, the host's death (even SIGKILL) ends every run: the
supervisor sees its socket's EOF (``rendezvous``). Without one (an image without python3,
``SANDBOXRUN_DOCKER_SUPERVISOR=0``), nothing in the container would notice, and its runs, the
terminals' too, would live on until ``sandboxrun clean``. So the owner starts this watchdog
when it opens such a container: a small process of its own session that holds the read end of
a pipe whose write end only the owner has (close-on-exec). When the owner closes the sandbox
it writes ``STOP`` and the watchdog exits; when the owner dies the pipe ends without it, and
the watchdog removes the container (force: every process in it dies) and exits.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

STOP = b"stop"
REMOVE_BUDGET_S = 30.0


_KEPT: list[Watchdog] = []
"""Watchdogs of containers the owner could not remove: they remove them once it is gone."""


class Watchdog:
    """The owner's end: ``stop`` once the container is gone (or about to be, by the owner)."""

    def __init__(self, container_id: str) -> None:
        read_end, self._write_end = os.pipe2(os.O_CLOEXEC)
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-m", "sandboxrun.backends.docker.watchdog", container_id],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a ^C or hang-up of the owner's group spares it
                close_fds=True,
            )
        except BaseException:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)

    def keep(self) -> None:
        """The owner could not remove the container: the watchdog stays until the owner is
        gone, then removes it."""
        _KEPT.append(self)

    def stop(self) -> None:
        """The owner ends the container itself: the watchdog exits without touching it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._write_end, STOP)
        with contextlib.suppress(OSError):
            os.close(self._write_end)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str]) -> int:
    """Wait for the owner's pipe to end: ``STOP`` first, nothing to do; else remove the
    container (the owner died)."""
    container_id = argv[1]
    said = b""
    while chunk := os.read(0, 64):
        said += chunk
        if said == STOP:
            return 0
    from sandboxrun.backends.docker import api as dockerapi

    try:
        client = dockerapi.connect()
    except Exception:
        return 1
    try:
        error = dockerapi.remove_container(
            client, container_id, budget_s=REMOVE_BUDGET_S, attempt_s=REMOVE_BUDGET_S / 3
        )
    finally:
        client.close()
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
