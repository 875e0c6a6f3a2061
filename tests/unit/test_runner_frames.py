"""The host's side of the supervisor protocol treats the supervisor as untrusted (on docker it
lives inside the sandbox): an oversized or malformed frame fails the one request it names (the
stream is resynchronized by its length), one that names none or smuggles fds ends the
connection as lost, never the host, and received fds are never leaked. The supervisor's own
side never sends a frame over its bound. Real sockets, no fakes."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable

import anyio
import anyio.to_thread
import pytest

from sandboxrun.backends.client import RunnerClient
from sandboxrun.errors import BackendError
from sandboxrun.supervisor.protocol import MAX_FRAME

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


async def ready_client() -> tuple[RunnerClient, socket.socket]:
    """A client attached to a peer that said ready: the client and the peer's end."""
    ours, peer = socket.socketpair()
    peer.sendall(frame({"op": "ready", "pid": 1, "layers": [], "ns": {}}))
    client = RunnerClient()
    await client.attach(ours, 5)
    return client, peer


async def attached(send: Callable[[socket.socket], None]) -> tuple[RunnerClient, socket.socket]:
    client, theirs = await ready_client()
    send(theirs)
    channel = client.open_channel("r1")
    await client.wait_for(lambda: channel.spawned is not None or channel.lost)
    return client, theirs


async def test_an_oversized_frame_fails_its_request_alone() -> None:
    """A reply over ``MAX_FRAME``: its request (named by the frame's head) fails, its bytes
    are read and dropped, and the next frame is routed as usual."""
    big = frame({"op": "spawn_error", "id": "r1", "errno": 2, "error": "x" * (MAX_FRAME + 10)})
    after = frame({"op": "spawned", "id": "r2", "pid": 7})
    client, peer = await ready_client()
    one, two = client.open_channel("r1"), client.open_channel("r2")
    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, lambda: peer.sendall(big + after))
        with anyio.fail_after(10):
            await client.wait_for(lambda: two.spawned is not None)
    assert client.dead is None
    assert one.spawned is not None and one.spawned["op"] == "spawn_error"
    assert "bytes" in str(one.spawned["error"]) and len(str(one.spawned["error"])) < 200
    assert two.spawned == {"op": "spawned", "id": "r2", "pid": 7, "_fds": []}
    peer.close()
    await client.close()


async def test_an_oversized_frame_that_names_no_request_is_a_lost_supervisor() -> None:
    client, peer = await attached(lambda s: s.sendall(HEADER.pack(MAX_FRAME + 1) + b"\x00" * 300))
    assert client.dead and "names no request" in client.dead
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
    ],
)
async def test_a_malformed_frame_that_names_no_request_is_a_lost_supervisor(
    payload: bytes,
) -> None:
    client, peer = await attached(lambda s: s.sendall(HEADER.pack(len(payload)) + payload))
    assert client.dead
    peer.close()
    await client.close()


@pytest.mark.parametrize(
    "payload",
    [
        b'{"op": "terminated", "id": "r1", "status": 1099511627776}',
        b'{"op": "terminated", "id": "r1", "cpu_s": NaN}',
        b'{"op": "terminated", "id": "r1", "survivors": -1}',
        b'{"op": "terminated", "id": "r1", "survivors": true}',
        b'{"op": "spawned", "id": "r1", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}",
        b'{"op": "spawned", "id": "r1", "pid": "five"',
    ],
)
async def test_a_malformed_frame_fails_the_request_it_names_alone(payload: bytes) -> None:
    client, peer = await attached(lambda s: s.sendall(HEADER.pack(len(payload)) + payload))
    assert client.dead is None
    failed = client._channels["r1"].spawned  # the request it names: failed
    assert failed is not None and failed["op"] == "spawn_error", failed
    assert "malformed" in str(failed["error"])
    channel = client.open_channel("r1")  # a fresh channel: the old one's failure was routed
    assert channel.spawned is None
    peer.sendall(frame({"op": "spawned", "id": "r1", "pid": 5}))
    with anyio.fail_after(5):
        await client.wait_for(lambda: channel.spawned is not None)
    assert channel.spawned is not None and channel.spawned["pid"] == 5  # still in step
    peer.close()
    await client.close()


