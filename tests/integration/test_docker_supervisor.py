"""The supervisor inside docker sandboxes (``backends/docker_supervisor.py``), attacked: its
socket is unreachable once it is connected, a dead owner leaves nothing (no ``clean``), a
command can neither kill nor stop it (it is PID 1), one that does below an entrypoint loses
only its own sandbox, and an image without python3 still works through the engine's exec
path."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import docker
import docker.errors
import pytest
from helpers import processes_with_arg, require_backend, wait_until

from sandboxrun import Limits, Sandbox
from sandboxrun.backends.docker.backend import DockerBackend

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", autouse=True)
def docker_backend() -> None:
    require_backend("docker")


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    client = docker.from_env(timeout=60)
    yield client
    client.close()


def owned_by(engine: docker.DockerClient, pid: int) -> list[str]:
    found = engine.containers.list(
        all=True,
        ignore_removed=True,
        filters={"label": ["sandboxrun.managed=true", f"sandboxrun.owner_pid={pid}"]},
    )
    return [str(c.id) for c in found]


@pytest.mark.parametrize("user", [None, "1000:1000", "4242:4242"])
async def test_commands_run_through_the_supervisor_whose_socket_is_gone(
    workspace: Path, engine: docker.DockerClient, user: str | None
) -> None:
    """Whoever the container's user is (the invoker, or another uid)."""
    async with Sandbox(workspace, backend="docker", user=user) as sb:
        backend = sb.backend
        assert isinstance(backend, DockerBackend)
        assert backend.supervisor is not None
        assert backend.session.container_id is not None
        source = next(
            m["Source"]
            for m in engine.api.inspect_container(backend.session.container_id)["Mounts"]
            if m["Destination"] == "/run/sandboxrun"
        )
        listing = await sb.exec(["ls", "-A", "/run/sandboxrun"])
        probe = await sb.exec(
            [
                "python3",
                "-c",
                "import socket; s = socket.socket(socket.AF_UNIX);\n"
                "try:\n s.connect('/run/sandboxrun/supervisor.sock'); print('connected')\n"
                "except OSError as e:\n print('refused', e.errno)",
            ]
        )
        fds = await sb.exec(["sh", "-c", "ls -l /proc/self/fd/ | grep -c socket || true"])
    assert listing.via == "supervisor"
    assert listing.status == "completed" and listing.stdout == ""  # nothing left to connect to
    assert probe.stdout.startswith("refused"), probe
    assert fds.stdout.strip() == "0"  # the supervisor's socket is not inherited
    assert not Path(source).exists()  # nothing of it on the host either


@pytest.mark.parametrize("via", ["supervisor", "engine"])
def test_sigkill_of_the_owner_leaves_no_container_and_no_process(
    workspace: Path, engine: docker.DockerClient, via: str
) -> None:
    """``kill -9`` of the program using sandboxrun mid-run: the supervisor sees its socket
    close, kills the run (a TERM-ignoring tree with a ``setsid`` child) and exits; the engine
    removes the container. Without a supervisor (the engine's exec path) the owner's watchdog
    sees its pipe end and removes the container. Within 5 s, without ``sandboxrun clean``."""
    code = textwrap.dedent(
        f"""
        import anyio
        from sandboxrun import Sandbox, Limits
        async def main():
            async with Sandbox({str(workspace)!r}, backend="docker",
                               limits=Limits(grace_s=30)) as sb:
                await sb.exec(shell="trap '' TERM; (setsid sh -c 'trap \\"\\" TERM; "
                              "sleep 6543.25' &); echo go; sleep 6543.5", timeout=300)
        anyio.run(main)
        """
    )
    env = {**os.environ, "SANDBOXRUN_DOCKER_SUPERVISOR": "0" if via == "engine" else "1"}
    host = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        assert wait_until(lambda: bool(processes_with_arg("6543.5")), 30)
        assert wait_until(lambda: bool(processes_with_arg("6543.25")), 10)
        assert owned_by(engine, host.pid)
    finally:
        host.kill()
        host.wait()
    killed = time.monotonic()
    assert wait_until(
        lambda: not processes_with_arg("6543.5") and not processes_with_arg("6543.25"), 5
    ), "the run outlived its owner"
    assert wait_until(lambda: not owned_by(engine, host.pid), 5 - (time.monotonic() - killed)), (
        "the container outlived its owner"
    )


