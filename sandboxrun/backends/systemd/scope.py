"""One command in its own transient systemd scope: the ``RunHandle`` of the systemd-scope backend.

The scope (a cgroup) is the managed range: every process the command starts, however it forks,
``setsid``s or clears its environment, stays in it. Termination is ``systemctl kill
--kill-whom=all`` with TERM (and CONT, for stopped processes), the grace period, then KILL
repeated until the scope's ``cgroup.procs`` is empty, which is when the unit goes inactive and
(``--collect``) disappears. Until the launcher has reported from inside the scope, the only
process there can be is our own child (systemd-run or the launcher), which is signalled by pid.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import anyio

from sandboxrun.backends.systemd.config import CgroupPaths, Mode, cpu_usage_s, kill_argv
from sandboxrun.engine.capture.pipes import FdPump
from sandboxrun.engine.capture.pty_pump import PtyPump
from sandboxrun.engine.supervise import KILL_BUDGET_S, Termination
from sandboxrun.supervisor import procfs as proctree
from sandboxrun.supervisor.launchwire import StatusReport, parse_status
from sandboxrun.supervisor.protocol import recv_fds

POLL_S = 0.02
UNSEEN = -1
"""Stands for members a populated cgroup has but a listing did not show."""
SAMPLE_EVERY_S = 0.25
KEEPER_EXIT_S = 1.0
KILL_REPEAT_S = 0.5
SYSTEMCTL_TIMEOUT_S = 10.0


@dataclass
class Accounting:
    """What the scope's cgroup said about the run while it still existed."""

    cpu_s: float | None = None
    oom_kills: int = 0
    slice_oom_before: int | None = None
    """The OOM-kill counter of the scope's parent (hierarchical) when the run started: if the
    scope's own cgroup is gone before it is read, a rise here is the evidence left."""


def read_text(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path) as f:  # noqa: PTH123
            return f.read()
    except OSError:
        return None


def cgroup_populated(events: str | None) -> bool | None:
    """The ``populated`` flag of a v2 ``cgroup.events`` (None when unreadable)."""
    if events is None:
        return None
    for row in events.splitlines():
        key, _, value = row.partition(" ")
        if key == "populated":
            return value.strip() == "1"
    return None


