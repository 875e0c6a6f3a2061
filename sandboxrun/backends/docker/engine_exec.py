"""One exec in the sandbox container, as the ``RunHandle`` that ``process.supervise`` drives."""

from __future__ import annotations

import signal
import socket
import time
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from sandboxrun.backends.docker import api as dockerapi
from sandboxrun.backends.docker import config as cfg
from sandboxrun.backends.docker.cgroup import RunCgroup, is_stub, stub_argv
from sandboxrun.backends.docker.demux import FrameDecoder, FrameError
from sandboxrun.engine import results
from sandboxrun.engine.capture.stream import StreamCapture
from sandboxrun.engine.launch import Launch
from sandboxrun.engine.pty import host_signaller
from sandboxrun.engine.pty_slave import SlaveLink, open_slave
from sandboxrun.engine.request import StdinStream
from sandboxrun.engine.results import Verdict
from sandboxrun.engine.supervise import KILL_BUDGET_S, Supervision, Termination
from sandboxrun.errors import BackendError
from sandboxrun.supervisor import procfs as proctree

if TYPE_CHECKING:
    from sandboxrun.backends.docker.session import ContainerSession

NO_ENGINE_TERMINAL = (
    "a terminal on docker's engine path (an image without python3) needs a local engine whose "
    "container cgroup this host may write (root): not available here (docs/terminals.md)"
)
CHUNK = 64 * 1024
YIELD_EVERY = 16
POLL_S = 0.25
SWEEP_TICK_S = 0.02
DEATH_WAIT_S = 1.0
LEFTOVER_DEATH_WAIT_S = 0.2
START_TIMEOUT_S = 10.0
"""How long an exec may take to appear in the container before the run is a sandbox error
(plus ``START_CPU_S`` of the container's CPU share, see ``start_timeout``)."""
START_CPU_S = 0.2
"""CPU time the runtime's start of an exec may need inside the container's cgroup: under a
CPU quota of ``cpus`` it takes ``START_CPU_S / cpus`` of wall time (20 s at 1 %)."""


def start_timeout(cpus: float | None) -> float:
    """How long to wait for an exec to appear: a wedged engine is a sandbox error, a start
    slowed by the container's own CPU quota (``runc init`` runs in its cgroup) is not."""
    return START_TIMEOUT_S + (START_CPU_S / cpus if cpus else 0.0)


START_POLL_S = 0.001
START_POLL_MAX_S = 0.02
START_FAST_S = 0.5
"""For this long the handshake polls every ``START_POLL_S`` (an engine starts an exec in tens
of ms, and every ms of polling delay is a ms of every exec); then it backs off."""
INSPECT_EVERY_S = 0.1


def wait_status_from_exit_code(code: int | None) -> int | None:
    """The engine reports a signal death as 128+N: turn it into a raw wait status."""
    if code is None or code < 0:
        return None
    if 128 < code < 128 + 65:
        return code - 128
    return (code & 0xFF) << 8


