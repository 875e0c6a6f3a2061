"""One-call escalation on real processes: ``exec(..., escalate=hook)``, ``run(escalate=)`` and
``sandboxrun run --ask``. The denial used is a write to a read-only workspace: the approved
re-run under workspace-write writes into the test's own workspace, nowhere else."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from sandboxrun import Limits, Policy, Sandbox, run
from sandboxrun.errors import PolicyRefusedError
from sandboxrun.models import ExecResult

PY = sys.executable
CLI = [PY, "-m", "sandboxrun"]
RO = Policy(access="read-only")
WIDER = RO.model_copy(update={"access": "workspace-write"})
LIMITS = Limits(timeout_s=60, grace_s=0.5)
WRITE = "echo run >> runs.txt || exit 5"
CONNECT = "import socket; socket.create_connection(('192.0.2.1', 80), timeout=5)"


class Hook:
    """Records its calls; answers ``answer`` (sync) or awaits first (async)."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.calls: list[tuple[ExecResult, Policy]] = []

    def __call__(self, result: ExecResult, policy: Policy) -> bool:
        self.calls.append((result, policy))
        return self.answer

    async def asynchronous(self, result: ExecResult, policy: Policy) -> bool:
        await anyio.sleep(0)
        return self(result, policy)


def exec_with(ws: Path, hook: object, shell: str = WRITE, policy: Policy = RO) -> ExecResult:
    async def go() -> ExecResult:
        async with Sandbox(ws, backend="process-group", policy=policy, limits=LIMITS) as sb:
            return await sb.exec(shell=shell, escalate=hook)  # type: ignore[arg-type]

    try:
        return anyio.run(go)
    except PolicyRefusedError as exc:
        pytest.skip(f"process-group cannot confine here: {exc}")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_approval_reruns_once_under_the_proposed_policy(workspace: Path, kind: str) -> None:
    hook = Hook(True)
    result = exec_with(workspace, hook if kind == "sync" else hook.asynchronous)
    assert len(hook.calls) == 1
    denied, proposed = hook.calls[0]
    assert denied.denial is not None and denied.denial.kind == "filesystem"
    assert denied.exit_code == 5 and proposed == WIDER
    assert result.status == "completed", result.stderr
    assert result.escalated_from == RO
    assert result.run_id != denied.run_id
    assert (workspace / "runs.txt").read_text() == "run\n"  # the re-run, and only it, wrote


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_refusal_returns_the_denied_result(workspace: Path, kind: str) -> None:
    hook = Hook(False)
    result = exec_with(workspace, hook if kind == "sync" else hook.asynchronous)
    assert len(hook.calls) == 1
    assert result.exit_code == 5 and result.denial is not None
    assert result.escalated_from is None
    assert result.run_id == hook.calls[0][0].run_id
    assert not (workspace / "runs.txt").exists()


@pytest.mark.parametrize("shell", ["cat /nonexistent", "sh -c 'exit 3'", "echo fine"])
def test_hook_is_not_called_without_a_denial(workspace: Path, shell: str) -> None:
    hook = Hook(True)
    result = exec_with(workspace, hook, shell=shell, policy=Policy())
    assert hook.calls == []
    assert result.escalated_from is None


def test_hook_is_not_called_for_a_denial_no_policy_lifts(workspace: Path) -> None:
    hook = Hook(True)
    line = "cp: error writing 'big': No space left on device"
    result = exec_with(workspace, hook, shell=f'echo "{line}" >&2; exit 1', policy=Policy())
    assert result.denial is not None and result.denial.escalate_to is None
    assert hook.calls == []


def test_the_rerun_is_never_escalated_again(workspace: Path) -> None:
    """Refused twice for different reasons: the hook is still asked only once."""
    hook = Hook(True)
    result = exec_with(workspace, hook, shell=f'echo run >> runs.txt && {PY} -c "{CONNECT}"')
    assert len(hook.calls) == 1
    assert result.escalated_from == RO
    assert result.denial is not None and result.denial.kind == "network"
    assert (workspace / "runs.txt").read_text() == "run\n"


