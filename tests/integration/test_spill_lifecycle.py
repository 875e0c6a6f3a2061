"""Spill files live as long as their sandbox (``keep_spill`` keeps them), and old ones are
pruned when a sandbox opens, never those of a sandbox open elsewhere. Real sandboxes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest
from helpers import require_backend

from sandboxrun import Limits, Policy, Sandbox, run
from sandboxrun.engine.capture import prune as spill_prune
from sandboxrun.engine.capture.prune import STAMP_NAME
from sandboxrun.engine.capture.spill import LOCK_NAME, SpillDir, SpillSession
from sandboxrun.errors import PolicyRefusedError

LIMITS = Limits(max_output=1024, grace_s=0.5, drain_s=0.5)
FLOOD = ["seq", "1", "20000"]  # ~110 KB: beyond max_output, so it spills
EXPECTED = "".join(f"{i}\n" for i in range(1, 20001))

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["process-group", "docker"])
def any_backend(request: pytest.FixtureRequest) -> str:
    return require_backend(str(request.param))


def leftovers(root: Path) -> list[str]:
    """What is under the spill root, the prune stamp aside."""
    return sorted(p.name for p in root.iterdir() if p.name != STAMP_NAME) if root.exists() else []


async def test_spill_files_go_with_the_sandbox(
    workspace: Path, any_backend: str, spill_root: Path
) -> None:
    async with Sandbox(workspace, backend=any_backend, limits=LIMITS) as sb:
        result = await sb.exec(FLOOD)
        job = await sb.start(FLOOD)
        job_result = await job.wait(timeout=60)
        assert sb.spill_dir is not None and sb.spill_dir.parent == spill_root
        for done in (result, job_result):
            assert done.stdout_spill is not None and done.stdout_spill_complete
            assert Path(done.stdout_spill).read_text() == EXPECTED  # valid while open
            assert Path(done.stdout_spill).is_relative_to(sb.spill_dir)
        assert (sb.spill_dir / f"{job.id}.log").is_dir()  # the job's log segments
        own = sb.spill_dir
    assert sb.spill_dir is None
    assert not own.exists() and leftovers(spill_root) == []


async def test_keep_spill_keeps_them_after_close(
    workspace: Path, any_backend: str, spill_root: Path
) -> None:
    async with Sandbox(workspace, backend=any_backend, limits=LIMITS, keep_spill=True) as sb:
        result = await sb.exec(FLOOD)
        own = sb.spill_dir
    assert own is not None and result.stdout_spill is not None
    assert Path(result.stdout_spill).read_text() == EXPECTED
    assert leftovers(spill_root) == [own.name]
    # closed: its lock is free, so pruning may remove it (here with a zero age cap)
    report = spill_prune.prune(spill_root, spill_prune.SpillCaps(max_age_s=0, max_total=None))
    assert report.removed == (own,) and leftovers(spill_root) == []


def test_sync_run_removes_unless_kept(workspace: Path, spill_root: Path) -> None:
    gone = run(FLOOD, workspace=workspace, backend="process-group", limits=LIMITS)
    kept = run(FLOOD, workspace=workspace, backend="process-group", limits=LIMITS, keep_spill=True)
    assert gone.stdout_spill is not None and not Path(gone.stdout_spill).exists()
    assert kept.stdout_spill is not None and Path(kept.stdout_spill).read_text() == EXPECTED


async def test_no_spill_no_directory(workspace: Path, spill_root: Path) -> None:
    limits = LIMITS.model_copy(update={"spill_max": 0})
    async with Sandbox(workspace, backend="process-group", limits=limits) as sb:
        result = await sb.exec(FLOOD)
        assert sb.spill_dir is None
    assert result.stdout_spill is None and leftovers(spill_root) == []


async def test_escalated_rerun_spills_into_its_parents_directory(
    workspace: Path, spill_root: Path
) -> None:
    """The re-run's sandbox closes before its result is returned: its spill must outlive it,
    in the asking sandbox's directory (removed with that one)."""
    script = "seq 1 20000; echo run >> runs.txt || exit 5"
    read_only = Policy(access="read-only")
    try:
        async with Sandbox(
            workspace, backend="process-group", policy=read_only, limits=LIMITS
        ) as sb:
            result = await sb.exec(shell=script, escalate=lambda result, policy: True)
            assert result.escalated_from == read_only and result.status == "completed"
            assert sb.spill_dir is not None and result.stdout_spill is not None
            assert Path(result.stdout_spill).is_relative_to(sb.spill_dir)
            assert Path(result.stdout_spill).read_text() == EXPECTED
            assert leftovers(spill_root) == [sb.spill_dir.name]  # no directory of its own
    except PolicyRefusedError as exc:
        pytest.skip(f"process-group cannot confine here: {exc}")
    assert not Path(result.stdout_spill).exists() and leftovers(spill_root) == []


