"""The ``sandboxrun`` inspect_ai sandbox beside inspect's own providers: what a timed-out
``exec`` leaves running, what an ``exec`` over the output limit returns, and what an ``exec``
costs. Prints one JSON line (docs/inspect.md quotes it).

Three providers, each given the same commands through inspect's ``SandboxEnvironment.exec``
contract:

* ``sandboxrun``: this project's provider on the docker backend (``sandboxrun/base:latest``);
* ``inspect_docker_exec``: inspect's docker provider needs ``docker compose`` v2 and Docker
  Engine >= 24.0.6 (``validate_prereqs``); where those are missing it cannot run, so its exec
  path is replayed exactly: a container like its auto-generated compose service (the same
  image, ``tail -f /dev/null`` under ``--init``, no network) and each command run as
  ``docker exec -i --workdir / <c> /usr/bin/timeout -k 5s <T>s CMD...`` through inspect's own
  ``subprocess()`` with the host timeout ``T + 10`` and ``output_limit`` = inspect's limit, as
  ``DockerSandboxEnvironment.exec`` does with ``docker compose exec`` (the same engine exec);
  ``docker_compose_v2`` in the output says whether the real provider could have run here;
* ``inspect_local``: inspect's ``local`` provider itself (``LocalSandboxEnvironment``).

Scenarios:

* ``timeout``: ``sleep A & setsid sleep B & (trap '' TERM; exec sleep C) & sleep D`` with
  ``timeout=2``: when ``exec`` raises ``TimeoutError``, and how many of the four sleeps are
  still alive then and 7 s later (past ``timeout -k 5s``'s KILL); the leftovers are killed
  afterwards. An ``exec`` still running 15 s after its timeout (inspect's ``local`` waits for
  the pipes the sleeps hold) has them counted (``left_while_blocked``) and killed, which lets
  it return;
* ``output``: ``seq 1 2500000`` (16.9 MiB, over the 10 MiB limit), checked as an eval does
  (``SandboxEnvironmentProxy.verify_exec_result_size``): raised or returned, how many bytes,
  whether the first and the last lines are there;
* ``exec_latency``: ``BENCH_REPEATS`` (default 20) × ``true``: p50 / p90 in ms.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

import anyio
import psutil
from _common import emit, env_int, machine, ms, percentile, quiet_logs
from inspect_ai.util import ExecResult as InspectResult
from inspect_ai.util import SandboxEnvironmentLimits
from inspect_ai.util._sandbox.events import SandboxEnvironmentProxy
from inspect_ai.util._sandbox.local import LocalSandboxEnvironment
from inspect_ai.util._subprocess import subprocess as inspect_subprocess

from sandboxrun.integrations.inspect.config import SandboxrunConfig
from sandboxrun.integrations.inspect.sandbox import SandboxrunSandboxEnvironment

IMAGE = "sandboxrun/base:latest"
TIMEOUT = 2
SEQ = 2_500_000
WATCHDOG_S = 15
Exec = Callable[..., Awaitable[InspectResult[str]]]


class DockerExecReplay:
    """inspect's docker provider's ``exec``, without compose (see the module docstring)."""

    def __init__(self) -> None:
        labels = [
            "--label",
            "sandboxrun.managed=true",
            "--label",
            "sandboxrun.bench=inspect_compare",
            "--label",
            f"sandboxrun.owner_pid={psutil.Process().pid}",
            "--label",
            f"sandboxrun.created={int(time.time())}",
        ]
        run = ["docker", "run", "-d", "--init", "--network", "none", *labels, IMAGE]
        started = subprocess.run(
            [*run, "tail", "-f", "/dev/null"], capture_output=True, text=True, check=True
        )
        self.container = started.stdout.strip()

    async def exec(
        self, cmd: list[str], input: str | None = None, timeout: int | None = None
    ) -> InspectResult[str]:
        inner = cmd if timeout is None else ["/usr/bin/timeout", "-k", "5s", f"{timeout}s", *cmd]
        result = await inspect_subprocess(
            ["docker", "exec", "-i", "--workdir", "/", self.container, *inner],
            input=input,
            timeout=None if timeout is None else timeout + 10,
            output_limit=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
        )
        if timeout is not None and result.returncode in (124, 137):
            raise TimeoutError(f"Command timed out after {timeout} seconds")
        return result

    def close(self) -> None:
        subprocess.run(["docker", "rm", "-f", self.container], capture_output=True, check=False)


ROLES = ("background", "setsid", "ignores_term", "foreground")
"""The scenario's four sleeps, in the order of their markers."""


