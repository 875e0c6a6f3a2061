"""The persistent shell for agents (``Sandbox.open_shell``) against the traps that wedge the
peers' shells: unmatched quotes and backticks (inspect #2985), ``read`` waiting for input,
pagers and editors (OpenHands #10189), a program that forges the end-of-command marker, a 10 KiB
command, a timeout (SWE-ReX #29: output lost), a shell that exits. Real terminals, real bash."""

from __future__ import annotations

import random
import time
from pathlib import Path

import anyio
import pytest
from conformance_helpers import assert_container_clean
from helpers import wait_until
from test_terminals import FAST, alive, gone, token

from sandboxrun import Sandbox

pytestmark = pytest.mark.anyio


@pytest.fixture
def sh_backend(tty_backend: str) -> str:
    """Every backend, docker both ways (``tests/conftest.py: tty_backend``)."""
    return tty_backend


async def test_state_persists_and_exit_codes_are_exact(workspace: Path, sh_backend: str) -> None:
    async with Sandbox(workspace, backend=sh_backend, limits=FAST) as sb:
        sh = await sb.open_shell()
        first = await sh.run("mkdir -p sub && cd sub && X=41 && f() { echo f$(( $1 + X )); }")
        assert first.exit_code == 0 and first.output == "", first
        again = await sh.run("pwd; f 1; (exit 42)")
        assert again.exit_code == 42
        assert again.output.splitlines() == [f"{_cwd(sb)}/sub", "f42"]
        assert (await sh.run("false")).exit_code == 1
        assert (
            await sh.run("kill -TERM $BASHPID 2>/dev/null; sh -c 'kill -9 $$'")
        ).exit_code == 137
        await sh.close()
        await assert_container_clean(sb)


def _cwd(sb: Sandbox) -> str:
    return str(sb.workspace.root) if sb.backend.name == "fake" else "/workspace"


@pytest.mark.parametrize(
    "command",
    [
        "echo 'unmatched",
        'echo "unmatched',
        "echo `unmatched",
        "echo $(unmatched",
        "if true; then",
        "cat <<EOF",
        "echo \\",
    ],
)
async def test_a_continuation_trap_is_a_syntax_error_and_the_shell_goes_on(
    workspace: Path, sh_backend: str, command: str
) -> None:
    async with Sandbox(workspace, backend=sh_backend, limits=FAST) as sb:
        sh = await sb.open_shell()
        trapped = await sh.run(command, timeout=10)
        assert not trapped.timed_out, trapped
        assert trapped.exit_code in (0, 1, 2), trapped
        after = await sh.run("echo still here", timeout=10)
        assert (after.output, after.exit_code) == ("still here\n", 0), after


async def test_read_pager_and_editor_are_ended_by_the_timeout_and_the_shell_answers(
    workspace: Path, sh_backend: str
) -> None:
    (workspace / "long.txt").write_text("".join(f"line {i}\n" for i in range(5000)))
    async with Sandbox(workspace, backend=sh_backend, limits=FAST) as sb:
        sh = await sb.open_shell()
        present = await sh.run("for p in less more vi vim nano; do command -v $p; done")
        tools = [Path(line).name for line in present.output.split()]
        assert {"less", "more"} & set(tools), present  # a pager at least (util-linux: more)
        traps = [f"{tool} long.txt" for tool in tools]
        for command in ("read answer", *traps, "cat", "python3"):
            trapped = await sh.run(command, timeout=1.5)
            assert trapped.timed_out and trapped.interrupted, (command, trapped)
            assert not trapped.restarted, (command, trapped)
            after = await sh.run("echo answers", timeout=10)
            assert after.output.endswith("answers\n") and after.exit_code == 0, (command, after)
        paged = await sh.run(
            "git --no-pager log 2>/dev/null; man ls 2>/dev/null | head -1; echo $PAGER"
        )
        assert paged.output.endswith("cat\n") and not paged.timed_out


async def test_a_forged_marker_does_not_end_the_command(workspace: Path, sh_backend: str) -> None:
    """A program (a child of the shell: no key, it is never exported) prints end markers with
    every key it can find or guess while it holds the foreground: the run goes on to the
    command's real end."""
    forge = (
        "import os, sys, time\n"
        "keys = [v for v in os.environ.values()] + ['', '0' * 16, 'deadbeefdeadbeef']\n"
        "for key in keys:\n"
        "    sys.stdout.write('\\x1b]133;D;0;%s\\x07' % key)\n"
        "sys.stdout.flush()\n"
        "time.sleep(1)\n"
        "print('real end')\n"
        "sys.exit(5)\n"
    )
    (workspace / "forge.py").write_text(forge)
    async with Sandbox(workspace, backend=sh_backend, limits=FAST) as sb:
        sh = await sb.open_shell()
        result = await sh.run("python3 forge.py", timeout=20)
        assert result.exit_code == 5 and result.output.endswith("real end\n"), result
        env = await sh.run('env | grep -c "=.*$__sandboxrun_key"')
        assert env.output.strip() == "0"  # the key is never exported


