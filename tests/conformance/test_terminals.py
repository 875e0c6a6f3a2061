"""Terminals (``Sandbox.open_terminal``) on every backend, driven the way hostile programs and
careless agents drive them: programs that ignore ^C, steal the foreground, turn ISIG off, flood
the terminal, never read their input, exit with a megabyte pending, leave ``setsid`` and
``setpgid`` children behind; escape sequences aimed at the reader; 1,000 open/close cycles.
Real terminals made inside the sandbox, no mocks. Every test checks that nothing is left."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path

import anyio
import psutil
import pytest
from conformance_helpers import assert_container_clean
from helpers import wait_until

from sandboxrun import ConfigError, Limits, Sandbox, Terminal

pytestmark = pytest.mark.anyio

FAST = Limits(grace_s=0.5, drain_s=0.5)
PROMPT = r"[$#] $"


def transcript_end(term: Terminal) -> int:
    """The offset past the last byte of ``term``'s transcript so far."""
    offset = 0
    while chunk := term.read(offset, 1 << 20).data:
        offset += len(chunk)
    return offset


def via_of(backend: str) -> str:
    """How ``backend`` starts a terminal here (``tty_backend``: docker both ways)."""
    if backend == "systemd-scope":
        return "scope"
    if backend == "docker" and os.environ.get("SANDBOXRUN_DOCKER_SUPERVISOR") == "0":
        return "engine"
    return "supervisor"


def mentioning(tok: str) -> list[psutil.Process]:
    """Live processes with ``tok`` in an argument (a ``python3 -c`` script has it inside)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and any(tok in a for a in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            pass
    return found


def alive(tok: str) -> bool:
    return bool(mentioning(tok))


def gone(tok: str) -> bool:
    return not mentioning(tok)


def token() -> str:
    return f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"


async def shell(sb: Sandbox, **options: object) -> tuple[Terminal, int]:
    """An interactive shell at its first prompt, and the offset after that prompt."""
    term = await sb.open_terminal(
        ["bash", "--norc", "--noprofile", "-i"],
        env={"PS1": "$ "},
        **options,  # type: ignore[arg-type]
    )
    assert not term.done, term.result
    seen = await term.wait_output(pattern=PROMPT, timeout=20)
    assert seen.reason == "pattern", seen
    return term, seen.output.next_offset


async def run_line(term: Terminal, after: int, line: str, until: str, timeout: float = 20) -> int:
    """Type ``line`` and wait for ``until`` in the text from ``after``; the offset past it."""
    await term.write(line + "\r")
    seen = await term.wait_output(after, pattern=until, timeout=timeout)
    assert seen.reason == "pattern", (line, seen)
    return seen.output.next_offset


async def answers(term: Terminal, after: int) -> int:
    """The shell is at its prompt and runs a command: it was left usable."""
    word = f"alive{random.randint(100000, 999999)}"
    return await run_line(term, after, f"echo {word[:5]}''{word[5:]}", f"{word}\r?\n")


async def assert_gone(sb: Sandbox, *tokens: str) -> None:
    for tok in tokens:
        assert wait_until(partial(gone, tok), 5), f"{tok} survived"
    await assert_container_clean(sb)


async def test_a_shell_runs_commands_at_the_size_asked_and_follows_resizes(
    workspace: Path, tty_backend: str
) -> None:
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term, at = await shell(sb, rows=33, cols=101)
        assert term.pid is not None and term.size == (33, 101)
        at = await run_line(term, at, "stty size; tty", r"33 101\r?\n/dev/pts/\d+")
        await term.resize(40, 132)
        at = await run_line(term, at, "stty size", r"40 132\r?\n\$ $")
        fg = term.foreground()
        assert fg is not None and fg.is_leader and fg.pgid == term.pid
        await term.write("exit 7\r")
        result = await term.wait(20)
    assert result.status == "failed" and result.exit_code == 7, result
    assert result.tty and result.via == via_of(tty_backend) and result.survivors == 0
    assert "40 132" in result.stdout and result.stderr == ""


async def test_a_resize_storm_ends_at_the_last_size(workspace: Path, tty_backend: str) -> None:
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term, at = await shell(sb)
        fds = len(os.listdir("/proc/self/fd"))
        for i in range(10_000):
            await term.resize(10 + i % 50, 20 + i % 90)
        await term.resize(33, 99)
        assert len(os.listdir("/proc/self/fd")) <= fds
        await run_line(term, at, "stty size", r"33 99")
        await term.close()


async def test_a_program_ignoring_sigint_is_killed_by_interrupt_and_the_shell_answers(
    workspace: Path, tty_backend: str
) -> None:
    tok = token()
    program = (
        "python3 -c 'import signal,time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        f'print("ign" "ored", flush=True); time.sleep({tok})\''
    )
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term, at = await shell(sb)
        at = await run_line(term, at, program, r"ignored")
        assert wait_until(lambda: bool(mentioning(tok)), 5)
        fg = term.foreground()
        assert fg is not None and not fg.is_leader and fg.comm.startswith("python")
        assert await term.interrupt(grace=2.0) == "killed"
        assert wait_until(lambda: not mentioning(tok), 2)
        at = await run_line(term, at, "echo rc=$?", r"rc=137")
        at = await answers(term, at)
        with anyio.fail_after(5):
            while (fg := term.foreground()) is None or not fg.is_leader:
                await anyio.sleep(0.01)
        assert fg is not None and fg.is_leader
        await term.close()
        await assert_gone(sb, tok)


STEAL = """
import os, signal, sys, time
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setpgid(0, 0)
    os.tcsetpgrp(0, os.getpgrp())
    print("stolen", flush=True)
    time.sleep(float(sys.argv[1]))
    os._exit(0)