KILLER = (
    "for p in /proc/[0-9]*; do [ ${p#/proc/} = $$ ] && continue; "
    "grep -q 'import runner' $p/cmdline 2>/dev/null && kill -SIG ${p#/proc/} && echo hit; "
    "done; kill -SIG 1 2>/dev/null; sleep 2; echo lived"
)
"""Signal every process of the container whose command line is the supervisor's, and PID 1."""


@pytest.mark.parametrize("sig", ["KILL", "STOP"])
async def test_a_command_cannot_kill_or_stop_the_supervisor(workspace: Path, sig: str) -> None:
    """The supervisor is the container's PID 1: the kernel delivers no signal to it from
    inside its namespace that it has no handler for (SIGKILL and SIGSTOP included)."""
    async with Sandbox(workspace, backend="docker", limits=Limits(grace_s=0.5)) as sb:
        backend = sb.backend
        assert isinstance(backend, DockerBackend)
        first = backend.session.container_id
        with anyio.fail_after(30):
            pid1 = await sb.exec(["cat", "/proc/1/cmdline"])
            hit = await sb.exec(shell=KILLER.replace("SIG", sig))
            after = await sb.exec(["echo", "same"])
        assert backend.session.container_id == first
    assert "import runner" in pid1.stdout
    assert "hit" in hit.stdout  # it found the supervisor and signalled it
    assert hit.status == "completed" and hit.stdout.endswith("lived\n"), hit
    assert after.status == "completed" and after.stdout == "same\n"


@pytest.fixture(scope="module")
def entrypoint_image(engine: docker.DockerClient) -> Iterator[str]:
    """An image whose entrypoint runs the container's command as a child (and forks): the
    supervisor is not PID 1 there, and a command can signal it."""
    tag = f"sandboxrun-test/entrypoint:{uuid.uuid4().hex[:8]}"
    dockerfile = (
        "ARG BASE=sandboxrun/base:0.1.0\nFROM ${BASE}\n"
        'ENTRYPOINT ["/bin/sh", "-c", "\\"$@\\"; echo done", "entry"]\n'
    )
    engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    yield tag
    engine.images.remove(tag, force=True)


@pytest.mark.parametrize("sig", ["KILL", "STOP"])
async def test_a_supervisor_below_an_entrypoint_killed_or_stopped_loses_only_its_sandbox(
    workspace: Path, entrypoint_image: str, sig: str
) -> None:
    """Killed, or stopped (seen from the host in /proc at once, not at a deadline): the exec
    is a ``sandbox_error`` that says so, files calls answer within 5 s, the next exec gets a
    fresh container, and nothing of the command is left."""
    tok = "6611.25"
    script = KILLER.replace("SIG", sig).replace("sleep 2", f"sleep {tok}")
    limits = Limits(grace_s=0.5)
    async with Sandbox(workspace, backend="docker", image=entrypoint_image, limits=limits) as sb:
        backend = sb.backend
        assert isinstance(backend, DockerBackend)
        first = backend.session.container_id
        assert (
            backend.session.supervisor_pid != backend.session.init_pid
        )  # below the entrypoint's shell
        began = time.monotonic()
        with anyio.fail_after(30):
            hit = await sb.exec(shell=script, timeout=20)
        took = time.monotonic() - began
        began = time.monotonic()
        with anyio.fail_after(30):
            read = await sb.read_file("hello.txt")
        read_took = time.monotonic() - began
        with anyio.fail_after(30):
            after = await sb.exec(["echo", "fresh"])
        assert backend.session.container_id != first
    assert "hit" in hit.stdout
    assert hit.status == "sandbox_error", hit
    assert took < 5, f"the exec ended {took:.1f} s after the supervisor was {sig}ed"
    if sig == "STOP":
        assert hit.error is not None and "supervisor was stopped" in hit.error, hit.error
    assert read == b"hello\n" and read_took < 5
    assert after.status == "completed" and after.stdout == "fresh\n", after
    assert after.via == "supervisor"
    assert wait_until(lambda: not processes_with_arg(tok), 5), "the command outlived its run"


