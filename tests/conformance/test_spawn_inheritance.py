"""What a command inherits from the process that starts it, on every backend: its three stdio
descriptors and nothing else (not the supervisor's socket, not a neighbour's pipes that are in
flight at the same moment), no signal ignored or blocked (Python ignores SIGPIPE and SIGXFSZ
for itself: ``yes | head`` must end by SIGPIPE, not loop on EPIPE), and the working directory
it asked for. Also how a spawn fails: the errno of the first real failure along PATH, the
name it failed on, a missing working directory named as such."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from helpers import assert_nothing_left

from sandboxrun import Limits, Sandbox
from sandboxrun.models import ExecResult

pytestmark = pytest.mark.anyio

FAST = Limits(grace_s=0.5, drain_s=0.5)
FDS = "ls /proc/self/fd"
"""``ls``'s own descriptors: 0, 1, 2 and the one it reads the directory with (3)."""


def supervised(result: ExecResult) -> bool:
    return result.via in ("supervisor", "scope")


async def test_only_stdio_is_inherited_even_with_neighbours_in_flight(
    workspace: Path, backend: str
) -> None:
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        got: list[ExecResult] = []

        async def one() -> None:
            got.append(await sb.exec(["sh", "-c", f"exec {FDS}"], stdin=b"x"))

        async with anyio.create_task_group() as tg:
            for _ in range(8):  # spawns whose pipes cross on the way to the supervisor
                tg.start_soon(one)
    assert len(got) == 8
    for result in got:
        assert result.status == "completed", result
        assert sorted(result.stdout.split(), key=int) == ["0", "1", "2", "3"], result.stdout
        assert_nothing_left(result.run_id)


async def test_no_signal_is_ignored_or_blocked(workspace: Path, backend: str) -> None:
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        masks = await sb.exec(["grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"])
        piped = await sb.exec(shell="yes | head -c 1 >/dev/null; echo done", timeout=20)
    assert masks.status == "completed", masks
    lines = dict(line.split(":\t") for line in masks.stdout.splitlines())
    assert lines == {"SigIgn": "0000000000000000", "SigBlk": "0000000000000000"}, masks.stdout
    assert piped.status == "completed" and piped.stdout == "done\n", piped


async def test_the_working_directory_is_the_one_asked_for(workspace: Path, backend: str) -> None:
    (workspace / "a" / "b").mkdir(parents=True)
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        inner = await sb.exec(["pwd"], workdir="a/b")
        top = await sb.exec(["pwd"])
        again = await sb.exec(["pwd"], workdir="a")
    root = "/workspace"  # on every backend (the local ones bind it there too)
    assert [inner.stdout, top.stdout, again.stdout] == [f"{root}/a/b\n", f"{root}\n", f"{root}/a\n"]


async def test_a_missing_working_directory_is_a_spawn_error_naming_it(
    workspace: Path, backend: str
) -> None:
    (workspace / "gone").mkdir()
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        request = sb._prepare(["true"], workdir="gone")
        (workspace / "gone").rmdir()  # after the host checked it: the sandbox finds it missing
        result = await sb._run_request(request)
        after = await sb.exec(["pwd"])  # the supervisor's own directory did not move
    if supervised(result):
        assert result.status == "spawn_error", result
        assert result.error is not None and "gone" in result.error, result.error
    else:  # the engine path's start stub reports it as the command's failure
        assert result.status == "failed", result
    assert after.status == "completed" and after.stdout == "/workspace\n", after


async def test_path_search_reports_the_first_real_failure(workspace: Path, backend: str) -> None:
    """A directory early on PATH holds a non-executable file of the name, a later one the
    real program: the program runs (execvp goes on past EACCES). With no program at all the
    EACCES is what is reported (126), not the ENOENT of the later directories."""
    (workspace / "bin1").mkdir()
    (workspace / "bin2").mkdir()
    (workspace / "bin1" / "sbrtool").write_text("#!/bin/sh\necho first\n")
    (workspace / "bin1" / "sbrtool").chmod(0o644)
    (workspace / "bin2" / "sbrtool").write_text("#!/bin/sh\necho second\n")
    (workspace / "bin2" / "sbrtool").chmod(0o755)
    (workspace / "bin1" / "sbrnone").write_text("#!/bin/sh\necho never\n")
    (workspace / "bin1" / "sbrnone").chmod(0o644)
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        root = "/workspace"  # on every backend (the local ones bind it there too)
        prepend = [f"{root}/bin1", f"{root}/bin2"]
        found = await sb.exec(["sbrtool"], path_prepend=prepend)
        denied = await sb.exec(["sbrnone"], path_prepend=prepend)
    assert found.status == "completed" and found.stdout == "second\n", found
    assert denied.exit_code == 126, denied
    if supervised(denied):
        assert denied.status == "spawn_error", denied
        assert denied.error is not None and "sbrnone" in denied.error, denied.error
