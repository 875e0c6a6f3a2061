"""The sandbox's supervisor against hostile commands and hostile requests, on every backend
(issue 17): a command that stops it, a request whose error would make a huge frame, a file
name of a megabyte, and a host out of file descriptors. One bad call never ends a neighbour,
no call waits on the supervisor without a deadline, and nothing is left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from conformance_helpers import assert_container_clean
from helpers import processes_with_arg, wait_until

from sandboxrun import Limits, Sandbox
from sandboxrun.errors import SandboxrunError as SandboxError

pytestmark = pytest.mark.anyio

FAST = Limits(grace_s=0.5, drain_s=0.5)

FIND_SUPERVISOR = (
    "ours() { tr '\\0' ' ' < /proc/$1/cmdline "
    "| grep -q -e 'import runner' -e 'supervisor/runner.py'; }; "
    'p=$$; found=; while [ "$p" -gt 1 ]; do '
    "p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2); "
    "if ours $p; then found=$p; break; fi; done; "
    '[ -z "$found" ] && ours 1 && found=1; '
    'if [ -n "$found" ]; then p=$found; ACTION && echo hit $p; fi; '
)
"""Act on the command's supervisor: the nearest ancestor whose command line is the
supervisor's (docker's boot code imports ``runner``; the local backends run
``supervisor/runner.py``),
else PID 1 when it is (systemd-scope's holder: a run joins its namespaces from outside, so
its parent is not in them). Never another sandbox's."""


def supervisor_of(sb: Sandbox) -> int | None:
    """The host pid of the sandbox's supervisor (docker's in-container runner, process-group's
    runner, systemd-scope's namespace holder)."""
    backend: Any = sb.backend
    if backend.name == "docker":
        return cast(int | None, backend.session.supervisor_pid)
    client = backend._client if backend.name == "process-group" else backend._holder
    return None if client is None else cast(int | None, client.pid)


def signal_supervisor(sig: str) -> str:
    # found is what counts: the kernel or Landlock's signal scope may refuse the signal itself
    action = f"{{ kill -{sig} $p || echo refused; }}"
    return FIND_SUPERVISOR.replace("ACTION", action) + f"kill -{sig} 1 2>/dev/null; "


STARVE = {
    "nofile": "import resource as r, sys; r.prlimit(int(sys.argv[1]), r.RLIMIT_NOFILE, (8, 8))",
    "nproc": "import resource as r, sys; r.prlimit(int(sys.argv[1]), r.RLIMIT_NPROC, (1, 1))",
    "nice": "import os, sys; os.setpriority(os.PRIO_PROCESS, int(sys.argv[1]), 19)",
}


@pytest.mark.parametrize("how", sorted(STARVE))
async def test_a_command_that_starves_its_supervisor_loses_only_its_sandbox(
    workspace: Path, backend: str, how: str
) -> None:
    """``prlimit`` and ``setpriority`` need only the same uid, PID 1 or not, and cannot be
    undone without privilege: the next call sees the change (from the host, in ``/proc``),
    and gets a fresh sandbox; nothing of the old one is left."""
    tok = "7315.25"
    action = f"python3 -c '{STARVE[how]}' $p"
    script = FIND_SUPERVISOR.replace("ACTION", action) + f"(sleep {tok} &) ; echo done"
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        first = supervisor_of(sb)
        with anyio.fail_after(60):
            hit = await sb.exec(shell=script, timeout=10)
            read = await _files_bounded(sb)
            after = await sb.exec(["echo", "fresh"])
            again = await sb.read_file("hello.txt")
            job = await sb.start(["sh", "-c", "echo job"])
            done = await job.wait()
        replaced = supervisor_of(sb)
        await assert_container_clean(sb)
    assert "hit" in hit.stdout, hit  # it found its supervisor and changed it
    assert first is not None and replaced is not None and replaced != first, "not replaced"
    assert hit.status in ("completed", "sandbox_error"), hit
    assert read == b"hello\n" or isinstance(read, SandboxError)
    assert after.status == "completed" and after.stdout == "fresh\n", after
    assert again == b"hello\n"
    assert done.status == "completed" and done.stdout == "job\n", done
    assert wait_until(lambda: not processes_with_arg(tok), 5), "the command outlived its run"


async def _files_bounded(sb: Sandbox) -> bytes | SandboxError:
    """A files call on a sandbox whose supervisor may be stopped: it answers or raises."""
    try:
        return await sb.read_file("hello.txt")
    except SandboxError as exc:
        return exc


