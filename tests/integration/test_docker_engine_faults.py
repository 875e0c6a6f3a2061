"""The docker backend against a real engine that misbehaves: a proxy (``engine_proxy``) in front of
the real engine socket stalls container removal, coalesces the exec-start response head with the
first output frame, or drops the limits of a container create. Also: a workspace of 200k files.

Every container a test leaks on purpose is removed by id through the real engine socket.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from engine_proxy import EngineProxy, real_engine_socket
from helpers import require_backend

from sandboxrun import Limits, PolicyRefusedError, Sandbox
from sandboxrun.backends.docker import backend as docker_backend
from sandboxrun.backends.docker import cgroup as docker_cgroup
from sandboxrun.backends.docker.backend import DockerBackend
from sandboxrun.models import Policy

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def engine_exec_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """These faults are the engine's: its exec stream and its removal. With the supervisor
    no command crosses the engine, and a container the engine fails to remove removes itself
    once its supervisor exits (``test_docker_supervisor.py``)."""
    monkeypatch.setenv("SANDBOXRUN_DOCKER_SUPERVISOR", "0")


CLI = [sys.executable, "-m", "sandboxrun"]
MiB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def docker_available() -> None:
    require_backend("docker")
    try:
        real_engine_socket()
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    """The real engine (never the proxy)."""
    client = docker.DockerClient(base_url=f"unix://{real_engine_socket()}", timeout=30)
    yield client
    client.close()


def containers_of(engine: docker.DockerClient, workspace: Path) -> list[str]:
    digest = hashlib.sha256(str(workspace.resolve()).encode()).hexdigest()[:16]
    found = engine.api.containers(all=True, filters={"label": f"sandboxrun.workspace={digest}"})
    return [str(c["Id"]) for c in found]


@pytest.fixture
def leaked(engine: docker.DockerClient, workspace: Path) -> Iterator[list[str]]:
    """Ids of containers a test leaks on purpose; all of the workspace's are removed after."""
    ids: list[str] = []
    yield ids
    for cid in {*ids, *containers_of(engine, workspace)}:
        with contextlib.suppress(docker.errors.NotFound):
            engine.api.remove_container(cid, force=True, v=True)


