"""The ``sandboxrun`` inspect_ai sandbox on the real docker engine (docs/inspect.md).

1. inspect_ai's own portable conformance suite (``inspect_ai.util._sandbox.self_check``): each
   check is one test (``test_self_check[<check>]``) against one sample sandbox; the one check
   that cannot pass is asserted to fail, for the reason docs/inspect.md gives, so a regression
   or an unexpected fix both show; ``test_self_check_summary`` prints the count.
2. What the provider adds beyond the suite: every process of a timed-out command is dead,
   inspect's output limit raises, ``user``, ``cwd`` outside the workspace, the sample
   lifecycle leaves nothing behind, ``task_init`` fails early, ``connection``.
3. A real ``inspect eval`` (subprocess) of tests/integration/inspect_task.py with inspect's
   ``mockllm/model`` whose bash tool calls run in sandboxrun, and
   ``inspect sandbox cleanup sandboxrun``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import docker
import psutil
import pytest
from helpers import kill_watchdog, require_backend, wait_until
from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxEnvironmentLimits,
    SandboxUserUnsupportedError,
)
from inspect_ai.util import SandboxUnavailableError as InspectUnavailable
from inspect_ai.util._sandbox import self_check
from inspect_ai.util._sandbox.limits import override_max_exec_output_size

from sandboxrun import SandboxUnavailableError
from sandboxrun.integrations.inspect.config import SandboxrunConfig
from sandboxrun.integrations.inspect.sandbox import SandboxrunSandboxEnvironment
from sandboxrun.integrations.inspect.workspace import cleanup as cleanup_leftovers
from sandboxrun.integrations.inspect.workspace import parent_dir

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
INSPECT = ROOT / ".venv" / "bin" / "inspect"
TASK = Path(__file__).with_name("inspect_task.py")

CHECKS = sorted(self_check.__all__)
EXPECTED_FAILURES: dict[str, str] = {}
"""None, with a writable root (``root: writable``, uid 0: adduser writes /etc/passwd and
chowns a home; ``exec(user=...)`` switches with setpriv). A read-only root fails
``test_exec_as_user`` alone: ``test_exec_as_user_needs_a_writable_root``."""
RESULTS: dict[str, str] = {}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def sample_env() -> AsyncIterator[SandboxrunSandboxEnvironment]:
    """One sample's sandbox for the whole suite, made and cleaned up as inspect does."""
    require_backend("docker")
    config = SandboxrunConfig(root="writable")  # adduser writes /etc/passwd
    envs = await SandboxrunSandboxEnvironment.sample_init("self-check", config, {})
    env = envs["default"]
    assert isinstance(env, SandboxrunSandboxEnvironment)
    yield env
    await SandboxrunSandboxEnvironment.sample_cleanup("self-check", None, envs, False)
    assert not env.workspace.exists(), "the sample's workspace outlived its cleanup"


def _own_containers(workspace: Path) -> list[str]:
    from sandboxrun.integrations.inspect.workspace import workspace_label

    client = docker.from_env()
    try:
        found = client.api.containers(
            all=True, filters={"label": f"sandboxrun.workspace={workspace_label(workspace)}"}
        )
        return [str(c["Id"]) for c in found]
    finally:
        client.close()


# -- 1. inspect's conformance suite -------------------------------------------------------------
def test_self_check_has_44_checks() -> None:
    assert len(CHECKS) == 44, CHECKS
    assert set(EXPECTED_FAILURES) <= set(CHECKS)


@pytest.mark.parametrize("check", CHECKS)
async def test_self_check(check: str, sample_env: SandboxrunSandboxEnvironment) -> None:
    run = getattr(self_check, check)
    if check in EXPECTED_FAILURES:
        with pytest.raises(AssertionError, match=EXPECTED_FAILURES[check]):
            await run(sample_env)
        RESULTS[check] = "expected failure"
        return
    await run(sample_env)
    RESULTS[check] = "passed"


def test_self_check_summary() -> None:
    if set(RESULTS) != set(CHECKS):
        pytest.skip("the summary needs every test_self_check of this module")
    passed = sorted(name for name, outcome in RESULTS.items() if outcome == "passed")
    print(f"\ninspect_ai self-check on sandboxrun (docker): {len(passed)}/{len(CHECKS)} passed")
    print(f"expected failures: {sorted(EXPECTED_FAILURES)}")
    assert len(passed) == len(CHECKS) - len(EXPECTED_FAILURES) == 44


