"""An ephemeral writable root (``--root writable``) and its bound (``--disk``), on a real engine:
package installs and ``adduser`` work as uid 0 and leave the host and the next sandbox
untouched; a flood past ``--disk`` (one big file, many small ones, a background writer that
left its session) ends ``disk_exceeded`` with every process of the sandbox gone and its root
thrown away, the workspace kept. The local backends refuse a writable root (no overlay here):
``tests/integration/test_local_isolation.py``."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import anyio
import docker
import pytest
from helpers import cli, processes_mentioning, require_backend, wait_until

from sandboxrun import Limits, Policy, PolicyRefusedError, Sandbox
from sandboxrun.backends.docker.backend import DockerBackend

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_ok")]

WRITABLE = Policy(root="writable")
PACKAGE = {
    "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\n'
    'build-backend = "setuptools.build_meta"\n\n'
    '[project]\nname = "tinypkg"\nversion = "1.0"\n',
    "tinypkg/__init__.py": "ANSWER = 42\n",
}


@pytest.fixture
def docker_ok() -> None:
    require_backend("docker")


def watched_here() -> None:
    """Skip where the engine bounds a root itself (``--storage-opt size``: the write fails
    with ENOSPC instead, ``failed`` with a ``disk-full`` denial): btrfs, zfs, overlay2 on xfs."""
    client = docker.from_env()
    try:
        info = client.info()
    finally:
        client.close()
    backing = dict(map(tuple, info.get("DriverStatus") or [])).get("Backing Filesystem", "")
    if info.get("Driver") in ("btrfs", "zfs") or "xfs" in str(backing):
        pytest.skip(f"this engine ({info.get('Driver')}) may bound the root itself: ENOSPC")


def _package(ws: Path) -> None:
    for name, text in PACKAGE.items():
        (ws / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / "pkg" / name).write_text(text)


async def test_install_and_adduser_as_root_leave_the_host_and_the_next_sandbox_untouched(
    workspace: Path,
) -> None:
    _package(workspace)
    passwd = Path("/etc/passwd").read_bytes()
    async with Sandbox(workspace, backend="docker", policy=WRITABLE, user="0") as sb:
        pip = await sb.exec(
            shell="pip install -q --no-build-isolation --no-index --break-system-packages "
            "--no-warn-script-location ./pkg 2>&1 && "
            "python3 -c 'import tinypkg; print(tinypkg.ANSWER)'"
        )
        assert pip.ok, pip.stdout + pip.stderr
        assert pip.stdout.strip().splitlines()[-1] == "42"
        assert "ephemeral-root" in pip.isolation and "read-only-root" not in pip.isolation
        user = await sb.exec(
            shell="adduser --comment t --disabled-password bob >/dev/null 2>&1; id -u bob; "
            "stat -c %U /home/bob; runuser -u bob -- whoami"
        )
        assert user.ok, user.stdout + user.stderr
        lines = user.stdout.split()
        assert lines[1:] == ["bob", "bob"] and int(lines[0]) >= 1000, user.stdout
        assert (await sb.exec(shell="echo x > /etc/made-here && cat /etc/made-here")).ok
    assert Path("/etc/passwd").read_bytes() == passwd
    assert not Path("/etc/made-here").exists()
    # a new sandbox starts from the image again: nothing of the last one's root
    async with Sandbox(workspace, backend="docker", policy=WRITABLE, user="0") as sb:
        again = await sb.exec(
            shell="id bob; ls /etc/made-here; python3 -c 'import tinypkg'; echo end"
        )
        assert "no such user" in again.stdout + again.stderr
        assert "No such file" in again.stderr and "ModuleNotFoundError" in again.stderr
    # the workspace is the host's: what pip built there stays
    built = workspace / "pkg"
    assert (built / "tinypkg.egg-info").is_dir() or (built / "build").exists()


async def test_the_default_root_stays_read_only_and_a_non_root_user_gets_no_capabilities(
    workspace: Path,
) -> None:
    async with Sandbox(workspace, backend="docker") as sb:
        ro = await sb.exec(shell="touch /etc/x")
        assert not ro.ok and "Read-only file system" in ro.stderr
        assert "read-only-root" in ro.isolation
    async with Sandbox(workspace, backend="docker", policy=WRITABLE, user="1000") as sb:
        caps = await sb.exec(shell="grep CapEff /proc/self/status; touch /etc/x")
        assert "CapEff:\t0000000000000000" in caps.stdout
        assert "Permission denied" in caps.stderr  # a writable root, but /etc is root's
        home = await sb.exec(shell="mkdir -p /opt/mine 2>&1 || echo refused")
        assert "refused" in home.stdout


async def test_a_disk_kill_result_comes_only_once_every_process_is_gone(workspace: Path) -> None:
    """The watch kills the container's PID 1; the kernel kills the rest of its namespace only
    after PID 1's socket to the host closed, which is how the run's end is seen. With 200
    daemons (each in its own session) to kill, the result must still come only once none
    lives (CI once saw one daemon alive at the result)."""
    marker = f"9{uuid.uuid4().int % 10**6:06d}.5"
    limits = Limits(disk_bytes=64 << 20, timeout_s=60, pids=1024)
    async with Sandbox(workspace, backend="docker", policy=WRITABLE, user="0", limits=limits) as sb:
        assert isinstance(sb.backend, DockerBackend)
        if sb.backend.disk_mode != "watch":
            pytest.skip("this engine bounds the root itself (--storage-opt size): ENOSPC")
        script = f"for i in $(seq 200); do setsid sleep {marker} > /dev/null 2>&1 & done; wait"
        await sb.start(["sh", "-c", script])  # (a job: they outlive no exec of their own)
        assert await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: len(processes_mentioning(marker)) >= 200, 20)
        )
        result = await sb.exec(shell="fallocate -l 1G /var/big")
        assert result.status == "disk_exceeded", result
        alive = processes_mentioning(marker)
        assert not alive, f"{len(alive)} daemons of the over-full sandbox lived at its result"


@pytest.mark.parametrize(
    "flood",
    [
        "dd if=/dev/zero of=/var/big bs=1M count=400 status=none",
        # many small files: the walk of the layer sees them too
        "python3 -c \"import os; os.makedirs('/var/many', exist_ok=True)\n"
        "for i in range(40000): open(f'/var/many/{i}', 'wb').write(b'x' * 4096)\"",
        # one call claims it all, between two looks of the watch: the run's end looks again
        "fallocate -l 1G /var/big",
        # a file no name leads to any more, still written
        "exec 3>/var/big; rm /var/big; head -c 400M /dev/zero >&3",
        # the engine's own file, outside the layer
        "head -c 400M /dev/zero > /etc/hosts",
    ],
    ids=["one-file", "many-files", "fallocate", "deleted-open", "etc-hosts"],
)
async def test_disk_stops_a_flood_and_throws_the_root_away(workspace: Path, flood: str) -> None:
    marker = f"9{uuid.uuid4().int % 10**6:06d}.5"  # `sleep 9123456.5`: its own
    limits = Limits(disk_bytes=64 << 20, timeout_s=60)
    async with Sandbox(workspace, backend="docker", policy=WRITABLE, user="0", limits=limits) as sb:
        assert isinstance(sb.backend, DockerBackend)
        first_cid = sb.backend.session.container_id
        assert first_cid is not None
        if sb.backend.disk_mode != "watch":
            pytest.skip("this engine bounds the root itself (--storage-opt size): ENOSPC")
        before = await sb.exec(shell="echo kept > /etc/before; echo ws > /workspace/ws-file")
        assert before.ok and "disk-limit" in before.isolation, before
        # a writer that left the command's session, also past the bound
        await sb.start(["sh", "-c", f"setsid sleep {marker} & wait"])
        assert await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: bool(processes_mentioning(marker)), 10)
        )
        started = time.monotonic()
        result = await sb.exec(shell=flood)
        assert result.status == "disk_exceeded", result
        assert "--disk 64m" in (result.error or "") and "MiB" in (result.error or "")
        assert result.denial is not None and result.denial.kind == "disk-full"
        assert time.monotonic() - started < 50
        assert not processes_mentioning(marker), "a process of the over-full sandbox lives"
        # the next command gets a fresh root: nothing of the old one's, the workspace kept
        after = await sb.exec(
            shell="cat /etc/before; ls /var/big /var/many; cat /workspace/ws-file"
        )
        assert "No such file" in after.stderr and "kept" not in after.stdout, after
        assert after.stdout.strip() == "ws"
        assert sb.backend.session.container_id != first_cid
    assert (workspace / "ws-file").read_text() == "ws\n"
    client = docker.from_env()
    try:
        assert not client.containers.list(all=True, ignore_removed=True, filters={"id": first_cid})
    finally:
        client.close()


def test_cli_disk_exit_status_and_line(workspace: Path) -> None:
    watched_here()
    proc = cli(
        "run", "-b", "docker", "--root", "writable", "--disk", "32m", "--user", "0", "-w",
        str(workspace), "--", "sh", "-c", "echo partial; dd if=/dev/zero of=/big bs=1M count=300",
    )  # fmt: skip
    assert proc.returncode == 137, proc.stderr
    assert proc.stdout == "partial\n"
    assert "past --disk 32m" in proc.stderr and "a larger --disk allows more" in proc.stderr


def test_a_detached_sandbox_gets_a_fresh_root_after_its_bound(workspace: Path) -> None:
    """Through the keeper (``create``/``exec``/``rm``, separate CLI processes)."""
    watched_here()
    made = cli(
        "create", "-b", "docker", "--root", "writable", "--disk", "32m", "--user", "0",
        "-w", str(workspace),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    name = made.stdout.strip()
    try:
        script = "echo a > /etc/a; dd if=/dev/zero of=/big bs=1M count=300 status=none"
        flood = cli("exec", name, "--", "sh", "-c", script)
        assert flood.returncode == 137 and "past --disk 32m" in flood.stderr, flood.stderr
        after = cli("exec", name, "--", "sh", "-c", "ls /etc/a /big; touch /etc/b && echo ok")
        assert after.returncode == 0 and after.stdout == "ok\n", after.stderr
        assert after.stderr.count("No such file") == 2
    finally:
        gone = cli("rm", "--force", name)
    assert gone.returncode == 0, gone.stderr


def test_cli_disk_needs_a_writable_root(workspace: Path) -> None:
    proc = cli("run", "-b", "docker", "--disk", "32m", "-w", str(workspace), "--", "true")
    assert proc.returncode == 125
    assert "--disk" in proc.stderr and "--root writable" in proc.stderr
    small = cli("run", "--root", "writable", "--disk", "100k", "-w", str(workspace), "--", "true")
    assert small.returncode == 125 and "--disk must be at least 1m" in small.stderr


async def test_a_bound_that_cannot_be_enforced_is_refused(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layer this host cannot read (a remote engine's): ``disk-limit`` is missing, so the
    sandbox is refused, with nothing left; with ``allow_degraded`` it runs unbounded and says so."""
    watched_here()
    from sandboxrun.backends.docker import disk

    monkeypatch.setattr(disk, "upper_dir", lambda inspected: None)
    limits = Limits(disk_bytes=64 << 20)
    with pytest.raises(PolicyRefusedError, match="disk-limit"):
        async with Sandbox(workspace, backend="docker", policy=WRITABLE, limits=limits):
            pass
    degraded = Policy(root="writable", allow_degraded=True)
    async with Sandbox(workspace, backend="docker", policy=degraded, limits=limits) as sb:
        result = await sb.exec(["true"])
        assert result.ok and "disk-limit" in result.missing_guarantees
        assert "disk-limit" not in result.isolation
    assert os.path.isdir(workspace)
