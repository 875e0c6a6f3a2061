"""The local isolation layer, attacked on real processes: process-group here, and systemd-scope
in the systemd test host. Each test states an escape a command tries, and fails if it works."""

from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from helpers import processes_with_arg, require_backend, wait_until

from sandboxrun import Limits, Policy, Sandbox
from sandboxrun.models import ExecResult

LOCAL = ["process-group", "systemd-scope"]
PY = sys.executable


def run(ws: Path, backend: str, script: str, **policy: object) -> ExecResult:
    async def go() -> ExecResult:
        async with Sandbox(
            ws, backend=backend, policy=Policy(**policy), limits=Limits(timeout_s=30, grace_s=0.5)
        ) as sb:
            return await sb.exec(shell=script)

    return anyio.run(go)


@pytest.fixture(params=LOCAL)
def backend(request: pytest.FixtureRequest) -> str:
    return require_backend(request.param)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def test_layers_are_reported(ws: Path, backend: str) -> None:
    result = run(ws, backend, "true")
    assert result.ok, result
    for layer in (
        "network-none",
        "read-only-root",
        "pid-namespace",
        "private-tmp",
        "sockets-masked",
        "secrets-masked",
        "landlock",
        "seccomp",
        "no-new-privileges",
    ):
        assert layer in result.isolation, (layer, result.isolation)
    assert result.missing_guarantees == []


@pytest.fixture
def tcp_server() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
    for conn in accepted:
        conn.close()


CONNECT_TCP = (
    "import socket,sys\n"
    "try:\n socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3)\n"
    "except OSError as e:\n print('refused', e); sys.exit(7)\n"
    "print('CONNECTED')\n"
)


def test_a_writable_root_is_refused_and_degrades_only_when_asked(ws: Path, backend: str) -> None:
    """No overlay in bookworm's bubblewrap: ``--root writable`` is a guarantee the local
    backends cannot give, refused by name with why; with ``allow_degraded`` the root stays
    read-only and the result says what is missing."""
    from sandboxrun import PolicyRefusedError

    with pytest.raises(PolicyRefusedError, match="ephemeral-root") as refused:
        run(ws, backend, "true", root="writable")
    assert "no overlay" in str(refused.value) and "docker" in str(refused.value)
    result = run(ws, backend, "touch /etc/x", root="writable", allow_degraded=True)
    assert not result.ok and "ephemeral-root" in result.missing_guarantees
    assert not os.path.exists("/etc/x")


def test_host_tcp_port_unreachable(ws: Path, backend: str, tcp_server: int) -> None:
    control = subprocess.run([PY, "-c", CONNECT_TCP, str(tcp_server)], capture_output=True)
    assert b"CONNECTED" in control.stdout  # the port is really open on the host
    (ws / "c.py").write_text(CONNECT_TCP)
    result = run(ws, backend, f"{PY} c.py {tcp_server}")
    assert "CONNECTED" not in result.stdout
    assert result.exit_code == 7, result


CONNECT_UNIX = (
    "import socket,sys\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "try:\n s.connect(sys.argv[1])\n"
    "except OSError as e:\n print('refused', e); sys.exit(7)\n"
    "print('CONNECTED')\n"
)


def socket_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) if os.geteuid() != 0 and runtime else Path("/run")


def test_host_unix_sockets_unreachable(ws: Path, backend: str) -> None:
    path = socket_dir() / f"sandboxrun-test-{secrets.token_hex(4)}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)
    try:
        control = subprocess.run([PY, "-c", CONNECT_UNIX, str(path)], capture_output=True)
        assert b"CONNECTED" in control.stdout
        (ws / "c.py").write_text(CONNECT_UNIX)
        targets = [str(path)]
        if Path("/var/run/docker.sock").exists():
            targets.append("/var/run/docker.sock")  # the engine: a full root escape
        for target in targets:
            result = run(ws, backend, f"{PY} c.py {target}")
            assert "CONNECTED" not in result.stdout, target
            assert result.exit_code == 7, result
    finally:
        server.close()
        path.unlink()


def test_host_tmp_and_home_not_writable(ws: Path, backend: str) -> None:
    token = secrets.token_hex(6)
    home = Path(os.path.expanduser("~"))
    targets = ["/tmp", "/var/tmp", str(home), "/etc"]
    script = "".join(f"echo x > {t}/escape-{token}; " for t in targets) + "echo done"
    result = run(ws, backend, script)
    assert "done" in result.stdout
    for where in (Path("/tmp"), Path("/var/tmp"), home, Path("/etc")):
        assert not (where / f"escape-{token}").exists(), where
    assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr


def test_private_tmp_is_shared_by_the_runs_of_one_sandbox(ws: Path, backend: str) -> None:
    token = secrets.token_hex(6)

    async def go() -> tuple[ExecResult, ExecResult]:
        async with Sandbox(ws, backend=backend, limits=Limits(timeout_s=30)) as sb:
            first = await sb.exec(shell=f"echo {token} > /tmp/shared")
            second = await sb.exec(shell="cat /tmp/shared")
            return first, second

    first, second = anyio.run(go)
    assert first.ok and second.ok, (first, second)
    assert second.stdout.strip() == token
    assert not Path("/tmp/shared").exists() or Path("/tmp/shared").read_text().strip() != token


def test_a_background_server_and_a_later_client_meet_on_loopback(ws: Path, backend: str) -> None:
    server = (
        "import socket\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 47311)); s.listen(1)\n"
        "print('listening', flush=True)\n"
        "c, _ = s.accept(); c.sendall(b'hello-from-server'); c.close()\n"
    )
    client = (
        "import socket, time\n"
        "for _ in range(100):\n"
        " try:\n  c = socket.create_connection(('127.0.0.1', 47311)); break\n"
        " except OSError: time.sleep(0.05)\n"
        "print(c.recv(100).decode())\n"
    )
    (ws / "server.py").write_text(server)
    (ws / "client.py").write_text(client)

    async def go() -> tuple[ExecResult, ExecResult]:
        async with Sandbox(ws, backend=backend, limits=Limits(timeout_s=20)) as sb:
            results: dict[str, ExecResult] = {}

            async def one(name: str) -> None:
                results[name] = await sb.exec([PY, f"{name}.py"])

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, "server")
                await anyio.sleep(0.3)
                tg.start_soon(one, "client")
            return results["server"], results["client"]

    srv, cli = anyio.run(go)
    assert srv.ok and cli.ok, (srv, cli)
    assert "hello-from-server" in cli.stdout


def test_secret_paths_are_masked(ws: Path, backend: str) -> None:
    ssh = Path(os.path.expanduser("~/.ssh"))
    created = not ssh.exists()
    ssh.mkdir(mode=0o700, exist_ok=True)
    planted = ssh / f"sandboxrun-planted-{secrets.token_hex(4)}"
    planted.write_text("PRIVATE-KEY-MATERIAL")
    extra = ws / "extra-secret.txt"  # a secret inside the workspace, masked on request
    extra.write_text("EXTRA-SECRET")
    try:
        script = f"cat {planted}; ls -a {ssh}; cat {extra}; echo end"
        result = run(ws, backend, script)
        assert "PRIVATE-KEY-MATERIAL" not in result.stdout
        assert planted.name not in result.stdout
        assert "EXTRA-SECRET" in result.stdout  # not masked unless asked
        masked = run(ws, backend, script, mask=(str(extra),))
        assert "EXTRA-SECRET" not in masked.stdout
        assert "end" in masked.stdout
    finally:
        planted.unlink()
        extra.unlink()
        if created:
            ssh.rmdir()


def test_the_docker_supervisors_directory_is_masked(ws: Path, backend: str) -> None:
    """Where docker sandboxes' supervisors are prepared (their runner copied, then imported
    by the container as it starts): a local sandbox neither sees nor replaces what is there
    (a runner swapped in before another sandbox's supervisor starts would be that sandbox's
    PID 1). Root's is under ``/run``, which no local sandbox sees; a user's, in its cache or
    runtime directory, is a masked secret path (``tests/unit/test_isolation.py``)."""
    from sandboxrun.backends.docker.rendezvous import private_dir
    from sandboxrun.backends.secrets import supervisor_parent

    parent = supervisor_parent(os.environ)
    private_dir(parent)
    planted = parent / f"sandbox-planted-{secrets.token_hex(4)}"
    planted.mkdir()
    (planted / "runner.py").write_text("ORIGINAL-RUNNER")
    try:
        script = (
            f"cat {planted}/runner.py; ls -a {parent}; echo swapped > {planted}/runner.py; echo end"
        )
        result = run(ws, backend, script)
        assert "end" in result.stdout, result
        assert "ORIGINAL-RUNNER" not in result.stdout
        assert planted.name not in result.stdout
        assert (planted / "runner.py").read_text() == "ORIGINAL-RUNNER"
    finally:
        (planted / "runner.py").unlink()
        planted.rmdir()


