"""``sandboxrun run``: one command in a sandbox over the workspace."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from sandboxrun.argv import quote_argv
from sandboxrun.cli import app
from sandboxrun.cli.report import (
    EXIT_SANDBOX,
    EXIT_USAGE,
    denial_line,
    exit_status,
    fail,
    say,
    summary,
    write_out,
)
from sandboxrun.env import parse_env_assignment
from sandboxrun.errors import (
    BackendError,
    InputError,
    PolicyRefusedError,
    SandboxrunError,
    SandboxUnavailableError,
)
from sandboxrun.units import parse_size

if TYPE_CHECKING:
    from sandboxrun.models import ExecResult, Policy
    from sandboxrun.sandbox import Sandbox
    from sandboxrun.spec import ExecRequest

OPTION_OF = {
    "timeout_s": "--timeout",
    "idle_timeout_s": "--idle-timeout",
    "grace_s": "--grace",
    "max_output": "--max-output",
    "spill_max": "--spill-max",
    "memory_bytes": "--memory",
    "cpus": "--cpus",
    "pids": "--pids",
}
"""The option behind a ``Limits`` field, for error messages."""


def _is_tty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def ask_to_escalate(current: Policy, wider: Policy) -> bool:
    """``--ask``: on a terminal (stdin and stderr both), ask on stderr whether to re-run under
    ``wider`` and read the answer from stdin (the command's stdin is /dev/null, never the
    terminal); without one never ask: say so and answer no."""
    from sandboxrun.denial import describe_change

    change = describe_change(current, wider)
    if not (_is_tty(0) and _is_tty(2)):
        say(f"sandboxrun: --ask: no terminal to ask on, not re-running (re-run with {change})")
        return False
    try:
        sys.stderr.write(f"sandboxrun: re-run with {change}? [y/N] ")
        sys.stderr.flush()
        answer = sys.stdin.readline()
    except (OSError, ValueError, AttributeError):  # stdin closed or gone
        return False
    return answer.strip().lower() in ("y", "yes")


async def _execute(sb: Sandbox, request: ExecRequest) -> ExecResult | None:
    """Open, run, close; SIGINT/SIGTERM at any moment cancel it (cleanup still runs: later
    signals are absorbed until it is done). None when cancelled before the command started."""
    import anyio

    result: ExecResult | None = None
    error: SandboxrunError | None = None
    work = anyio.CancelScope()

    async def watch() -> None:  # outside `work`: it keeps absorbing signals during cleanup
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                work.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        with work:
            try:
                async with sb:
                    result = await sb.run_request(request)
            except SandboxrunError as exc:  # raised after the task group, unwrapped
                error = exc
        tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return result if result is not None else sb.last_result


Backend = Literal["auto", "docker", "systemd-scope", "process-group"]
Access = Literal["read-only", "workspace-write", "danger-full-access"]


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    command: Annotated[list[str], typer.Argument(help="COMMAND [ARGS...] (after --)")],
    workspace: Annotated[Path, typer.Option("-w", "--workspace")] = Path(),
    workdir: Annotated[str | None, typer.Option("-C", "--workdir")] = None,
    backend: Annotated[Backend, typer.Option("-b", "--backend")] = "auto",
    policy: Annotated[Access, typer.Option("--policy")] = "workspace-write",
    network: Annotated[Literal["none", "on"], typer.Option("--network")] = "none",
    timeout: Annotated[float | None, typer.Option("-t", "--timeout")] = None,
    idle_timeout: Annotated[
        float | None,
        typer.Option(
            "--idle-timeout",
            metavar="SECONDS",
            help="end the run (as timed out, exit 124) after SECONDS without any output "
            "on stdout or stderr; default: none",
        ),
    ] = None,
    grace: Annotated[float, typer.Option("--grace")] = 3.0,
    max_output: Annotated[str, typer.Option("--max-output")] = "64k",
    spill_max: Annotated[str, typer.Option("--spill-max")] = "64m",
    env: Annotated[list[str] | None, typer.Option("-e", "--env")] = None,
    pass_env: Annotated[list[str] | None, typer.Option("--pass-env")] = None,
    pass_proxy: Annotated[bool, typer.Option("--pass-proxy")] = False,
    path_prepend: Annotated[list[str] | None, typer.Option("--path-prepend")] = None,
    shell: Annotated[bool, typer.Option("--shell", help="COMMAND is one shell string")] = False,
    login_shell: Annotated[
        str | None,
        typer.Option("--login-shell", help="PATH of the login shell (default: chosen inside)"),
    ] = None,
    login_each: Annotated[
        bool,
        typer.Option("--login-each", help="a login shell per command (no environment snapshot)"),
    ] = False,
    memory: Annotated[str | None, typer.Option("--memory")] = None,
    cpus: Annotated[float | None, typer.Option("--cpus")] = None,
    pids: Annotated[int | None, typer.Option("--pids")] = None,
    image: Annotated[str | None, typer.Option("--image", help="docker only")] = None,
    user: Annotated[str | None, typer.Option("--user", help="UID[:GID], docker only")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run")] = False,
    strict: Annotated[bool, typer.Option("--strict")] = False,
    allow_degraded: Annotated[
        bool,
        typer.Option(
            "--allow-degraded",
            envvar="SANDBOXRUN_ALLOW_DEGRADED",
            help="run even where the backend cannot give every guarantee asked for",
        ),
    ] = False,
    mask: Annotated[
        list[str] | None,
        typer.Option("--mask", help="PATH to hide from the command (local backends)"),
    ] = None,
    no_mask: Annotated[
        bool, typer.Option("--no-mask", help="do not mask secret values in the output")
    ] = False,
    ask: Annotated[
        bool,
        typer.Option("--ask", help="on a denial, ask (on a terminal) to re-run with more access"),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Run COMMAND in a sandbox over the workspace and exit with its status."""
    import anyio
    from pydantic import ValidationError

    from sandboxrun.models import Limits, Policy
    from sandboxrun.sandbox import Sandbox
    from sandboxrun.terminal import LiveWriter

    logging.getLogger("sandboxrun").addHandler(logging.NullHandler())
    logging.getLogger("sandboxrun").propagate = False
    try:
        if shell and len(command) != 1:
            raise InputError("--shell takes exactly one COMMAND string (quote the script)")
        limits = Limits(
            timeout_s=timeout if timeout is not None else Limits().timeout_s,
            grace_s=grace,
            max_output=parse_size(max_output, what="--max-output"),
            spill_max=parse_size(spill_max, what="--spill-max"),
            memory_bytes=None if memory is None else parse_size(memory, what="--memory"),
            cpus=cpus,
            pids=pids,
            idle_timeout_s=idle_timeout,
        )
        live = None if json_out or dry_run else LiveWriter()
        shown_denial = False
        sb = Sandbox(
            workspace,
            backend=backend,
            policy=Policy(
                access=policy,
                network=network,
                strict=strict,
                allow_degraded=allow_degraded,
                mask=tuple(mask or ()),
                mask_output=not no_mask,
            ),
            limits=limits,
            env=dict(parse_env_assignment(item) for item in env or []),
            pass_env=pass_env or [],
            pass_proxy=pass_proxy,
            path_prepend=path_prepend or [],
            image=image,
            user=user,
            login="each" if login_each else "snapshot",
            login_shell=login_shell,
        )
        request = sb.prepare(
            None if shell else command,
            shell=command[0] if shell else None,
            workdir=workdir,
            timeout=timeout,
            sink=live,
        )
        if dry_run:
            chosen, _ = sb.choose_backend()
            chosen.check_request(request)
            write_out(quote_argv(chosen.describe(request)) + "\n")
            raise typer.Exit(0)
        try:
            outcome = anyio.run(_execute, sb, request)
        finally:
            if live is not None:
                live.close()
            for message in sb.close_errors:  # e.g. a container left behind
                say(f"sandboxrun: warning: {message}")
        if outcome is None:
            raise fail(130, "interrupted before the command started")
        result = outcome
        wider = result.denial.escalate_to if result.denial is not None else None
        if ask and not json_out and wider is not None and wider != sb.policy:  # --json: never
            say(denial_line(result) or "")
            shown_denial = True
            if ask_to_escalate(sb.policy, wider):
                widened, again = sb.escalated(request, wider)
                live = LiveWriter()
                again = dataclasses.replace(again, sink=live)
                try:
                    outcome = anyio.run(_execute, widened, again)
                finally:
                    live.close()
                    for message in widened.close_errors:
                        say(f"sandboxrun: warning: {message}")
                if outcome is None:
                    raise fail(130, "interrupted before the command started")
                result = outcome.model_copy(update={"escalated_from": sb.policy})
                shown_denial = False
        if sb.close_errors and json_out:  # --json readers learn of it too (stderr has it)
            result = result.model_copy(update={"warnings": [*result.warnings, *sb.close_errors]})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        where = OPTION_OF.get(where, where)
        message = str(first["msg"]).removeprefix("Value error, ")
        raise fail(EXIT_USAGE, f"invalid {where}: {message}") from None
    except InputError as exc:
        raise fail(EXIT_USAGE, str(exc)) from None
    except (SandboxUnavailableError, PolicyRefusedError, BackendError) as exc:
        raise fail(EXIT_SANDBOX, str(exc)) from None
    except KeyboardInterrupt:
        raise fail(130, "interrupted") from None
    if result.fallback_reason:
        say(f"sandboxrun: warning: falling back to {result.backend}: {result.fallback_reason}")
    if result.missing_guarantees:
        say(
            f"sandboxrun: warning: {result.backend} cannot enforce: "
            f"{', '.join(result.missing_guarantees)}"
        )
    if json_out:
        write_out((result.to_json() + "\n").encode())  # valid UTF-8 whatever the locale
    else:
        for warning in result.warnings:
            say(f"sandboxrun: warning: {warning}")
        denied = denial_line(result)
        if denied and not shown_denial:
            say(denied)
        line = summary(result, live.stats if live else None)
        if line:
            say(line)
    raise typer.Exit(exit_status(result))
