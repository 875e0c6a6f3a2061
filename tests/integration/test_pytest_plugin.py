"""The pytest plugin (``sandboxrun.integrations.pytest_plugin``) in a real inner pytest session
(pytester, in
a subprocess, the plugin loaded through its ``pytest11`` entry point), on real backends: the
fixtures work, markers, command-line and ini options are honoured, a project's own ``sandbox``
fixture wins, and nothing of a sandbox outlives its test."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import require_backend

from sandboxrun import Limits, SandboxFileNotFoundError
from sandboxrun.integrations.blocking import BlockingSandbox

pytest_plugins = ["pytester"]

DOCKER_IMAGE = "sandboxrun/base:latest"


def run_inner(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error", *args)


def processes_of_run(run_id: str) -> list[int]:
    """Host processes whose environment carries this sandboxrun run id."""
    needle = f"SANDBOXRUN_RUN_ID={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def containers_of(owner_pid: int) -> list[str]:
    from sandboxrun.backends.docker import api as dockerapi

    client = dockerapi.connect(10)
    try:
        found = client.containers.list(
            all=True,
            ignore_removed=True,
            filters={"label": ["sandboxrun.managed=true", f"sandboxrun.owner_pid={owner_pid}"]},
        )
        return [str(c.name) for c in found]
    finally:
        client.close()


BASIC = """
import os
from pathlib import Path

def test_exec_and_files(sandbox, tmp_path):
    result = sandbox.exec(["echo", "hi"])
    assert result.stdout == "hi\\n"
    assert result.status == "completed"
    assert sandbox.workspace == tmp_path.resolve()
    sandbox.write_file("note.txt", b"from the test\\n")
    assert (tmp_path / "note.txt").read_bytes() == b"from the test\\n"
    assert sandbox.exec(["cat", "note.txt"]).stdout == "from the test\\n"
    assert sandbox.read_file("note.txt") == b"from the test\\n"
    assert [e.name for e in sandbox.list_dir(".")] == ["note.txt"]
    assert sandbox.exec(shell="exit 3").exit_code == 3
    Path(os.environ["FACTS"]).write_text(result.backend)
"""


@pytest.mark.parametrize("backend", ["process-group", "docker"])
def test_sandbox_fixture_on_tmp_path(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    require_backend(backend)
    pytester.makepyfile(test_basic=BASIC)
    facts = pytester.path / "facts.txt"
    monkeypatch.setenv("FACTS", str(facts))
    result = run_inner(pytester, f"--sandboxrun-backend={backend}")
    result.assert_outcomes(passed=1)
    assert facts.read_text() == backend


LEAVES_A_JOB = """
import json, os
from pathlib import Path

def test_leaves_a_job_running(sandbox):
    job = sandbox.start(["sleep", "300"])
    assert job.status == "running"
    leftover = sandbox.exec(shell="sleep 300 & echo started")  # a descendant left running
    assert leftover.stdout == "started\\n"
    facts = {"run_id": job.id, "pid": os.getpid(), "backend": sandbox.backend_name}
    Path(os.environ["FACTS"]).write_text(json.dumps(facts))
"""


@pytest.mark.parametrize("backend", ["process-group", "docker"])
def test_nothing_outlives_the_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    require_backend(backend)
    pytester.makepyfile(test_leaves=LEAVES_A_JOB)
    facts_file = pytester.path / "facts.json"
    monkeypatch.setenv("FACTS", str(facts_file))
    started = time.monotonic()
    result = run_inner(pytester, f"--sandboxrun-backend={backend}")
    result.assert_outcomes(passed=1)
    assert time.monotonic() - started < 60  # the job was ended, not waited for
    facts = json.loads(facts_file.read_text())
    assert facts["backend"] == backend
    assert processes_of_run(facts["run_id"]) == []
    if backend == "docker":
        assert containers_of(facts["pid"]) == []


MARKED = """
import os
import pytest
from pathlib import Path

pytestmark = pytest.mark.sandboxrun(backend="process-group", network="on")

@pytest.mark.sandboxrun(workspace="ws")
def test_marker_options(sandbox, pytestconfig):
    assert sandbox.workspace == (pytestconfig.rootpath / "ws").resolve()
    result = sandbox.exec(["pwd"])
    assert result.backend == "process-group"
    assert result.stdout == "/workspace\\n"  # (as on every backend)
    assert "network-none" not in result.isolation

def test_module_marker_only(sandbox, tmp_path):
    result = sandbox.exec(["true"])
    assert result.backend == "process-group"
    assert "network-none" not in result.isolation
    assert sandbox.workspace == tmp_path.resolve()

@pytest.mark.sandboxrun(network="none", access="read-only")
def test_closer_marker_wins(sandbox):
    result = sandbox.exec(shell="touch x")
    assert result.exit_code != 0
    assert "network-none" in result.isolation
    assert "read-only-workspace" in result.isolation
"""


def test_markers_win_over_the_command_line(pytester: pytest.Pytester) -> None:
    require_backend("process-group")
    pytester.makepyfile(test_marked=MARKED)
    (pytester.path / "ws").mkdir()
    # the command line asks for docker and an image; the module's marker says process-group
    # (an image from the command line is a docker option: not applied to a local backend)
    result = run_inner(
        pytester, "--sandboxrun-backend=docker", f"--sandboxrun-image={DOCKER_IMAGE}"
    )
    result.assert_outcomes(passed=3)


INI_BACKEND = """
def test_backend_from_ini(sandbox):
    assert sandbox.exec(["true"]).backend == "process-group"