async def test_a_ten_kib_command_arrives_whole(workspace: Path, sh_backend: str) -> None:
    payload = "".join(random.choice("abcdefgh'\"`$\\\t ") for _ in range(10_240))
    command = "cat <<'SANDBOXRUN_END' | md5sum\n" + payload.replace("\n", "") + "\nSANDBOXRUN_END"
    async with Sandbox(workspace, backend=sh_backend, limits=FAST) as sb:
        sh = await sb.open_shell()
        result = await sh.run(command, timeout=20)
        local = await sb.exec(["md5sum"], stdin=(payload.replace("\n", "") + "\n").encode())
        assert result.exit_code == 0, result
        assert result.output.split()[0] == local.stdout.split()[0]
        multi = await sh.run("for i in 1 2 3; do\n  echo n$i\ndone\n")
        assert multi.output == "n1\nn2\nn3\n"


async def test_a_timeout_keeps_the_partial_output_and_kills_the_command(
    workspace: Path, sh_backend: str
) -> None:
    tok = token()
    async with Sandbox(workspace, backend=sh_backend, limits=FAST) as sb:
        sh = await sb.open_shell()
        result = await sh.run(f"echo before; sleep {tok}; echo never", timeout=1.0)
        assert result.timed_out and result.interrupted and not result.restarted, result
        assert result.output.startswith("before\n") and "never" not in result.output
        assert wait_until(lambda: gone(tok), 5)
        trap = await sh.run(f"trap '' INT; sleep {tok}", timeout=1.0)  # ^C ignored by all
        assert trap.timed_out and trap.interrupted, trap
        assert wait_until(lambda: gone(tok), 5)
        assert (await sh.run("echo ok")).output == "ok\n"


async def test_a_shell_that_exits_is_restarted_and_says_so(
    workspace: Path, sh_backend: str
) -> None:
    async with Sandbox(workspace, backend=sh_backend, limits=FAST) as sb:
        sh = await sb.open_shell()
        await sh.run("Y=1")
        gone_shell = await sh.run("exit 3", timeout=10)
        assert gone_shell.restarted and gone_shell.exit_code is None, gone_shell
        assert not gone_shell.timed_out
        fresh = await sh.run("echo Y=${Y-unset}")
        assert fresh.output == "Y=unset\n"
        assert sum(not t.done for t in sb.terminals()) == 1


async def test_closing_the_sandbox_ends_the_shell_and_its_background_jobs(
    workspace: Path, sh_backend: str
) -> None:
    tok = token()
    async with Sandbox(workspace, backend=sh_backend, limits=FAST) as sb:
        sh = await sb.open_shell()
        await sh.run(f"setsid sleep {tok} & nohup sleep {tok} >/dev/null 2>&1 &")
        assert wait_until(lambda: alive(tok), 5)
    assert wait_until(lambda: gone(tok), 5)


async def test_a_command_that_changes_the_terminals_modes_does_not_break_the_next(
    workspace: Path, sh_backend: str
) -> None:
    async with Sandbox(workspace, backend=sh_backend, limits=FAST) as sb:
        sh = await sb.open_shell()
        assert (await sh.run("stty echo intr e; stty -isig")).exit_code == 0
        after = await sh.run("echo one")
        assert after.output == "one\n", after  # no echo of the typed line, e is a letter
        trapped = await sh.run("sleep 600", timeout=1.0)
        assert trapped.timed_out and trapped.interrupted and not trapped.restarted, trapped
        assert (await sh.run("echo two")).output == "two\n"


async def test_a_flood_of_forged_markers_neither_ends_the_command_nor_stalls_the_loop(
    workspace: Path, sh_backend: str
) -> None:
    forge = (
        "import sys; sys.stdout.write('\\x1b]133;D;0;%s\\x07' % ('0' * 16) * 20000); print('end')"
    )
    (workspace / "flood.py").write_text(forge)
    async with Sandbox(workspace, backend=sh_backend, limits=FAST) as sb:
        sh = await sb.open_shell()
        beats = 0

        async def heartbeat() -> None:
            nonlocal beats
            while True:
                await anyio.sleep(0.01)
                beats += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(heartbeat)
            began = time.monotonic()
            result = await sh.run("python3 flood.py; echo rc=$?", timeout=30)
            spent = time.monotonic() - began
            tg.cancel_scope.cancel()
        assert result.exit_code == 0 and result.output.endswith("end\nrc=0\n"), result
        assert spent < 20 and beats >= spent / 0.01 / 10, (beats, spent)  # the loop kept turning
