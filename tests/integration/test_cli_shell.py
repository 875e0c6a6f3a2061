"""``sandboxrun shell`` driven through a real terminal: tmux runs it in a pane, keys are sent
with ``send-keys`` and the screen read with ``capture-pane``. The prompt comes, the size and a
resize reach ``stty size``, ^C reaches the foreground job, a full-screen program opens and
quits, the exit status is the shell's, and the user's terminal modes are restored afterwards
(also when the CLI is sent SIGTERM). Without a terminal it says so in one line (exit 125)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import require_backend

SANDBOXRUN = str(Path(sys.executable).with_name("sandboxrun"))

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (scripts/test.sh installs it)"
)


class Pane:
    """One tmux server of our own (its own socket), one window running ``command``."""

    def __init__(self, command: str, cwd: Path) -> None:
        self.socket = f"sandboxrun-test-{uuid.uuid4().hex[:8]}"
        env = dict(os.environ)
        self._tmux(
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "100",
            "-y",
            "30",
            "-c",
            str(cwd),
            command,
            env=env,
        )

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, env=env, timeout=10
        )
        return done.stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "t", *keys)

    def type(self, line: str) -> None:
        self._tmux("send-keys", "-t", "t", "-l", line)
        self._tmux("send-keys", "-t", "t", "Enter")

    def screen(self) -> str:
        return self._tmux("capture-pane", "-t", "t", "-p", "-S", "-200")

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.screen(), re.MULTILINE)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} never showed:\n{self.screen()}")
            time.sleep(0.1)

    def prompts(self) -> int:
        """How many shell prompts the pane (and its history) shows."""
        return len(re.findall(r"^sbx\$", self.screen(), re.MULTILINE))

    def wait_until(self, done: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} never showed:\n{self.screen()}")
            time.sleep(0.1)

    def resize(self, cols: int, rows: int) -> None:
        self._tmux("resize-window", "-t", "t", "-x", str(cols), "-y", str(rows))

    def pid_of_cli(self) -> int:
        shell_pid = int(self._tmux("display-message", "-t", "t", "-p", "#{pane_pid}").strip())
        children = Path(f"/proc/{shell_pid}/task/{shell_pid}/children").read_text().split()
        return int(children[0])

    def close(self) -> None:
        self._tmux("kill-server")


@pytest.fixture(params=["process-group", "docker"])
def cli_backend(request: pytest.FixtureRequest) -> str:
    return require_backend(str(request.param))


@pytest.fixture
def pane(workspace: Path, cli_backend: str) -> Iterator[Pane]:
    (workspace / "long.txt").write_text("".join(f"line {i}\n" for i in range(500)))
    script = (
        f"PS1='$ ' {SANDBOXRUN} shell -b {cli_backend} -e PS1='sbx$ ' -- bash --norc -i; "
        "echo status=$?; echo modes=$(stty -a | tr ' ;' '\\n\\n' "
        "| grep -xE -- '-?(icanon|isig|echo)' | tr '\\n' ,); sleep 600"
    )
    opened = Pane(f"sh -c {_quote(script)}", workspace)
    try:
        yield opened
    finally:
        opened.close()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def test_a_shell_through_a_real_terminal(pane: Pane, cli_backend: str) -> None:
    pane.wait_for(r"^sbx\$\s*$")
    pane.type("stty size; echo T=$TERM")
    pane.wait_for(r"^30 100$")
    pane.wait_for(r"^T=\S*256color$")  # the user's TERM
    pane.resize(120, 40)
    time.sleep(0.5)
    pane.type("stty size")
    pane.wait_for(r"^40 120$")
    pane.type("sleep 600")
    time.sleep(0.5)
    pane.keys("C-c")
    pane.wait_for(r"^\^C$")
    pane.type("echo rc=$?")
    pane.wait_for(r"^rc=130$")
    viewer = "more"  # (util-linux: in the image and on every host)
    if cli_backend == "process-group":
        viewer = next((v for v in ("vi", "less") if shutil.which(v)), viewer)
    pane.type(f"{viewer} long.txt")
    pane.wait_for(r"^line 1\b")
    prompts = pane.prompts()
    if viewer == "vi":
        pane.keys("Escape")
        pane.type(":q!")
    else:  # less and more
        pane.keys("q")
    # the next line only once the shell prompts again: a pager that is still quitting reads
    # what is typed ahead (on any terminal), which CI saw as 'osed: command not found'
    pane.wait_until(lambda: pane.prompts() > prompts, "the prompt after the viewer")
    pane.type("echo closed $((6*7))")
    pane.wait_for(r"^closed 42$")
    pane.type("exit 7")
    pane.wait_for(r"^status=7$")
    modes = pane.wait_for(r"^modes=.*$").group(0)
    assert modes == "modes=isig,icanon,echo,", modes  # restored: none of them is off


def test_sigterm_to_the_cli_ends_the_session_and_restores_the_terminal(pane: Pane) -> None:
    pane.wait_for(r"^sbx\$\s*$")
    pane.type("sleep 600")
    time.sleep(0.5)
    os.kill(pane.pid_of_cli(), signal.SIGTERM)
    pane.wait_for(r"^status=\d+$", 15)
    modes = pane.wait_for(r"^modes=.*$").group(0)
    assert modes == "modes=isig,icanon,echo,", modes


def test_without_a_terminal_it_says_so_in_one_line(workspace: Path) -> None:
    done = subprocess.run(
        [SANDBOXRUN, "shell", "-b", "process-group", "-w", str(workspace)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 125
    assert done.stderr.count("\n") == 1 and "not a TTY" in done.stderr, done.stderr