@pytest.mark.parametrize("sig", ["STOP", "TSTP"])
async def test_a_command_cannot_freeze_its_sandbox(workspace: Path, backend: str, sig: str) -> None:
    """The command finds its supervisor and signals it; the supervisor is its sandbox's PID 1
    on every backend (docker's container, the local backends' namespaces), so the signal
    never arrives: the exec ends by its own timeout, files calls answer at once, the same
    supervisor serves the next exec, and nothing of the command is left. (Where it is not
    PID 1 and a stop does arrive: ``test_a_stopped_supervisor_that_is_not_pid_1_is_replaced``
    and the docker ENTRYPOINT tests.)"""
    tok = "7313.25"
    script = signal_supervisor(sig) + f"echo sent; sleep {tok}"
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        first = supervisor_of(sb)
        began = time.monotonic()
        with anyio.fail_after(30):
            hit = await sb.exec(shell=script, timeout=3)
        took = time.monotonic() - began
        began = time.monotonic()
        with anyio.fail_after(30):
            read = await _files_bounded(sb)
        read_took = time.monotonic() - began
        with anyio.fail_after(30):
            after = await sb.exec(["echo", "fresh"])
            again = await sb.read_file("hello.txt")
        same = supervisor_of(sb)
        await assert_container_clean(sb)
    assert "hit" in hit.stdout, hit  # it found its supervisor and signalled it
    assert hit.status == "timed_out", hit
    assert took < 3 + 0.5 + 5, f"the exec took {took:.1f} s"
    assert read == b"hello\n" and read_took < 5, (read, read_took)
    assert after.status == "completed" and after.stdout == "fresh\n", after
    assert again == b"hello\n"
    assert first is not None and same == first, "the supervisor was replaced"
    assert wait_until(lambda: not processes_with_arg(tok), 5), "the command outlived its run"


async def test_a_huge_spawn_error_is_that_spawns_alone(workspace: Path, backend: str) -> None:
    """A 1.2 MB argv[0] (its error quotes it): a ``spawn_error`` with a bounded message; a
    job running meanwhile completes untouched and the sandbox goes on."""
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        job = await sb.start(["sh", "-c", "sleep 1.5; echo neighbour"])
        with anyio.fail_after(30):
            bad = await sb.exec(["/x" * 600_000])
            done = await job.wait()
            after = await sb.exec(["echo", "fine"])
        await assert_container_clean(sb)
    assert bad.status == "spawn_error", bad
    assert bad.exit_code in (126, 127)
    assert bad.error is not None and len(bad.error) < 4096
    assert done.status == "completed" and done.stdout == "neighbour\n", done
    assert after.status == "completed" and after.stdout == "fine\n"


async def test_a_megabyte_file_name_fails_that_call_alone(workspace: Path, backend: str) -> None:
    async with Sandbox(workspace, backend=backend, limits=FAST) as sb:
        job = await sb.start(["sh", "-c", "sleep 1; echo neighbour"])
        with anyio.fail_after(30):
            with pytest.raises(SandboxError) as caught:
                await sb.read_file("n" * 1_000_000)
            with pytest.raises(SandboxError):
                await sb.write_file("/tmp/" + "m" * 1_000_000, b"x")
            done = await job.wait()
            listing = await sb.list_dir(".")
        await assert_container_clean(sb)
    assert len(str(caught.value)) < 4096, "the error quotes the whole name"
    assert done.status == "completed" and done.stdout == "neighbour\n", done
    assert "hello.txt" in {e.name for e in listing}


