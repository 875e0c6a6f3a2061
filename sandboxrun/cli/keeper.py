"""The keeper of one detached sandbox: ``python -m sandboxrun.cli.keeper``.

Started by ``client.create`` with its configuration as JSON on stdin (secrets never in argv)
and the sandbox's lock file open (it holds the lock while it lives: that is how ``ls`` and a
second ``create`` of the name know it lives). It forks once more so its starter reaps it at once,
opens the sandbox, serves it on the socket (mode 0600, peers of its own uid or root only),
writes one line on stdout (``{"ready": info}`` or ``{"error": ...}``) and closes it.

It ends, removing the sandbox with every process, its socket and its state, on ``rm``, when
its TTL or idle TTL runs out, or on SIGTERM/SIGINT/SIGHUP. A client that goes away mid-exec
cancels that run only (it is killed as any cancelled run)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import signal
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from sandboxrun.detached import protocol
from sandboxrun.detached.place import Place
from sandboxrun.errors import InputError, SandboxrunError

if TYPE_CHECKING:
    from sandboxrun.api.sandbox import Sandbox
    from sandboxrun.engine.request import StdinStream
    from sandboxrun.models import ExecResult

log = logging.getLogger("sandboxrun")

SCOPE = re.compile(r"/sandboxrun-[0-9a-f]+\.scope(/|$)")
"""A cgroup path inside a run's systemd scope."""
HIGH_WATER = 1 << 20
"""Output bytes queued for a client before the run is held back (the command blocks)."""
END_RUNS_S = 10.0
"""On top of the grace: how long the commands still running at the end get to be killed and
reported to their clients before the rest is cancelled."""
CLIENT_GONE = (
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    anyio.IncompleteRead,
    OSError,
)
"""What a connection raises once its client is gone."""
LAST_SEND_S = 30.0
"""After its run, how long a client gets to take the rest of its output and the result."""
CLOSE_S = 30.0
"""A bound on closing the sandbox itself (the backends' own budgets are below it)."""
TICK_S = 0.5
LIST_PART = 1000
"""Directory entries per frame of a ``list_dir`` answer (well below ``protocol.MAX_LINE``)."""
"""How often the TTLs are looked at (at most)."""


