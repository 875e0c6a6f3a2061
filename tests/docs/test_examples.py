"""Every command and Python snippet of README.md and docs/*.md runs as written (doctest-style).

One test per block (id ``file:line``), as ``tests/docs/doc_blocks.py`` finds them:

- shell blocks (``sh``, ``bash``, ``shell``, ``console``) run through ``bash -e`` from the
  repository root, ``.venv/bin`` first on PATH, as a reader of a checkout runs them;
- python blocks run with the venv's python, and ``run: pytest`` ones as a test module under
  pytest, in a scratch directory holding a copy of ``examples/`` and ``project/`` (a copy of
  ``examples/sample-workspace``: the docs' ``./project`` stands for the reader's project), so
  that what they write never lands in the checkout;
- each must end with exit status 0, or the one its ``<!-- exit: N -->`` marker names, within
  ``BLOCK_TIMEOUT_S``;
- a block marked ``<!-- not-run: reason -->`` is skipped with that reason (``-ra`` lists them).
  Every other block must run: one that cannot is a failure (mark it, with a reason, or fix it).

The docs describe the default set-up, the docker backend and the default image (`make`,
`npm`, `pytest` in it): without a docker engine the runnable blocks are skipped, or fail when
docker is required (``SANDBOXRUN_REQUIRE_BACKENDS``, as CI sets it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import DocBlock, parse
from helpers import require_backend

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK_TIMEOUT_S = 90.0
VENV_BIN = REPO / ".venv" / "bin"
PYTHON = str(VENV_BIN / "python") if (VENV_BIN / "python").exists() else sys.executable
SCRATCH_IGNORE = shutil.ignore_patterns("__pycache__", ".pytest_cache", "node_modules")


def all_blocks() -> list[DocBlock]:
    blocks: list[DocBlock] = []
    for document in DOCUMENTS:
        blocks += parse(str(document.relative_to(REPO)), document.read_text())
    return blocks


BLOCKS = all_blocks()


def run_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', os.defpath)}"
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def scratch_dir(tmp_path: Path) -> Path:
    scratch = tmp_path / "scratch"
    shutil.copytree(REPO / "examples", scratch / "examples", ignore=SCRATCH_IGNORE)
    shutil.copytree(
        REPO / "examples" / "sample-workspace", scratch / "project", ignore=SCRATCH_IGNORE
    )
    return scratch


def execute(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``argv`` in a session of its own; past the timeout the whole session is killed."""
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=run_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            text = out.decode(errors="replace")
            pytest.fail(f"still running after {BLOCK_TIMEOUT_S:g}s:\n{text[-4000:]}")
        return proc.returncode, out.decode(errors="replace")


def run_block(block: DocBlock, tmp_path: Path) -> tuple[int, str]:
    if block.kind == "shell":
        script = tmp_path / "block.sh"
        script.write_text(block.code)
        return execute(["bash", "-e", str(script)], REPO)
    scratch = scratch_dir(tmp_path)
    if block.kind == "python":
        (scratch / "snippet.py").write_text(block.code)
        return execute([PYTHON, "snippet.py"], scratch)
    (scratch / "test_snippet.py").write_text(block.code)
    argv = [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"]
    return execute([*argv, "test_snippet.py"], scratch)


def test_the_docs_have_blocks_to_run() -> None:
    """Guards the parametrization below against silently finding nothing."""
    readme = [b for b in BLOCKS if b.path == "README.md"]
    assert len([b for b in readme if b.not_run is None]) >= 3, readme
    assert {b.kind for b in BLOCKS if b.not_run is None} == {"shell", "python", "pytest"}


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_block_runs(block: DocBlock, tmp_path: Path) -> None:
    if block.not_run is not None:
        pytest.skip(f"{block.id}: not run: {block.not_run}")
    require_backend("docker")
    status, output = run_block(block, tmp_path)
    shown = f"{block.id} ({block.language}) ended with {status}, expected {block.exit}:\n"
    assert status == block.exit, shown + block.code + "--- output ---\n" + output[-6000:]
    if block.kind == "pytest" and block.exit == 0:
        assert re.search(r"\b[1-9]\d* passed", output), output
        assert not re.search(r"\b(skipped|xfailed|xpassed|deselected)\b", output), output