def test_a_hook_that_raises_propagates_and_nothing_reruns(workspace: Path) -> None:
    def hook(result: ExecResult, policy: Policy) -> bool:
        raise RuntimeError("no answer")

    with pytest.raises(RuntimeError, match="no answer"):
        exec_with(workspace, hook)
    assert not (workspace / "runs.txt").exists()


def test_sync_run_escalates_too(workspace: Path) -> None:
    hook = Hook(True)
    try:
        result = run(
            shell=WRITE, workspace=workspace, backend="process-group", policy=RO, escalate=hook
        )
    except PolicyRefusedError as exc:
        pytest.skip(f"process-group cannot confine here: {exc}")
    assert len(hook.calls) == 1 and result.escalated_from == RO and result.ok


# -- the CLI: --ask --------------------------------------------------------------------------

ASK = ["run", "-b", "process-group", "--policy", "read-only", "--ask", "--shell", "--", WRITE]


def skip_if_refused(rc: int, err: str) -> None:
    if rc == 125 and "cannot enforce" in err:
        pytest.skip(f"process-group cannot confine here: {err.strip()}")


def test_ask_without_a_terminal_never_prompts(workspace: Path) -> None:
    proc = subprocess.run(
        [*CLI, *ASK[:1], "-w", str(workspace), *ASK[1:]],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    skip_if_refused(proc.returncode, proc.stderr)
    assert proc.returncode == 5, proc.stderr
    assert "sandboxrun: denied: the sandbox refused a write to runs.txt" in proc.stderr
    assert "runs.txt: Read-only file system)" in proc.stderr  # (evidence)
    assert "no terminal to ask on" in proc.stderr
    assert "[y/N]" not in proc.stderr
    assert proc.stderr.count("sandboxrun: denied:") == 1
    assert not (workspace / "runs.txt").exists()


def test_text_mode_prints_the_denial_without_ask(workspace: Path) -> None:
    args = [*CLI, "run", "-w", str(workspace), *ASK[1:]]
    args.remove("--ask")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    skip_if_refused(proc.returncode, proc.stderr)
    assert proc.returncode == 5
    assert proc.stderr.count("sandboxrun: denied:") == 1
    assert "no terminal" not in proc.stderr


def test_json_never_prompts(workspace: Path) -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(
            [*CLI, "run", "-w", str(workspace), "--json", *ASK[1:]],
            stdin=slave,
            stderr=slave,
            stdout=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(slave)
        os.close(master)
    skip_if_refused(proc.returncode, "cannot enforce" if proc.returncode == 125 else "")
    assert proc.returncode == 5
    data = ExecResult.model_validate_json(proc.stdout)
    assert data.denial is not None and data.escalated_from is None


def ask_on_a_terminal(workspace: Path, answer: bytes) -> tuple[int, str]:
    """The CLI with a pty as stdin and stderr; answers the prompt once it shows."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*CLI, "run", "-w", str(workspace), *ASK[1:]],
        stdin=slave,
        stderr=slave,
        stdout=subprocess.DEVNULL,
    )
    os.close(slave)
    seen = b""
    answered = False
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the CLI closed the terminal (exited)
                    break
                if not chunk:
                    break
                seen += chunk
            if not answered and b"[y/N]" in seen:
                os.write(master, answer)
                answered = True
            if proc.poll() is not None and not ready:
                break
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
        os.close(master)
    return rc, seen.decode(errors="replace")


def test_ask_on_a_terminal_yes_reruns(workspace: Path) -> None:
    rc, screen = ask_on_a_terminal(workspace, b"y\n")
    skip_if_refused(rc, screen)
    assert "re-run with --policy workspace-write? [y/N]" in screen
    assert rc == 0, screen
    assert (workspace / "runs.txt").read_text() == "run\n"


def test_ask_on_a_terminal_no_keeps_the_denial(workspace: Path) -> None:
    rc, screen = ask_on_a_terminal(workspace, b"n\n")
    skip_if_refused(rc, screen)
    assert "[y/N]" in screen
    assert rc == 5, screen
    assert screen.count("sandboxrun: denied:") == 1
    assert not (workspace / "runs.txt").exists()