async def test_an_open_reply_without_its_fd_fails_that_open_alone() -> None:
    client, peer = await ready_client()

    def answer() -> None:
        head = peer.recv(4)
        request = json.loads(peer.recv(HEADER.unpack(head)[0]))
        reply = {"op": "opened", "id": request["id"], "kind": "file", "size": 1, "fds": 1}
        peer.sendall(frame(reply))  # no fd with it

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, answer)
        with anyio.fail_after(10), pytest.raises(OSError) as caught:
            await client.open_path("f", os.O_RDONLY)
    assert "without the descriptor" in str(caught.value)
    assert client.dead is None
    peer.close()
    await client.close()


async def test_an_open_nobody_answers_fails_within_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A supervisor that reads requests and never answers: the call fails at its deadline,
    and a slow supervisor is not declared dead for it."""
    monkeypatch.setattr("sandboxrun.backends.client.REQUEST_TIMEOUT_S", 0.3)
    client, peer = await ready_client()
    with anyio.fail_after(5), pytest.raises(BackendError) as caught:
        await client.open_path("f", os.O_RDONLY)
    assert "did not answer" in str(caught.value)
    assert client.dead is None
    peer.close()
    await client.close()


async def test_a_stopped_supervisor_is_declared_dead_and_killed() -> None:
    """The probe: the watched process is stopped (SIGSTOP): a waiting call is released with
    the reason at once, and the process is killed."""
    proc = subprocess.Popen(["sleep", "60"])
    client, peer = await ready_client()
    client.watch(proc.pid)
    channel = client.open_channel("r1")
    os.kill(proc.pid, signal.SIGSTOP)
    with anyio.fail_after(5):
        await client.wait_for(lambda: channel.lost)
    assert client.dead is not None and "supervisor was stopped" in client.dead
    assert proc.wait(timeout=5) == -signal.SIGKILL
    peer.close()
    await client.close()


def test_the_supervisor_clips_every_string_it_sends() -> None:
    from sandboxrun.supervisor.runner import MAX_SEND, MAX_TEXT, clip, describe_error

    assert clip("short") == "short"
    long = "\u00e9" * (MAX_TEXT + 5)
    cut = clip(long)
    assert cut.startswith("\u00e9" * MAX_TEXT) and cut.endswith(f"\u2026({len(long) * 2} bytes)")
    code, text = describe_error(FileNotFoundError(2, "No such file or directory", "/x" * 600_000))
    assert code == 2 and text.startswith("No such file or directory: ") and len(text) < 400
    code, text = describe_error(ValueError("v" * 1_000_000))
    assert code == 0 and len(text) < MAX_TEXT + 40
    assert len(frame({"op": "x", "error": text})) < MAX_SEND


def test_the_supervisor_never_sends_a_frame_over_its_bound() -> None:
    """A reply over ``MAX_SEND`` (with an fd or without) goes as an ``error`` of its request,
    without the fd; a small one as it is, with its fd."""
    from sandboxrun.supervisor.runner import MAX_SEND, Runner

    ours, theirs = socket.socketpair()
    runner = Runner(theirs)
    r, w = os.pipe()
    try:
        runner.send(op="opened", id="open-1", kind="y" * (MAX_SEND * 2))
        runner.send_fds([r], op="opened", id="open-2", kind="z" * (MAX_SEND * 2))
        runner.send_fds([r], op="opened", id="open-3", kind="file", size=1)
        got: list[dict[str, object]] = []
        ours.settimeout(5)
        buf, fds = b"", list[int]()
        while len(got) < 3:
            data, more, _, _ = socket.recv_fds(ours, 1 << 17, 4)
            buf, fds = buf + data, fds + more
            while len(buf) >= 4 and len(buf) >= 4 + HEADER.unpack_from(buf)[0]:
                size = HEADER.unpack_from(buf)[0]
                assert size <= MAX_SEND
                got.append(json.loads(buf[4 : 4 + size]))
                buf = buf[4 + size :]
        for item, rid in zip(got[:2], ("open-1", "open-2"), strict=True):
            assert item["op"] == "error" and item["id"] == rid and item["about"] == "opened"
        assert got[2] == {"op": "opened", "id": "open-3", "kind": "file", "size": 1, "fds": 1}
        assert len(fds) == 1  # only the small reply's fd travelled
        os.close(fds[0])
    finally:
        ours.close()
        theirs.close()
        os.close(r)
        os.close(w)


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


async def test_a_request_a_stopped_supervisor_does_not_read_ends_at_once() -> None:
    """A large request (a spawn's megabyte of argv) to a supervisor that does not read: the
    send probes it while the socket is full, and a stopped one is declared dead at once."""
    proc = subprocess.Popen(["sleep", "60"])
    client, peer = await ready_client()
    client.watch(proc.pid)
    os.kill(proc.pid, signal.SIGSTOP)
    with anyio.fail_after(5), pytest.raises(BackendError) as caught:
        await client.spawn(client.open_channel("r1"), {"argv": ["x" * 4_000_000]}, [])
    assert "supervisor was stopped" in str(caught.value)
    assert proc.wait(timeout=5) == -signal.SIGKILL
    peer.close()
    await client.close()


async def test_a_bad_reply_never_takes_or_drops_a_neighbours_fd(tmp_path: object) -> None:
    """A malformed reply to one open, then a good reply with its fd to another, in one
    receive: the first open fails alone, the second gets exactly its own file."""
    client, peer = await ready_client()
    client._opens.update({"open-1": None, "open-2": None})
    r, w = os.pipe()
    pipe = os.readlink(f"/proc/self/fd/{r}")
    bad = b'{"op": "open_error", "id": "open-1", "errno": -1}'
    peer.sendall(HEADER.pack(len(bad)) + bad)
    good = {"op": "opened", "id": "open-2", "kind": "file", "size": 1, "fds": 1}
    socket.send_fds(peer, [frame(good)], [r])
    os.close(r)
    with anyio.fail_after(5):
        await client.wait_for(lambda: client._opens["open-2"] is not None)
    first, second = client._opens["open-1"], client._opens["open-2"]
    assert client.dead is None
    assert first is not None and first["op"] == "open_error" and first["_fds"] == []
    assert second is not None and len(second["_fds"]) == 1
    assert os.readlink(f"/proc/self/fd/{second['_fds'][0]}") == pipe  # its own file
    os.close(second["_fds"][0])
    os.close(w)
    peer.close()
    await client.close()


def test_the_supervisor_gives_each_spawn_exactly_its_own_fds() -> None:
    """The runner (a real one) takes a request's fds only from the receive its first byte
    came in: a spawn sent without fds fails alone, and never takes the next spawn's."""
    from sandboxrun.backends.client import RUNNER

    host, child = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(RUNNER), str(child.fileno())], pass_fds=[child.fileno()]
    )
    child.close()
    out_r, out_w = os.pipe()
    null = os.open(os.devnull, os.O_RDWR)
    try:
        base = {"env": {}, "cwd": "/", "grace": 0.5}
        host.sendall(frame({"op": "spawn", "id": "a", "argv": ["true"], **base}))
        spawn_b = frame({"op": "spawn", "id": "b", "argv": ["echo", "mine"], **base})
        socket.send_fds(host, [spawn_b], [null, out_w, null])
        os.close(out_w)
        replies: dict[str, dict[str, object]] = {}
        buf = b""
        host.settimeout(10)
        while not {"a", "b"} <= replies.keys():
            buf += host.recv(65536)
            while len(buf) >= 4 and len(buf) >= 4 + HEADER.unpack_from(buf)[0]:
                size = HEADER.unpack_from(buf)[0]
                msg = json.loads(buf[4 : 4 + size])
                buf = buf[4 + size :]
                if msg.get("op") in ("spawned", "spawn_error"):
                    replies[msg["id"]] = msg
        assert replies["a"]["op"] == "spawn_error", replies
        assert "three stdio fds" in str(replies["a"]["error"])
        assert replies["b"]["op"] == "spawned", replies
        assert os.read(out_r, 100) == b"mine\n"  # b's output on b's own pipe
    finally:
        host.close()
        proc.wait(timeout=10)
        os.close(out_r)
        os.close(null)


def test_received_descriptors_are_close_on_exec_from_the_start() -> None:
    """Both ends receive with ``protocol.recv_fds``: Python 3.11's ``socket.recv_fds`` drops
    the ``MSG_CMSG_CLOEXEC`` it is given, and a descriptor that is not close-on-exec reaches
    whatever the receiver spawns next (the runner: a neighbour's command)."""
    import fcntl

    from sandboxrun.supervisor.protocol import recv_fds

    ours, theirs = socket.socketpair()
    r, w = os.pipe()
    os.set_inheritable(r, True)
    try:
        socket.send_fds(ours, [b"frame"], [r, w])
        data, fds, _ = recv_fds(theirs, 64, 4)
        assert data == b"frame" and len(fds) == 2
        assert all(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC for fd in fds)
        for fd in fds:
            os.close(fd)
    finally:
        for fd in (r, w):
            os.close(fd)
        ours.close()
        theirs.close()