def cli(*args: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


# -- item 9: an engine that never answers the removal -----------------------------------------
@pytest.mark.parametrize("json_out", [False, True])
def test_cli_reports_a_container_it_could_not_remove_within_its_budget(
    tmp_path: Path, workspace: Path, engine: docker.DockerClient, leaked: list[str], json_out: bool
) -> None:
    mode = ["--json"] if json_out else []
    with EngineProxy(tmp_path / "proxy.sock", stall_deletes=-1) as proxy:
        env = {**os.environ, "DOCKER_HOST": proxy.url}
        start = time.monotonic()
        proc = cli("run", "-b", "docker", *mode, "-w", str(workspace), "--", "echo", "hi", env=env)
        elapsed = time.monotonic() - start
        assert proxy.stalled, "the removal never reached the proxy"
    ids = containers_of(engine, workspace)
    leaked += ids
    assert len(ids) == 1
    assert proc.returncode == 0, proc.stderr
    if json_out:  # one JSON object whose warnings name the container left behind
        result = json.loads(proc.stdout)
        assert result["stdout"] == "hi\n"
        assert any(ids[0][:12] in w and "sandboxrun clean" in w for w in result["warnings"])
    else:
        assert proc.stdout == "hi\n"
    assert elapsed < docker_backend.CLOSE_BUDGET_S + 8, elapsed
    assert ids[0][:12] in proc.stderr
    assert "sandboxrun clean" in proc.stderr
    assert "warning" in proc.stderr
    real = {**os.environ, "DOCKER_HOST": f"unix://{real_engine_socket()}"}
    listed = json.loads(cli("ps", "--json", env=real).stdout)
    assert ids[0] in [row["id"] for row in listed]  # still labelled: `clean` will find it


def test_a_second_connect_to_an_engine_asks_no_version_and_a_lost_one_is_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API version an engine negotiated is kept for the process (``api.connect``: one
    round trip fewer at every open after the first); an engine that could not be reached is
    asked again next time (it may be another engine now)."""
    from sandboxrun.backends.docker import api
    from sandboxrun.errors import SandboxUnavailableError

    def paths(proxy: EngineProxy) -> list[bytes]:
        return [line.split(b" ")[1].split(b"?")[0] for line in proxy.requests]

    url = f"unix://{tmp_path / 'proxy.sock'}"
    with EngineProxy(tmp_path / "proxy.sock") as proxy:  # (made before: it forwards to the engine)
        monkeypatch.setenv("DOCKER_HOST", url)
        for _ in range(3):
            api.connect(5).close()
        assert sum(p.endswith(b"/version") for p in paths(proxy)) == 1, paths(proxy)
        assert sum(p.endswith(b"/_ping") for p in paths(proxy)) == 3, paths(proxy)
    with pytest.raises(SandboxUnavailableError):
        api.connect(2)  # (the socket is gone)
    monkeypatch.delenv("DOCKER_HOST")
    with EngineProxy(tmp_path / "proxy.sock") as proxy:
        monkeypatch.setenv("DOCKER_HOST", url)
        api.connect(5).close()
        assert sum(p.endswith(b"/version") for p in paths(proxy)) == 1, paths(proxy)
        # an engine that answers but refuses the version kept (replaced by an older one):
        # the next connect negotiates again instead of failing
        key = api._engine_key()
        negotiated = api._API_VERSIONS[key]
        api._API_VERSIONS[key] = (negotiated[0], "1.99")
        api.connect(5).close()
        assert api._API_VERSIONS[key] == negotiated
        assert sum(p.endswith(b"/version") for p in paths(proxy)) == 2, paths(proxy)
        assert any(p.startswith(b"/v1.99/") for p in paths(proxy)), paths(proxy)


async def test_api_close_errors_name_the_container_left_behind(
    tmp_path: Path,
    workspace: Path,
    engine: docker.DockerClient,
    leaked: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(docker_backend, "CLOSE_BUDGET_S", 3.0)
    monkeypatch.setattr(docker_backend, "REMOVE_ATTEMPT_S", 1.0)
    with EngineProxy(tmp_path / "proxy.sock", stall_deletes=-1) as proxy:
        monkeypatch.setenv("DOCKER_HOST", proxy.url)
        sb = Sandbox(workspace, backend="docker")
        async with sb:
            assert (await sb.exec(["true"])).ok
            assert isinstance(sb.backend, DockerBackend)
            cid = sb.backend.session.container_id
            start = time.monotonic()
        elapsed = time.monotonic() - start
        assert cid is not None
        leaked.append(cid)
        assert len(proxy.stalled) >= 2  # asked again after the first attempt's deadline
    assert elapsed < 3.0 + 1.5, elapsed
    assert len(sb.close_errors) == 1
    assert cid[:12] in sb.close_errors[0]
    assert "sandboxrun clean" in sb.close_errors[0]
    assert containers_of(engine, workspace) == [cid]


async def test_close_retries_a_stalled_removal_within_its_budget(
    tmp_path: Path,
    workspace: Path,
    engine: docker.DockerClient,
    leaked: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(docker_backend, "CLOSE_BUDGET_S", 8.0)
    monkeypatch.setattr(docker_backend, "REMOVE_ATTEMPT_S", 1.0)
    with EngineProxy(tmp_path / "proxy.sock", stall_deletes=1) as proxy:
        monkeypatch.setenv("DOCKER_HOST", proxy.url)
        sb = Sandbox(workspace, backend="docker")
        start = time.monotonic()
        async with sb:
            assert (await sb.exec(["true"])).ok
        elapsed = time.monotonic() - start
        assert len(proxy.stalled) == 1
    assert sb.close_errors == []
    assert containers_of(engine, workspace) == []
    assert elapsed < 8


# -- item 10: the exec-start response head and the first frame in one read -------------------
async def test_output_coalesced_with_the_exec_start_response_is_kept(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a cgroup per exec (a host whose cgroup v2 directory is not writable: chosen here)
    the exec writes as soon as it starts, so its first frame can share a read with the head."""
    monkeypatch.setattr(docker_cgroup, "unified_dir", lambda pid, cid: None)
    with EngineProxy(tmp_path / "proxy.sock", coalesce_exec_start=True) as proxy:
        monkeypatch.setenv("DOCKER_HOST", proxy.url)
        async with Sandbox(workspace, backend="docker") as sb:
            results = [await sb.exec(["echo", "hello"]) for _ in range(3)]
            both = await sb.exec(shell="echo out; echo err >&2; echo more")
            fed = await sb.exec(["cat"], stdin=b"fed\n")
        assert proxy.coalesced >= 4  # not `cat`: it writes only after its stdin is sent
    for result in results:
        assert result.status == "completed"
        assert result.stdout == "hello\n"
    assert both.stdout == "out\nmore\n"
    assert both.stderr == "err\n"
    assert fed.stdout == "fed\n"


# -- item 7: limits the engine did not apply are not listed ----------------------------------
LIMITED = Limits(cpus=0.5, memory_bytes=64 * MiB, pids=64, grace_s=0.5)
CGROUP_VIEW = (
    "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max"
)


async def test_isolation_lists_the_limits_the_cgroup_shows(workspace: Path) -> None:
    async with Sandbox(workspace, backend="docker", limits=LIMITED) as sb:
        result = await sb.exec(shell=CGROUP_VIEW)
    assert result.stdout.strip() == "50000"
    assert {"cpu-limit", "memory-limit", "pids-limit"} <= set(result.isolation)
    assert result.missing_guarantees == []


async def test_limits_an_engine_dropped_are_not_listed(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with EngineProxy(tmp_path / "proxy.sock", strip_limits=True):
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'proxy.sock'}")
        with pytest.raises(PolicyRefusedError, match="cpu-limit"):  # fail closed by default
            async with Sandbox(workspace, backend="docker", limits=LIMITED) as sb:
                await sb.exec(["true"])
        degraded = Policy(allow_degraded=True)
        async with Sandbox(workspace, backend="docker", limits=LIMITED, policy=degraded) as sb:
            result = await sb.exec(shell=CGROUP_VIEW)
        assert result.stdout.strip() in ("-1", "max")  # really no CPU limit
        assert not {"cpu-limit", "memory-limit", "pids-limit"} & set(result.isolation)
        assert set(result.missing_guarantees) >= {"cpu-limit", "memory-limit", "pids-limit"}
        strict = Policy(strict=True, allow_degraded=True)
        with pytest.raises(PolicyRefusedError, match="cpu-limit"):
            async with Sandbox(workspace, backend="docker", limits=LIMITED, policy=strict) as sb:
                await sb.exec(["true"])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--cpus", "0.0000000001", "--cpus must be at least 0.01"),
        ("--cpus", "0", "--cpus must be more than 0"),
        ("--cpus", "100000", "--cpus 100000 is more than this host's"),
        ("--memory", "1k", "--memory must be at least 6m"),
        ("--grace", "100000", "--grace"),
    ],
)
def test_limits_the_engine_cannot_honour_exit_2_before_any_container(
    workspace: Path, engine: docker.DockerClient, option: str, value: str, message: str
) -> None:
    proc = cli(
        "run", "-b", "docker", "-w", str(workspace), option, value, "--", "true", env={**os.environ}
    )
    assert proc.returncode == 125, proc.stderr
    assert message in proc.stderr
    assert containers_of(engine, workspace) == []


