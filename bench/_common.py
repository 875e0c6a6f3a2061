"""Shared helpers of the benchmarks in ``bench/``.

Every benchmark is a standalone script that prints exactly one JSON line on stdout. Figures are
ratios against a baseline measured in the same run, so they say something on any machine; the
absolute numbers are reported too, with a little machine context.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from docker import DockerClient

    from sandboxrun import ExecResult

MARKER_VAR = "SANDBOXRUN_RUN_ID"


def env_int(name: str, default: int) -> int:
    """An integer from the environment (``BENCH_BYTES=1073741824``), else ``default``."""
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def rounded(value: float, digits: int = 3) -> float:
    return round(value, digits)


def ms(seconds: float) -> float:
    return rounded(seconds * 1000.0)


def summary(samples: list[float]) -> dict[str, float]:
    """p50/p95/min/max of latencies given in seconds, in milliseconds."""
    return {
        "p50_ms": ms(percentile(samples, 50)),
        "p95_ms": ms(percentile(samples, 95)),
        "min_ms": ms(min(samples)),
        "max_ms": ms(max(samples)),
    }


def head_argv(n: int) -> list[str]:
    return ["head", "-c", str(n), "/dev/zero"]


PIPE_READ_CHUNK = 65536


def pipe_read_once(n: int) -> float:
    """Seconds to drain ``n`` bytes from a plain local pipe (``head -c n /dev/zero``, spawn
    to reap, ``os.read(fd, PIPE_READ_CHUNK)``): the baseline of the output benchmarks."""
    start = time.perf_counter()
    proc = subprocess.Popen(head_argv(n), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    total = 0
    while True:
        data = os.read(fd, PIPE_READ_CHUNK)
        if not data:
            break
        total += len(data)
    proc.wait()
    elapsed = time.perf_counter() - start
    proc.stdout.close()
    if total != n or proc.returncode != 0:
        raise RuntimeError(f"pipe baseline read {total} of {n} bytes, exit {proc.returncode}")
    return elapsed


def mb_per_s(n: int, seconds: float) -> float:
    return n / 1e6 / seconds if seconds > 0 else 0.0


def accounting(result: ExecResult, n: int, max_output: int) -> dict[str, Any]:
    """Whether the run counted every byte of an ``n``-byte stdout flood exactly."""
    expected_dropped = max(0, n - max_output)
    return {
        "status": result.status,
        "total_bytes": result.stdout_total_bytes,
        "dropped_bytes": result.stdout_dropped_bytes,
        "exact": result.status == "completed"
        and result.stdout_total_bytes == n
        and result.stdout_dropped_bytes == expected_dropped,
    }


def maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


class RssSampler:
    """Samples the current RSS every few ms in a thread: ``ru_maxrss`` is a high-water mark
    since the process started, so growth that stays below an earlier (import-time) peak is
    invisible to it; the sampled peak shows it (reported, not a target)."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self.start_rss = self._proc.memory_info().rss
        self.peak_rss = self.start_rss
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.peak_rss = max(self.peak_rss, self._proc.memory_info().rss)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_rss = max(self.peak_rss, self._proc.memory_info().rss)


def latency_stats(latencies: list[float]) -> dict[str, Any]:
    """p50/max/min and every value, in seconds (the kill benchmarks' shared figures)."""
    return {
        "p50_s": rounded(percentile(latencies, 50)),
        "max_s": rounded(max(latencies)),
        "min_s": rounded(min(latencies)),
        "latency_s": [rounded(x) for x in latencies],
    }


def machine() -> dict[str, Any]:
    """A little context: where the numbers come from."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def emit(payload: dict[str, Any]) -> None:
    """Print the one JSON line of a benchmark."""
    sys.stdout.write(json.dumps(payload, separators=(",", ":")) + "\n")
    sys.stdout.flush()


@contextmanager
def temp_workspace(prefix: str = "sandboxrun-bench-") -> Iterator[Path]:
    """A throw-away workspace directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as path:
        yield Path(path)


def marked_alive(run_id: str) -> list[int]:
    """Pids of live (non-zombie) processes carrying the run's environment marker."""
    found: list[int] = []
    for proc in psutil.process_iter():
        with suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARKER_VAR) == run_id:
                found.append(proc.pid)
    return found


def quiet_logs() -> None:
    """Silence sandboxrun's one-off "cannot enforce" warning (the process-group backend cannot
    confine the filesystem or the network; that is expected here and not what is measured)."""
    logging.getLogger("sandboxrun").setLevel(logging.ERROR)


# -- docker baselines -------------------------------------------------------------------------
# Imported lazily: the process-group benchmarks never touch the engine.

DOCKER_IMAGE = "sandboxrun/base:latest"
MANAGED_LABEL = "sandboxrun.managed"
BENCH_LABEL = "sandboxrun.bench"
CONTAINER_WORKDIR = "/workspace"
BASE_TMPFS = "rw,nosuid,nodev,size=256m,mode=1777"
ENGINE_TIMEOUT_S = 60


def docker_client() -> DockerClient:
    """A plain docker-py client of the baselines (its own connection pool, not sandboxrun's)."""
    import docker

    client = docker.from_env(timeout=ENGINE_TIMEOUT_S)
    client.ping()
    return client


def bench_labels(bench: str) -> dict[str, str]:
    """Labels of every container a benchmark creates itself: managed (so every sweep and the
    test guard know it), which benchmark, and the owner as sandboxrun labels its own (process,
    host, creation time), so ``sandboxrun clean`` can tell a leaked one from a live one."""
    return {
        MANAGED_LABEL: "true",
        BENCH_LABEL: bench,
        "sandboxrun.owner_pid": str(os.getpid()),
        "sandboxrun.owner_host": socket.gethostname(),
        "sandboxrun.created": str(int(time.time())),
    }


def user_spec() -> str:
    return f"{os.getuid()}:{os.getgid()}"


def create_baseline(
    client: DockerClient, workspace: Path, bench: str, *, seccomp: bool = False
) -> str:
    """Create (not start) a container like sandboxrun's: same image, ``sleep infinity`` under
    an init, all capabilities dropped, no new privileges, read-only root with tmpfs /tmp and
    home, no network, pids and memory limits, no logging, the workspace bound read-write.
    ``seccomp``: sandboxrun's seccomp profile too, and its ``/var/tmp`` tmpfs (the whole
    hardening of a sandbox, for a start-up compared with sandboxrun's)."""
    from docker.types import LogConfig

    api = client.api
    security = ["no-new-privileges"]
    tmpfs = {"/tmp": BASE_TMPFS, "/home/sandbox": BASE_TMPFS}
    if seccomp:
        from sandboxrun.backends.docker import seccomp as profile

        security.append(f"seccomp={profile.profile_json()}")
        tmpfs["/var/tmp"] = BASE_TMPFS
    host = api.create_host_config(
        init=True,
        cap_drop=["ALL"],
        security_opt=security,
        read_only=True,
        tmpfs=tmpfs,
        pids_limit=512,
        mem_limit=2 << 30,
        memswap_limit=2 << 30,
        network_mode="none",
        log_config=LogConfig(type=LogConfig.types.NONE),
        binds={str(workspace): {"bind": CONTAINER_WORKDIR, "mode": "rw"}},
    )
    created = api.create_container(
        DOCKER_IMAGE,
        command=["sleep", "infinity"],
        user=user_spec(),
        labels=bench_labels(bench),
        working_dir=CONTAINER_WORKDIR,
        network_disabled=True,
        host_config=host,
    )
    return str(created["Id"])


def remove_container(client: DockerClient, container_id: str) -> None:
    """Force-remove (with its anonymous volumes); already gone is fine."""
    import docker.errors

    with suppress(docker.errors.NotFound):
        client.api.remove_container(container_id, force=True, v=True)


@contextmanager
def baseline_container(client: DockerClient, workspace: Path, bench: str) -> Iterator[str]:
    """A started baseline container, force-removed afterwards whatever happens."""
    container_id = create_baseline(client, workspace, bench)
    try:
        client.api.start(container_id)
        yield container_id
    finally:
        remove_container(client, container_id)


def raw_exec(
    client: DockerClient,
    container_id: str,
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    chunk: int = 65536,
) -> tuple[int, int | None]:
    """The raw Engine API exec, as sandboxrun does it but without it: ``exec_create``,
    ``exec_start(socket=True)``, read the raw (still multiplexed) socket until EOF, then
    ``exec_inspect``. Returns ``(stream bytes read, exit code)``."""
    api = client.api
    created = api.exec_create(
        container_id, list(cmd), environment=env, workdir=CONTAINER_WORKDIR, user=user_spec()
    )
    exec_id = created["Id"]
    wrapper = api.exec_start(exec_id, socket=True)
    sock = getattr(wrapper, "_sock", wrapper)
    if not isinstance(sock, socket.socket):
        wrapper.close()
        raise TypeError(f"unexpected exec stream object {type(sock).__name__}")
    total = 0
    try:
        while True:
            data = sock.recv(chunk)
            if not data:
                break
            total += len(data)
    finally:
        sock.close()
        wrapper.close()
    info = api.exec_inspect(exec_id)
    code = info.get("ExitCode")
    return total, None if code is None else int(code)


def own_containers(client: DockerClient, pid: int | None = None) -> list[str]:
    """Ids of the managed containers process ``pid`` (default: this one) created, directly or
    through sandboxrun (both label their containers with the creating pid)."""
    owner = os.getpid() if pid is None else pid
    found = client.api.containers(
        all=True, filters={"label": [f"{MANAGED_LABEL}=true", f"sandboxrun.owner_pid={owner}"]}
    )
    return [str(c["Id"]) for c in found]


def sweep_own_containers(client: DockerClient, pid: int | None = None) -> list[str]:
    """Remove whatever :func:`own_containers` finds (there should be nothing); return the ids."""
    left = own_containers(client, pid)
    for container_id in left:
        remove_container(client, container_id)
    return left