FD_SCRIPT = textwrap.dedent(
    """
    import json, os, resource, sys
    import anyio
    from sandboxrun import Sandbox, Limits
    from sandboxrun.errors import SandboxrunError as SandboxError

    def outcome(call):
        async def run():
            try:
                value = await call()
            except (OSError, SandboxError) as exc:
                return {"raised": type(exc).__name__, "errno": getattr(exc, "errno", None),
                        "text": str(exc)}
            return {"value": repr(getattr(value, "status", value))[:200]}
        return run

    async def main():
        ws, backend = sys.argv[1], sys.argv[2]
        async with Sandbox(ws, backend=backend, limits=Limits(grace_s=0.5)) as sb:
            job = await sb.start(["sh", "-c", "echo up; sleep 2; echo neighbour"])
            while job.read().data != b"up\\n":  # it runs: its spawn is behind it
                await anyio.sleep(0.02)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
            held = []
            try:
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                pass
            report = {}
            await anyio.sleep(1)  # the job's waiter probes the supervisor meanwhile
            report["read_file"] = await outcome(lambda: sb.read_file("hello.txt"))()
            report["exec"] = await outcome(lambda: sb.exec(["echo", "x"]))()
            job2 = await sb.start(["echo", "x"])  # returns at once: its result says why
            failed = await job2.wait()  # its task runs while the fds are still held
            report["start"] = {"status": failed.status, "text": failed.error or ""}
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            done = await job.wait()
            report["job"] = [done.status, done.stdout]
            report["after_read"] = await outcome(lambda: sb.read_file("hello.txt"))()
            after = await sb.exec(["echo", "after"])
            report["after_exec"] = [after.status, after.stdout]
        print(json.dumps(report))

    anyio.run(main)
    """
)


def test_a_host_out_of_fds_fails_each_call_alone(workspace: Path, backend: str) -> None:
    """With this process at its fd limit, ``read_file``, ``exec`` and ``start`` each fail
    with a clear error of their own; a running job is untouched; once fds are freed the
    next calls succeed."""
    proc = subprocess.run(
        [sys.executable, "-c", FD_SCRIPT, str(workspace), backend],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    for call in ("read_file", "exec"):
        got = report[call]
        assert "raised" in got, f"{call} did not fail at the fd limit: {got}"
        assert got["errno"] == 24 and "too many open files" in got["text"].lower(), got
    start = report["start"]  # a job's start returns at once; the job's result says why
    assert start["status"] == "sandbox_error", start
    assert "too many open files" in start["text"].lower(), start
    assert report["job"] == ["completed", "up\nneighbour\n"], report
    assert report["after_read"] == {"value": repr(b"hello\n")}, report
    assert report["after_exec"] == ["completed", "after\n"], report


@pytest.mark.parametrize("sig", ["STOP", "TSTP"])
async def test_a_stopped_supervisor_that_is_not_pid_1_is_replaced(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, sig: str
) -> None:
    """Without bubblewrap (``--allow-degraded``) the process-group runner is no namespace's
    init, and a command can stop it: the host sees it stopped (``/proc``), kills it and what
    it ran, the exec is a ``sandbox_error`` that says so, and the next call gets a fresh one."""
    from sandboxrun.backends.local.isolation import probe_host

    monkeypatch.setenv("SANDBOXRUN_BWRAP", "")
    probe_host.cache_clear()  # cached for the process: probed again without bubblewrap
    try:
        await _stop_an_unprotected_runner(workspace, sig)
    finally:
        probe_host.cache_clear()


async def _stop_an_unprotected_runner(workspace: Path, sig: str) -> None:
    from sandboxrun import Policy

    tok = "7314.25"
    script = signal_supervisor(sig) + f"echo sent; sleep {tok}"
    policy = Policy(allow_degraded=True)
    async with Sandbox(workspace, backend="process-group", policy=policy, limits=FAST) as sb:
        watched = sb.backend._client._watch_pid  # type: ignore[attr-defined]
        began = time.monotonic()
        with anyio.fail_after(30):
            hit = await sb.exec(shell=script, timeout=4)
        took = time.monotonic() - began
        began = time.monotonic()
        with anyio.fail_after(30):
            read = await _files_bounded(sb)
        read_took = time.monotonic() - began
        with anyio.fail_after(30):
            after = await sb.exec(["echo", "fresh"])
            again = await sb.read_file("hello.txt")
    assert "hit" in hit.stdout  # it found the runner
    if sig == "STOP":  # cannot be ignored: seen from the host, which replaces the runner
        assert hit.status == "sandbox_error", (hit.stdout, watched)
        assert hit.error is not None and "supervisor was stopped" in hit.error, hit.error
        assert took < 3, f"a stopped runner was noticed only after {took:.1f} s"
    else:  # ignored by the runner: the command's own timeout ends it
        assert hit.status == "timed_out", hit
        assert took < 4 + 0.5 + 2
    assert read_took < 5
    assert read == b"hello\n" or isinstance(read, SandboxError)
    assert after.status == "completed" and after.stdout == "fresh\n", after
    assert again == b"hello\n"
    assert wait_until(lambda: not processes_with_arg(tok), 5), "the command outlived its run"
