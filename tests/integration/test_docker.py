"""The docker backend against the real engine: lifecycle, hardening, argv, policy, limits.

Nothing here is mocked. Every test runs on ``sandboxrun/base:latest`` (built offline; never
pulled) and is skipped only when the docker probe fails (failed instead when docker is listed
in ``SANDBOXRUN_REQUIRE_BACKENDS``). No test sends a packet off this host: network isolation is
judged by the interfaces and routes the container sees and by a name lookup that must fail.

Containers are found by their labels, and always by *our* ``owner_pid``/``owner_host`` or by the
test's own workspace hash, so that other sessions using the same engine do not disturb counts.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import docker
import docker.errors
import pytest
from conformance_helpers import assert_container_clean
from helpers import require_backend, wait_until

from sandboxrun import ConfigError, Limits, Policy, Sandbox, WorkspaceError
from sandboxrun.backends.docker.backend import DockerBackend
from sandboxrun.models import ExecResult

pytestmark = pytest.mark.anyio

CLI = [sys.executable, "-m", "sandboxrun"]
MANAGED = "sandboxrun.managed"
FAST = Limits(grace_s=0.5, drain_s=0.5)
MiB = 1 << 20
PREFIX = (
    'if [ -n "${SANDBOXRUN_EXPLICIT_PATH+x}" ]; then '
    'PATH="$SANDBOXRUN_EXPLICIT_PATH"; export PATH; fi; '
    'if [ -n "${SANDBOXRUN_PATH_PREPEND-}" ]; then '
    'PATH="$SANDBOXRUN_PATH_PREPEND${PATH:+:$PATH}"; export PATH; fi; '
    "unset SANDBOXRUN_EXPLICIT_PATH SANDBOXRUN_PATH_PREPEND; "
)
"""The login-shell prefix, written out literally: the golden tests pin it."""
PROFILE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""What the image's login profile assigns to PATH (images/base/profile.sh)."""


# -- fixtures and helpers -------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def docker_backend() -> None:
    """Like the root ``backend`` fixture: skip with the probe's reason, or fail if required."""
    require_backend("docker")


@pytest.fixture(scope="module")
def engine(docker_backend: None) -> Iterator[docker.DockerClient]:
    client = docker.from_env(timeout=30)
    yield client
    client.close()


def ours(engine: docker.DockerClient) -> list[dict[str, Any]]:
    """Managed containers owned by this test process (any state)."""
    filters = {
        "label": [
            f"{MANAGED}=true",
            f"sandboxrun.owner_pid={os.getpid()}",
            f"sandboxrun.owner_host={socket.gethostname()}",
        ]
    }
    return list(engine.api.containers(all=True, filters=filters))


def workspace_hash(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]


def events(engine: docker.DockerClient, since: float, **filters: str) -> list[dict[str, Any]]:
    """Container events from ``since`` until now (the engine keeps a short history)."""
    stream = engine.api.events(
        since=int(since) - 1,
        until=int(time.time()) + 1,  # whole seconds only: waits out the current one
        filters={"type": "container", **filters},
        decode=True,
    )
    return [e for e in stream if float(e.get("timeNano", 0)) / 1e9 >= since - 0.001]


def created_for(engine: docker.DockerClient, since: float, workspace: Path) -> list[str]:
    """Ids of the managed containers created for ``workspace`` since ``since``."""
    found = events(engine, since, label=f"sandboxrun.workspace={workspace_hash(workspace)}")
    return [str(e["id"]) for e in found if e.get("Action") == "create"]


def exec_creates(engine: docker.DockerClient, since: float, container: str) -> list[str]:
    found = events(engine, since, container=container)
    return [str(e["Action"]) for e in found if str(e.get("Action", "")).startswith("exec_create")]


def backend_of(sb: Sandbox) -> DockerBackend:
    backend = sb.backend
    assert isinstance(backend, DockerBackend)
    return backend


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def lines_of(result: ExecResult) -> list[str]:
    return result.stdout.splitlines()


