"""The supervisor's socket protocol, one definition for both ends: the runner
(``supervisor/runner.py``, inside the sandbox) and its host client (``backends/client.py``).

A stream socket; every message is a 4-byte big-endian length (``HEADER``) and a JSON object; fds
travel with SCM_RIGHTS beside the frame they belong to (at most ``MAX_FDS``). The host still
validates every frame it receives (``backends.client.valid_message``): the supervisor lives
inside the sandbox and is never trusted for isolation.

Stdlib only, importing nothing its users do not import anyway (``struct``, ``socket``,
``array``; the per-run launcher does not import it): the runner imports it before it connects,
whether it runs as ``sandboxrun.supervisor.runner`` or as a script next to this file.
"""

from __future__ import annotations

import array
import socket
import struct

HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 20
"""The largest frame the host accepts from a supervisor."""
MAX_SEND = 1 << 16
"""The largest frame a supervisor sends: a reply that would be larger is replaced by an
``error`` about it, so no request can grow a frame toward ``MAX_FRAME``."""
MAX_FDS = 8
"""fds one frame may carry (a spawn's stdio is 3)."""
MAX_TEXT = 2000
"""Characters of any string a supervisor sends (errors, paths) at most (``clip``)."""
KILL_BUDGET_S = 5.0
"""How long after the grace period SIGKILL is repeated before survivors are reported."""
ORPHANED_GRACE_S = 1.0
"""The grace of runs whose host went away (its socket closed): nothing is left within the
bound the host promises (a few seconds), even of a TERM-ignoring command."""
MARKER_VAR = "SANDBOXRUN_RUN_ID"
"""The environment variable that marks every process of a run with the run's id."""
MARKER = MARKER_VAR.encode() + b"="


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` as a supervisor may send it: at most ``limit`` characters, a cut one marked
    with its whole size (``…(1200008 bytes)``)."""
    if len(text) <= limit:
        return text
    size = len(text.encode("utf-8", "surrogateescape"))
    return text[:limit] + f"\u2026({size} bytes)"


def recv_fds(sock: socket.socket, bufsize: int, maxfds: int) -> tuple[bytes, list[int], int]:
    """``socket.recv_fds`` with the descriptors close-on-exec from the start
    (``MSG_CMSG_CLOEXEC``: Python 3.11's ``recv_fds`` drops the flags it is given, so a
    received descriptor could reach the next command spawned). ``(data, fds, msg_flags)``."""
    fds = array.array("i")
    data, ancdata, flags, _ = sock.recvmsg(
        bufsize, socket.CMSG_LEN(maxfds * fds.itemsize), socket.MSG_CMSG_CLOEXEC
    )
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return data, list(fds), flags