"""


def test_ini_options(pytester: pytest.Pytester) -> None:
    require_backend("process-group")
    pytester.makeini("[pytest]\nsandboxrun_backend = process-group\n")
    pytester.makepyfile(test_ini=INI_BACKEND)
    run_inner(pytester).assert_outcomes(passed=1)


IMAGE = """
def test_image(sandbox):
    result = sandbox.exec(["sh", "-c", "pwd; . /etc/os-release; echo $ID"])
    assert result.backend == "docker"
    assert result.stdout == "/workspace\\ndebian\\n"
"""


def test_image_option_on_docker(pytester: pytest.Pytester) -> None:
    require_backend("docker")
    pytester.makeini(f"[pytest]\nsandboxrun_backend = docker\nsandboxrun_image = {DOCKER_IMAGE}\n")
    pytester.makepyfile(test_image=IMAGE)
    run_inner(pytester).assert_outcomes(passed=1)
    missing = run_inner(pytester, "--sandboxrun-image=sandboxrun/absent:nope")
    missing.assert_outcomes(errors=1)
    missing.stdout.fnmatch_lines(["*sandboxrun/absent:nope*"])


ASYNC = """
import pytest

@pytest.fixture
def anyio_backend():
    return "asyncio"

@pytest.mark.anyio
@pytest.mark.sandboxrun(backend="process-group")
async def test_async(async_sandbox, tmp_path):
    result = await async_sandbox.exec(["echo", "hi"])
    assert result.stdout == "hi\\n"
    await async_sandbox.write_file("a.txt", b"a")
    assert (tmp_path / "a.txt").read_bytes() == b"a"
"""


def test_async_sandbox(pytester: pytest.Pytester) -> None:
    require_backend("process-group")
    pytester.makepyfile(test_async=ASYNC)
    run_inner(pytester).assert_outcomes(passed=1)


def test_a_projects_own_sandbox_fixture_wins(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "import pytest\n\n@pytest.fixture\ndef sandbox():\n    return 'the project fixture'\n"
    )
    pytester.makepyfile(
        test_own="def test_own(sandbox):\n    assert sandbox == 'the project fixture'\n"
    )
    run_inner(pytester).assert_outcomes(passed=1)


def test_unused_plugin_changes_nothing(pytester: pytest.Pytester) -> None:
    """Loaded, the plugin registers its options and marker and touches nothing else: a test
    without its fixtures runs (warnings are errors, markers strict) without sandboxrun's models."""
    pytester.makepyfile(
        test_plain="""
import sys
import pytest

@pytest.mark.sandboxrun(backend="docker")
def test_plain():
    assert "sandboxrun.integrations.pytest_plugin" in sys.modules
    heavy = [m for m in ("pydantic", "docker", "sandboxrun.models") if m in sys.modules]
    assert heavy == []
"""
    )
    run_inner(pytester, "--strict-markers").assert_outcomes(passed=1)
    assert "--sandboxrun-backend" in "\n".join(run_inner(pytester, "--help").outlines)


def test_unknown_marker_option_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_typo="""
import pytest

@pytest.mark.sandboxrun(netwrok="on")
def test_typo(sandbox):
    pass
"""
    )
    result = run_inner(pytester)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*unknown option netwrok*"])


@pytest.mark.sandboxrun(backend="process-group", limits=Limits(grace_s=0.5))
def test_blocking_facade_in_this_session(sandbox: BlockingSandbox, tmp_path: Path) -> None:
    """The plugin is loaded in this project's own session too: the fixture, its jobs (stdin,
    wait, kill) and errors raised in the sandbox's thread, seen from a plain test."""
    assert sandbox.backend_name == "process-group"
    assert sandbox.workspace == tmp_path.resolve()
    job = sandbox.start(["cat"], stdin=True)
    job.write_stdin(b"one\n")
    job.close_stdin()
    result = job.wait(timeout=10)
    assert (result.status, result.stdout) == ("completed", "one\n")
    assert (job.done, job.status, job.result) == (True, "completed", result)
    sleeper = sandbox.start(["sleep", "60"])
    assert [j.id for j in sandbox.jobs()] == [job.id, sleeper.id]
    assert sleeper.kill().status == "cancelled"
    with pytest.raises(SandboxFileNotFoundError):
        sandbox.read_file("missing.txt")
    with pytest.raises(TimeoutError):
        sandbox.start(["sleep", "60"]).wait(timeout=0.1)


def test_the_example_runs_from_a_checkout_without_the_dev_extras() -> None:
    """issue 20: ``pytest -q examples/pytest-plugin`` from the repository died with ``Unknown
    config option: timeout`` (sandboxrun's own pytest configuration, read from its
    pyproject.toml, needs pytest-timeout, a dev extra; ``-p no:timeout`` stands for a user
    without it)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:timeout", "-W", "error",
         "examples/pytest-plugin", "--sandboxrun-backend", "process-group"],
        cwd=repo, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout
