"""The host's side of the supervisor protocol treats the supervisor as untrusted (on docker it
lives inside the sandbox): oversized, malformed or fd-smuggling frames end the connection as
lost, never the host, and received fds are never leaked. Real sockets, no fakes."""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Callable

import pytest

from sandboxrun.errors import BackendError
from sandboxrun.runner_client import MAX_FRAME, RunnerClient

pytestmark = pytest.mark.anyio
HEADER = struct.Struct("!I")


def frame(msg: object) -> bytes:
    data = json.dumps(msg).encode()
    return HEADER.pack(len(data)) + data


def holding(target: str) -> list[str]:
    """Our fds that refer to ``target`` (a ``/proc/self/fd`` link text, e.g. ``pipe:[123]``)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                held.append(fd)
        except OSError:
            pass
    return held


async def attached(send: Callable[[socket.socket], None]) -> tuple[RunnerClient, socket.socket]:
    ours, theirs = socket.socketpair()
    theirs.sendall(frame({"op": "ready", "pid": 1, "layers": [], "ns": {}}))
    client = RunnerClient()
    await client.attach(ours, 5)
    send(theirs)
    channel = client.open_channel("r1")
    await client.wait_for(lambda: channel.spawned is not None or channel.lost)
    return client, theirs


async def test_an_oversized_frame_is_a_lost_supervisor() -> None:
    client, peer = await attached(lambda s: s.sendall(HEADER.pack(MAX_FRAME + 1)))
    assert client.dead and "frame" in client.dead
    with pytest.raises(BackendError):
        await client.terminate("r1", 0)
    peer.close()
    await client.close()


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1, 2]",
        b'{"no": "op"}',
        b'{"op": 7}',
        b'{"op": "spawned", "fds": 3}',
        b'{"op": "spawned", "id": ["r1"]}',
        b'{"op": "ready", "ns": 5}',
        b'{"op": "terminated", "id": "r1", "status": 1099511627776}',
        b'{"op": "terminated", "id": "r1", "cpu_s": NaN}',
        b'{"op": "terminated", "id": "r1", "survivors": -1}',
        b'{"op": "terminated", "id": "r1", "survivors": true}',
        b'{"op": "spawned", "id": "r1", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    ],
)
async def test_a_malformed_frame_is_a_lost_supervisor(payload: bytes) -> None:
    client, peer = await attached(lambda s: s.sendall(HEADER.pack(len(payload)) + payload))
    assert client.dead
    peer.close()
    await client.close()


async def test_fds_are_claimed_only_as_named_and_never_leaked() -> None:
    r, w = os.pipe()
    pipe = os.readlink(f"/proc/self/fd/{r}")

    def smuggle(sock: socket.socket) -> None:
        data = frame({"op": "spawned", "id": "r1", "pid": 5})
        socket.send_fds(sock, [data], [r, r, r, r, r, r, r, r, r])  # 9 fds no frame claims

    client, peer = await attached(smuggle)
    os.close(r)
    os.close(w)
    assert client.dead and "fds" in client.dead
    held = holding(pipe)
    assert not held, "a received fd was kept"
    peer.close()
    await client.close()


async def test_a_well_formed_reply_is_routed() -> None:
    client, peer = await attached(
        lambda s: s.sendall(frame({"op": "spawned", "id": "r1", "pid": 5}))
    )
    assert client.dead is None
    peer.close()
    await client.close()


async def test_fds_on_a_frame_that_carries_none_for_the_host_are_closed() -> None:
    r, w = os.pipe()
    pipe = os.readlink(f"/proc/self/fd/{r}")

    def send(sock: socket.socket) -> None:
        socket.send_fds(sock, [frame({"op": "spawned", "id": "r1", "pid": 5, "fds": 2})], [r, w])

    client, peer = await attached(send)
    os.close(r)
    os.close(w)
    assert client.dead is None  # well formed: routed, its fds dropped
    held = holding(pipe)
    assert not held, "an fd the host never asked for was kept"
    peer.close()
    await client.close()