# -- 2. beyond the suite ------------------------------------------------------------------------
async def test_timeout_kills_every_process(sample_env: SandboxrunSandboxEnvironment) -> None:
    """inspect's docker provider wraps the command in ``timeout``: a ``setsid`` grandchild
    escapes it. Here nothing of the command is left once TimeoutError is raised."""
    script = "setsid sleep 301 & (trap '' TERM; sleep 302) & sleep 303"
    started = time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        await sample_env.exec(["sh", "-c", script], timeout=1)
    assert time.monotonic() - started < 1 + sample_env.config.grace + 3
    assert "timed out after 1 seconds" in str(raised.value)
    ps = await sample_env.exec(["ps", "-eo", "args"])
    assert ps.success
    assert not [line for line in ps.stdout.splitlines() if line.startswith("sleep 30")], ps.stdout


async def test_another_users_command_is_ended_too_and_files_keep_their_modes(
    sample_env: SandboxrunSandboxEnvironment,
) -> None:
    """``exec(user=...)`` in a writable root switches uid (``setpriv``): the supervisor, which
    keeps only ``CAP_KILL`` of the sandbox's capabilities, still ends every process of such a
    command at its timeout; and the files API, as root, honours mode bits (no ``DAC_OVERRIDE``
    in the supervisor; a command as root has it)."""
    added = await sample_env.exec(
        ["adduser", "--comment", "t", "--disabled-password", "carol"], user="root", timeout=20
    )
    assert added.success, added.stderr
    who = await sample_env.exec(["sh", "-c", "id -un; echo $HOME"], user="carol")
    assert who.stdout.split() == ["carol", "/home/carol"], who
    script = "setsid sleep 311 & (trap '' TERM; sleep 312) & sleep 313"
    with pytest.raises(TimeoutError):
        await sample_env.exec(["sh", "-c", script], user="carol", timeout=1)
    ps = await sample_env.exec(["ps", "-eo", "user:12,args"])
    assert not [line for line in ps.stdout.splitlines() if "sleep 31" in line], ps.stdout
    caps = await sample_env.exec(["grep", "CapEff", "/proc/1/status", "/proc/self/status"])
    assert "/proc/1/status:CapEff:\t0000000000000020" in caps.stdout, caps.stdout  # KILL only
    await sample_env.exec(["sh", "-c", "echo secret > closed && chmod 0 closed"])
    with pytest.raises(PermissionError):
        await sample_env.read_file("closed")
    read = await sample_env.exec(["cat", "closed"])  # a root command: DAC_OVERRIDE
    assert read.stdout == "secret\n"
    await sample_env.exec(["userdel", "-r", "carol"], user="root")


async def test_timeout_keeps_partial_output(sample_env: SandboxrunSandboxEnvironment) -> None:
    with pytest.raises(TimeoutError) as raised:
        await sample_env.exec(["sh", "-c", "echo started; sleep 30"], timeout=1)
    assert getattr(raised.value, "truncated_output", None) == "started\n"


async def test_output_limit_raises(sample_env: SandboxrunSandboxEnvironment) -> None:
    with override_max_exec_output_size(1024):
        fits = await sample_env.exec(["head", "-c", "1024", "/dev/zero"])
        assert len(fits.stdout) == 1024
        with pytest.raises(OutputLimitExceededError) as raised:
            await sample_env.exec(["sh", "-c", "seq 1 100000; echo oops >&2"])
    assert raised.value.limit_str == "1 KiB"
    kept = raised.value.truncated_output or ""
    assert kept.startswith("1\n2\n") and "bytes omitted ...]" in kept
    assert kept.endswith("100000\noops\n")
    assert SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE == 10 * 1024**2  # restored


async def test_default_output_limit(sample_env: SandboxrunSandboxEnvironment) -> None:
    """inspect's default (10 MiB per stream): 10 MiB passes whole, one byte more raises."""
    limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
    whole = await sample_env.exec(["head", "-c", str(limit), "/dev/zero"])
    assert len(whole.stdout) == limit
    with pytest.raises(OutputLimitExceededError):
        await sample_env.exec(["head", "-c", str(limit + 1), "/dev/zero"])


