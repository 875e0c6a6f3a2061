"""inspect's sandbox tools server as a background job of the sample's sandbox (docs/inspect.md).

inspect's ``bash_session()`` (and its other stateful tools) talk to a server that
``inspect-sandbox-tools start-server`` leaves running in the sandbox. An exec of sandboxrun is
over only when nothing of it is alive, so a server started by an exec would die with it, and
every bash session with the server. The provider runs that one command as a background job
instead (``TOOLS_SCRIPT``): ``start-server`` runs exactly as in any sandbox, its output and exit
status are what the exec returns, and the job then holds the server, with everything it
starts, until the sandbox closes, which ends them like every job.
"""

from __future__ import annotations

import posixpath
import secrets
import time
from collections.abc import Sequence

import anyio

from sandboxrun.api.jobs import Job

TOOLS_CLI = "inspect-sandbox-tools"
MARK = "sandboxrun-tools-server-started"
START_TIMEOUT_S = 600.0
"""How long ``start-server`` may take when the exec gives no timeout (inspect's own wait)."""
POLL_S = 0.02
TOOLS_SCRIPT = (
    '"$0" start-server; s=$?; printf "\\n%s %s %s\\n" "$1" "$2" "$s" >&2; '
    '[ "$s" = 0 ] || exit "$s"; while :; do sleep 3600; done'
)
"""``sh -c TOOLS_SCRIPT CLI MARK NONCE``: start the server, say how that ended on stderr, and
then hold the server (the job's main process waits until it is killed)."""


def is_start_server(cmd: Sequence[str]) -> bool:
    """Whether ``cmd`` is inspect's ``start-server`` of its sandbox tools."""
    return len(cmd) == 2 and posixpath.basename(cmd[0]) == TOOLS_CLI and cmd[1] == "start-server"


def server_argv(cli: str) -> tuple[list[str], str]:
    """The job's argv for the tools ``cli``, and the nonce of its status line."""
    nonce = secrets.token_hex(8)
    return ["/bin/sh", "-c", TOOLS_SCRIPT, cli, MARK, nonce], nonce


def status_of(stderr: bytes, nonce: str) -> tuple[int, bytes] | None:
    """``(exit status, stderr before the status line)`` once ``start-server`` has ended."""
    line = f"\n{MARK} {nonce} ".encode()
    at = stderr.rfind(line)
    if at < 0:
        return None
    end = stderr.find(b"\n", at + len(line))
    if end < 0:
        return None
    try:
        return int(stderr[at + len(line) : end]), stderr[:at]
    except ValueError:
        return None


class _Reader:
    """One stream of a job, read on from where it stopped."""

    def __init__(self, job: Job, stream: str) -> None:
        self.job, self.stream, self.data, self._offset = job, stream, bytearray(), 0

    def catch_up(self) -> bytes:
        while chunk := self.job.read(self._offset, 1 << 20, stream=self.stream).data:  # type: ignore[arg-type]
            self.data += chunk
            self._offset += len(chunk)
        return bytes(self.data)


async def started(job: Job, nonce: str, timeout: float | None) -> tuple[int, bytes, bytes] | None:
    """Wait until ``start-server`` in ``job`` has ended: ``(exit status, stdout, stderr)``;
    None after ``timeout`` (the caller kills the job)."""
    deadline = time.monotonic() + (START_TIMEOUT_S if timeout is None else timeout)
    out, err = _Reader(job, "stdout"), _Reader(job, "stderr")
    while True:
        found = status_of(err.catch_up(), nonce)
        if found is not None:
            return found[0], out.catch_up(), found[1]
        if job.done:
            result = job.result
            code = 1 if result is None or result.exit_code is None else result.exit_code
            return code, out.catch_up(), err.catch_up()
        if time.monotonic() >= deadline:
            return None
        await anyio.sleep(POLL_S)