class ScopeRun:
    """The ``RunHandle`` of one command in ``unit``, started as our child ``proc``."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        unit: str,
        mode: Mode,
        systemctl: str,
        manager_env: dict[str, str],
        pump: FdPump | PtyPump | None,
        status_fd: int,
        hold_fd: int,
    ) -> None:
        self.proc = proc
        self.unit = unit
        self.mode = mode
        self.systemctl = systemctl
        self.manager_env = manager_env
        self._pump = pump
        self._status_fd = status_fd
        self._hold_fd: int | None = hold_fd
        self.keeper: int | None = None
        self._keeper_fd: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(proc.pid)
        except OSError:  # no pidfd (old kernel, seccomp, EMFILE): poll with WNOHANG instead
            self._pidfd = None
        self.paths: CgroupPaths | None = None
        self.wait_status: int | None = None
        self.cpu_rusage_s: float | None = None
        self.maxrss_kb: int | None = None
        self.accounting = Accounting()
        self._termination: Termination | None = None
        self.sent_kill = False
        self.lost: list[str] = []
        """The limits this scope turned out not to apply (``SystemdScopeBackend._launch``)."""

    async def read_status(
        self, timeout_s: float, fds: list[int] | None = None
    ) -> StatusReport | None:
        """Read the status pipe to EOF (the launcher exec'd, failed, or systemd-run gave up);
        None when it did not end within ``timeout_s``. ``fds``: the status is a socket (a run
        on a terminal), and the descriptors that came on it are added there (close-on-exec)."""
        data = bytearray()
        with anyio.move_on_after(timeout_s):
            while True:
                try:
                    if fds is None:  # noqa: SIM108 - two ways to read, one each
                        chunk = os.read(self._status_fd, 65536)
                    else:
                        chunk = self._receive(fds)
                except BlockingIOError:
                    await anyio.wait_readable(self._status_fd)
                    continue
                if not chunk:
                    return parse_status(bytes(data))
                data += chunk
        return None

    def _receive(self, fds: list[int]) -> bytes:
        with socket.socket(fileno=os.dup(self._status_fd)) as sock:
            sock.setblocking(False)  # (never a default timeout: BlockingIOError when empty)
            data, got, flags = recv_fds(sock, 65536, 4)
        fds.extend(got)
        if flags & socket.MSG_CTRUNC:
            raise OSError(errno.EMFILE, "too many open files in this process for the terminal")
        return data

    async def wait_exit(self) -> int | None:
        if self.wait_status is None:
            while not await self._exited_within(SAMPLE_EVERY_S):
                self.sample()  # now and then, in case the keeper is killed
            self.sample()  # the keeper holds the scope's cgroup: its figures are complete
            await self.release_keeper()
            _, status, usage = os.wait4(self.proc.pid, 0)  # noqa: ASYNC222 (exited: no wait)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            self.wait_status = status
            self.cpu_rusage_s = usage.ru_utime + usage.ru_stime
            self.maxrss_kb = usage.ru_maxrss
        return self.wait_status

    async def _exited_within(self, seconds: float) -> bool:
        """Whether the main process exited (it is then a zombie, not yet reaped)."""
        if self._pidfd is not None:
            with anyio.move_on_after(seconds):
                await anyio.wait_readable(self._pidfd)
                return True
            return False
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):  # noqa: ASYNC222
                return True
            await anyio.sleep(POLL_S)
        return False

    def sample(self) -> None:
        """Read the scope's accounting (CPU time, OOM kills) while its cgroup exists."""
        paths = self.paths
        if paths is None:
            return
        cpu = None
        if paths.unified is not None:  # v2, or hybrid: its core cpu.stat counts every task
            text = read_text(f"{paths.unified}/cpu.stat")
            cpu = None if text is None else cpu_usage_s(text, v2=True)
        if cpu is None and paths.cpuacct is not None and not paths.v2:
            text = read_text(f"{paths.cpuacct}/cpuacct.usage")
            cpu = None if text is None else cpu_usage_s(text, v2=False)
        if cpu is not None:
            self.accounting.cpu_s = max(cpu, self.accounting.cpu_s or 0.0)
        oom_file = (
            f"{paths.memory}/memory.events" if paths.v2 else f"{paths.memory}/memory.oom_control"
        )
        text = read_text(oom_file if paths.memory else None)
        count = None if text is None else proctree.oom_count(text)
        if count:
            self.accounting.oom_kills = max(count, self.accounting.oom_kills)

    def slice_oom_kills(self) -> int | None:
        paths = self.paths
        if paths is None or paths.memory is None:
            return None
        name = "memory.events" if paths.v2 else "memory.oom_control"
        text = read_text(f"{Path(paths.memory).parent}/{name}")
        return None if text is None else proctree.oom_count(text)

    def oom_killed(self, signal_name: str | None, sent_kill: bool) -> bool:
        """An OOM kill happened in the scope: its counter says so, or (the scope already
        gone) the main process died of a SIGKILL we did not send and the parent's rose."""
        if self.accounting.oom_kills:
            return True
        before, after = self.accounting.slice_oom_before, self.slice_oom_kills()
        rose = before is not None and after is not None and after > before
        return signal_name == "SIGKILL" and not sent_kill and rose

    async def release_keeper(self) -> None:
        """Let the keeper go (EOF on its hold pipe) and wait, briefly, until it is gone."""
        if self._hold_fd is None:
            return
        with suppress(OSError):
            os.close(self._hold_fd)
        self._hold_fd = None
        keeper, self.keeper = self.keeper, None
        watch, self._keeper_fd = self._keeper_fd, None
        if watch is not None:  # exact, and immune to pid reuse
            with anyio.move_on_after(KEEPER_EXIT_S):
                await anyio.wait_readable(watch)
            os.close(watch)
        elif keeper is not None:
            end = time.monotonic() + KEEPER_EXIT_S
            alive = proctree.alive(keeper)
            while alive and time.monotonic() < end:
                await anyio.sleep(0.002)
                alive = proctree.alive(keeper)

    def set_keeper(self, pid: int | None) -> None:
        """The keeper the launcher reported; watched through a pidfd where there is one."""
        self.keeper = pid
        if pid is not None:
            with suppress(OSError):
                self._keeper_fd = os.pidfd_open(pid)

    def members(self) -> list[int]:
        """Live processes of the run: the scope's members and, until reaped, our child. Where
        a v2 hierarchy holds the scope (pure v2 or hybrid), its ``populated`` flag decides
        emptiness: it is exact, while a listing can miss a fork walker between two reads."""
        live: set[int] = set()
        populated = None
        if self.paths is not None:
            if self.paths.unified is not None:
                populated = cgroup_populated(read_text(f"{self.paths.unified}/cgroup.events"))
            for pid in proctree.read_pids(self.paths.procs):
                if pid != self.keeper and (proctree.alive(pid) or proctree.threads_left(pid)):
                    live.add(pid)
        if self.wait_status is None and proctree.alive(self.proc.pid):
            live.add(self.proc.pid)
        if populated and not live and self.keeper is None:
            live.add(UNSEEN)  # populated, but nothing seen by the listing: not over yet
        return sorted(live)

    def kill_cgroup(self) -> None:
        """``cgroup.kill`` (Linux 5.14+): SIGKILL to every member at once, forks included."""
        if self.paths is not None and self.paths.unified is not None:
            with suppress(OSError), open(f"{self.paths.unified}/cgroup.kill", "w") as f:  # noqa: PTH123
                f.write("1")

    async def _signal(self, number: int) -> None:
        name = signal.Signals(number).name
        if self.wait_status is None:  # not reaped: the pid cannot have been reused
            with suppress(OSError):
                os.kill(self.proc.pid, number)
        with suppress(OSError):
            with anyio.move_on_after(SYSTEMCTL_TIMEOUT_S):
                await anyio.run_process(
                    kill_argv(self.systemctl, self.mode, self.unit, name),
                    check=False,
                    env=self.manager_env,
                    stdin=subprocess.DEVNULL,
                )

    async def _until_empty(self, seconds: float) -> list[int]:
        end = time.monotonic() + seconds
        left = self.members()
        while left and time.monotonic() < end:
            await anyio.sleep(POLL_S)
            left = self.members()
        return left

    async def terminate(self, grace_s: float) -> Termination:
        if self._termination is None:
            self._termination = await self._terminate(grace_s)
        return self._termination

    async def _terminate(self, grace_s: float) -> Termination:
        if self.wait_status is None:  # a timeout or cancel: read the figures before killing
            self.sample()  # (after a normal exit, wait_exit has read them)
        await self.release_keeper()
        left = self.members()
        if left:
            await self._signal(signal.SIGTERM)
            await self._signal(signal.SIGCONT)
            left = await self._until_empty(grace_s)
        end = time.monotonic() + KILL_BUDGET_S
        while left and time.monotonic() < end:
            self.sent_kill = True
            self.kill_cgroup()
            await self._signal(signal.SIGKILL)
            left = await self._until_empty(min(KILL_REPEAT_S, max(0.0, end - time.monotonic())))
        return Termination(survivors=len(left))

    @property
    def emptied(self) -> bool:
        """Termination saw the scope empty (its watchdog registration can go)."""
        done = self._termination
        return done is not None and done.survivors == 0 and self.paths is not None

    def accounting_figures(self) -> tuple[float | None, int | None]:
        """``(cpu_s, peak_rss_bytes)``: the scope's CPU time where it could be read (it counts
        orphans too), else the main process's rusage; peak RSS from rusage."""
        cpus = [c for c in (self.accounting.cpu_s, self.cpu_rusage_s) if c is not None]
        cpu = round(max(cpus), 6) if cpus else None
        rss = self.maxrss_kb * 1024 if self.maxrss_kb else None
        return cpu, rss

    def use_pump(self, pump: FdPump | PtyPump) -> None:
        """The run's streams, once known (a terminal's: after the launcher sent its master)."""
        self._pump = pump

    async def pump(self) -> None:
        if self._pump is not None:
            await self._pump.pump()

    def close(self) -> None:
        if self._pump is not None:
            self._pump.close_stdin()
        for fd in (self._pidfd, self._status_fd, self._hold_fd, self._keeper_fd):
            if fd is None:
                continue
            with suppress(OSError):
                os.close(fd)
        if self.proc.returncode is None:  # never reaped (should not happen): do not leak it
            with suppress(OSError):
                os.kill(self.proc.pid, 9)
            with suppress(ChildProcessError, OSError):
                os.waitpid(self.proc.pid, 0)
            self.proc.returncode = -9