async def test_users(sample_env: SandboxrunSandboxEnvironment) -> None:
    own = await sample_env.exec(["id", "-u"], user=str(sample_env.uid))
    assert own.stdout.strip() == str(sample_env.uid)
    if sample_env.uid == 0:
        assert (await sample_env.exec(["whoami"], user="root")).stdout == "root\n"
    # the module's sample: uid 0 in a writable root, which switches (setpriv)
    other = await sample_env.exec(["sh", "-c", "id -un; echo $HOME"], user="nobody")
    assert other.stdout == "nobody\n/nonexistent\n", other
    missing = await sample_env.exec(["id"], user="no-such-user")
    assert not missing.success and "no-such-user" in missing.stderr


async def test_another_user_needs_a_writable_root() -> None:
    """The default sample (a read-only root, no capability): one uid for every command."""
    envs = await SandboxrunSandboxEnvironment.sample_init("users", None, {})
    env = envs["default"]
    assert isinstance(env, SandboxrunSandboxEnvironment)
    try:
        with pytest.raises(SandboxUserUnsupportedError, match="runs every command as uid"):
            await env.exec(["id"], user="nobody" if env.uid != 65534 else "root")
        added = await env.exec(["adduser", "--disabled-password", "--comment", "x", "dan"])
        assert not added.success
    finally:
        await SandboxrunSandboxEnvironment.sample_cleanup("users", None, envs, False)


async def test_cwd_outside_the_workspace(sample_env: SandboxrunSandboxEnvironment) -> None:
    assert (await sample_env.exec(["pwd"], cwd="/tmp")).stdout == "/tmp\n"
    await sample_env.exec(["ln", "-sfn", "/usr/share", "link"])
    assert (await sample_env.exec(["pwd", "-P"], cwd="link")).stdout == "/usr/share\n"
    missing = await sample_env.exec(["no-such-command"], cwd="/tmp")
    assert (missing.returncode, missing.success) == (127, False)
    gone = await sample_env.exec(["pwd"], cwd="/no/such/dir")
    assert not gone.success and "/no/such/dir" in gone.stderr
    with pytest.raises(PermissionError):
        await sample_env.exec(["/etc/passwd"], cwd="/tmp")
    await sample_env.exec(["rm", "link"])


async def test_files_stay_in_the_workspace(sample_env: SandboxrunSandboxEnvironment) -> None:
    with pytest.raises(PermissionError, match="escapes"):
        await sample_env.read_file("../outside")
    await sample_env.write_file("deep/er/file.txt", "x")
    assert (sample_env.workspace / "deep" / "er" / "file.txt").read_text() == "x"
    await sample_env.write_file("~notes", b"n")  # a file of the workspace, not of HOME
    assert (sample_env.workspace / "~notes").read_bytes() == b"n"
    await sample_env.exec(["rm", "-r", "deep", "~notes"])