@pytest.fixture(scope="module")
def image_without_python(engine: docker.DockerClient) -> Iterator[str]:
    tag = f"sandboxrun-test/nopython:{uuid.uuid4().hex[:8]}"
    dockerfile = (
        "ARG BASE=sandboxrun/base:0.1.0\nFROM ${BASE}\nUSER root\n"
        "RUN rm -f /usr/bin/python3 /usr/bin/python3.*\n"
    )
    engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    yield tag
    engine.images.remove(tag, force=True)


async def test_an_image_without_python3_uses_the_engine_exec_path(
    workspace: Path, image_without_python: str
) -> None:
    started = time.monotonic()
    async with Sandbox(workspace, backend="docker", image=image_without_python) as sb:
        backend = sb.backend
        assert isinstance(backend, DockerBackend)
        opened = time.monotonic() - started
        assert backend.supervisor is None
        result = await sb.exec(["echo", "hi"])
    assert result.status == "completed" and result.stdout == "hi\n"
    assert result.via == "engine"
    assert opened < 8, f"finding no python3 took {opened:.1f} s"


async def test_the_engine_path_can_be_chosen(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOXRUN_DOCKER_SUPERVISOR", "0")
    async with Sandbox(workspace, backend="docker") as sb:
        result = await sb.exec(["echo", "hi"])
    assert result.via == "engine" and result.stdout == "hi\n"


def test_the_rendezvous_is_never_the_container_users_and_never_in_a_workspace(
    tmp_path: Path,
) -> None:
    """Nothing of the rendezvous belongs to the container's user (a chown racing a symlink
    swap could hand it a host file), it lives in a parent only the invoker enters, never in
    a directory a sandbox can write (``TMPDIR``, a workspace: another sandbox's command
    could replace the runner's copy before the supervisor starts)."""
    from sandboxrun.backends.docker.rendezvous import PYCACHE, SCRIPTS, Rendezvous, parent_dir

    parent = parent_dir(tmp_path)
    assert parent is not None
    assert not parent.is_relative_to(Path(os.environ.get("TMPDIR", "/tmp")))
    umask = os.umask(0o077)  # (the modes are set, never the umask's)
    try:
        rendezvous = Rendezvous(parent)
    finally:
        os.umask(umask)
    try:
        assert (parent.stat().st_mode & 0o777) == 0o700 and parent.stat().st_uid == os.geteuid()
        scripts = [(rendezvous.dir / name, 0o444) for name in SCRIPTS]
        tag = sys.implementation.cache_tag
        compiled = [
            (rendezvous.dir / PYCACHE / f"{Path(n).stem}.{tag}.pyc", 0o444) for n in SCRIPTS
        ]
        assert sorted(p.name for p in rendezvous.dir.iterdir()) == sorted(
            [*SCRIPTS, "supervisor.sock", PYCACHE]
        )
        assert sorted((rendezvous.dir / PYCACHE).iterdir()) == sorted(p for p, _ in compiled)
        for path, mode in (
            (rendezvous.dir, 0o755),
            (rendezvous.dir / PYCACHE, 0o755),
            *scripts,
            *compiled,
        ):
            assert (path.stat().st_mode & 0o777) == mode, path
            assert path.stat().st_uid == os.geteuid()
    finally:
        rendezvous.close()
    assert not rendezvous.dir.exists()
    assert parent_dir(parent.parent) is None  # a workspace holding it: no supervisor there


def test_the_containers_python_loads_the_supervisors_bytecode_not_its_sources(
    tmp_path: Path, engine: docker.DockerClient
) -> None:
    """The rendezvous carries the scripts compiled by this host's Python (unchecked-hash
    ``.pyc``): a container whose ``python3`` has the same cache tag imports the runner
    without compiling it. Proved by breaking every source after the rendezvous was made: the
    import still works (a Python that read the sources would fail on them)."""
    from sandboxrun.backends.docker.rendezvous import MOUNT, SCRIPTS, Rendezvous, parent_dir

    image = "sandboxrun/base:latest"
    tag = engine.containers.run(
        image, ["python3", "-c", "import sys; print(sys.implementation.cache_tag)"],
        remove=True, network_mode="none", labels={"sandboxrun.managed": "true"},
    ).decode().strip()  # fmt: skip
    if tag != sys.implementation.cache_tag:
        pytest.skip(f"the image's python3 is {tag}, this host's {sys.implementation.cache_tag}")
    parent = parent_dir(tmp_path)
    assert parent is not None
    rendezvous = Rendezvous(parent)
    try:
        for name in SCRIPTS:
            path = rendezvous.dir / name
            path.chmod(0o644)
            path.write_text("this is not python (\n")
            path.chmod(0o444)
        out = engine.containers.run(
            image,
            ["python3", "-I", "-S", "-c", f"import sys; sys.path.insert(0, {MOUNT!r}); "
             "import runner; print(runner.Runner.__name__)"],
            remove=True, network_mode="none", labels={"sandboxrun.managed": "true"},
            volumes={str(rendezvous.dir): {"bind": MOUNT, "mode": "ro"}},
            user=f"{os.getuid()}:{os.getgid()}",
        )  # fmt: skip
        assert out.decode().strip() == "Runner"
    finally:
        rendezvous.close()
    assert not rendezvous.dir.exists()


async def test_an_entrypoint_that_forks_still_gets_a_supervisor(
    workspace: Path, entrypoint_image: str
) -> None:
    async with Sandbox(workspace, backend="docker", image=entrypoint_image) as sb:
        result = await sb.exec(["echo", "hi"])
        leftover = await sb.exec(shell="sleep 0.2 & echo bg")
    assert result.via == "supervisor" and result.stdout == "hi\n"
    assert leftover.survivors == 0  # the entrypoint's shell is the container's, not the run's


async def test_the_oom_killer_takes_a_command_not_the_supervisor(workspace: Path) -> None:
    """Many small processes over the memory limit: the supervisor (a ~13 MB python3) is
    not the OOM killer's choice; the run is oom_killed or failed, the sandbox goes on."""
    small = "python3 -c 'import time; x = bytearray(3 << 20); time.sleep(30)'"
    hog = f"for i in $(seq 40); do {small} & done; wait"
    limits = Limits(memory_bytes=64 << 20, grace_s=0.5)
    async with Sandbox(workspace, backend="docker", limits=limits, user="1000:1000") as sb:
        backend = sb.backend
        assert isinstance(backend, DockerBackend)
        first = backend.session.container_id
        scores = await sb.exec(shell="cat /proc/self/oom_score_adj /proc/$PPID/oom_score_adj")
        result = await sb.exec(shell=hog, timeout=15)
        after = await sb.exec(["echo", "alive"])
        assert backend.session.container_id == first, (
            "the supervisor died: the sandbox was recreated"
        )
    assert result.status != "sandbox_error", result
    assert after.status == "completed"
    assert scores.stdout.split() == ["1000", "0"]  # the command first, its supervisor last


async def test_an_engine_that_cannot_see_the_host_directory_falls_back(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker-in-docker, a VM, an ssh-forwarded socket: the engine answers "bind source path
    does not exist" for the rendezvous directory; the sandbox runs through the engine's exec
    path instead of failing."""
    from sandboxrun.backends.docker import rendezvous as sv

    real_init = sv.Rendezvous.__init__

    def unseen(self: sv.Rendezvous, parent: Path) -> None:
        real_init(self, parent)
        self.close()  # as if it were on another machine's filesystem

    monkeypatch.setattr(sv.Rendezvous, "__init__", unseen)
    async with Sandbox(workspace, backend="docker") as sb:
        result = await sb.exec(["echo", "hi"])
    assert result.via == "engine" and result.stdout == "hi\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to another uid to look")
async def test_a_non_root_invoker_sees_the_engine_as_local(workspace: Path) -> None:
    """The supervisor, PID 1 of the container, is non-dumpable: only root may read its
    ``environ``. Another uid still recognises the engine as local, by the container's cgroup
    (the check ``DockerBackend.open`` makes; else the sandbox would run without a
    supervisor and, its ``sleep`` as PID 1, reap nothing)."""
    async with Sandbox(workspace, backend="docker") as sb:
        backend = sb.backend
        assert isinstance(backend, DockerBackend)
        pid, cid = backend.session.init_pid, backend.session.container_id
        assert pid is not None and cid is not None
        code = (
            "import os, sys\n"
            # before: root's files
            "from sandboxrun.backends.docker.backend import engine_visible\n"
            "os.setgid(65534); os.setuid(65534)\n"
            f"print(os.access('/proc/{pid}/environ', os.R_OK), engine_visible({pid}, {cid!r}))\n"
        )
        seen = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.split() == ["False", "True"]
