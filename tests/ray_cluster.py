"""A real multi-node Ray cluster for tests, in a network namespace of its own with only `lo`.

Ray rewrites 127.0.0.1 to the machine's address when it can see one, and the test machines
allow loopback only: so the whole cluster (head, worker nodes, drivers) runs in a network
namespace that has nothing but `lo`, where 127.0.0.1 is the only address there is. Each node
runs `ray start --block` in a UTS namespace of its own with its own host name, so it is a node
as a separate machine would be: its sandboxes carry its name as ``owner_host``, and its
processes are found by that namespace (never by name: `ray stop --force` would kill every Ray
of the user). HOME (Ray's auth token), Ray's temp dir and the spill root are the test's own.
Only `nsenter --net` enters the namespace: `ip netns exec` would also remount /sys, hiding the
cgroup tree the docker backend's supervisor needs.

A sampler lists the namespace's TCP connections all along (``ss``); ``peers()`` is every
remote address it saw.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

VENV_BIN = Path(sys.executable).parent
RAY = VENV_BIN / "ray"
PORT = 6379


def why_not() -> str | None:
    """Why a cluster cannot run here, or None."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'sandboxrun[ray]')"
    if os.geteuid() != 0:
        return "a network namespace for the test cluster needs root"
    for tool in ("ip", "nsenter", "unshare", "ss"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def ns_inode(pid: int, kind: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def in_namespace(kind: str, inode: int) -> list[int]:
    """Every live process whose ``kind`` namespace is ``inode``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and ns_inode(int(entry), kind) == inode:
            with suppress(psutil.Error):
                if psutil.Process(int(entry)).status() != psutil.STATUS_ZOMBIE:
                    found.append(int(entry))
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Node:
    name: str
    proc: subprocess.Popen[bytes]
    uts: int
    log: Path
    slots: int

    def pids(self) -> list[int]:
        return in_namespace("uts", self.uts)

    def raylet(self) -> int:
        for pid in self.pids():
            with suppress(psutil.Error):
                if psutil.Process(pid).name() == "raylet":
                    return pid
        raise AssertionError(f"no raylet on {self.name}")


@dataclass
class Cluster:
    netns: str
    root: Path
    env: dict[str, str]
    nodes: dict[str, Node] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _sampler: threading.Thread | None = None

    @property
    def net(self) -> int:
        return os.stat(f"/run/netns/{self.netns}").st_ino

    def enter(self, host: str) -> list[str]:
        """The argv prefix that runs a command in the cluster's network namespace, in a UTS
        namespace of its own named ``host``."""
        return [
            "nsenter",
            f"--net=/run/netns/{self.netns}",
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            host,
        ]

    # -- nodes ------------------------------------------------------------------------------
    def add_node(
        self, name: str, slots: int, *, head: bool = False, env: dict[str, str] | None = None
    ) -> Node:
        log = self.root / f"{name}.log"
        argv = [str(RAY), "start", "--block", "--disable-usage-stats", "--num-cpus=1"]
        argv += [
            "--object-store-memory=80000000",
            f"--resources={json.dumps({'sandbox_slots': slots})}",
        ]
        if head:
            argv += ["--head", f"--port={PORT}", "--include-dashboard=false"]
            argv += [f"--temp-dir={self.root / 'ray'}"]
        else:
            argv += [f"--address=127.0.0.1:{PORT}"]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*self.enter(name), *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.env, **(env or {})},
                start_new_session=True,
            )
        uts = None
        deadline = time.monotonic() + 10
        while uts is None or uts == ns_inode(os.getpid(), "uts"):
            assert time.monotonic() < deadline, "the node's namespace did not appear"
            time.sleep(0.02)
            uts = ns_inode(proc.pid, "uts")
        node = Node(name, proc, uts, log, slots)
        self.nodes[name] = node
        self.wait_nodes()
        return node

    def alive_nodes(self) -> list[dict[str, Any]]:
        listed = self.python(
            "import json, ray\n"
            f"ray.init(address='127.0.0.1:{PORT}', logging_level='ERROR')\n"
            "print(json.dumps([{'host': n['NodeManagerHostname'], 'alive': n['Alive'], "
            "'address': n['NodeManagerAddress']} for n in ray.nodes()]))\n",
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr[-3000:]
        rows: list[dict[str, Any]] = json.loads(listed.stdout.strip().splitlines()[-1])
        return rows

    def wait_nodes(self, timeout: float = 60) -> None:
        """Until every node started here and still running is alive in the cluster."""
        deadline = time.monotonic() + timeout
        while True:
            running = {n for n, node in self.nodes.items() if node.proc.poll() is None}
            try:
                alive = {r["host"] for r in self.alive_nodes() if r["alive"]}
            except (AssertionError, json.JSONDecodeError, IndexError):
                alive = set()
            if running <= alive:
                return
            if time.monotonic() > deadline:
                logs = "".join(n.log.read_text()[-2000:] for n in self.nodes.values())
                raise AssertionError(f"nodes {running - alive} did not join: {logs}")
            time.sleep(0.5)

    def wait_gone(self, name: str, timeout: float = 60) -> None:
        """Until the cluster no longer lists node ``name`` alive (a test placing slots on the
        nodes alive comes next)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                rows = self.alive_nodes()
            except (AssertionError, json.JSONDecodeError, IndexError):
                rows = None  # (a line of Ray's own on stdout: look again)
            if rows is not None and not any(r["host"] == name and r["alive"] for r in rows):
                return
            assert time.monotonic() < deadline, f"node {name} is still listed alive"
            time.sleep(0.5)

    def kill_node(self, name: str) -> None:
        """Every process of the node, at once (a machine lost)."""
        node = self.nodes.pop(name)
        kill_all(node.pids())
        node.proc.wait(10)

    def kill_raylet(self, name: str) -> int:
        node = self.nodes[name]
        pid = node.raylet()
        os.kill(pid, signal.SIGKILL)
        return pid

    def forget(self, name: str) -> None:
        """A node gone by a fault: whatever of it is left is killed."""
        node = self.nodes.pop(name, None)
        if node is not None:
            kill_all(node.pids())
            with suppress(subprocess.TimeoutExpired):
                node.proc.wait(10)

    # -- drivers ----------------------------------------------------------------------------
    def driver(self, script: str, *args: str, host: str = "sbr-driver") -> Driver:
        """A driver process (``script``, Python) in the cluster: its JSON lines, its stdin."""
        path = self.root / f"driver-{time.monotonic_ns()}.py"
        path.write_text(script)
        err = self.root / f"{path.stem}.err"
        with err.open("w") as errors:
            proc = subprocess.Popen(
                [*self.enter(host), sys.executable, str(path), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env=self.env,
            )
        return Driver(proc, err)

    def python(
        self, script: str, *args: str, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        path = self.root / f"driver-{time.monotonic_ns()}.py"
        path.write_text(script)
        return subprocess.run(
            [*self.enter("sbr-driver"), sys.executable, str(path), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )

    # -- the network -------------------------------------------------------------------------
    def start_sampler(self) -> None:
        def sample() -> None:
            while not self._stop.wait(0.5):
                with suppress(subprocess.SubprocessError, OSError):
                    out = subprocess.run(
                        ["nsenter", f"--net=/run/netns/{self.netns}", "ss", "-tanH"],
                        capture_output=True,
                        text=True,
                        timeout=10,
                        check=False,
                    ).stdout
                    for line in out.splitlines():
                        parts = line.split()
                        if len(parts) >= 5 and parts[0] != "LISTEN":
                            self._seen.add(parts[4].rsplit(":", 1)[0])

        self._sampler = threading.Thread(target=sample, daemon=True)
        self._sampler.start()

    def peers(self) -> set[str]:
        return set(self._seen)

    def _ip(self, *argv: str) -> list[list[str]]:
        out = subprocess.run(
            ["nsenter", f"--net=/run/netns/{self.netns}", "ip", "-o", *argv],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return [line.split() for line in out.splitlines()]

    def interfaces(self) -> list[str]:
        return [row[1].rstrip(":") for row in self._ip("link")]

    def addresses(self) -> set[str]:
        return {row[3] for row in self._ip("addr")}

    # -- the end -----------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + 20
        while True:
            left = in_namespace("net", self.net)
            if not left or time.monotonic() > deadline:
                break
            kill_all(left)
            time.sleep(0.2)
        for node in self.nodes.values():
            with suppress(subprocess.TimeoutExpired):
                node.proc.wait(5)
        subprocess.run(["ip", "netns", "del", self.netns], check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def start(slots: dict[str, int]) -> Cluster:
    """A head (no slots) and one worker node per entry of ``slots``."""
    netns = f"sbr-ray-{os.getpid()}"
    subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "add", netns], check=True)
    subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", "ip", "link", "set", "lo", "up"], check=True
    )
    root = Path(tempfile.mkdtemp(prefix="sbr-ray-", dir="/tmp"))  # short: Ray's socket paths
    (root / "home").mkdir()
    env = {
        **os.environ,
        "HOME": str(root / "home"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_health_check_period_ms": "500",
        "RAY_health_check_timeout_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
        "SANDBOXRUN_SPILL_DIR": str(root / "spill"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("RAY_ADDRESS", None)
    cluster = Cluster(netns=netns, root=root, env=env)
    try:
        cluster.start_sampler()
        cluster.add_node("sbr-head", 0, head=True)
        for name, count in slots.items():
            cluster.add_node(name, count)
    except BaseException:
        cluster.stop()
        raise
    return cluster


class Driver:
    """A driver process's JSON lines (``{"event": ...}``), read by a thread as they come."""

    def __init__(self, proc: subprocess.Popen[str], err: Path) -> None:
        self.proc = proc
        self.err = err
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with suppress(json.JSONDecodeError):
                obj = json.loads(line)
                if isinstance(obj, dict):
                    self.events.put(obj)
        self.events.put(None)

    def expect(self, event: str, timeout: float = 120) -> dict[str, Any]:
        """The next line whose ``event`` is ``event`` (earlier other ones are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                got = None
                if time.monotonic() < deadline:
                    continue
            if got is None:
                raise AssertionError(
                    f"the driver gave no {event!r} (exit {self.proc.poll()}): "
                    f"{self.err.read_text()[-4000:] if self.err.exists() else ''}"
                )
            if got.get("event") == event:
                return got
            if got.get("event") == "error":
                raise AssertionError(f"the driver failed: {got}")

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        with suppress(ProcessLookupError):
            self.proc.kill()
        with suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with suppress(OSError):
                    stream.close()