os.waitpid(pid, 0)
"""


async def test_a_program_that_takes_the_foreground_is_named_and_ended(
    workspace: Path, tty_backend: str
) -> None:
    tok = token()
    await anyio.Path(workspace / "steal.py").write_text(STEAL)
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term, at = await shell(sb)
        at = await run_line(term, at, f"python3 steal.py {tok}", r"stolen")
        fg = term.foreground()
        assert fg is not None and not fg.is_leader and len(fg.pids) == 1
        thief = fg.pids[0]
        assert any(tok in part for part in _cmdline(thief)), _cmdline(thief)
        assert await term.interrupt(grace=2.0) == "killed"
        await answers(term, at)
        await term.close()
        await assert_gone(sb, tok)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


async def test_ctrl_c_right_after_a_command_starts_is_never_lost(
    workspace: Path, tty_backend: str
) -> None:
    """^C sent within a millisecond of the foreground changing, before the job's program has
    even run: a single byte is lost there now and then; ``interrupt`` never is (100 tries)."""
    tok = token()
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term, at = await shell(sb)
        outcomes: dict[str, int] = {}
        for _ in range(100):
            await term.write(f"sleep {tok}\r")
            with anyio.fail_after(10):
                while (fg := term.foreground()) is not None and fg.is_leader:
                    await anyio.sleep(0)
            outcome = await term.interrupt(grace=2.0)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            assert outcome in ("interrupted", "killed"), outcomes
            with anyio.fail_after(5):
                while (fg := term.foreground()) is None or not fg.is_leader:
                    await anyio.sleep(0.001)
        assert wait_until(lambda: not mentioning(tok), 2), "a sleep outlived its ^C"
        await answers(term, at)
        await term.close()
        await assert_gone(sb, tok)


async def test_raw_mode_without_isig_still_gets_the_terminals_sigint(
    workspace: Path, tty_backend: str
) -> None:
    tok = token()
    program = (
        'python3 -c \'import tty,time; tty.setraw(0); print("RAW" "-ON", flush=True); '
        f"time.sleep({tok})'"
    )
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term, at = await shell(sb)
        at = await run_line(term, at, program, r"RAW-ON")
        await term.write(b"\x03")  # ISIG is off: plain data now
        await anyio.sleep(0.3)
        assert mentioning(tok), "the 0x03 byte acted as ^C in raw mode"
        assert await term.signal("INT") is True  # TIOCSIG: the terminal's own SIGINT
        assert wait_until(lambda: not mentioning(tok), 5)
        await term.write("stty sane\r")
        await answers(term, at)
        await term.close()


async def test_a_flood_keeps_the_log_bounded_and_the_sandbox_responsive(
    workspace: Path, tty_backend: str
) -> None:
    limits = Limits(grace_s=0.5, drain_s=0.5, max_output=64 * 1024, spill_max=1 << 20)
    async with Sandbox(workspace, backend=tty_backend, limits=limits) as sb:
        term = await sb.open_terminal(["yes", "flood"])
        await anyio.sleep(1.0)
        slowest = 0.0
        for _ in range(5):
            began = time.monotonic()
            beside = await sb.exec(["true"])
            slowest = max(slowest, time.monotonic() - began)
            assert beside.status == "completed", beside
            await anyio.sleep(0.5)
        assert slowest < 2.0, f"an exec beside the flood took {slowest:.3f} s"
        head = term.read(0)
        assert head.lossy and head.offset > 0  # the oldest bytes were let go
        began = time.monotonic()
        result = await term.close()
        assert time.monotonic() - began < limits.grace_s + 3
    assert result.status == "cancelled" and result.tty
    assert result.stdout_total_bytes > 4 * (1 << 20)
    assert len(result.stdout.encode()) <= 64 * 1024 + 64  # and the omission marker
    assert result.stdout_dropped_bytes > 0 and result.survivors == 0


async def test_input_a_program_never_reads_times_out_and_nothing_hangs(
    workspace: Path, tty_backend: str
) -> None:
    tok = token()
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term = await sb.open_terminal(["sleep", tok])
        with anyio.fail_after(10), pytest.raises(TimeoutError, match="does not read"):
            await term.write(b"y\n" * (1 << 19), timeout=1.0)
        with anyio.fail_after(10):
            result = await term.close()
        assert result.status == "cancelled"
        with pytest.raises(BrokenPipeError):
            await term.write(b"late")
        await assert_gone(sb, tok)


async def test_exit_with_a_megabyte_pending_drains_every_byte(
    workspace: Path, tty_backend: str
) -> None:
    program = (
        "import sys; sys.stdout.write('x' * 1000000 + '\\nbye\\n'); sys.stdout.flush(); sys.exit(3)"
    )
    limits = Limits(grace_s=0.5, drain_s=0.5, max_output=4 << 20)
    async with Sandbox(workspace, backend=tty_backend, limits=limits) as sb:
        term = await sb.open_terminal(["python3", "-c", program])
        result = await term.wait(30)
    assert result.exit_code == 3, result
    assert result.stdout.count("x") == 1_000_000
    assert result.stdout.endswith("bye\r\n")


async def test_wait_returns_on_the_leaders_exit_though_a_disowned_child_holds_the_terminal(
    workspace: Path, tty_backend: str
) -> None:
    tok = token()
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term = await sb.open_terminal(
            ["sh", "-c", f"trap '' HUP; (trap '' HUP; sleep {tok}) & echo started; exit 0"]
        )
        with anyio.fail_after(15):
            result = await term.wait()
        assert result.exit_code == 0 and "started" in result.stdout, result
        assert result.survivors == 0
        await assert_gone(sb, tok)


async def test_close_ends_setsid_setpgid_and_job_children(
    workspace: Path, tty_backend: str
) -> None:
    toks = [token() for _ in range(4)]
    lines = [
        f"setsid sleep {toks[0]} &",
        f"python3 -c 'import os,time; os.setpgid(0,0); time.sleep({toks[1]})' &",
        f"sleep {toks[2]} &",
        f"(trap '' HUP TERM; exec sleep {toks[3]}) &",
    ]
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term, at = await shell(sb)
        for line in lines:
            at = await run_line(term, at, line, PROMPT)
        for tok in toks:
            assert wait_until(partial(alive, tok), 5), tok
        with anyio.fail_after(15):
            result = await term.close()
        assert result.status == "cancelled" and result.survivors == 0, result
        assert result.error is not None and "close()" in result.error
        await assert_gone(sb, *toks)


async def test_aclose_with_sixteen_terminals_open_leaves_nothing(
    workspace: Path, tty_backend: str
) -> None:
    toks = [token() for _ in range(16)]
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        terms = []
        for tok in toks:
            term, at = await shell(sb)
            await run_line(term, at, f"setsid sleep {tok} & sleep {tok}x", rf"sleep {tok}x")
            terms.append(term)
        with pytest.raises(ConfigError, match="max_terminals"):
            await sb.open_terminal()
        for tok in toks:
            assert wait_until(partial(alive, tok), 5), tok
        began = time.monotonic()
    assert time.monotonic() - began < 15
    assert all(t.done and t.result is not None and t.result.status == "cancelled" for t in terms)
    for tok in toks:
        assert wait_until(partial(gone, tok), 5), tok


OWNER = """
import anyio, sys
from sandboxrun import Sandbox, Limits
async def main():
    async with Sandbox(sys.argv[1], backend=sys.argv[2], limits=Limits(grace_s=30)) as sb:
        for i in range(3):
            term = await sb.open_terminal(["sh", "-c",
                f"trap '' TERM HUP; setsid sleep {sys.argv[3]} & exec sleep {sys.argv[3]}"])
        print("ready", flush=True)
        await anyio.sleep(600)