def peer_creds(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of a unix socket (``SO_PEERCRED``; pid
    0 when it is not visible from here)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return int(pid), int(uid)


def refusal(pid: int, uid: int, keeper: int | None = None) -> str | None:
    """Why the peer ``pid`` of ``uid`` may not use this keeper, or None: it must be this uid
    or root, and not a sandboxed command (which runs as the same uid): one inside namespaces
    other than the keeper's (bubblewrap, a container), below the keeper, carrying a run's
    marker, or in a sandboxrun scope. A command of one sandbox would otherwise drive another
    one, with that one's policy, through its keeper."""
    from sandboxrun.supervisor import procfs

    keeper = os.getpid() if keeper is None else keeper
    if uid not in (os.getuid(), 0):
        return f"uid {uid}"
    if pid <= 0:
        return "a process out of sight (another pid namespace)"
    for ns in ("mnt", "pid"):
        try:
            theirs, ours = (Path(f"/proc/{p}/ns/{ns}").readlink() for p in (pid, keeper))
            if theirs != ours:
                return f"a process in another {ns} namespace"
        except OSError:
            return "a process whose namespaces cannot be read"
    if procfs.marker_of(pid) is not None:
        return "a command of a sandbox (its run marker)"
    if any(SCOPE.search(path) for _, path in procfs.cgroup_lines(pid)):
        return "a command of a sandbox (its scope)"
    table = procfs.process_table()
    seen: set[int] = set()
    at = pid
    while at in table and at not in seen and at > 1:
        if at == keeper:
            return "a command of this sandbox"
        seen.add(at)
        at = table[at].ppid
    return None


class Forward:
    """The live sink of one exec: output queued for the client (``congested`` past
    ``HIGH_WATER``, so the command is held back rather than memory growing), and the keeper's
    own frames for it (stdin credit), all sent by ``pump``, the connection's one sender. A
    client that cannot be written to any more is lost: ``on_lost`` (its run is cancelled),
    the rest dropped, nothing held back."""

    def __init__(self, on_lost: Callable[[], None]) -> None:
        self.queue: deque[tuple[str, bytes]] = deque()
        self.queued = 0
        self.taken = 0
        self.lost = False
        self.on_lost = on_lost
        self.wake = anyio.Event()

    def __call__(self, name: str, chunk: bytes) -> None:
        if self.lost:
            return
        self.queue.append((name, chunk))
        self.queued += len(chunk)
        self.wake.set()

    def control(self, frame: bytes) -> None:
        """A frame of the keeper's own, sent in order with the output."""
        if not self.lost:
            self.queue.append(("", frame))
            self.wake.set()

    def congested(self, name: str) -> bool:
        return self.queued > HIGH_WATER and not self.lost

    def progress(self) -> int:
        return self.taken

    def lossy(self, name: str) -> bool:
        return self.lost

    def lose(self) -> None:
        if not self.lost:
            self.lost = True
            self.queue.clear()
            self.queued = 0
            self.on_lost()

    async def pump(self, stream: anyio.abc.ByteStream, done: anyio.Event) -> None:
        """Send what is queued until ``done`` is set and nothing is left. Once ``done``, a
        client that does not take the rest within ``LAST_SEND_S`` is lost."""
        try:
            while True:
                while self.queue and not self.lost:
                    name, chunk = self.queue.popleft()
                    if name:
                        self.queued -= len(chunk)
                        self.taken += 1
                    frames = (
                        [chunk]
                        if not name
                        else [
                            protocol.data_frame("out", name, chunk[at : at + protocol.CHUNK])
                            for at in range(0, len(chunk), protocol.CHUNK)
                        ]
                    )
                    for data in frames:
                        with anyio.move_on_after(LAST_SEND_S if done.is_set() else math.inf):
                            await stream.send(data)
                            continue
                        self.lose()  # a client that stopped reading, after the run
                        break
                if done.is_set() and (self.lost or not self.queue):
                    return
                self.wake = anyio.Event()
                if not self.queue:
                    with anyio.move_on_after(0.05):  # (a sink called off the loop: looked again)
                        await self.wake.wait()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self.lose()


class StdinFeed:
    """A client's stdin frames handed to the command without ever holding up the reading of
    the client's frames (a ``cancel`` is seen at once, however full the command's stdin):
    the client sends at most ``protocol.STDIN_WINDOW`` bytes ahead; each chunk written to the
    command gives it that much credit back."""

    def __init__(self, stdin: StdinStream, sink: Forward) -> None:
        self.stdin = stdin
        self.sink = sink
        self.chunks: deque[bytes | None] = deque()
        self.held = 0
        self.wake = anyio.Event()

    def put(self, data: bytes | None) -> None:
        """A chunk (None: EOF); ``ProtocolError`` when the client sends past its window."""
        if data is not None:
            self.held += len(data)
            if self.held > protocol.STDIN_WINDOW:
                raise protocol.ProtocolError("stdin sent past its window")
        self.chunks.append(data)
        self.wake.set()

    async def feed(self) -> None:
        while True:
            while self.chunks:
                data = self.chunks.popleft()
                if data is None:
                    self.stdin.close()
                    return
                with suppress(BrokenPipeError):  # the command closed its stdin: dropped
                    await self.stdin.send(data)
                self.held -= len(data)
                self.sink.control(protocol.encode({"credit": len(data)}))
            self.wake = anyio.Event()
            await self.wake.wait()


class Keeper:
    """One open sandbox served on ``place.socket``."""

    def __init__(self, place: Place, config: dict[str, Any]) -> None:
        self.place = place
        self.config = config
        self.ttl_s: float | None = config.get("ttl_s")
        self.idle_ttl_s: float | None = config.get("idle_ttl_s")
        self.created = time.time()
        self.started = time.monotonic()
        self.last_active = self.started
        self.running = 0
        self.execs = 0
        self.stop = anyio.Event()
        self.why = ""
        self.removers: list[anyio.abc.ByteStream] = []
        self.runs: set[anyio.CancelScope] = set()
        """The cancel scopes of the commands running (``end_runs``)."""
        self.answering = 0
        """Execs whose last frame is not sent yet: a run that is over still sends its output
        and result; ending waits for them too (within its bound)."""
        self.sb: Sandbox | None = None

    # -- life ------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        sb = self.sb
        now = time.monotonic()
        return {
            "name": self.place.name,
            "pid": os.getpid(),
            "uid": os.getuid(),
            "backend": sb.backend.name if sb is not None and sb._opened else None,
            "workspace": str(sb.workspace.root) if sb is not None else None,
            "image": sb.image if sb is not None else None,
            "created": self.created,
            "ttl_s": self.ttl_s,
            "idle_ttl_s": self.idle_ttl_s,
            "expires_in_s": None if self.ttl_s is None else self.ttl_s - (now - self.started),
            "idle_expires_in_s": None
            if self.idle_ttl_s is None or self.running
            else self.idle_ttl_s - (now - self.last_active),
            "running": self.running,
            "execs": self.execs,
        }

    def end(self, why: str) -> None:
        if not self.stop.is_set():
            self.why = why
            self.stop.set()

    async def expiry(self) -> None:
        while True:
            now = time.monotonic()
            waits = [TICK_S]
            if self.ttl_s is not None:
                left = self.ttl_s - (now - self.started)
                if left <= 0:
                    self.end("its TTL ran out")
                    return
                waits.append(left)
            if self.idle_ttl_s is not None and not self.running:
                left = self.idle_ttl_s - (now - self.last_active)
                if left <= 0:
                    self.end("its idle TTL ran out")
                    return
                waits.append(left)
            await anyio.sleep(min(waits))

    async def signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as got:
            async for sig in got:
                self.end(f"signal {signal.Signals(sig).name}")
                return

    async def run(self, ready: Any) -> int:
        """Open, serve until told to end, remove. ``ready``: the creator's stdout."""
        from sandboxrun.api.sandbox import Sandbox
        from sandboxrun.cli.report import use_secrets
        from sandboxrun.models import Limits, Policy

        spec = dict(self.config["sandbox"])
        spec["policy"] = Policy(**spec["policy"]) if spec.get("policy") else None
        spec["limits"] = Limits(**spec["limits"]) if spec.get("limits") else None
        try:
            self.sb = Sandbox(**spec)
            use_secrets(None if not self.sb.policy.mask_output else self.sb._env)
            await self.sb.open()
            self.place.socket.unlink(missing_ok=True)  # a dead keeper's (the lock is ours)
            listener = await anyio.create_unix_listener(self.place.socket)
            self.place.socket.chmod(0o600)
        except BaseException as exc:
            if self.sb is not None:
                with anyio.CancelScope(shield=True):
                    await self.sb.aclose()
            say_ready(ready, protocol.error_frame(exc))
            return 1
        try:
            state = self.place.state.with_suffix(".json.tmp")
            state.write_text(json.dumps(self.info()))
            state.chmod(0o600)
            state.replace(self.place.state)
            if not say_ready(ready, protocol.encode({"ready": self.info()})):
                self.end("its creator gave up waiting for it")
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.expiry)
                tg.start_soon(self.signals)
                tg.start_soon(self.serve, listener)
                await self.stop.wait()
                await self.end_runs()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await listener.aclose()
                self.place.socket.unlink(missing_ok=True)
                await self.sb.aclose()
                self.place.state.unlink(missing_ok=True)
                warnings = list(self.sb.close_errors)
                for stream in self.removers:
                    with suppress(Exception):
                        await stream.send(
                            protocol.encode({"removed": {"why": self.why, "warnings": warnings}})
                        )
                        await stream.aclose()
                for warning in warnings:
                    print(f"sandboxrun: keeper: {warning}", file=sys.stderr, flush=True)
                print(f"sandboxrun: keeper: removed: {self.why}", file=sys.stderr, flush=True)
        return 0

    def end_bound(self) -> float:
        """How long ending may take at most: the commands' kill, then the sandbox's close."""
        grace = self.sb.limits.grace_s if self.sb is not None else 0.0
        return grace + END_RUNS_S + CLOSE_S

    async def end_runs(self) -> None:
        """Cancel the commands still running (each is killed: TERM, grace, KILL) and let their
        clients have their results, within a bound; whatever is left then is cancelled."""
        for scope in list(self.runs):
            scope.cancel()
        grace = self.sb.limits.grace_s if self.sb is not None else 0.0
        with anyio.move_on_after(grace + END_RUNS_S):
            while self.running or self.answering:  # noqa: ASYNC110 - counts, polled at shutdown
                await anyio.sleep(0.02)

    # -- serving ---------------------------------------------------------------------------
    async def serve(self, listener: Any) -> None:
        async with anyio.create_task_group() as tg:
            while True:
                stream = await listener.accept()
                tg.start_soon(self.handle, stream)

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        keep = False
        try:
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610
            why = refusal(*peer_creds(raw))
            if why is not None:
                log.warning("sandboxrun: keeper: refused a client: %s", why)
                return
            reader = BufferedByteReceiveStream(stream)
            try:
                first = protocol.decode(await reader.receive_until(b"\n", protocol.MAX_LINE))
                op = first.get("op")
                if op == "exec":
                    await self.exec(first, reader, stream)
                elif op == "info":
                    await stream.send(protocol.encode({"info": self.info()}))
                elif op in ("read_file", "write_file", "list_dir"):
                    await self.files(op, first, reader, stream)
                elif op == "rm":
                    force = bool(first.get("force"))
                    self.check_remove(force)
                    await stream.send(protocol.encode({"removing": {"within_s": self.end_bound()}}))
                    self.removers.append(stream)  # the last word comes once all is gone
                    keep = True
                    self.end("removed by rm" + (" --force" if force else ""))
                else:
                    raise protocol.ProtocolError(f"unknown op {op!r}")
            except SandboxrunError as exc:  # first: a SandboxFileError is an OSError too
                with suppress(Exception):
                    await stream.send(protocol.error_frame(exc))
            except CLIENT_GONE:
                raise
            except Exception as exc:
                error = own_error(exc)
                if not isinstance(error, SandboxrunError | anyio.DelimiterNotFound):
                    log.exception("sandboxrun: keeper: a request failed")
                with suppress(Exception):
                    await stream.send(protocol.error_frame(error))
        except CLIENT_GONE:
            pass
        except anyio.get_cancelled_exc_class():
            if not keep:  # ending: a request caught in the middle hears why, not a bare close
                with anyio.CancelScope(shield=True), anyio.move_on_after(1.0), suppress(Exception):
                    gone = InputError(f"sandbox {self.place.name} was removed: {self.why}")
                    await stream.send(protocol.error_frame(gone))
            raise
        finally:
            if not keep:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()

    async def files(
        self,
        op: str,
        frame: dict[str, Any],
        reader: BufferedByteReceiveStream,
        stream: anyio.abc.SocketStream,
    ) -> None:
        """The files API, as ``Sandbox``'s (its errors, typed, in the error frame): the
        content in ``protocol.CHUNK`` pieces, each way; what a client sends is bounded
        (``protocol.WRITE_MAX``). A file operation is activity (the idle TTL starts again)."""
        sb = self.sb
        assert sb is not None
        if self.stop.is_set():
            raise InputError(f"sandbox {self.place.name} is being removed ({self.why})")
        path = frame.get("path")
        if not isinstance(path, str):
            raise protocol.ProtocolError(f"{op} takes a 'path' string")
        self.last_active = time.monotonic()
        if op == "read_file":
            data = await sb.read_file(path, max_bytes=int(frame.get("max_bytes") or 16 << 20))
            for at in range(0, len(data), protocol.CHUNK):
                await stream.send(
                    protocol.data_frame("chunk", "file", data[at : at + protocol.CHUNK])
                )
            await stream.send(protocol.encode({"file": {"size": len(data)}}))
        elif op == "write_file":
            size = frame.get("size")
            if not isinstance(size, int) or not 0 <= size <= protocol.WRITE_MAX:
                raise InputError(
                    f"write_file takes at most {protocol.WRITE_MAX} bytes through a keeper"
                )
            got = bytearray()
            while len(got) < size:
                part = protocol.decode(await reader.receive_until(b"\n", protocol.MAX_LINE))
                got += protocol.data_of(part)
                if len(got) > size:
                    raise protocol.ProtocolError("write_file sent more than its size")
            await sb.write_file(
                path,
                bytes(got),
                mode=int(frame.get("mode", 0o644)),
                parents=bool(frame.get("parents")),
            )
            await stream.send(protocol.encode({"written": {"size": size}}))
        else:
            entries = await sb.list_dir(path, max_entries=int(frame.get("max_entries") or 10_000))
            rows = [dataclasses.asdict(entry) for entry in entries]
            for at in range(0, len(rows), LIST_PART):
                await stream.send(protocol.encode({"entries": rows[at : at + LIST_PART]}))
            await stream.send(protocol.encode({"listed": {"count": len(rows)}}))
        self.last_active = time.monotonic()

    def check_remove(self, force: bool) -> None:
        """``rm``: refused while commands run, unless ``force``."""
        if self.running and not force:
            raise InputError(
                f"sandbox {self.place.name} has {self.running} command(s) running: "
                f"`sandboxrun rm --force {self.place.name}` ends them"
            )

    async def exec(
        self,
        frame: dict[str, Any],
        reader: BufferedByteReceiveStream,
        stream: anyio.abc.SocketStream,
    ) -> None:
        if self.stop.is_set():
            raise InputError(f"sandbox {self.place.name} is being removed ({self.why})")
        self.answering += 1
        try:
            await self.answer(frame, reader, stream)
        finally:
            self.answering -= 1

    async def answer(
        self,
        frame: dict[str, Any],
        reader: BufferedByteReceiveStream,
        stream: anyio.abc.SocketStream,
    ) -> None:
        """One exec, from its frame to its last frame (the result)."""
        from sandboxrun.engine.request import StdinStream

        sb = self.sb
        assert sb is not None
        argv = frame.get("argv")
        shell = frame.get("shell")
        if (argv is None) == (shell is None):
            raise protocol.ProtocolError("exec takes one of 'argv' and 'shell'")
        run = anyio.CancelScope()
        sink = Forward(on_lost=run.cancel)
        stdin = StdinStream() if frame.get("stdin") else None
        feed = StdinFeed(stdin, sink) if stdin is not None else None
        request = sb._prepare(
            argv,
            shell=shell,
            workdir=frame.get("workdir"),
            env=frame.get("env") or None,
            timeout=frame.get("timeout"),
            idle_timeout=frame.get("idle_timeout"),
            sink=sink,
        )
        if stdin is not None:
            request = dataclasses.replace(request, stdin=stdin)
        helpers = anyio.CancelScope()
        done = anyio.Event()
        result: ExecResult | None = None
        self.running += 1
        self.execs += 1
        self.runs.add(run)

        async def listen() -> None:
            with helpers:
                async with anyio.create_task_group() as inner:
                    if feed is not None:
                        inner.start_soon(feed.feed)
                    await self.listen(reader, feed, run)
                    inner.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(sink.pump, stream, done)  # the one sender of frames
                tg.start_soon(listen)
                with run:
                    try:
                        result = await sb._run_request(request)
                    finally:
                        if result is None:
                            result = sb.last_result
                        self.runs.discard(run)
                        self.running -= 1  # the run is over; its client may still be taking output
                        self.last_active = time.monotonic()
                        done.set()  # the pump sends what is queued, then ends
                        sink.wake.set()
                        helpers.cancel()
        finally:
            if run in self.runs:  # (never started)
                self.runs.discard(run)
                self.running -= 1
                self.last_active = time.monotonic()
        if result is None:  # cancelled before the command started (the client went away)
            raise InputError("cancelled before the command started")
        if sink.lost:
            return
        with anyio.move_on_after(LAST_SEND_S):
            await stream.send(protocol.encode(self.final(result, request.timeout_s, frame)))

    async def listen(
        self, reader: BufferedByteReceiveStream, feed: StdinFeed | None, run: anyio.CancelScope
    ) -> None:
        """The client's frames while its exec runs: stdin, EOF, cancel; never held up by the
        command. The client gone (its connection ended before the result) or speaking out of
        turn cancels the run."""
        try:
            while True:
                line = await reader.receive_until(b"\n", protocol.MAX_LINE)
                frame = protocol.decode(line)
                op = frame.get("op")
                if op == "cancel":
                    run.cancel()
                elif op == "stdin" and feed is not None:
                    feed.put(protocol.data_of(frame))
                elif op == "eof" and feed is not None:
                    feed.put(None)
        except (
            anyio.EndOfStream,
            anyio.IncompleteRead,
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            anyio.DelimiterNotFound,
            protocol.ProtocolError,
            OSError,
        ):
            run.cancel()

    def final(self, result: ExecResult, timeout_s: float, frame: dict[str, Any]) -> dict[str, Any]:
        """The exec's last frame: the result (``--json``'s line), the CLI's exit status and the
        lines it says on stderr, as ``sandboxrun run`` would."""
        from sandboxrun.cli.report import exit_status, result_json, shown_line, summary

        sb = self.sb
        assert sb is not None
        json_out = bool(frame.get("json"))
        notes: list[str] = []
        if result.fallback_reason:
            notes.append(f"warning: falling back to {result.backend}: {result.fallback_reason}")
        if result.missing_guarantees:
            missing = ", ".join(result.missing_guarantees)
            notes.append(f"warning: {result.backend} cannot enforce: {missing}")
        if not json_out:
            notes += [f"warning: {w}" for w in result.warnings]
        line = summary(
            result,
            None,
            shown_live=not json_out,
            spill_kept=False,  # as run's default: they go with the sandbox
            timeout_s=timeout_s,
            memory_bytes=sb.limits.memory_bytes,
        )
        if self.stop.is_set():
            notes.append(f"the sandbox was removed: {self.why}")
        lines = [shown_line(f"sandboxrun: {n}") for n in notes]
        if line:
            lines.append(shown_line(line))
        return {"result": result_json(result), "exit": exit_status(result), "notes": lines}


