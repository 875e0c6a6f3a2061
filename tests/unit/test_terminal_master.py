"""The host never trusts the supervisor with a terminal: the ``spawned`` of a run that asked for
one must bring exactly one fd, a pty master. A regular file, a pipe, a socket, the slave end or
``/dev/tty``-like devices are refused and closed, the run fails as a spawn error the host ends,
and the connection (and every neighbour on it) goes on. Real sockets and real ptys, no fakes."""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
from collections.abc import Callable

import pytest

from sandboxrun.backends.client import RunnerClient
from sandboxrun.engine.pty import PtyControl, check_master, check_size
from sandboxrun.errors import ConfigError

pytestmark = pytest.mark.anyio
HEADER = struct.Struct("!I")


def frame(msg: object) -> bytes:
    data = json.dumps(msg).encode()
    return HEADER.pack(len(data)) + data


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def regular_file() -> int:
    fd, path = tempfile.mkstemp()
    os.unlink(path)
    return fd


def slave_end() -> int:
    master, slave = os.openpty()
    os.close(master)
    return slave


def a_pipe() -> int:
    r, w = os.pipe()
    os.close(w)
    return r


def a_socket() -> int:
    a, b = socket.socketpair()
    b.close()
    return a.detach()


def dev_null() -> int:
    return os.open(os.devnull, os.O_RDWR)


FORGERIES: dict[str, Callable[[], int]] = {
    "regular file": regular_file,
    "slave end": slave_end,
    "pipe": a_pipe,
    "socket": a_socket,
    "/dev/null": dev_null,
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_check_master_refuses_what_is_not_a_pty_master(name: str) -> None:
    fd = FORGERIES[name]()
    try:
        assert check_master(fd) is not None
    finally:
        os.close(fd)


def test_check_master_accepts_a_real_master() -> None:
    master, slave = os.openpty()
    try:
        assert check_master(master) is None
        assert check_master(slave) is not None
    finally:
        os.close(master)
        os.close(slave)


async def ready_client() -> tuple[RunnerClient, socket.socket]:
    ours, peer = socket.socketpair()
    peer.sendall(frame({"op": "ready", "pid": 1, "layers": [], "ns": {}}))
    client = RunnerClient()
    await client.attach(ours, 5)
    return client, peer


@pytest.mark.parametrize("name", [*sorted(FORGERIES), "none", "two masters"])
async def test_a_forged_terminal_master_is_refused_closed_and_the_connection_goes_on(
    name: str,
) -> None:
    client, peer = await ready_client()
    before = open_fds()
    channel = client.open_channel("t1", tty=True)
    neighbour = client.open_channel("n1")
    sent: list[int] = []
    if name == "two masters":
        for _ in range(2):
            master, slave = os.openpty()
            os.close(slave)
            sent.append(master)
    elif name != "none":
        sent.append(FORGERIES[name]())
    data = frame({"op": "spawned", "id": "t1", "pid": 5, "fds": len(sent)})
    if sent:
        socket.send_fds(peer, [data], sent)
    else:
        peer.sendall(data)
    for fd in sent:
        os.close(fd)
    peer.sendall(frame({"op": "spawned", "id": "n1", "pid": 6}))
    await client.wait_for(lambda: channel.spawned is not None and neighbour.spawned is not None)
    assert client.dead is None
    assert channel.spawned is not None and channel.spawned["op"] == "spawn_error"
    assert "no terminal master" in channel.spawned["error"]
    assert channel.spawned.get("_host") is True  # it runs: the host must end it
    assert channel.master is None
    assert neighbour.spawned is not None and neighbour.spawned["op"] == "spawned"
    assert open_fds() <= before, "a refused descriptor was kept"
    client.close_channel("t1")
    peer.close()
    await client.close()


async def test_a_real_master_is_handed_to_the_run_and_a_closed_channel_closes_it() -> None:
    client, peer = await ready_client()
    before = open_fds()
    channel = client.open_channel("t1", tty=True)
    master, slave = os.openpty()
    socket.send_fds(peer, [frame({"op": "spawned", "id": "t1", "pid": 5, "fds": 1})], [master])
    os.close(master)
    await client.wait_for(lambda: channel.spawned is not None)
    assert channel.spawned is not None and channel.spawned["op"] == "spawned"
    assert channel.master is not None and check_master(channel.master) is None
    os.write(slave, b"hello")
    assert os.read(channel.master, 5) == b"hello"  # the very terminal that was sent
    client.close_channel("t1")  # never taken by a run: closed with the channel
    os.close(slave)
    assert open_fds() <= before
    peer.close()
    await client.close()


async def test_a_master_for_a_run_that_asked_for_no_terminal_is_closed() -> None:
    client, peer = await ready_client()
    before = open_fds()
    channel = client.open_channel("r1")
    master, slave = os.openpty()
    os.close(slave)
    socket.send_fds(peer, [frame({"op": "spawned", "id": "r1", "pid": 5, "fds": 1})], [master])
    os.close(master)
    await client.wait_for(lambda: channel.spawned is not None)
    assert channel.spawned is not None and channel.spawned["op"] == "spawned"
    assert channel.master is None
    assert open_fds() <= before
    peer.close()
    await client.close()


@pytest.mark.parametrize(
    ("rows", "cols"), [(0, 80), (24, 0), (-1, 80), (24, 10001), (True, 80), (2.5, 80)]
)
def test_a_terminal_size_out_of_range_is_refused_by_name(rows: object, cols: object) -> None:
    with pytest.raises(ConfigError, match=r"rows|cols"):
        check_size(rows, cols)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        PtyControl(rows, cols)  # type: ignore[arg-type]


def test_a_control_without_a_master_answers_nothing_and_raises_nothing() -> None:
    control = PtyControl(30, 100)
    assert control.foreground() is None and control.session() is None
    assert control.terminal_signal(2) is False
    control.resize(10, 20)
    assert (control.rows, control.cols) == (10, 20)
    with pytest.raises(ValueError, match="INT, QUIT and TSTP"):
        control.terminal_signal(9)


def test_a_run_on_a_terminal_never_silently_gets_pipes(tmp_path: object) -> None:
    """A backend that would run the command on pipes (the engine path, a scope) refuses it."""
    import dataclasses

    from sandboxrun.api.sandbox import Sandbox
    from sandboxrun.engine.launch import Stdio
    from sandboxrun.engine.results import NotStarted

    request = Sandbox(str(tmp_path), backend="process-group")._prepare(["true"])
    request = dataclasses.replace(request, tty=PtyControl())
    before = open_fds()
    with Stdio(request) as stdio, pytest.raises(NotStarted) as caught:
        stdio.pipes()
    assert caught.value.status == "sandbox_error" and "terminal" in str(caught.value)
    assert open_fds() <= before  # refused before any pipe was made
    assert request.tty is not None and request.tty.ended  # its control told: no terminal