def test_host_processes_are_invisible_and_unsignalable(ws: Path, backend: str) -> None:
    victim = subprocess.Popen(["sleep", "300"])
    try:
        pid = victim.pid
        script = (
            f"ls /proc/{pid} >/dev/null 2>&1 && echo VISIBLE; "
            f"kill -TERM {pid} 2>/dev/null && echo KILLED; ps -e | wc -l"
        )
        result = run(ws, backend, script)
        assert "VISIBLE" not in result.stdout
        assert "KILLED" not in result.stdout
        assert victim.poll() is None
        assert int(result.stdout.split()[-1]) < 10  # a handful of own processes, not the host's
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize(
    "attack",
    [
        "cp /bin/sh s; chmod 4755 s",
        "cp /bin/sh s; chmod u+s s",
        "cp /bin/sh s; chmod g+s s",
        "install -m 4755 /bin/sh s",
        f"{PY} -c \"import os; os.close(os.open('s', os.O_CREAT | os.O_WRONLY, 0o6755))\"",
        "mknod dev c 1 3",
        "mknod blk b 7 0",
    ],
)
def test_no_setuid_or_device_plant(ws: Path, backend: str, attack: str) -> None:
    run(ws, backend, attack)
    for path in ws.rglob("*"):
        mode = path.lstat().st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID), (path, oct(mode))
        assert not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)), path


def test_ordinary_file_modes_still_work(ws: Path, backend: str) -> None:
    result = run(ws, backend, "cp /bin/sh s && chmod 755 s && mkfifo p && ./s -c 'echo ok'")
    assert result.ok and result.stdout.strip() == "ok", result
    assert stat.S_ISFIFO((ws / "p").lstat().st_mode)


def test_read_only_policy_holds(ws: Path, backend: str) -> None:
    (ws / "keep").write_text("original")
    result = run(
        ws, backend, "echo changed > keep; touch new; rm -f keep; cat keep", access="read-only"
    )
    assert (ws / "keep").read_text() == "original"
    assert not (ws / "new").exists()
    assert "read-only-workspace" in result.isolation
    assert "original" in result.stdout


def test_network_on_reaches_the_host(ws: Path, backend: str, tcp_server: int) -> None:
    (ws / "c.py").write_text(CONNECT_TCP)
    result = run(ws, backend, f"{PY} c.py {tcp_server}", network="on")
    assert "CONNECTED" in result.stdout, result
    assert "network-none" not in result.isolation


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "sandboxrun", "run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_auto_with_an_unreachable_engine_still_isolates(ws: Path) -> None:
    require_backend("process-group")
    done = cli(
        "--json",
        "-w",
        str(ws),
        "--",
        "sh",
        "-c",
        "echo x > /etc/escape-auto; echo ran",
        env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
    )
    result = json.loads(done.stdout)
    assert result["backend"] in ("systemd-scope", "process-group")
    assert "network-none" in result["isolation"]
    assert "read-only-root" in result["isolation"]
    assert not Path("/etc/escape-auto").exists()
    assert result["fallback_reason"]


def test_refused_where_the_layers_cannot_apply_and_allowed_degraded(ws: Path) -> None:
    require_backend("process-group")
    seam = {"SANDBOXRUN_BWRAP": "/nonexistent/bwrap"}  # a host without bubblewrap
    marker = ws / "ran"
    refused = cli("-b", "process-group", "-w", str(ws), "--", "touch", str(marker), env=seam)
    assert refused.returncode == 125, refused
    assert not marker.exists()
    assert "network-none" in refused.stderr and "--allow-degraded" in refused.stderr
    assert "apt-get install bubblewrap" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    strict = cli(
        "-b", "process-group", "--allow-degraded", "--strict", "-w", str(ws), "--", "true", env=seam
    )
    assert strict.returncode == 125
    degraded = cli(
        "--json",
        "-b",
        "process-group",
        "--allow-degraded",
        "-w",
        str(ws),
        "--",
        "touch",
        str(marker),
        env=seam,
    )
    assert degraded.returncode == 0, degraded
    result = json.loads(degraded.stdout)
    assert "network-none" in result["missing_guarantees"]
    assert "warning" in degraded.stderr
    assert marker.exists()  # the workspace stays writable
    assert "landlock" in result["isolation"]  # what the host still gives, it still gets
    env_var = cli(
        "-b",
        "process-group",
        "-w",
        str(ws),
        "--",
        "true",
        env={**seam, "SANDBOXRUN_ALLOW_DEGRADED": "1"},
    )
    assert env_var.returncode == 0, env_var