anyio.run(main)
"""


def test_the_owner_sigkilled_with_terminals_open_leaves_nothing(
    workspace: Path, tty_backend: str
) -> None:
    tok = token()
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(OWNER), str(workspace), tty_backend, tok],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        assert wait_until(lambda: len(mentioning(tok)) >= 6, 10)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    assert wait_until(lambda: not mentioning(tok), 5), "a terminal outlived its owner"
    if tty_backend == "docker":
        from sandboxrun.backends.docker import api as dockerapi

        engine = dockerapi.connect(10)
        try:

            def left() -> int:
                label = f"sandboxrun.owner_pid={owner.pid}"
                return len(
                    engine.containers.list(all=True, ignore_removed=True, filters={"label": label})
                )

            assert wait_until(lambda: not left(), 5), "the container outlived its owner"
        finally:
            engine.close()


async def test_text_shows_no_escape_sequence_the_program_printed(
    workspace: Path, tty_backend: str
) -> None:
    script = (
        r"printf '\033]52;c;SGVsbG8=\007\033]0;title\007\033P+q544e\033\\\302\23331mX"
        r"\033[6n\302\235evil\302\234ok caf\303\251\n'"
    )
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term = await sb.open_terminal(["sh", "-c", script])
        result = await term.wait(20)
        raw = term.read(0).data
        text = term.text(0).text
    assert b"\x1b]52" in raw  # the transcript is exact
    assert text == "Xok caf\u00e9\n", repr(text)
    assert result.stdout.count("\x1b") >= 3  # the result's stdout is the transcript, exact


async def test_a_thousand_open_close_cycles_leak_no_fd_and_no_process(
    workspace: Path, tty_backend: str
) -> None:
    cycles = 1000 if tty_backend == "process-group" else 200
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        await (await sb.open_terminal(["true"])).wait(10)  # warm: the login snapshot taken
        for _ in range(20):  # and the engine client's connection pool filled (engine path)
            await (await sb.open_terminal(["cat"])).close()
        fds = len(os.listdir("/proc/self/fd"))
        children = len(_children())
        for i in range(cycles):
            term = await sb.open_terminal(["cat"])
            if i % 2:
                await term.write(b"x\r")
            result = await term.close()
            assert result.status in ("cancelled", "failed"), result
            assert result.survivors == 0
        assert len(os.listdir("/proc/self/fd")) <= fds
        assert len(_children()) <= children
        assert len(sb.terminals()) <= sb.max_ended_jobs + 1
        await assert_container_clean(sb)


def _children() -> list[int]:
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rfind(b")") + 2 :].split()[1]) == me:
                found.append(int(name))
    return found


async def test_a_command_that_cannot_start_gives_an_ended_terminal_saying_why(
    workspace: Path, tty_backend: str
) -> None:
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term = await sb.open_terminal(["no-such-program-here"])
        result = await term.wait(10)
    # (the engine path's start stub reports it as the command's failure: test_contract)
    status = "failed" if via_of(tty_backend) == "engine" else "spawn_error"
    assert result.status == status and result.exit_code == 127, result
    assert term.foreground() is None
    assert await term.interrupt() == "ended"


async def test_a_terminal_on_a_scope_is_made_inside_the_sandbox(
    workspace: Path, backend: str
) -> None:
    """The launcher makes the terminal after joining the sandbox's namespaces: its devpts."""
    if backend != "systemd-scope":
        pytest.skip("the systemd-scope launcher's own terminal")
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        term = await sb.open_terminal(["sh", "-c", "tty; stty size; echo $$"], rows=21, cols=77)
        result = await term.wait(20)
    assert result.exit_code == 0 and result.tty, result
    lines = result.stdout.split()
    assert lines[0].startswith("/dev/pts/") and lines[1:3] == ["21", "77"], lines