# -- container lifecycle and labels -----------------------------------------------------------
async def test_one_labelled_hardened_container_while_open_and_none_after(
    workspace: Path, engine: docker.DockerClient
) -> None:
    limits = Limits(memory_bytes=256 * MiB, pids=100)
    assert ours(engine) == []
    before = time.time()
    async with Sandbox(workspace, backend="docker", limits=limits) as sb:
        after = time.time()
        listed = ours(engine)
        assert len(listed) == 1, listed
        cid = backend_of(sb).session.container_id
        assert cid is not None
        assert listed[0]["Id"] == cid
        info = engine.api.inspect_container(cid)
        result = await sb.exec(["true"])
    assert result.status == "completed"

    labels = info["Config"]["Labels"]
    assert labels[MANAGED] == "true"
    assert labels["sandboxrun.owner_pid"] == str(os.getpid())
    assert labels["sandboxrun.owner_host"] == socket.gethostname()
    assert int(before) - 1 <= int(labels["sandboxrun.created"]) <= after + 1
    assert labels["sandboxrun.workspace"] == workspace_hash(workspace)
    assert info["State"]["Running"] is True

    host = info["HostConfig"]
    assert not host["Init"]  # the supervisor is the container's PID 1 (docs/docker.md)
    assert host["AutoRemove"] is True
    assert host["CapDrop"] == ["ALL"]
    assert not host.get("CapAdd")
    assert "no-new-privileges" in (host.get("SecurityOpt") or [])
    assert host["ReadonlyRootfs"] is True
    assert host["PidsLimit"] == 100
    assert host["Memory"] == 256 * MiB
    assert host["MemorySwap"] == 256 * MiB
    assert host["NetworkMode"] == "none"
    assert host["Privileged"] is False
    assert host.get("PidMode", "") != "host"
    assert host.get("IpcMode", "") != "host"
    assert host.get("UTSMode", "") != "host"
    assert host.get("UsernsMode", "") != "host"
    assert not host.get("Devices")
    assert not host.get("VolumesFrom")
    assert host["LogConfig"]["Type"] == "none"
    assert set(host["Tmpfs"]) == {"/tmp", "/var/tmp", "/home/sandbox"}
    for where, options in host["Tmpfs"].items():
        assert "nosuid" in options
        assert "nodev" in options
        # only /var/tmp may run programs (inspect's tools; the workspace is writable here)
        assert ("exec" in options.split(",")) is (where == "/var/tmp"), (where, options)
    assert info["Config"]["User"] == f"{os.getuid()}:{os.getgid()}"

    mounts = info["Mounts"]
    binds = [m for m in mounts if m["Type"] == "bind"]
    # the workspace, and the supervisor's private directory (read-only, gone from the host)
    supervisor = [m for m in binds if m["Destination"] == "/run/sandboxrun"]
    assert len(supervisor) == 1 and supervisor[0]["RW"] is False, mounts
    assert not Path(supervisor[0]["Source"]).exists()
    binds = [m for m in binds if m not in supervisor]
    assert len(binds) == 1, mounts
    assert binds[0]["Destination"] == "/workspace"
    assert binds[0]["Source"] == str(workspace.resolve())
    assert binds[0]["RW"] is True  # workspace-write is the default policy
    assert not any("docker.sock" in str(m.get("Source", "")) for m in mounts)

    assert ours(engine) == []
    with pytest.raises(docker.errors.NotFound):
        engine.api.inspect_container(cid)
    # the event check that other tests use to prove "no container was created" does see one
    assert created_for(engine, before, workspace) == [cid]


async def test_container_is_hardened_as_seen_from_inside(workspace: Path) -> None:
    async with Sandbox(workspace, backend="docker", user="1000:1000") as sb:
        init = await sb.exec(["cat", "/proc/1/cmdline"])
        status = await sb.exec(["cat", "/proc/self/status"])
        ident = await sb.exec(["id", "-u"])
        root = await sb.exec(
            ["sh", "-c", "grep ' / ' /proc/mounts; grep ' /workspace ' /proc/mounts"]
        )
        tools = await sb.exec(  # issue 20: what agents reach for first is in the default image
            ["sh", "-c", "curl --version && jq --version && rg --version"]
        )
    assert "import runner" in init.stdout  # PID 1 is the supervisor (no docker-init)
    fields = dict(line.split(":", 1) for line in lines_of(status) if ":" in line)
    assert fields["CapEff"].strip() == "0" * 16
    assert fields["CapPrm"].strip() == "0" * 16
    assert fields["CapBnd"].strip() == "0" * 16
    assert fields["NoNewPrivs"].strip() == "1"
    assert ident.stdout == "1000\n"
    root_line, ws_line = lines_of(root)
    assert root_line.split()[3].split(",")[0] == "ro"
    assert ws_line.split()[3].split(",")[0] == "rw"
    assert tools.status == "completed", tools.stderr
    assert "curl " in tools.stdout and "jq-" in tools.stdout and "ripgrep " in tools.stdout


async def test_container_removed_when_the_body_raises(
    workspace: Path, engine: docker.DockerClient
) -> None:
    cid = None
    with pytest.raises(RuntimeError, match="boom"):
        async with Sandbox(workspace, backend="docker") as sb:
            cid = backend_of(sb).session.container_id
            assert len(ours(engine)) == 1
            await sb.exec(["true"])
            raise RuntimeError("boom")
    assert cid is not None
    assert ours(engine) == []
    with pytest.raises(docker.errors.NotFound):
        engine.api.inspect_container(cid)


async def test_container_removed_when_the_body_is_cancelled(
    workspace: Path, engine: docker.DockerClient
) -> None:
    cid = None
    with anyio.move_on_after(1.0) as scope:
        async with Sandbox(workspace, backend="docker", limits=FAST) as sb:
            cid = backend_of(sb).session.container_id
            await sb.exec(["sleep", "30"])
    assert scope.cancelled_caught
    assert cid is not None
    assert ours(engine) == []


# -- --dry-run golden tests -------------------------------------------------------------------
def dry_run_env(tmp_path: Path) -> dict[str, str]:
    """A controlled host environment (plus what reaching the engine needs)."""
    env = {
        "PATH": f"/host/only/bin:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": "/root/host-home",
        "USER": "tester",
        "LANG": "en_US.UTF-8",
        "TMPDIR": str(tmp_path),
        "SHELL": "/bin/zsh",
        "GITHUB_TOKEN": "ghp_host_secret_value",
    }
    env.update({k: v for k, v in os.environ.items() if k.startswith("DOCKER_")})
    return env


def run_id_in(text: str) -> str:
    """The one (random) run id in a dry-run line; everything else is golden."""
    found = re.findall(r"SANDBOXRUN_RUN_ID=([0-9a-f]{16})\s", text)
    assert len(found) == 1, text
    return str(found[0])


def with_run_id(argv: list[str], run_id: str) -> list[str]:
    return [a.replace("SANDBOXRUN_RUN_ID=<id>", f"SANDBOXRUN_RUN_ID={run_id}") for a in argv]