def own_error(exc: BaseException) -> BaseException:
    """The error to report for ``exc``: sandboxrun's own inside a task group's exception group
    (a run's ``InputError``), else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if isinstance(e, SandboxrunError)]
        exc = inner[0] if inner else exc.exceptions[0]
    return exc


def say_ready(out: Any, line: bytes) -> bool:
    """The one line for the starter, then EOF (it stops waiting). False when the starter is
    gone (it gave up waiting): nobody knows of this sandbox, it must not live on."""
    try:
        out.write(line)
    except OSError:
        return False
    finally:
        with suppress(OSError):
            out.close()
    return True


def main() -> int:
    """The keeper's entry: read the configuration, fork (the starter reaps the parent), run."""
    config = json.loads(sys.stdin.buffer.read() or b"{}")
    ready = sys.stdout.buffer
    place = Place(Path(config["dir"]), config["name"])
    if os.fork():
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    ready_fd = os.dup(1)
    os.dup2(devnull, 1)  # the starter's pipe is written once, through ready_fd
    os.close(devnull)
    ready = os.fdopen(ready_fd, "wb", buffering=0)
    lock_fd = int(config["lock_fd"])
    os.set_inheritable(lock_fd, False)  # held for life; the sandbox's processes never get it
    os.pwrite(lock_fd, f"{os.getpid()}\n".encode(), 0)  # for `rm --force`, even while starting
    try:
        return anyio.run(Keeper(place, config).run, ready)
    finally:
        with suppress(OSError):
            ready.close()


if __name__ == "__main__":
    sys.exit(main())