async def test_wait_output_finds_a_pattern_past_the_first_mebibyte(
    workspace: Path, tty_backend: str
) -> None:
    limits = Limits(grace_s=0.5, drain_s=0.5, max_output=8 << 20)
    program = "import sys; sys.stdout.write('z' * 1572864 + '\\nNEEDLE\\n'); sys.stdout.flush()"
    async with Sandbox(workspace, backend=tty_backend, limits=limits) as sb:
        term = await sb.open_terminal(["python3", "-c", program])
        seen = await term.wait_output(pattern=r"NEEDLE", timeout=30)
        assert seen.reason == "pattern" and seen.output.text.count("z") == 1572864, seen.reason
        await term.close()


@pytest.mark.parametrize("kind", ["wall", "idle"])
async def test_a_terminals_timeout_ends_everything_it_started(
    workspace: Path, tty_backend: str, kind: str
) -> None:
    """A terminal's own ``timeout`` (or ``idle_timeout``) ends it like an exec's: a TERM- and
    HUP-ignoring tree with a ``setsid`` child is gone, its output so far kept."""
    tok = token()
    script = f"trap '' TERM HUP; echo started; (trap '' TERM HUP; setsid sleep {tok}) & sleep {tok}"
    limit = {"timeout": 1.5} if kind == "wall" else {"idle_timeout": 1.0}
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term = await sb.open_terminal(["sh", "-c", script], **limit)  # type: ignore[arg-type]
        with anyio.fail_after(20):
            result = await term.wait()
        assert result.status == "timed_out" and result.timeout_kind == kind, result
        assert "started" in result.stdout and result.survivors == 0
        await assert_gone(sb, tok)


