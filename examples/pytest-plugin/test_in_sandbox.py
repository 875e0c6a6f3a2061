"""Testing a project's commands in a sandbox with sandboxrun's pytest plugin (docs/pytest.md).

Run from the repository root: ``pytest examples/pytest-plugin`` (add
``--sandboxrun-backend process-group`` to run without Docker).
"""

import shutil
import time
from pathlib import Path

import pytest

from sandboxrun import Limits

SAMPLE = Path(__file__).parent.parent / "sample-workspace"


def test_the_sample_suite_passes(sandbox):
    shutil.copytree(SAMPLE, sandbox.workspace, dirs_exist_ok=True)  # the workspace: tmp_path
    result = sandbox.exec(["python3", "-B", "-m", "unittest", "-q"], timeout=60)
    assert result.status == "completed", result.stderr
    assert "Ran 2 tests" in result.stderr


@pytest.mark.sandboxrun(workspace=str(SAMPLE), access="read-only")
def test_the_workspace_can_be_read_only(sandbox):
    result = sandbox.exec(shell="cat wordcount.py > /dev/null && echo planted > planted.txt")
    assert result.status == "failed"
    assert not (sandbox.workspace / "planted.txt").exists()


@pytest.mark.sandboxrun(limits=Limits(grace_s=0.5))
def test_a_runaway_is_killed_whole(sandbox):
    result = sandbox.exec(shell="sleep 60 & sleep 60", timeout=1)
    assert result.status == "timed_out"
    assert result.survivors == 0  # the background sleep too


def test_a_server_in_the_background(sandbox):
    server = sandbox.start(["python3", "-u", "-m", "http.server", "8000"])
    while b"Serving HTTP" not in server.read().data:
        assert not server.done, server.result
        time.sleep(0.05)
    get = "import urllib.request as r; print(r.urlopen('http://127.0.0.1:8000/').status)"
    assert sandbox.exec(["python3", "-c", get]).stdout == "200\n"
    assert server.kill().status == "cancelled"
