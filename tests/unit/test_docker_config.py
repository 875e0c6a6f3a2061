"""The docker backend's configuration checks: the engine-socket hard-link search over a real file
tree with a real unix socket, the limits docker accepts, and reading a container's cgroup limits."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxrun.backends.docker import config as cfg
from sandboxrun.errors import ConfigError
from sandboxrun.models import Limits, Policy
from sandboxrun.supervisor.procfs import parse_cgroup_lines

MiB = 1 << 20


def limits_of(proc_cgroup: str, mount: Path) -> set[str] | None:
    """The limits a container's cgroup shows, from its ``/proc/PID/cgroup`` text."""
    return cfg.cgroup_limits(parse_cgroup_lines(proc_cgroup), str(mount))


@pytest.fixture
def engine_sock(tmp_path: Path) -> Iterator[Path]:
    """A real listening unix socket standing in for the engine's, on the workspace's file system."""
    path = tmp_path / "engine" / "docker.sock"
    path.parent.mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    yield path
    server.close()


def many_files(root: Path, count: int, per_dir: int = 1000) -> None:
    for start in range(0, count, per_dir):
        sub = root / f"d{start // per_dir}"
        sub.mkdir(parents=True)
        for i in range(min(per_dir, count - start)):
            os.mknod(sub / f"f{i}")


def test_a_workspace_larger_than_the_search_bound_is_not_refused(
    tmp_path: Path, engine_sock: Path
) -> None:
    """The socket has one link (its own name): no file tree can hold another, nothing is walked."""
    ws = tmp_path / "ws"
    many_files(ws, 3000)
    cfg.check_workspace(ws, str(engine_sock), max_entries=100)


def test_a_hard_link_in_the_workspace_is_found_and_named(tmp_path: Path, engine_sock: Path) -> None:
    ws = tmp_path / "ws"
    many_files(ws, 300)
    os.link(engine_sock, ws / "d0" / "innocent")
    with pytest.raises(ConfigError, match=r"d0/innocent is the engine socket"):
        cfg.check_workspace(ws, str(engine_sock))


def test_a_hard_link_elsewhere_is_searched_for_within_the_bound(
    tmp_path: Path, engine_sock: Path
) -> None:
    ws = tmp_path / "ws"
    many_files(ws, 300)
    os.link(engine_sock, tmp_path / "elsewhere")
    cfg.check_workspace(ws, str(engine_sock))  # searched, not found: allowed


def test_a_hard_link_elsewhere_and_a_workspace_too_large_to_search_names_the_cause(
    tmp_path: Path, engine_sock: Path
) -> None:
    ws = tmp_path / "ws"
    many_files(ws, 300)
    os.link(engine_sock, tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"2 hard links") as info:
        cfg.check_workspace(ws, str(engine_sock), max_entries=100)
    assert str(engine_sock) in str(info.value)


def test_a_symlink_to_the_socket_is_not_a_second_link(tmp_path: Path, engine_sock: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "sock").symlink_to(engine_sock)  # docker does not follow symlinks inside a bind mount
    cfg.check_workspace(ws, str(engine_sock), max_entries=0)


# -- limits ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (Limits(memory_bytes=6 * MiB - 1), "--memory must be at least 6 MiB"),
        (Limits(memory_bytes=1), "--memory must be at least 6 MiB"),
        (Limits(cpus=2.01), "--cpus must be at most 2"),
        (Limits(cpus=64), "--cpus must be at most 2"),
    ],
)
def test_limits_docker_refuses_are_refused_first(limits: Limits, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cfg.check_limits(limits, cpu_count=2)


@pytest.mark.parametrize(
    "limits",
    [Limits(), Limits(memory_bytes=6 * MiB, cpus=0.01, pids=1), Limits(cpus=2.0)],
)
def test_limits_docker_accepts_pass(limits: Limits) -> None:
    cfg.check_limits(limits, cpu_count=2)
    cfg.check_limits(limits, cpu_count=None)  # a remote engine: its own check decides


def test_nano_cpus_is_never_zero() -> None:
    config = cfg.host_config(
        workspace=Path("/w"),
        policy=Policy(),
        limits=Limits(cpus=0.01),
        image="i",
        user="1:1",
        lbls={},
    )
    assert config["host_config"]["nano_cpus"] == 10_000_000


@pytest.mark.parametrize(("access", "runs"), [("workspace-write", True), ("read-only", False)])
def test_var_tmp_runs_programs_only_where_the_workspace_could_hold_them(
    access: str, runs: bool
) -> None:
    """inspect's sandbox tools run from /var/tmp; a read-only workspace gets no writable place
    that may run programs (the engine adds noexec to a tmpfs without ``exec``)."""
    config = cfg.host_config(
        workspace=Path("/w"),
        policy=Policy(access=access),
        limits=Limits(),
        image="i",
        user="1:1",
        lbls={},
    )
    tmpfs = config["host_config"]["tmpfs"]
    assert ("exec" in tmpfs["/var/tmp"].split(",")) is runs
    assert "exec" not in tmpfs["/tmp"].split(",") and "exec" not in tmpfs[cfg.HOME].split(",")
    assert {"nosuid", "nodev"} <= set(tmpfs["/var/tmp"].split(","))


# -- what the container's cgroup shows --------------------------------------------------------
HYBRID = """12:perf_event:/docker/abc
8:pids:/docker/abc
4:memory:/docker/abc
2:cpuacct:/docker/abc
1:cpu:/docker/abc
0::/docker/abc
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v1_limits(tmp_path: Path) -> None:
    write(tmp_path / "cpu/docker/abc/cpu.cfs_quota_us", "-1\n")
    write(tmp_path / "memory/docker/abc/memory.limit_in_bytes", "2147483648\n")
    write(tmp_path / "pids/docker/abc/pids.max", "512\n")
    assert limits_of(HYBRID, tmp_path) == {"memory-limit", "pids-limit"}
    write(tmp_path / "cpu/docker/abc/cpu.cfs_quota_us", "50000\n")
    write(tmp_path / "memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n")
    write(tmp_path / "pids/docker/abc/pids.max", "max\n")
    assert limits_of(HYBRID, tmp_path) == {"cpu-limit"}


def test_cgroup_v1_comounted_cpu_cpuacct(tmp_path: Path) -> None:
    write(tmp_path / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "1000\n")
    shown = limits_of("3:cpu,cpuacct:/docker/abc\n", tmp_path)
    assert shown == {"cpu-limit"}


def test_cgroup_v2_limits(tmp_path: Path) -> None:
    write(tmp_path / "system.slice/docker-abc.scope/cpu.max", "max 100000\n")
    write(tmp_path / "system.slice/docker-abc.scope/memory.max", "67108864\n")
    write(tmp_path / "system.slice/docker-abc.scope/pids.max", "64\n")
    text = "0::/system.slice/docker-abc.scope\n"
    assert limits_of(text, tmp_path) == {"memory-limit", "pids-limit"}
    write(tmp_path / "system.slice/docker-abc.scope/cpu.max", "1000 100000\n")
    write(tmp_path / "system.slice/docker-abc.scope/memory.max", "max\n")
    assert limits_of(text, tmp_path) == {"cpu-limit", "pids-limit"}


def test_unreadable_cgroup_is_none(tmp_path: Path) -> None:
    assert limits_of(HYBRID, tmp_path) is None


def test_isolation_drops_limits_the_cgroup_does_not_show() -> None:
    static = cfg.isolation(Policy(), Limits(cpus=1), "1000:1000")
    assert {"cpu-limit", "memory-limit", "pids-limit"} <= set(static)
    shown = cfg.isolation(Policy(), Limits(cpus=1), "1000:1000", shown={"pids-limit"})
    assert "pids-limit" in shown
    assert "cpu-limit" not in shown
    assert "memory-limit" not in shown
    assert shown[:3] == static[:3]


def test_check_is_fast_on_a_big_tree(tmp_path: Path, engine_sock: Path) -> None:
    ws = tmp_path / "ws"
    many_files(ws, 2000)
    start = time.monotonic()
    for _ in range(100):
        cfg.check_workspace(ws, str(engine_sock), max_entries=10)
    assert time.monotonic() - start < 0.5


def test_mask_mounts_only_inside_the_workspace(tmp_path: Path) -> None:
    from sandboxrun.backends.docker.config import mask_mounts
    from sandboxrun.engine.paths import CONTAINER_ROOT

    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "f").write_text("x")
    mounts = mask_mounts(ws, (str(ws / "d"), str(ws / "f"), str(ws / "missing"), str(tmp_path)))
    assert [(m["Target"], m["Type"]) for m in mounts] == [
        (str(CONTAINER_ROOT / "d"), "tmpfs"),
        (str(CONTAINER_ROOT / "f"), "bind"),
    ]
    assert all(m["ReadOnly"] for m in mounts)
    assert mounts[1]["Source"] == "/dev/null"


def test_start_timeout_grows_with_the_containers_cpu_quota() -> None:
    from sandboxrun.backends.docker.engine_exec import START_TIMEOUT_S, start_timeout

    assert start_timeout(None) == START_TIMEOUT_S  # a wedged engine is still found in time
    assert start_timeout(2.0) == pytest.approx(START_TIMEOUT_S + 0.1)
    assert start_timeout(0.01) == pytest.approx(START_TIMEOUT_S + 20.0)  # runc init at 1 %