async def left(run: Exec, marks: list[int], local: bool) -> list[str]:
    """Which of the scenario's sleeps are alive in the sandbox (on the host for local)."""
    wanted = {str(m): role for m, role in zip(marks, ROLES, strict=True)}
    found: list[str] = []
    if local:
        for proc in psutil.process_iter(["cmdline", "status"]):
            with suppress(psutil.Error):
                line = proc.info["cmdline"] or []
                if proc.info["status"] != psutil.STATUS_ZOMBIE and line[:1] == ["sleep"]:
                    found += [wanted[word] for word in line[1:] if word in wanted]
    else:
        listed = await run(["ps", "-eo", "args"])
        for line in listed.stdout.splitlines():
            words = line.split()
            if words[:1] == ["sleep"] and words[-1] in wanted:
                found.append(wanted[words[-1]])
    return sorted(found, key=ROLES.index)


def kill_local(marks: list[int]) -> None:
    wanted = {str(m) for m in marks}
    for proc in psutil.process_iter(["cmdline"]):
        with suppress(psutil.Error):
            line = proc.info["cmdline"] or []
            if line[:1] == ["sleep"] and set(line[1:]) & wanted:
                proc.kill()


async def timeout_scenario(run: Exec, *, local: bool) -> dict[str, Any]:
    base = random.randint(4000, 9000)  # noqa: S311 - a marker, not a secret
    marks = [base, base + 1, base + 2, base + 3]
    script = (
        f"sleep {marks[0]} & setsid sleep {marks[1]} & "
        f"(trap '' TERM; exec sleep {marks[2]}) & sleep {marks[3]}"
    )
    blocked: dict[str, list[str]] = {}

    async def watchdog() -> None:
        """An exec still running WATCHDOG_S after its timeout: count the sleeps, kill them."""
        await anyio.sleep(TIMEOUT + WATCHDOG_S)
        blocked["left_while_blocked"] = await left(run, marks, local)
        if local:
            kill_local(marks)

    started = time.monotonic()
    raised = None
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(watchdog)
        try:
            await run(["sh", "-c", script], timeout=TIMEOUT)
        except TimeoutError as exc:
            raised = type(exc).__name__
        tasks.cancel_scope.cancel()
    returned = time.monotonic() - started
    at_return = await left(run, marks, local)
    await anyio.sleep(7)
    later = await left(run, marks, local)
    if local:
        kill_local(marks)
    return {
        "raised": raised,
        "returned_after_s": round(returned, 2),
        "returned_only_once_the_leftovers_were_killed": bool(blocked),
        **blocked,
        "left_at_return": at_return,
        "left_after_7s": later,
        "of": len(marks),
    }


async def output_scenario(run: Exec) -> dict[str, Any]:
    try:
        result = await run(["seq", "1", str(SEQ)])
        SandboxEnvironmentProxy.verify_exec_result_size(result)  # what an eval's proxy does
    except Exception as exc:
        kept = getattr(exc, "truncated_output", None) or ""
        return {
            "raised": type(exc).__name__,
            "kept_bytes": len(kept.encode()),
            "first_line_kept": kept.startswith("1\n"),
            "last_line_kept": kept.endswith(f"\n{SEQ}\n"),
            "says_what_was_cut": "bytes omitted" in kept,
        }
    return {
        "raised": None,
        "returned_bytes": len(result.stdout.encode()),
        "first_line_kept": result.stdout.startswith("1\n"),
        "last_line_kept": result.stdout.endswith(f"\n{SEQ}\n"),
        "says_what_was_cut": False,
    }


async def latency(run: Exec, repeats: int) -> dict[str, float]:
    await run(["true"])
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        await run(["true"])
        samples.append(time.perf_counter() - started)
    return {"p50_ms": ms(percentile(samples, 50)), "p90_ms": ms(percentile(samples, 90))}


async def measure(run: Exec, *, local: bool, repeats: int) -> dict[str, Any]:
    return {
        "timeout": await timeout_scenario(run, local=local),
        "output": await output_scenario(run),
        "exec_latency": await latency(run, repeats),
    }


def compose_v2() -> bool:
    found = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, check=False
    )
    return found.returncode == 0


async def main() -> None:
    quiet_logs()
    repeats = env_int("BENCH_REPEATS", 20)
    results: dict[str, Any] = {}

    env = await SandboxrunSandboxEnvironment.open(SandboxrunConfig())
    try:
        results["sandboxrun"] = await measure(env.exec, local=False, repeats=repeats)
    finally:
        await env.close()

    replay = DockerExecReplay()
    try:
        results["inspect_docker_exec"] = await measure(replay.exec, local=False, repeats=repeats)
    finally:
        replay.close()

    local = LocalSandboxEnvironment()
    try:
        results["inspect_local"] = await measure(local.exec, local=True, repeats=repeats)
    finally:
        shutil.rmtree(local.directory.name, ignore_errors=True)

    server = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    emit(
        {
            "bench": "inspect_compare",
            "providers": results,
            "docker_compose_v2": compose_v2(),
            "docker_engine": server,
            "exec_output_limit_bytes": SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    anyio.run(main)