# -- item 6: a workspace with many files -------------------------------------------------------
@pytest.fixture(scope="module")
def big_fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tmpfs (fast to fill and to drop) holding a 201k-file workspace ``ws``; the engine proxy
    socket goes on the same file system, as the engine socket shares /tmp's on many hosts."""
    mount = tmp_path_factory.mktemp("bigfs")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256m,nr_inodes=400k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a fast 200k-file workspace: {done.stderr.strip()}")
    try:
        ws = mount / "ws"
        for d in range(201):  # more than the 200k entries the old search walked
            sub = ws / f"d{d}"
            sub.mkdir(parents=True)
            for i in range(1000):
                os.mknod(sub / f"f{i}")
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_200k_file_workspace_on_the_engine_sockets_file_system_runs(
    big_fs: Path, engine: docker.DockerClient
) -> None:
    ws = big_fs / "ws"
    try:
        with EngineProxy(big_fs / "proxy.sock") as proxy:
            env = {**os.environ, "DOCKER_HOST": proxy.url}
            assert os.stat(big_fs / "proxy.sock").st_dev == os.stat(ws).st_dev
            start = time.monotonic()
            proc = cli("run", "-b", "docker", "-w", str(ws), "--", "true", env=env)
            elapsed = time.monotonic() - start
            assert proc.returncode == 0, proc.stderr
            assert elapsed < 20
            os.link(big_fs / "proxy.sock", ws / "d7" / "f-link")
            refused = cli("run", "-b", "docker", "-w", str(ws), "--", "true", env=env)
            assert refused.returncode == 125
            assert "is the engine socket" in refused.stderr
            assert "d7/f-link" in refused.stderr
    finally:
        (ws / "d7" / "f-link").unlink(missing_ok=True)
        for cid in containers_of(engine, ws):
            engine.api.remove_container(cid, force=True, v=True)