async def test_connection(sample_env: SandboxrunSandboxEnvironment) -> None:
    connection = await sample_env.connection()
    assert connection.container in _own_containers(sample_env.workspace)
    assert connection.command.startswith("docker exec -it -u ")
    argv = shlex.split(connection.command)
    assert argv[-2:] == ["bash", "-l"] and argv[2] == "-it"
    probe = subprocess.run(
        [*argv[:2], *argv[3:-2], "cat", "/etc/hostname"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode == 0 and connection.container.startswith(probe.stdout.strip())


async def test_sample_lifecycle_leaves_nothing(tmp_path: Path) -> None:
    require_backend("docker")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "README").write_text("template\n")
    config = tmp_path / "sandboxrun.yaml"
    config.write_text("workspace: repo\nmemory: 256m\nenv:\n  GREETING: hello\n")
    envs = await SandboxrunSandboxEnvironment.sample_init("lifecycle", str(config), {})
    env = envs["default"]
    assert isinstance(env, SandboxrunSandboxEnvironment)
    workspace = env.workspace
    try:
        assert workspace.parent == parent_dir() and workspace != tmp_path / "repo"
        assert await env.read_file("README") == "template\n"
        memory = "cat /sys/fs/cgroup/memory.max || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
        said = await env.exec(["sh", "-c", f'echo "$GREETING"; ({memory}) 2>/dev/null'])
        assert said.stdout == f"hello\n{256 << 20}\n"
        await env.write_file("README", "changed\n")
        assert (tmp_path / "repo" / "README").read_text() == "template\n"  # a copy
        assert len(_own_containers(workspace)) == 1
    finally:
        await SandboxrunSandboxEnvironment.sample_cleanup("lifecycle", str(config), envs, False)
    assert not workspace.exists()
    assert wait_until(lambda: not _own_containers(workspace), 10)


async def test_task_cleanup_closes_what_samples_left() -> None:
    require_backend("docker")
    envs = await SandboxrunSandboxEnvironment.sample_init("left", None, {})
    env = envs["default"]
    assert isinstance(env, SandboxrunSandboxEnvironment)
    await SandboxrunSandboxEnvironment.task_cleanup("shutdown", None, False)  # kept
    assert (await env.exec(["true"])).success
    await SandboxrunSandboxEnvironment.task_cleanup("shutdown", None, True)
    assert not env.workspace.exists()
    assert wait_until(lambda: not _own_containers(env.workspace), 10)


async def test_a_dead_container_is_unavailable_then_replaced() -> None:
    """The container killed under a sample: inspect's SandboxUnavailableError (a tool call
    shows ``sandbox_unavailable``, not the failure as the command's output); the next exec
    runs in a fresh container."""
    require_backend("docker")
    env = await SandboxrunSandboxEnvironment.open(SandboxrunConfig())
    try:
        (container,) = _own_containers(env.workspace)
        client = docker.from_env()
        try:

            async def kill_it() -> None:  # once the command runs
                await anyio.sleep(1)
                await anyio.to_thread.run_sync(client.api.kill, container)

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(kill_it)
                    with pytest.raises(InspectUnavailable):
                        await env.exec(["sleep", "30"], timeout=40)
        finally:
            client.close()
        again = await env.exec(["echo", "again"])
        assert again.stdout == "again\n"
        assert container not in _own_containers(env.workspace)
    finally:
        await env.close()


async def test_task_init_fails_early(tmp_path: Path) -> None:
    require_backend("docker")
    config = tmp_path / "sandboxrun.yaml"
    config.write_text("image: sandboxrun/no-such-image:latest\n")
    with pytest.raises(SandboxUnavailableError, match="no-such-image"):
        await SandboxrunSandboxEnvironment.task_init("early", str(config))
    config.write_text("memory: lots\n")
    with pytest.raises(Exception, match="invalid memory 'lots'"):
        await SandboxrunSandboxEnvironment.task_init("early", str(config))


# -- 3. a real eval, and the CLI cleanup ---------------------------------------------------------
def _inspect_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(INSPECT_LOG_DIR=str(tmp_path / "logs"), INSPECT_DISPLAY="none", NO_COLOR="1")
    return env


def _eval_sample(
    tmp_path: Path,
    task: str,
    timeout: float,
    config: str | None = None,
    *,
    files: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> Any:
    """``inspect eval inspect_task.py@task [args]`` in a directory of its own (with ``config``
    as its ``sandboxrun.yaml``, and ``files``): its one log's one sample, once the eval
    succeeded."""
    done = _eval(tmp_path, task, timeout, config, files=files, args=args)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = list((tmp_path / "logs").glob("*.json"))
    assert len(logs) == 1
    log = json.loads(logs[0].read_text())
    assert log["status"] == "success", log.get("error")
    (sample,) = log["samples"]
    return sample


def _eval(
    tmp_path: Path,
    task: str,
    timeout: float,
    config: str | None = None,
    *,
    files: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    task_dir = tmp_path / "task"
    task_dir.mkdir()
    shutil.copy(TASK, task_dir / TASK.name)
    if config is not None:
        (task_dir / "sandboxrun.yaml").write_text(config)
    for name, text in (files or {}).items():
        (task_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (task_dir / name).write_text(text)
    return subprocess.run(
        [str(INSPECT), "eval", f"{TASK.name}@{task}", "--log-format", "json", *args],
        cwd=task_dir,
        env=_inspect_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_inspect_eval_mockllm(tmp_path: Path) -> None:
    """``inspect eval`` of a task whose scripted model calls ``bash``: the tool runs in the
    sandboxrun container (/workspace, the file the sample wrote, its read-only root, the
    ``sandboxrun.yaml`` found next to the task file), a timed-out call leaves nothing running,
    the scorer reads the sandbox, and no container or workspace is left afterwards."""
    require_backend("docker")
    before = {p.name for p in parent_dir().iterdir()}
    sample = _eval_sample(tmp_path, "sandboxrun_bash", 100, "env:\n  FROM_CONFIG: found\n")
    assert sample["scores"]["in_sandbox"]["value"] == "C", sample["scores"]
    tools = [m for m in sample["messages"] if m["role"] == "tool"]
    look, hang, answer = (m["content"] for m in tools)
    # the bash tool ran in the container: /workspace, the file the sample wrote there, the
    # container's read-only root file system
    assert "cwd=/workspace\nseed=planted by the sample\nconfig=found\n" in look, look
    assert "Read-only file system" in look, look
    # the timed-out call: inspect's timeout error with the output so far; then not one of
    # its three sleeps (one in its own session) is left in the sandbox
    assert hang == "started\n" and tools[1]["error"]["type"] == "timeout", tools[1]
    assert answer == "0\n", answer
    assert {p.name for p in parent_dir().iterdir()} == before
    assert not _containers_of_pid(None, since=int(time.time()) - 120)


def test_inspect_eval_bash_session_and_text_editor(tmp_path: Path) -> None:
    """inspect's stateful tools on the sandboxrun provider, in a real eval: ``bash_session()``
    keeps its directory and variables from one call to the next (inspect's tools server,
    installed under the container's /var/tmp, outlives the exec that started it: it is a job
    of the sample's sandbox), ``text_editor()`` creates, edits and views a file; afterwards no
    tools server, container or workspace is left."""
    require_backend("docker")
    before = {p.name for p in parent_dir().iterdir()}
    sample = _eval_sample(tmp_path, "sandboxrun_session_tools", 240)
    tools = [m for m in sample["messages"] if m["role"] == "tool"]
    assert [m.get("error") for m in tools] == [None] * 5, [m.get("error") for m in tools]
    contents = [str(m["content"]) for m in tools]
    assert "set" in contents[0], contents[0]
    assert "got=42 in /tmp" in contents[1], contents[1]  # the same shell, one call later
    assert "beta" in contents[4] and "alpha" not in contents[4], contents[4]
    assert sample["scores"]["in_sandbox"]["value"] == "C", sample["scores"]
    assert {p.name for p in parent_dir().iterdir()} == before
    assert not _containers_of_pid(None, since=int(time.time()) - 240)
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if "inspect-sandbox-tools" in " ".join(p.info["cmdline"] or [])
    ], "the tools server outlived its sandbox"


def _containers_of_pid(pid: int | None, *, since: int) -> list[str]:
    """sandboxrun containers of this host created since ``since`` (by ``pid`` when given;
    the Ray tests' nodes, each a host of its own name, run beside these)."""
    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": "sandboxrun.managed=true"})
    finally:
        client.close()
    return [
        str(c["Id"])
        for c in found
        if int(c["Labels"].get("sandboxrun.created", "0")) >= since
        and c["Labels"].get("sandboxrun.owner_host") == socket.gethostname()
        and (pid is None or c["Labels"].get("sandboxrun.owner_pid") == str(pid))
        and c["Labels"].get("sandboxrun.owner_pid") != str(os.getpid())
    ]


HOLDER = textwrap.dedent(
    """
    import anyio
    from sandboxrun.integrations.inspect.config import SandboxrunConfig
    from sandboxrun.integrations.inspect.sandbox import SandboxrunSandboxEnvironment

    async def main() -> None:
        env = await SandboxrunSandboxEnvironment.open(SandboxrunConfig())
        print(env.workspace.name, flush=True)
        await anyio.sleep(300)

    anyio.run(main)
    """
)


def _hold_sandbox(tmp_path: Path, *, supervisor: bool) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ)
    if not supervisor:  # the container's main process is a sleep (only a watchdog ends it)
        env["SANDBOXRUN_DOCKER_SUPERVISOR"] = "0"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, env=env
    )
    assert holder.stdout is not None
    return holder, holder.stdout.readline().strip()


def test_inspect_sandbox_cleanup(tmp_path: Path) -> None:
    """``inspect sandbox cleanup sandboxrun``: an eval process killed with SIGKILL leaves its
    workspace (and, without a supervisor, its container, when its watchdog is killed with
    it); the cleanup removes both, and keeps a live eval's sandbox unless its name is given."""
    require_backend("docker")
    cleanup_leftovers(None)  # what earlier runs left: the counts below are this test's
    dead, dead_name = _hold_sandbox(tmp_path, supervisor=False)
    live, live_name = _hold_sandbox(tmp_path, supervisor=True)
    try:
        dead_ws, live_ws = parent_dir() / dead_name, parent_dir() / live_name
        assert dead_ws.is_dir() and live_ws.is_dir()
        assert len(_own_containers(dead_ws)) == 1
        kill_watchdog(dead.pid)  # (it would remove the container)
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        assert _own_containers(dead_ws), "a container without a supervisor outlives its owner"
        cleanup = [str(INSPECT), "sandbox", "cleanup", "sandboxrun"]
        done = subprocess.run(cleanup, capture_output=True, text=True, check=True)
        assert "removed 1 container(s) and 1 workspace(s)" in done.stdout, done.stdout
        assert "workspace(s) of running evals" in done.stdout, done.stdout
        assert not dead_ws.exists() and not _own_containers(dead_ws)
        assert live_ws.is_dir() and len(_own_containers(live_ws)) == 1
        done = subprocess.run([*cleanup, live_name], capture_output=True, text=True, check=True)
        assert "removed 1 container(s) and 1 workspace(s)" in done.stdout, done.stdout
        assert not live_ws.exists() and not _own_containers(live_ws)
    finally:
        for holder in (dead, live):
            holder.kill()
            holder.wait()
            if holder.stdout is not None:
                holder.stdout.close()
        for name in (dead_name, live_name):  # after a failure: nothing of the test stays
            cleanup_leftovers(name)


def test_inspect_eval_on_a_dockerfile_and_a_one_service_compose_file(tmp_path: Path) -> None:
    """issue 20: ``sandbox=("sandboxrun", "env/Dockerfile")`` and ``("sandboxrun",
    "compose.yaml")`` with one service (``build``, ``environment``, ``working_dir``, limits)
    in real evals: the image is built once (the second eval reuses it) and the command runs on
    it, where the compose file says; a file with two services is refused in one line."""
    require_backend("docker")
    from sandboxrun.image.build import BOOTSTRAP_REPO, host_source
    from sandboxrun.image.source import planned_tag

    dockerfile = f"FROM {BOOTSTRAP_REPO}:{host_source()[1]}\nRUN echo baked > /opt/marker\n"
    compose = (
        "services:\n  default:\n    build: env\n    init: true\n    command: tail -f /dev/null\n"
        "    environment:\n      FROM_COMPOSE: yes-it-is\n    working_dir: /tmp\n"
        "    network_mode: none\n    mem_limit: 1g\n    x-default: true\n"
        "    volumes: ['./data:/var/tmp/data:ro']\n"
    )
    files = {"env/Dockerfile": dockerfile, "compose.yaml": compose, "data/v.txt": "vol\n"}
    before = {p.name for p in parent_dir().iterdir()}
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "Dockerfile").write_text(dockerfile)
    tag = planned_tag(tmp_path / "probe")
    try:
        for config, where in (("env/Dockerfile", "/workspace"), ("compose.yaml", "/tmp")):
            run_dir = tmp_path / config.replace("/", "-")
            run_dir.mkdir()
            sample = _eval_sample(
                run_dir, "sandboxrun_image", 300, files=files, args=("-T", f"config={config}")
            )
            (look,) = (m["content"] for m in sample["messages"] if m["role"] == "tool")
            env = "yes-it-is" if config == "compose.yaml" else "none"
            volume = "vol\nro\n" if config == "compose.yaml" else "ro\n"  # a read-only bind
            assert look == f"baked\ncwd={where} env={env}\n{volume}", (config, look)
            assert sample["scores"]["in_sandbox"]["value"] == "C", sample["scores"]
        two = compose + "  other:\n    image: debian\n"
        (tmp_path / "two").mkdir()
        refused = _eval(
            tmp_path / "two", "sandboxrun_image", 120,
            files={"env/Dockerfile": dockerfile, "compose.yaml": two},
            args=("-T", "config=compose.yaml"),
        )  # fmt: skip
        words = "compose.yaml: 2 services (default, other); a sandboxrun sandbox is one container"
        assert refused.returncode != 0 and words in refused.stdout + refused.stderr, refused
    finally:
        client = docker.from_env()
        try:
            client.api.remove_image(tag)
        finally:
            client.close()
    assert {p.name for p in parent_dir().iterdir()} == before
    assert not _containers_of_pid(None, since=int(time.time()) - 300)