OTHER = textwrap.dedent(
    """
    import sys
    import anyio
    from sandboxrun import Limits, Sandbox

    async def main():
        limits = Limits(max_output=1024)
        async with Sandbox(sys.argv[1], backend="process-group", limits=limits) as sb:
            result = await sb.exec(["seq", "1", "20000"])
            print(result.stdout_spill, flush=True)
            await anyio.to_thread.run_sync(sys.stdin.read)

    anyio.run(main)
    """
)


async def test_opening_a_sandbox_prunes_but_never_an_open_ones_files(
    workspace: Path, spill_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = SpillSession.create(spill_root)
    spilled = SpillDir(stale.path, "0123456789abcdef").open_file("stdout")
    spilled.write(b"old output\n")
    spilled.close()
    stale.close(keep=True)
    two_days_ago = time.time() - 48 * 3600
    for path in (stale.path / "0123456789abcdef" / "stdout", stale.path / "0123456789abcdef"):
        os.utime(path, (two_days_ago, two_days_ago))
    os.utime(stale.path / LOCK_NAME, (two_days_ago, two_days_ago))
    os.utime(stale.path, (two_days_ago, two_days_ago))
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER, str(workspace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert other.stdin is not None and other.stdout is not None
    try:
        others = Path(other.stdout.readline().strip())
        assert others.read_text() == EXPECTED
        monkeypatch.setenv("SANDBOXRUN_SPILL_MAX_AGE", "0")  # every closed one is too old
        monkeypatch.setattr(spill_prune, "_last_scan", {})  # this process has not scanned yet
        async with Sandbox(workspace, backend="process-group", limits=LIMITS) as sb:
            assert not stale.path.exists()  # pruned as the sandbox opened
            assert others.read_text() == EXPECTED  # the other process's sandbox is open
            assert sb.spill_dir is not None
            assert leftovers(spill_root) == sorted([others.parents[1].name, sb.spill_dir.name])
        other.stdin.close()
        assert await anyio.to_thread.run_sync(lambda: other.wait(timeout=60)) == 0
        assert leftovers(spill_root) == []  # each removed its own on close
    finally:
        other.kill()
        other.wait()
        other.stdout.close()


async def test_rerun_after_close_spills_in_its_own_locked_dir(
    workspace: Path, spill_root: Path
) -> None:
    """The CLI's --ask re-run is made after the first sandbox closed: it must not spill unlocked
    into the root (never removed, prunable mid-run), but into a directory of its own."""
    backend = require_backend("process-group")
    async with Sandbox(workspace, backend=backend, limits=LIMITS) as first:
        request = first._prepare(FLOOD)
    widened, again = first._escalated(request, Policy(access="workspace-write"))
    async with widened:
        result = await widened._run_request(again)
        assert result.stdout_spill is not None
        assert widened.spill_dir is not None
        assert Path(result.stdout_spill).is_relative_to(widened.spill_dir)
        assert (widened.spill_dir / LOCK_NAME).exists()
    assert leftovers(spill_root) == []