OWNER = """
import sys, anyio
from sandboxrun import Sandbox, Limits
async def main():
    async with Sandbox(sys.argv[1], backend=sys.argv[2], limits=Limits(timeout_s=600)) as sb:
        client = getattr(sb.backend, "_client", None) or getattr(sb.backend, "_holder", None)
        print(client.inner_pid(), flush=True)
        await sb.exec(shell="P='%(py)s -c \\"import time; time.sleep(900)\\" %(tok)s'; "
                            "eval $P & setsid sh -c \\"$P\\" & eval $P")
anyio.run(main)
"""


def test_sigkill_of_owner_and_supervisor_leaves_nothing(ws: Path, backend: str) -> None:
    token = f"tok-{secrets.token_hex(4)}"
    owner = subprocess.Popen(
        [PY, "-c", OWNER % {"tok": token, "py": PY}, str(ws), backend],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        supervisor = int(owner.stdout.readline())
        assert wait_until(lambda: len(processes_with_arg(token)) >= 3, 10), "the run did not start"
        os.kill(owner.pid, 9)
        os.kill(supervisor, 9)
        start = time.monotonic()
        assert wait_until(lambda: not processes_with_arg(token), 5.0), processes_with_arg(token)
        assert time.monotonic() - start < 5.0
    finally:
        owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
        for proc in processes_with_arg(token):
            proc.kill()


def test_signalling_the_supervisor_ends_no_run(ws: Path, backend: str) -> None:
    """PID 1 inside is the sandbox's supervisor: a command's signals must not end it (and with
    it every other run of the sandbox)."""

    async def go() -> tuple[ExecResult, ExecResult, ExecResult]:
        async with Sandbox(ws, backend=backend, limits=Limits(timeout_s=20)) as sb:
            results: list[ExecResult] = []

            async def sibling() -> None:
                results.append(await sb.exec(shell="sleep 1.5; echo sibling-done"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(sibling)
                await anyio.sleep(0.3)
                signals = "INT TERM HUP QUIT USR1 USR2 ALRM"
                attack = await sb.exec(shell=f"for s in {signals}; do kill -$s 1; done; echo sent")
            later = await sb.exec(shell="echo later")
            return attack, results[0], later

    attack, sibling, later = anyio.run(go)
    assert "sent" in attack.stdout
    assert sibling.ok and "sibling-done" in sibling.stdout, sibling
    assert later.ok and later.stdout == "later\n", later


def test_without_namespaces_network_on_is_still_refused(ws: Path) -> None:
    """Landlock alone limits writes, not reads or connect(): it never stands for read-only-root,
    so even `--network on` is refused where bubblewrap cannot run."""
    require_backend("process-group")
    seam = {"SANDBOXRUN_BWRAP": "/nonexistent/bwrap"}
    done = cli("-b", "process-group", "--network", "on", "-w", str(ws), "--", "true", env=seam)
    assert done.returncode == 125, done
    assert "read-only-root" in done.stderr


def test_path_prepend_cannot_reexpose_host_sockets(ws: Path) -> None:
    require_backend("process-group")
    (ws / "c.py").write_text(CONNECT_UNIX)
    path = Path("/run") / f"sandboxrun-test-{secrets.token_hex(4)}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(4)
    try:
        for prepend in ("/run", "/var/run", "/"):
            done = cli(
                "--json",
                "-b",
                "process-group",
                "--path-prepend",
                prepend,
                "-w",
                str(ws),
                "--",
                PY,
                "c.py",
                str(path),
            )
            result = json.loads(done.stdout)
            assert "CONNECTED" not in result["stdout"], prepend
            assert "sockets-masked" in result["isolation"]
    finally:
        server.close()
        path.unlink()