class DockerRun:
    def __init__(
        self, session: ContainerSession, launch: Launch, out: StreamCapture, err: StreamCapture
    ) -> None:
        self.session = session
        self.launch = launch
        self.request = request = launch.request
        self.captures = {"stdout": out, "stderr": err}
        self.decoder = FrameDecoder(lambda name, data: self.captures[name].feed(data))
        self.exec_id = ""
        self.exec_pid = 0
        self.exec_start: int | None = None  # the exec pid's start time (a reused pid is not it)
        self.oom_before: int | None = None
        self.sock: socket.socket | None = None
        self.keep: Any = None  # docker-py's socket wrapper, kept alive with the socket
        self.initial = b""  # stream bytes read with the exec-start response head
        self.eof = False
        self.eof_event = anyio.Event()
        self.stream_error: str | None = None
        self.exit_info: dict[str, Any] | None = None
        self.termination: Termination | None = None
        self.termed: set[tuple[int, int]] = set()
        self.had_leftovers = False
        self.stdin_left = request.stdin
        base = session.run_cgroup_base
        self.cgroup = RunCgroup(base, request.run_id) if base is not None else None
        self.tty = request.tty
        self.link: SlaveLink | None = None
        """A terminal's slave, held from the stopped stub on until its leader exits."""

    @property
    def client(self) -> dockerapi.Client:
        return self.session.api()

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self._start_sync)
        if self.tty is not None:
            if self.link is None:  # ended before it ever ran: there is no terminal to reach
                self.tty.ready.set()
            else:
                self.tty.attach(self.link, host_signaller(self.tty))

    def _start_sync(self) -> None:
        session, request = self.session, self.request
        session.active.add(request.run_id)
        if session.init_pid:
            self.oom_before = proctree.oom_kills(session.init_pid)
        if session.dying():
            session.recycle_needed = True
            raise BackendError("the sandbox container is not running (it will be recreated)")
        command = self.launch.argv
        if self.tty is not None and self.cgroup is None:
            raise BackendError(NO_ENGINE_TERMINAL)
        if self.cgroup is not None:
            try:
                self.cgroup.create()
            except OSError as exc:
                raise BackendError(
                    f"cannot create the exec's cgroup {self.cgroup.path}: {exc}"
                ) from exc
            command = stub_argv(command)
        client, cid = session.require()
        self.exec_id = dockerapi.exec_create(
            client,
            cid,
            command,
            stdin=request.stdin is not None,
            tty=self.tty is not None,
            environment=dict(self.launch.env),
            workdir=self.launch.cwd,
            user=session.user,
        )
        self.keep = dockerapi.exec_attach(client, self.exec_id, tty=self.tty is not None)
        raw = getattr(self.keep, "_sock", self.keep)
        if not isinstance(raw, socket.socket):
            raise BackendError(f"docker: unexpected exec stream object {type(raw).__name__}")
        raw.setblocking(False)
        self.initial = dockerapi.buffered_bytes(self.keep)  # first frames, if coalesced
        self.sock = raw
        if self.cgroup is not None:
            self._adopt(self.cgroup, start_timeout(self.request.limits.cpus))

    def _adopt(self, cgroup: RunCgroup, allowed: float = START_TIMEOUT_S) -> None:
        """Move the exec's stub into the run's cgroup once it has stopped itself, then let it
        go on: every process of the run is born in the run's cgroup. Returns once the exec is
        known to have started, or to have ended without ever appearing (a start error, after
        ``allowed`` seconds)."""
        began = time.monotonic()
        deadline = began + allowed
        next_inspect = began + INSPECT_EVERY_S  # not at once: the engine is busy starting it
        pause = START_POLL_S
        while time.monotonic() < deadline:
            members = cgroup.adopt()
            stopped = [p for p in members if p.state == "T"]
            if stopped and self.tty is not None and not self._took_terminal(stopped):
                stopped = []  # the exec's own stub is not stopped yet: it is waited for
            if stopped:
                proctree.signal_all(stopped, signal.SIGCONT)
                return
            if members and not any(is_stub(p.pid) for p in members):
                if self.tty is not None:  # its terminal was never taken: no terminal to reach
                    raise BackendError("docker: the terminal's start stub ran on unstopped")
                return  # continued by someone else before it stopped: it runs, in its cgroup
            now = time.monotonic()
            if not members and now >= next_inspect:
                if self.session.dying():
                    self.session.recycle_needed = True
                    raise BackendError("the sandbox container stopped while the exec started")
                info = self._inspect()
                if not info.get("Running") and info.get("ExitCode") is not None:
                    return  # ended without appearing: the engine could not start it
                next_inspect = now + INSPECT_EVERY_S
            time.sleep(pause)  # a stub still starting (slow under a CPU limit) is waited for
            if now - began > START_FAST_S:
                pause = min(pause * 1.5, START_POLL_MAX_S)
        self.session.recycle_needed = True  # whatever starts later dies with the container
        raise BackendError(f"docker: the exec did not start within {allowed:.0f} s")

    def _took_terminal(self, stopped: list[proctree.Proc]) -> bool:
        """Take the terminal once the exec's own stub (the pid the engine names, not any
        process that copied its marker and stopped itself) has stopped, before anything of
        the command has run: hold its slave and give the terminal its size (the engine
        makes it 0x0). False while that stub is not seen stopped yet."""
        assert self.tty is not None
        if not self.exec_pid:
            self.exec_pid = int(self._inspect().get("Pid") or 0)  # set once it runs
        stub = next((p for p in stopped if p.pid == self.exec_pid and is_stub(p.pid)), None)
        if stub is None:
            return False
        try:
            fd = open_slave(stub.pid)
        except OSError as exc:
            raise BackendError(f"docker: cannot reach the exec's terminal: {exc}") from exc
        self.link = SlaveLink(fd, stub.pid, stub.start)
        self.link.set_size(*self.tty.spawn_options().values())
        return True

    # -- output -----------------------------------------------------------------------------
    async def pump(self) -> None:
        async with anyio.create_task_group() as tg:
            if not self.eof:
                tg.start_soon(self._read)
            if self.stdin_left is not None:
                tg.start_soon(self._write_stdin)

    async def _read(self) -> None:
        sock = self.sock
        assert sock is not None
        # The bytes read with the exec-start response head come first (the stream's first bytes).
        if self.initial and not await self._feed(self.initial):
            return
        self.initial = b""
        reads = 0
        while True:
            try:
                data = sock.recv(CHUNK)
            except BlockingIOError:
                await anyio.wait_readable(sock)
                continue
            except OSError as exc:
                self.stream_error = f"exec stream failed: {exc}"
                data = b""
            if not data:
                self.eof = True
                self.eof_event.set()
                if self.decoder.mid_frame:
                    self.stream_error = "the exec stream ended inside a frame"
                return
            if not await self._feed(data):
                return
            reads += 1
            if reads % YIELD_EVERY == 0:
                await anyio.lowlevel.checkpoint()

    async def _feed(self, data: bytes) -> bool:
        """Demultiplex ``data`` into the captures, then wait while a slow live reader is behind
        (backpressure); False when the stream is not a valid multiplexed stream (it ends)."""
        if self.tty is not None:  # a terminal's stream is raw: the terminal merged the streams
            self.captures["stdout"].feed(data)
            await self.captures["stdout"].wait_sink()
            return True
        try:
            self.decoder.feed(data)
        except FrameError as exc:
            self.stream_error = str(exc)
            self.eof = True
            self.eof_event.set()
            return False
        for capture in self.captures.values():
            await capture.wait_sink()
        return True

    async def _write_stdin(self) -> None:
        """Write the stdin bytes, or forward a ``StdinStream`` until the caller closes it, the
        socket fails, or the exec has ended (its output closing is not enough: a command may
        close its output and read on); then half-close the socket. However forwarding stops,
        the stream is aborted: a waiting ``send`` raises ``BrokenPipeError`` at once."""
        sock, data = self.sock, self.stdin_left
        assert sock is not None and data is not None

        async def send_all(chunk: bytes) -> None:
            view = memoryview(chunk)
            while view:
                await anyio.wait_writable(sock)
                try:
                    view = view[sock.send(view) :]
                except BlockingIOError:
                    continue

        if not isinstance(data, StdinStream):
            with suppress(OSError):
                await send_all(data)
                sock.shutdown(socket.SHUT_WR)
            self.stdin_left = None
            return
        stream = data
        try:
            async with anyio.create_task_group() as tg:

                async def forward() -> None:
                    with suppress(OSError):
                        while (chunk := await stream.receive()) is not None:
                            await send_all(chunk)
                            stream.written()
                        sock.shutdown(socket.SHUT_WR)
                    tg.cancel_scope.cancel()

                tg.start_soon(forward)
                await self.eof_event.wait()
                # the output closed; the exec may still run and read (wait_exit sets exit_info
                # once it has ended, and has no event for it)
                while self.exit_info is None:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
        finally:
            stream.abort()
            self.stdin_left = None

    # -- exit -------------------------------------------------------------------------------
    async def wait_exit(self) -> int | None:
        """The stream ends when the exec's output closes; a child holding it keeps it open, so
        the exec is also polled (the main process may have exited long before)."""
        pause = 0.01
        while self.exit_info is None:
            with anyio.move_on_after(POLL_S):
                await (self._leader_exit() if self.link is not None else self.eof_event.wait())
            if self.link is not None and self.link.exited():
                self.release_terminal()  # the leader is gone: the terminal's output may end now
            info = await anyio.to_thread.run_sync(self._inspect)
            if not info.get("Running"):
                self.exit_info = info
                self.release_terminal()
            elif self.eof:  # output closed, process still running (or exit not yet recorded)
                await anyio.sleep(pause)
                pause = min(pause * 2, POLL_S)
        return wait_status_from_exit_code(self.exit_info.get("ExitCode"))

    def release_terminal(self) -> None:
        """Close the held slave (on the event loop: the terminal's control uses it there)."""
        link, self.link = self.link, None
        if link is not None:
            link.release()

    async def _leader_exit(self) -> None:
        """Return once a terminal's leader has exited (its pidfd is readable)."""
        assert self.link is not None
        if self.link.pidfd is None:
            await anyio.sleep(POLL_S)
        else:
            await anyio.wait_readable(self.link.pidfd)

    def _inspect(self) -> dict[str, Any]:
        try:
            return dockerapi.exec_inspect(self.client, self.exec_id)
        except BackendError as exc:
            return {"Running": False, "ExitCode": None, "Error": str(exc)}

    # -- termination ------------------------------------------------------------------------
    async def terminate(self, grace_s: float) -> Termination:
        if self.termination is None:
            self.termination = await self._terminate(grace_s)
        return self.termination

    async def _terminate(self, grace_s: float) -> Termination:
        """TERM (+CONT) everything of the exec (newcomers too), wait out the grace, then KILL
        until nothing is left or the kill budget is spent (then the container is recycled).
        "Nothing left" needs two empty sweeps in a row: a process caught mid-``exec`` or
        mid-reparenting can be invisible to one."""
        if self.cgroup is None and self.exit_info is None:
            info = await anyio.to_thread.run_sync(self._wait_started)
            if self.session.local:  # the exec pid: found without its environ
                self.exec_pid = int(info.get("Pid") or 0) if info.get("Running") else 0
                known = proctree.read_proc(self.exec_pid) if self.exec_pid else None
                self.exec_start = known.start if known is not None else None
        alive = await self._settled("TERM")
        self.had_leftovers = alive > 0 and self.exit_info is not None  # after a normal exit
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            await anyio.sleep(SWEEP_TICK_S)
            alive = await self._settled("TERM")
        deadline = time.monotonic() + KILL_BUDGET_S
        while alive and time.monotonic() < deadline:
            await self._sweep("KILL")
            await anyio.sleep(SWEEP_TICK_S)
            alive = await self._settled("KILL")
        if alive:
            self.session.recycle_needed = True
            return Termination(survivors=alive, error=f"{alive} process(es) could not be killed")
        if self.cgroup is not None:
            cpu = self.cgroup.cpu_s()
            self.cgroup.remove()
            return Termination(cpu_s=None if cpu is None else round(cpu, 6))
        return Termination()

    def _wait_started(self) -> dict[str, Any]:
        """Without a run cgroup: wait (bounded) until the engine says the exec's process
        exists (``Pid``: the engine sets ``Running`` before it asks the runtime to start the
        process, and the pid once it has) or has ended, so that an empty sweep means "nothing
        left", not "not there yet"."""
        deadline = time.monotonic() + start_timeout(self.request.limits.cpus)
        while True:
            info = self._inspect()
            started = bool(info.get("Running") and info.get("Pid"))
            ended = not info.get("Running") and info.get("ExitCode") is not None
            if started or ended or "Error" in info or time.monotonic() > deadline:
                return info
            time.sleep(START_POLL_S * 20)

    def _own_root(self) -> tuple[int, ...]:
        """The exec's own main process, while its pid still names it (start time unchanged)."""
        if not self.exec_pid or self.exec_start is None:
            return ()
        current = proctree.read_proc(self.exec_pid)
        return (self.exec_pid,) if current is not None and current.start == self.exec_start else ()

    async def _settled(self, sig: str) -> int:
        alive = await self._sweep(sig)
        if not alive and self.cgroup is None:  # only a run's own cgroup is exact
            await anyio.sleep(SWEEP_TICK_S)
            alive = await self._sweep(sig)
        return alive

    async def _sweep(self, sig: str) -> int:
        """Signal the exec's processes (TERM only once per process); return how many live."""
        session, cgroup = self.session, self.cgroup
        if cgroup is not None:
            if sig == "TERM":
                self._term_once(cgroup.members())
            else:
                cgroup.kill()
            alive = len(cgroup.members())
            return alive if alive or not cgroup.populated() else 1
        if session.local:
            if session.cgroup_procs and session.init_pid:
                procs = proctree.cgroup_members(
                    session.cgroup_procs,
                    self.request.run_id,
                    base=session.keep | {session.init_pid},
                    others=frozenset(session.active - {self.request.run_id}),
                    roots=self._own_root(),
                )
            else:
                procs = proctree.members(
                    self.request.run_id,
                    init_pid=session.init_pid,
                    keep=session.keep,
                    roots=self._own_root(),
                )
            if sig == "TERM":
                self._term_once(procs)
            else:
                proctree.signal_all(procs, signal.SIGKILL)
            return len(procs)
        return await anyio.to_thread.run_sync(self._sweep_in_container, sig)

    def _term_once(self, procs: list[proctree.Proc]) -> None:
        """TERM (+CONT) each process not TERMed before: a process gets one TERM, newcomers too."""
        fresh = [p for p in procs if (p.pid, p.start) not in self.termed]
        self.termed.update((p.pid, p.start) for p in fresh)
        proctree.signal_all(fresh, signal.SIGTERM)

    def _sweep_in_container(self, sig: str) -> int:
        try:
            client, cid = self.session.require()  # (closed meanwhile: gone, not a crash)
            argv = cfg.sweep_argv(self.request.run_id, sig)
            made = dockerapi.exec_create(client, cid, argv, user=self.session.user)
            output = dockerapi.exec_output(client, made)
            return int(output.decode().strip().splitlines()[-1])
        except (BackendError, ValueError, IndexError):
            return 0 if not self._container_running() else 1

    def _container_running(self) -> bool:
        try:
            return bool(self.session.state().get("Running"))
        except BackendError:
            return False

    # -- result -----------------------------------------------------------------------------
    async def verdict(self, sup: Supervision) -> Verdict:
        """Container death and OOM are facts of the container, not of the exec's exit code
        (asked only when the exec did not end by a plain exit)."""
        session = self.session
        status, exit_code, sig = results.outcome(sup)
        init_dead = session.dying()
        plain = exit_code is not None and sig is None and not self.stream_error
        if plain and not init_dead and not self.had_leftovers:
            return Verdict()
        state = await anyio.to_thread.run_sync(self._state_or_empty)
        unsent_signal = status == "failed" and sig is not None
        if (unsent_signal or self.had_leftovers) and state.get("Running"):
            # A signal sandboxrun did not send, or leftovers that had to be killed, may mean the
            # container is dying (``kill 1``): the engine and the init take a moment to show it.
            with anyio.move_on_after(DEATH_WAIT_S if unsent_signal else LEFTOVER_DEATH_WAIT_S):
                while state.get("Running") and not init_dead:
                    await anyio.sleep(0.05)
                    init_dead = session.dying()
                    if not session.init_pid:
                        state = await anyio.to_thread.run_sync(self._state_or_empty)
        oom_after = proctree.oom_kills(session.init_pid) if session.init_pid else None
        exec_oom = None not in (self.oom_before, oom_after) and oom_after != self.oom_before
        if init_dead or not state.get("Running"):
            session.recycle_needed = True
            if session.disk_exceeded:
                return Verdict(status="disk_exceeded", error=session.disk_exceeded)
            error = (
                "the sandbox container stopped or was removed during the exec "
                f"(state: {state.get('Status', 'gone')})"
            )
            return Verdict(status="sandbox_error", error=error)
        if sig == "SIGKILL" and (exec_oom or state.get("OOMKilled")):
            return Verdict(status="oom_killed")
        if self.stream_error and status == "completed":
            return Verdict(status="sandbox_error", error=self.stream_error)
        if self.exit_info is not None and self.exit_info.get("ExitCode") is None:
            return Verdict(status="sandbox_error", error="the engine lost the exec's exit code")
        return Verdict()

    def _state_or_empty(self) -> dict[str, Any]:
        try:
            return self.session.state()
        except BackendError:  # (NotFoundError too: the container is gone)
            return {}

    def close(self) -> None:
        """Release the run (blocking: call it in a worker thread). A run that never reached
        termination (a start error) leaves nothing: its stub, adopted or not, is killed."""
        try:
            cgroup, self.cgroup = self.cgroup, None
            # Still there: termination never ran (a start error). Termination removes it.
            if cgroup is not None and cgroup.path.exists():
                deadline = time.monotonic() + KILL_BUDGET_S
                while time.monotonic() < deadline:
                    cgroup.adopt()  # a stub never adopted (in the container's own cgroup) too
                    cgroup.kill()
                    if not cgroup.populated():
                        break
                    time.sleep(SWEEP_TICK_S)
                if not cgroup.remove() and cgroup.populated():
                    self.session.recycle_needed = True  # unkillable: the next exec starts afresh
        finally:
            self.session.active.discard(self.request.run_id)
            self.release_terminal()  # (a start error: never attached to the terminal's control)
        if self.sock is not None:
            with suppress(OSError):
                self.sock.close()
        if self.keep is not None:
            with suppress(Exception):
                self.keep.close()
        self.sock = None