async def test_a_terminal_on_the_engine_path_has_its_size_before_the_command_runs(
    workspace: Path, tty_backend: str
) -> None:
    """The engine makes an exec's terminal 0x0 (moby #9098): the size is set while the start
    stub is stopped, so the command's very first look sees it."""
    if tty_backend != "docker" or os.environ.get("SANDBOXRUN_DOCKER_SUPERVISOR") != "0":
        pytest.skip("docker's engine path")
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term = await sb.open_terminal(["sh", "-c", "stty size; tty"], rows=21, cols=77)
        result = await term.wait(20)
    assert result.exit_code == 0 and result.tty and result.via == "engine", result
    lines = result.stdout.split()
    assert lines[0:2] == ["21", "77"] and lines[2].startswith("/dev/pts/"), lines


async def test_the_engine_path_without_a_run_cgroup_refuses_a_terminal_and_says_why(
    workspace: Path, tty_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where this host may not give each exec a cgroup (not root, a remote engine), the
    engine path could neither reach the terminal nor kill what it started: refused, named."""
    if tty_backend != "docker" or os.environ.get("SANDBOXRUN_DOCKER_SUPERVISOR") != "0":
        pytest.skip("docker's engine path")
    from sandboxrun.backends.docker import cgroup as docker_cgroup

    monkeypatch.setattr(docker_cgroup, "unified_dir", lambda *_: None)
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        with pytest.raises(ConfigError, match=r"engine path.*cgroup"):
            await sb.open_terminal(["sh"])
        assert (await sb.exec(["true"])).exit_code == 0  # the sandbox goes on
        assert sb.terminals() == []


async def test_screen_shows_what_a_full_screen_program_drew_and_follows_a_resize(
    workspace: Path, tty_backend: str
) -> None:
    """``screen()`` renders the transcript as the terminal shows it: cursor addressing and
    clears applied, the rows at the size in force when they were drawn."""
    script = (
        'trap \'printf "\\033[2J\\033[H%s" "$(stty size)"\' WINCH; '
        "printf '\\033[2J\\033[Htop line\\033[10;5Hbottom'; while :; do sleep 0.05; done"
    )
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term = await sb.open_terminal(["bash", "-c", script], rows=12, cols=40)
        assert (await term.wait_output(pattern="bottom", timeout=20)).reason == "pattern"
        screen = term.screen()
        assert len(screen.rows) == 12 and {len(r) for r in screen.rows} == {40}, screen
        assert screen.rows[0].rstrip() == "top line" and screen.rows[9][4:10] == "bottom"
        assert screen.cursor == (9, 10)
        await term.resize(6, 20)
        assert (await term.wait_output(pattern="6 20", timeout=20)).reason == "pattern"
        screen = term.screen()
        assert screen.text == "6 20" and len(screen.rows) == 6 and len(screen.rows[0]) == 20
        await term.close()


CURSES_PAGE = (
    "import curses\n"
    "def page(win):\n"
    "    win.addstr(5, 10, 'curses page')\n"
    "    win.refresh()\n"
    "    win.getch()\n"
    "curses.wrapper(page)\n"
)


async def test_screen_shows_a_curses_page_while_it_runs_and_the_shell_once_it_quits(
    workspace: Path, tty_backend: str
) -> None:
    """A real full-screen program: curses draws on the alternate screen (terminfo's smcup);
    once it quits (rmcup) the shell's screen is back, the lines typed before it and the
    prompt, nothing of its page left."""
    async with Sandbox(workspace, backend=tty_backend, limits=FAST) as sb:
        term, at = await shell(sb, rows=24, cols=100)
        at = await run_line(term, at, "echo before-curses", r"before-curses\r?\n\$ $")
        (workspace / "page.py").write_text(CURSES_PAGE)
        await term.write("python3 page.py\r")
        seen = await term.wait_output(at, pattern=r"curses page", timeout=20)
        assert seen.reason == "pattern", seen
        shown = term.screen()
        assert shown.rows[5][10:21] == "curses page", shown.rows
        assert "before-curses" not in shown.text, shown.rows
        await term.write("q")
        seen = await term.wait_output(seen.output.next_offset, pattern=r"\$ $", timeout=20)
        assert seen.reason == "pattern", seen
        back = term.screen()
        assert "before-curses" in back.text and "curses page" not in back.text, back.rows
        assert back.rows[back.cursor[0]].rstrip() == "$", back
        await term.close()


async def test_screen_after_a_flood_draws_from_the_transcripts_end(
    workspace: Path, tty_backend: str
) -> None:
    """Megabytes since the last look are not all replayed (pyte draws ~0.3 MB/s: the loop
    would stall): the end of the transcript draws the screen, which says it is ``lossy``."""
    program = "import sys; sys.stdout.write(('y' * 79 + '\\n') * 50000 + 'END')"
    limits = Limits(grace_s=0.5, drain_s=0.5, max_output=16 << 20)
    async with Sandbox(workspace, backend=tty_backend, limits=limits) as sb:
        term = await sb.open_terminal(["python3", "-c", program], rows=10, cols=80)
        await term.wait(30)
        shown = term.screen()
    assert shown.lossy and shown.offset == transcript_end(term) >= 4_000_000, shown
    assert shown.rows[-1].rstrip() == "END" and shown.rows[0].rstrip() == "y" * 79, shown.rows