GOLDEN_ENV = [
    "-e", "API_TOKEN=<redacted>",
    "-e", "DB_URL=https://<redacted>@db.example/x",
    "-e", "FOO=a b",
    "-e", "GIT_EDITOR=true",
    "-e", "GIT_PAGER=cat",
    "-e", "GIT_TERMINAL_PROMPT=0",
    "-e", "HOME=/home/sandbox",
    "-e", "LANG=en_US.UTF-8",
    "-e", "LC_CTYPE=C.UTF-8",
    "-e", "NO_COLOR=1",
    "-e", "PAGER=cat",
    "-e", "PYTHONIOENCODING=utf-8",
    "-e", "PYTHONUNBUFFERED=1",
    "-e", "SANDBOXRUN_PATH_PREPEND=/opt/x",
    "-e", "SANDBOXRUN_RUN_ID=<id>",
    "-e", "TERM=dumb",
    "-e", "USER=tester",
]  # fmt: skip


def test_dry_run_prints_the_exact_docker_exec_argv(
    workspace: Path, tmp_path: Path, engine: docker.DockerClient
) -> None:
    since = time.time()
    proc = cli(
        "run", "-b", "docker", "-w", str(workspace), "-C", "sub", "--dry-run",
        "-e", "ZED_TOKEN_SECRET=s3cret-z", "-e", "FOO=a b", "-e", "API_TOKEN=s3cret",
        "-e", "DB_URL=https://bob:hunter2@db.example/x",
        "--user", "1000:1000", "--path-prepend", "/opt/x",
        "--", "printf", "%s\\n", "hello world", "it's", "$(id)", "",
        env=dry_run_env(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n")
    assert len(proc.stdout.splitlines()) == 1
    expected = [
        "docker", "exec", "-w", "/workspace/sub",
        *GOLDEN_ENV,
        "-e", "ZED_TOKEN_SECRET=<redacted>",
        "-u", "1000:1000", "<sandbox-container>",
        "bash", "-lc", PREFIX + 'exec "$@"', "sandboxrun",
        "printf", "%s\\n", "hello world", "it's", "$(id)", "",
    ]  # fmt: skip
    expected = with_run_id(expected, run_id_in(proc.stdout))
    assert proc.stdout == shlex.join(expected) + "\n"
    # the secrets themselves appear nowhere, and nothing of the host leaks into the argv
    for leak in ("s3cret", "hunter2", "ghp_host_secret_value", "/host/only", "/root/host-home"):
        assert leak not in proc.stdout + proc.stderr
    assert shlex.split(proc.stdout) == expected
    assert created_for(engine, since, workspace) == []


def test_dry_run_shell_mode_and_default_user(
    workspace: Path, tmp_path: Path, engine: docker.DockerClient
) -> None:
    since = time.time()
    proc = cli(
        "run", "-b", "docker", "-w", str(workspace), "--dry-run", "--shell",
        "--", 'echo "$PATH" > out; touch ran',
        env={**dry_run_env(tmp_path), "USER": "other"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    expected = [
        "docker", "exec", "-w", "/workspace",
        "-e", "GIT_EDITOR=true", "-e", "GIT_PAGER=cat", "-e", "GIT_TERMINAL_PROMPT=0",
        "-e", "HOME=/home/sandbox", "-e", "LANG=en_US.UTF-8", "-e", "LC_CTYPE=C.UTF-8",
        "-e", "NO_COLOR=1", "-e", "PAGER=cat", "-e", "PYTHONIOENCODING=utf-8",
        "-e", "PYTHONUNBUFFERED=1", "-e", "SANDBOXRUN_RUN_ID=<id>", "-e", "TERM=dumb",
        "-e", "USER=other",
        "-u", f"{os.getuid()}:{os.getgid()}", "<sandbox-container>",
        "bash", "-lc", PREFIX + 'echo "$PATH" > out; touch ran', "bash",
    ]  # fmt: skip
    expected = with_run_id(expected, run_id_in(proc.stdout))
    assert proc.stdout == shlex.join(expected) + "\n"
    assert not (workspace / "ran").exists()
    assert created_for(engine, since, workspace) == []


# -- PATH prepend after the login profile --------------------------------------------------------
@pytest.mark.parametrize("mode", ["argv", "shell"])
async def test_path_prepend_survives_the_login_profile(workspace: Path, mode: str) -> None:
    async with Sandbox(workspace, backend="docker", path_prepend=["/opt/x"]) as sb:
        if mode == "argv":
            result = await sb.exec(["printenv", "PATH"], path_prepend=["/opt/y"])
            env = await sb.exec(["env"], path_prepend=["/opt/y"])
        else:
            result = await sb.exec(shell='echo "$PATH"', path_prepend=["/opt/y"])
            env = await sb.exec(shell="env", path_prepend=["/opt/y"])
    assert result.status == "completed", result.stderr
    assert result.stdout == f"/opt/x:/opt/y:{PROFILE_PATH}\n"
    assert "SANDBOXRUN_PATH_PREPEND" not in env.stdout


@pytest.mark.parametrize("mode", ["argv", "shell"])
def test_path_prepend_from_the_cli(workspace: Path, mode: str) -> None:
    command = ["--", "printenv", "PATH"] if mode == "argv" else ["--shell", "--", "echo $PATH"]
    proc = cli("run", "-b", "docker", "-w", str(workspace), "--path-prepend", "/opt/x", *command)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("/opt/x:")
    assert proc.stdout == f"/opt/x:{PROFILE_PATH}\n"


async def test_without_prepend_path_is_the_profiles(workspace: Path) -> None:
    async with Sandbox(workspace, backend="docker", host_env={"PATH": "/host/only/bin"}) as sb:
        result = await sb.exec(["printenv", "PATH"])
    assert result.stdout == f"{PROFILE_PATH}\n"


# -- argv arrives verbatim ---------------------------------------------------------------------
NASTY = [
    "a b",
    "  leading and trailing  ",
    "it's",
    'say "hi"',
    "$(touch /tmp/pwned-dollar)",
    "`touch /tmp/pwned-backtick`",
    "${HOME}",
    "$HOME",
    "line1\nline2\n",
    "*",
    "/*",
    "",
    "",
    "\\back\\slash\\",
    "; touch /tmp/pwned-semi",
    "| cat",
    "&& true",
    "-e",
    "--",
    "tab\there",
    "ünïcødé ✓",
    "'",
    '"',
    "~",
    "!",
    "#comment",
]


async def test_argv_arrives_verbatim(workspace: Path) -> None:
    (workspace / "a-file").write_text("")
    async with Sandbox(workspace, backend="docker") as sb:
        result = await sb.exec(["printf", "%s\\0", *NASTY])
        pwned = await sb.exec(["sh", "-c", "ls /tmp"])
    assert result.status == "completed", result.stderr
    assert result.stdout.split("\0")[:-1] == NASTY
    assert result.stdout == "".join(f"{arg}\0" for arg in NASTY)
    assert "pwned" not in pwned.stdout


def test_argv_arrives_verbatim_through_the_cli(workspace: Path) -> None:
    proc = cli("run", "-b", "docker", "-w", str(workspace), "--", "printf", "%s\\0", *NASTY)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\0")[:-1] == NASTY


# -- read-only policy and workspace-write -------------------------------------------------------
WRITES = [
    "touch /workspace/x",
    "touch /workspace/sub/dir/x",
    "mkdir /workspace/newdir",
    "echo more >> /workspace/hello.txt",
    "rm /workspace/hello.txt",
    "mv /workspace/hello.txt /workspace/moved.txt",
    "chmod 777 /workspace/hello.txt",
    "ln -s /etc /workspace/link",
    "touch /etc/x",
    "touch /usr/x",
    "touch /x",
    "touch /var/x",
    "touch /workspace/../x",
    "echo evil > /etc/profile.d/zz.sh",
]


async def test_read_only_policy_blocks_every_write(workspace: Path) -> None:
    before = sorted(str(p.relative_to(workspace)) for p in workspace.rglob("*"))
    mode = (workspace / "hello.txt").stat().st_mode
    policy = Policy(access="read-only")
    async with Sandbox(workspace, backend="docker", policy=policy) as sb:
        for script in WRITES:
            result = await sb.exec(shell=script)
            assert result.status == "failed", (script, result)
            assert result.exit_code not in (None, 0), script
        scratch = await sb.exec(shell='touch /tmp/ok "$HOME/ok" && ls /tmp/ok "$HOME/ok"')
        assert scratch.status == "completed", scratch.stderr
        assert "read-only-workspace" in scratch.isolation
        assert "read-only-root" in scratch.isolation
    assert sorted(str(p.relative_to(workspace)) for p in workspace.rglob("*")) == before
    assert (workspace / "hello.txt").read_text() == "hello\n"
    assert (workspace / "hello.txt").stat().st_mode == mode


async def test_workspace_write_allows_the_workspace_and_nothing_else(workspace: Path) -> None:
    async with Sandbox(workspace, backend="docker") as sb:
        ws = await sb.exec(
            shell="touch x && mkdir -p newdir && echo more >> hello.txt && echo deep > sub/dir/f",
        )
        root = [await sb.exec(shell=f"touch {p}") for p in ("/etc/x", "/usr/x", "/x")]
    assert ws.status == "completed", ws.stderr
    assert (workspace / "x").is_file()
    assert (workspace / "newdir").is_dir()
    assert (workspace / "hello.txt").read_text() == "hello\nmore\n"
    assert (workspace / "sub" / "dir" / "f").read_text() == "deep\n"
    assert all(r.status == "failed" for r in root), root
    assert "Read-only file system" in root[0].stderr
    assert "read-only-workspace" not in ws.isolation


# -- ownership and the non-root claim -----------------------------------------------------------
@pytest.mark.parametrize("user", [None, "1000:1000", "1000", "0:0", "1234:5678"])
async def test_created_files_belong_to_the_sandbox_user(workspace: Path, user: str | None) -> None:
    workspace.chmod(0o777)
    if user is None:
        expected = (os.getuid(), os.getgid())
    else:
        uid, _, gid = user.partition(":")
        expected = (int(uid), int(gid or uid))
    async with Sandbox(workspace, backend="docker", user=user) as sb:
        result = await sb.exec(shell="echo data > created && mkdir made && id -u && id -g")
    assert result.status == "completed", result.stderr
    assert lines_of(result) == [str(expected[0]), str(expected[1])]
    for name in ("created", "made"):
        st = (workspace / name).stat()
        assert (st.st_uid, st.st_gid) == expected, name
    assert ("non-root" in result.isolation) == (expected[0] != 0)


@pytest.mark.parametrize("user", ["00", "000:0", "0000:1000"])
async def test_uid_zero_spelled_with_leading_zeros_is_not_non_root(
    workspace: Path, user: str
) -> None:
    async with Sandbox(workspace, backend="docker", user=user) as sb:
        result = await sb.exec(["id", "-u"])
    assert result.stdout == "0\n"  # the engine reads it as uid 0
    assert "non-root" not in result.isolation


# -- symlinks out of the workspace --------------------------------------------------------------
async def test_symlink_to_a_host_path_outside_does_not_expose_it(
    workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("TOPSECRET\n")
    (workspace / "dirlink").symlink_to(outside)
    (workspace / "filelink").symlink_to(secret)
    (workspace / "rellink").symlink_to(Path("..") / "outside" / "secret.txt")
    async with Sandbox(workspace, backend="docker") as sb:
        reads = [
            await sb.exec(["cat", path])
            for path in ("dirlink/secret.txt", "filelink", "rellink", str(secret))
        ]
        listing = await sb.exec(["ls", "-la", "dirlink/"])
        find = await sb.exec(shell="grep -rs TOPSECRET /workspace /tmp /home /etc; true")
        # write through the link (creating its target's directories in the container): the
        # host file must not change
        write = await sb.exec(
            shell='mkdir -p "$(dirname "$(readlink filelink)")" && echo pwned > filelink'
        )
    for read in reads:
        assert read.status == "failed", read
        assert "TOPSECRET" not in read.stdout
    assert listing.status == "failed"
    assert "secret.txt" not in listing.stdout
    assert "TOPSECRET" not in find.stdout
    assert secret.read_text() == "TOPSECRET\n", write  # whatever became of the write
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


# -- workdir escapes ------------------------------------------------------------------------------
ESCAPES = ["..", "../..", "sub/../../x", "/etc", "/workspace/..", "/workspace/../etc", "out"]


@pytest.mark.parametrize("workdir", [*ESCAPES, "HOST-OUTSIDE"])
async def test_escaping_workdir_is_refused_before_any_container_call(
    workspace: Path, tmp_path: Path, engine: docker.DockerClient, workdir: str
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (workspace / "out").symlink_to(outside)
    if workdir == "HOST-OUTSIDE":
        workdir = str(outside)
    async with Sandbox(workspace, backend="docker") as sb:
        cid = backend_of(sb).session.container_id
        assert cid is not None
        since = time.time()
        with pytest.raises(WorkspaceError, match="escapes"):
            await sb.exec(["touch", "escaped"], workdir=workdir)
        assert exec_creates(engine, since, cid) == []
        assert sb.last_result is None
        fine = await sb.exec(["pwd"], workdir="sub")  # the check does see a real exec
        assert fine.stdout == "/workspace/sub\n"
        # through the supervisor no command is an engine exec at all
        assert len(exec_creates(engine, since, cid)) == (fine.via == "engine")
    assert not (outside / "escaped").exists()


def test_escaping_workdir_from_the_cli_creates_no_container(
    workspace: Path, engine: docker.DockerClient
) -> None:
    since = time.time()
    proc = cli("run", "-b", "docker", "-w", str(workspace), "-C", "../..", "--", "true")
    assert proc.returncode == 125
    assert "escapes" in proc.stderr
    assert created_for(engine, since, workspace) == []


# -- forbidden configurations ---------------------------------------------------------------------
async def test_workspace_root_is_refused(engine: docker.DockerClient) -> None:
    since = time.time()
    with pytest.raises(WorkspaceError, match="'/'"):
        async with Sandbox("/", backend="docker"):
            pytest.fail("a sandbox over / was opened")
    proc = cli("run", "-b", "docker", "-w", "/", "--", "true")
    assert proc.returncode == 125
    assert "'/'" in proc.stderr
    assert created_for(engine, since, Path("/")) == []


@pytest.mark.parametrize("where", ["/run", "/var/run", "LINK-TO-RUN", "/run/lock"])
async def test_workspace_exposing_the_engine_socket_is_refused(
    tmp_path: Path, engine: docker.DockerClient, where: str
) -> None:
    if where == "LINK-TO-RUN":
        (tmp_path / "runlink").symlink_to("/run")
        where = str(tmp_path / "runlink")
    if not Path(where).is_dir():
        pytest.skip(f"{where} does not exist on this host")
    since = time.time()
    with pytest.raises(ConfigError, match="refusing to mount"):
        async with Sandbox(where, backend="docker"):
            pytest.fail(f"a sandbox over {where} was opened")
    assert ours(engine) == []
    assert created_for(engine, since, Path(where)) == []
    proc = cli("run", "-b", "docker", "-w", where, "--", "true")
    assert proc.returncode == 125, proc.stderr
    assert "refusing to mount" in proc.stderr


@pytest.mark.parametrize("workspace_is", ["socket-dir", "its-parent"])
async def test_workspace_holding_the_configured_engine_socket_is_refused(
    tmp_path: Path,
    engine: docker.DockerClient,
    monkeypatch: pytest.MonkeyPatch,
    workspace_is: str,
) -> None:
    """DOCKER_HOST names a socket in an ordinary directory: that directory may not be mounted."""
    real = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not real.startswith("unix://"):
        pytest.skip("the engine is not reached through a unix socket")
    sockdir = tmp_path / "engine"
    sockdir.mkdir()
    (sockdir / "docker.sock").symlink_to(real.removeprefix("unix://"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sockdir / 'docker.sock'}")
    where = sockdir if workspace_is == "socket-dir" else tmp_path
    with pytest.raises(ConfigError, match="engine socket"):
        async with Sandbox(where, backend="docker"):
            pytest.fail("the engine socket's directory was mounted")
    assert ours(engine) == []


PING_ENGINE = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print("unreachable:", exc)
    raise SystemExit(1)
s.sendall(b"GET /_ping HTTP/1.0\\r\\n\\r\\n")
print(s.recv(200).decode(errors="replace").splitlines()[0])
"""


async def test_workspace_holding_a_hard_link_to_the_engine_socket_is_refused(
    workspace: Path,
) -> None:
    """Only ``GET /_ping`` is sent, to this host's engine, to see whether it answers."""
    real = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not real.startswith("unix://"):
        pytest.skip("the engine is not reached through a unix socket")
    link = workspace / "engine.sock"
    try:
        os.link(os.path.realpath(real.removeprefix("unix://")), link)
    except OSError as exc:
        pytest.skip(f"cannot hard-link the engine socket here: {exc}")
    try:
        reached = None
        with contextlib.suppress(ConfigError):
            async with Sandbox(workspace, backend="docker") as sb:
                reached = await sb.exec(["python3", "-c", PING_ENGINE, "/workspace/engine.sock"])
    finally:
        link.unlink()
    # refused (ConfigError) or at least unusable from inside
    assert reached is None or "200 OK" not in reached.stdout, reached.stdout


BAD_USERS = ["root", "sandbox", "1000:abc", "-1", "1:2:3", "", ":", "1000:", ":1000", " 1000"]
BAD_USERS_SUBTLE = [
    pytest.param(
        user,
        id=ident,
    )
    for user, ident in [
        ("2147483648", "uid-out-of-range"),
        ("1000:99999999999", "gid-out-of-range"),
        ("\u0663", "arabic-indic-digit"),
        ("\u00b2", "superscript-two"),
    ]
]


@pytest.mark.parametrize("user", [*BAD_USERS, *BAD_USERS_SUBTLE])
async def test_bad_user_is_refused_before_any_container(
    workspace: Path, engine: docker.DockerClient, user: str
) -> None:
    since = time.time()
    with pytest.raises(ConfigError, match="--user"):
        async with Sandbox(workspace, backend="docker", user=user):
            pytest.fail(f"a sandbox with user {user!r} was opened")
    assert created_for(engine, since, workspace) == []


@pytest.mark.parametrize("user", ["root", "1000:abc", "1:2:3"])
def test_bad_user_on_the_cli_exits_2(
    workspace: Path, engine: docker.DockerClient, user: str
) -> None:
    since = time.time()
    proc = cli("run", "-b", "docker", "-w", str(workspace), "--user", user, "--", "true")
    assert proc.returncode == 125, proc.stderr
    assert "--user" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""
    assert created_for(engine, since, workspace) == []


# -- network -------------------------------------------------------------------------------------
def interfaces(proc_net_dev: str) -> list[str]:
    return [line.split(":")[0].strip() for line in proc_net_dev.splitlines()[2:] if ":" in line]


async def test_network_none_has_only_loopback_no_route_and_no_dns(workspace: Path) -> None:
    async with Sandbox(workspace, backend="docker") as sb:
        dev = await sb.exec(["cat", "/proc/net/dev"])
        v4 = await sb.exec(["cat", "/proc/net/route"])
        v6 = await sb.exec(["cat", "/proc/net/ipv6_route"])
        start = time.monotonic()
        dns = await sb.exec(["getent", "hosts", "example.com"], timeout=20)
        elapsed = time.monotonic() - start
    assert interfaces(dev.stdout) == ["lo"]
    assert lines_of(v4)[0].startswith("Iface")
    assert lines_of(v4)[1:] == []  # no IPv4 route at all
    assert all(line.split()[-1] == "lo" for line in lines_of(v6))  # IPv6: loopback only
    assert dns.status == "failed"
    assert dns.stdout == ""
    assert elapsed < 5
    assert "network-none" in dns.isolation


async def test_network_on_is_a_real_interface(workspace: Path) -> None:
    """The contrast: the check above would notice a network (no packet is sent here)."""
    async with Sandbox(workspace, backend="docker", policy=Policy(network="on")) as sb:
        dev = await sb.exec(["cat", "/proc/net/dev"])
    assert "lo" in interfaces(dev.stdout)
    assert len(interfaces(dev.stdout)) > 1
    assert "network-none" not in dev.isolation


# -- limits --------------------------------------------------------------------------------------
FORK_LOOP = "n=0; while :; do sleep 1000 & n=$((n+1)); echo $n; done"


async def test_pids_limit_stops_a_fork_bomb_and_the_run_ends_cleanly(workspace: Path) -> None:
    limits = Limits(pids=64, grace_s=0.5, drain_s=0.5)
    async with Sandbox(workspace, backend="docker", limits=limits) as sb:
        start = time.monotonic()
        result = await sb.exec(shell=FORK_LOOP, timeout=5)
        elapsed = time.monotonic() - start
        await assert_container_clean(sb)
        after = await sb.exec(["echo", "alive"])
    assert result.status in ("timed_out", "failed")
    assert result.survivors == 0
    assert "Resource temporarily unavailable" in result.stderr
    forked = [int(n) for n in lines_of(result)]
    assert forked
    assert max(forked) < 64  # the limit, not the timeout, stopped the forking
    assert elapsed < 5 + limits.grace_s + 3
    assert "pids-limit" in result.isolation
    assert after.status == "completed"
    assert after.stdout == "alive\n"


ALLOCATE = "x = b'x' * (500 << 20); print('survived')"


def oom_kills(text: str) -> int:
    """``oom_kill`` from memory.oom_control (cgroup v1) or memory.events (cgroup v2)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill":
            return int(value)
    raise AssertionError(f"no oom_kill counter in {text!r}")


OOM_COUNTER = (
    "cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null || cat /sys/fs/cgroup/memory.events"
)


async def test_memory_limit_kills_the_allocation(workspace: Path) -> None:
    """The mechanism works: the kernel OOM-kills the command, and the container lives on."""
    limits = Limits(memory_bytes=64 * MiB, grace_s=0.5)
    async with Sandbox(workspace, backend="docker", limits=limits) as sb:
        before = oom_kills((await sb.exec(shell=OOM_COUNTER)).stdout)
        result = await sb.exec(["python3", "-c", ALLOCATE], timeout=60)
        after = oom_kills((await sb.exec(shell=OOM_COUNTER)).stdout)
        alive = await sb.exec(["echo", "alive"])
    assert result.signal == "SIGKILL"
    assert result.exit_code is None
    assert "survived" not in result.stdout
    assert after == before + 1
    assert alive.stdout == "alive\n"
    assert "memory-limit" in result.isolation


async def test_memory_limit_yields_oom_killed(workspace: Path) -> None:
    limits = Limits(memory_bytes=64 * MiB, grace_s=0.5)
    async with Sandbox(workspace, backend="docker", limits=limits) as sb:
        result = await sb.exec(["python3", "-c", ALLOCATE], timeout=60)
    assert result.status == "oom_killed"
    assert "survived" not in result.stdout


async def test_plain_sigkill_is_not_oom_killed(workspace: Path) -> None:
    limits = Limits(memory_bytes=64 * MiB, grace_s=0.5)
    async with Sandbox(workspace, backend="docker", limits=limits) as sb:
        result = await sb.exec(shell="kill -KILL $$")
    assert result.status == "failed"
    assert result.signal == "SIGKILL"


# -- a dead container ----------------------------------------------------------------------------
@pytest.fixture
def engine_path_for_kill_1(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """``kill 1`` and ``kill -9 -1`` end a container whose main process is a ``sleep`` (the
    engine's exec path); the supervisor is the container's PID 1, out of reach of both (as on
    the local backends, a command cannot end its sandbox that way:
    ``test_kill_1_does_not_end_a_supervised_sandbox``)."""
    params = getattr(request.node, "callspec", None)
    scenario = " ".join(str(v) for v in (params.params.values() if params else ()))
    if "kill 1" in scenario or "kill -9 -1" in scenario:  # the supervisor is out of reach
        monkeypatch.setenv("SANDBOXRUN_DOCKER_SUPERVISOR", "0")


async def test_kill_9_minus_1_does_not_end_a_supervised_sandbox(workspace: Path) -> None:
    """``kill -9 -1`` reaches every process of the container but PID 1, the supervisor: the
    sandbox goes on in the same container."""
    async with Sandbox(workspace, backend="docker", limits=FAST) as sb:
        cid = backend_of(sb).session.container_id
        hit = await sb.exec(shell="kill -9 -1; kill -9 1; kill -STOP 1; echo lived")
        after = await sb.exec(["echo", "same"])
        assert backend_of(sb).session.container_id == cid
    assert hit.status != "sandbox_error", hit
    assert after.status == "completed" and after.stdout == "same\n", after


async def test_kill_1_does_not_end_a_supervised_sandbox(workspace: Path) -> None:
    async with Sandbox(workspace, backend="docker", limits=FAST) as sb:

        async def victim() -> ExecResult:
            return await sb.exec(shell="echo up; sleep 1.5; echo still", timeout=20)

        async with anyio.create_task_group() as tg:
            got: list[ExecResult] = []
            tg.start_soon(lambda: _append(got, victim()))
            await anyio.sleep(0.5)
            killer = await sb.exec(shell="kill 1; kill -TERM 1; kill -INT 1; sleep 0.2")
    assert killer.status == "completed", killer
    assert got[0].status == "completed" and got[0].stdout == "up\nstill\n", got[0]
    assert got[0].via == "supervisor"


async def _append(into: list[ExecResult], result: Any) -> None:
    into.append(await result)


async def kill_from_another_exec(
    workspace: Path, killer: str, user: str | None
) -> tuple[ExecResult, ExecResult, float]:
    """Run ``sleep 30`` and, 0.7 s later, ``killer`` in a second exec; then one more exec."""
    results: dict[str, ExecResult] = {}
    async with Sandbox(workspace, backend="docker", limits=FAST, user=user) as sb:

        async def victim() -> None:
            results["victim"] = await sb.exec(shell="echo up; sleep 30; echo never", timeout=20)

        start = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(victim)
            await anyio.sleep(0.7)
            await sb.exec(shell=killer)
        elapsed = time.monotonic() - start
        results["after"] = await sb.exec(["echo", "again"])
    return results["victim"], results["after"], elapsed


@pytest.mark.parametrize("killer", ["kill 1", "kill -9 -1"])
@pytest.mark.parametrize("user", [None, "1000:1000"])
@pytest.mark.usefixtures("engine_path_for_kill_1")
async def test_container_killed_from_another_exec_never_completes_nor_hangs(
    workspace: Path, engine: docker.DockerClient, killer: str, user: str | None
) -> None:
    victim, _, elapsed = await kill_from_another_exec(workspace, killer, user)
    assert victim.status != "completed", victim
    assert victim.stdout == "up\n"
    assert "never" not in victim.stdout
    assert elapsed < 6  # not the victim's 20 s timeout
    assert ours(engine) == []


@pytest.mark.parametrize("killer", ["kill 1", "kill -9 -1"])
@pytest.mark.parametrize("user", [None, "1000:1000"])
@pytest.mark.usefixtures("engine_path_for_kill_1")
async def test_container_killed_from_another_exec_is_sandbox_error(
    workspace: Path, engine: docker.DockerClient, killer: str, user: str | None
) -> None:
    victim, after, _ = await kill_from_another_exec(workspace, killer, user)
    assert victim.status == "sandbox_error", victim
    assert victim.error
    assert "stopped or was removed" in victim.error
    assert after.status == "completed", after  # the sandbox goes on in a fresh container
    assert after.stdout == "again\n"
    assert ours(engine) == []


@pytest.mark.parametrize(
    "script",
    [
        "kill 1; sleep 5",
        "kill 1",  # exits at once: the init holds the TERM it forwards, not yet acted on
        "kill -9 -1",
    ],
)
@pytest.mark.usefixtures("engine_path_for_kill_1")
async def test_exec_that_kills_init_itself_is_always_sandbox_error(
    workspace: Path, script: str
) -> None:
    outcomes: Counter[tuple[str, bool]] = Counter()
    async with Sandbox(workspace, backend="docker", limits=FAST) as sb:
        for _ in range(25):
            result = await sb.exec(shell=script, timeout=20)
            outcomes[(result.status, bool(result.error))] += 1
    assert outcomes == {("sandbox_error", True): 25}


async def test_init_killed_by_a_leftover_of_the_exec_is_not_completed(
    workspace: Path, engine: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOXRUN_DOCKER_SUPERVISOR", "0")  # `kill 1` ends only a `sleep`
    limits = Limits(grace_s=2.0, drain_s=0.5)
    async with Sandbox(workspace, backend="docker", limits=limits) as sb:
        cid = backend_of(sb).session.container_id
        assert cid is not None
        result = await sb.exec(
            shell="(trap '' TERM; sleep 0.3; kill 1) >/dev/null 2>&1 & echo bg", timeout=20
        )
        stopped = wait_until(lambda: not engine.api.inspect_container(cid)["State"]["Running"])
    assert stopped, "the scenario did not kill the container"
    assert result.stdout == "bg\n"
    assert result.status == "sandbox_error", result


def kill_and_wait(engine: docker.DockerClient, cid: str) -> None:
    """Kill the container from outside and wait until the engine reports it stopped (or, with
    the supervisor's ``AutoRemove``, already removed it)."""
    engine.api.kill(cid)
    deadline = time.monotonic() + 10
    while True:
        try:
            if not engine.api.inspect_container(cid)["State"]["Running"]:
                return
        except docker.errors.NotFound:
            return
        assert time.monotonic() < deadline, "the container did not stop"
        time.sleep(0.05)


async def test_container_killed_while_idle_is_replaced_before_the_next_exec(
    workspace: Path, engine: docker.DockerClient
) -> None:
    """Its supervisor is seen gone (its pidfd) before the next exec uses it: that exec runs in
    a fresh container."""
    async with Sandbox(workspace, backend="docker", limits=FAST) as sb:
        cid = backend_of(sb).session.container_id
        assert cid is not None
        await anyio.to_thread.run_sync(kill_and_wait, engine, cid)
        result = await sb.exec(["echo", "hi"])
        assert backend_of(sb).session.container_id != cid
    assert result.status == "completed" and result.stdout == "hi\n", result
    assert ours(engine) == []


async def test_container_killed_while_idle_is_sandbox_error_on_the_engine_path(
    workspace: Path, engine: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOXRUN_DOCKER_SUPERVISOR", "0")  # nothing to watch: found at exec
    async with Sandbox(workspace, backend="docker", limits=FAST) as sb:
        cid = backend_of(sb).session.container_id
        assert cid is not None
        await anyio.to_thread.run_sync(kill_and_wait, engine, cid)
        result = await sb.exec(["echo", "hi"])
    assert result.status == "sandbox_error"
    assert result.error
    assert "not running" in result.error
    assert ours(engine) == []


async def test_sandbox_recovers_after_its_container_died_while_idle(
    workspace: Path, engine: docker.DockerClient
) -> None:
    async with Sandbox(workspace, backend="docker", limits=FAST) as sb:
        cid = backend_of(sb).session.container_id
        assert cid is not None
        await anyio.to_thread.run_sync(kill_and_wait, engine, cid)
        await sb.exec(["echo", "hi"])  # a fresh container, or sandbox_error (tested above)
        later = [await sb.exec(["echo", "hi"]) for _ in range(3)]
    assert [r.status for r in later] == ["completed"] * 3, later[0].error
    assert ours(engine) == []


async def test_container_removed_under_an_exec_is_sandbox_error(
    workspace: Path, engine: docker.DockerClient
) -> None:
    removed: list[str] = []
    async with Sandbox(workspace, backend="docker", limits=FAST) as sb:
        cid = backend_of(sb).session.container_id
        assert cid is not None

        def remove_on_first_output(name: str, chunk: bytes) -> None:
            # Blocking on purpose: the removal is complete before sandboxrun reads on.
            if not removed:
                engine.api.remove_container(cid, force=True)
                removed.append(cid)

        result = await sb.exec(shell="echo up; sleep 30", timeout=20, sink=remove_on_first_output)
        after = await sb.exec(["echo", "again"])
    assert removed == [cid]
    assert result.status == "sandbox_error"
    assert result.error
    assert "removed" in result.error
    assert after.status == "completed"
    assert after.stdout == "again\n"
    assert ours(engine) == []


# -- stdin ----------------------------------------------------------------------------------------
async def test_stdin_bytes_reach_cat(workspace: Path) -> None:
    data = b"first line\n\x00\xff\xfe binary \x1b[31m\nno newline at the end"
    async with Sandbox(workspace, backend="docker") as sb:
        echoed = await sb.exec(["cat"], stdin=data)
        counted = await sb.exec(["wc", "-c"], stdin=b"y" * (3 * MiB + 7))
        empty = await sb.exec(["cat"], stdin=b"")
        shell = await sb.exec(shell='read -r a; echo "got:$a"', stdin=b"hello there\n")
    assert echoed.status == "completed"
    assert echoed.stdout_total_bytes == len(data)
    assert echoed.stdout == data.decode("utf-8", errors="replace")
    assert counted.stdout.strip() == str(3 * MiB + 7)
    assert empty.status == "completed"
    assert empty.stdout == ""
    assert shell.stdout == "got:hello there\n"


def test_no_labelled_container_of_ours_is_left(engine: docker.DockerClient) -> None:
    assert ours(engine) == []
