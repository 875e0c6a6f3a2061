"""The ``sandboxrun`` command line (typer). Exit statuses: see ``exit_status`` and docs/cli.md."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import sys
from contextlib import suppress
from pathlib import Path
from typing import Annotated, Literal

import anyio
import typer
from pydantic import ValidationError

from sandboxrun import backends
from sandboxrun.argv import quote_argv
from sandboxrun.denial import describe_change
from sandboxrun.env import parse_env_assignment
from sandboxrun.errors import (
    BackendError,
    InputError,
    PolicyRefusedError,
    SandboxrunError,
    SandboxUnavailableError,
)
from sandboxrun.models import ExecResult, Limits, Policy
from sandboxrun.sandbox import Sandbox
from sandboxrun.spec import ExecRequest
from sandboxrun.spill import default_spill_root, prune
from sandboxrun.terminal import LiveWriter, StreamStats
from sandboxrun.units import parse_size

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Run untrusted commands against a workspace with OS-level isolation.",
)

EXIT_USAGE = 2
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
EXIT_SANDBOX = 125


def exit_status(result: ExecResult) -> int:
    """The CLI exit status for a result (documented contract)."""
    if result.status == "timed_out":
        return 124
    if result.status == "cancelled":
        return 130
    if result.status == "sandbox_error":
        return EXIT_SANDBOX
    if result.status == "oom_killed":
        return 137
    if result.status == "spawn_error":
        return result.exit_code or 127
    if result.signal is not None:
        known = signal.Signals.__members__.get(result.signal)
        return 128 + (int(known) if known is not None else 0)
    return result.exit_code if result.exit_code is not None else EXIT_SANDBOX


def write_out(text: str | bytes) -> None:
    """Write to stdout as bytes, whatever the locale: lone surrogates of a ``str`` (bytes of an
    argv or a path that are not UTF-8) go out as the original bytes."""
    sys.stdout.flush()
    sys.stdout.buffer.write(text if isinstance(text, bytes) else os.fsencode(text))
    sys.stdout.flush()


def say(line: str) -> None:
    """One line to stderr; a reader that closed it must not turn the run's exit status into a
    traceback (nor the interpreter's final flush into exit 120)."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (BrokenPipeError, OSError):
        with suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)


def fail(code: int, message: str) -> typer.Exit:
    say(f"sandboxrun: error: {message}")
    return typer.Exit(code)


def _where(result: ExecResult, name: str) -> str:
    """Where the full stream ``name`` can be found, as a summary clause."""
    spill = getattr(result, f"{name}_spill")
    if spill and getattr(result, f"{name}_spill_complete"):
        return f"full stream in {spill}"
    if spill:
        return f"first part in {spill}"
    return "the full stream was not kept"


def live_notes(result: ExecResult, stats: dict[str, StreamStats]) -> list[str]:
    """What live output did not reach its reader, and why (slow terminal, closed pipe)."""
    parts: list[str] = []
    for name, s in stats.items():
        if s.dropped:
            parts.append(
                f"{s.dropped} bytes of {name} not shown on the terminal "
                f"(too slow; {_where(result, name)})"
            )
        if s.lost and s.failure == "closed":
            parts.append(
                f"the reader of {name} closed the pipe: {s.lost} bytes not shown "
                f"({_where(result, name)})"
            )
        elif s.lost:
            parts.append(
                f"writing {name} failed ({s.failure}): {s.lost} bytes not shown "
                f"({_where(result, name)})"
            )
    return parts


def summary(result: ExecResult, live: dict[str, StreamStats] | None = None) -> str | None:
    """One line on what the user should know: live output not shown, truncation, timeout,
    survivors."""
    parts = live_notes(result, live or {})
    if result.timed_out:
        parts.append(f"timed out after {result.duration_s:.1f}s")
        if result.timeout_kind == "idle":
            idle = [p for p in (result.error or "").split("; ") if p.endswith("(idle timeout)")]
            parts[-1] += f": {idle[0] if idle else 'no output (idle timeout)'}"
    for name in ("stdout", "stderr"):
        if getattr(result, f"{name}_truncated"):
            dropped = getattr(result, f"{name}_dropped_bytes")
            spill = getattr(result, f"{name}_spill")
            where = f", full stream in {spill}" if spill else ""
            if spill and not getattr(result, f"{name}_spill_complete"):
                where = f", first part in {spill}"
            parts.append(f"{name} truncated ({dropped} bytes omitted{where})")
    if result.survivors:
        parts.append(f"{result.survivors} process(es) survived termination")
    if result.error and result.status in ("spawn_error", "sandbox_error"):
        parts.append(result.error)
    return "sandboxrun: " + "; ".join(parts) if parts else None


def denial_line(result: ExecResult) -> str | None:
    """The line saying the sandbox, not the program, refused something (text mode)."""
    found = result.denial
    return None if found is None else f"sandboxrun: denied: {found.message} ({found.evidence})"


def _is_tty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def ask_to_escalate(current: Policy, wider: Policy) -> bool:
    """``--ask``: on a terminal (stdin and stderr both), ask on stderr whether to re-run under
    ``wider`` and read the answer from stdin (the command's stdin is /dev/null, never the
    terminal); without one never ask: say so and answer no."""
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


def layer_rows() -> list[dict[str, object]]:
    """The local isolation layer, part by part: given here or not, why, and how to get it."""
    from sandboxrun.isolation import NAMESPACE_LAYERS, probe_host

    support = probe_host()
    ns = ", ".join(("network-none", *NAMESPACE_LAYERS))
    return [
        {
            "layer": "namespaces (bubblewrap)",
            "available": support.bwrap is not None,
            "gives": ns,
            "reason": support.bwrap_reason,
        },
        {
            "layer": "landlock",
            "available": support.landlock_abi > 0,
            "gives": f"writes only where the policy allows (ABI {support.landlock_abi})"
            if support.landlock_abi
            else "writes only where the policy allows",
            "reason": None
            if support.landlock_abi
            else "the kernel has no Landlock (CONFIG_SECURITY_LANDLOCK=y and lsm=...,landlock)",
        },
        {
            "layer": "seccomp",
            "available": support.seccomp,
            "gives": "no setuid/setgid file, no device node",
            "reason": None if support.seccomp else "the kernel has no seccomp filter support",
        },
    ]


@app.command()
def doctor(json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """For each backend: available or not and why, and the isolation it gives; then each part
    of the local isolation layer (process-group, systemd-scope): given here or why not."""
    probes = [backends.probe(name) for name in backends.ORDER]
    layers = layer_rows()
    if json_out:
        rows = [
            {
                "backend": p.backend,
                "available": p.available,
                "reason": p.reason,
                "isolation": list(p.isolation),
            }
            for p in probes
        ]
        sys.stdout.write(json.dumps({"backends": rows, "local_layers": layers}) + "\n")
        return
    for p in probes:
        state = "available" if p.available else "unavailable"
        detail = ", ".join(p.isolation) if p.available else p.reason
        sys.stdout.write(f"{p.backend:<14} {state:<12} {detail}\n")
    sys.stdout.write("local isolation layer:\n")
    for row in layers:
        state = "available" if row["available"] else "unavailable"
        detail = str(row["gives"] if row["available"] else row["reason"])
        sys.stdout.write(f"  {row['layer']!s:<24} {state:<12} {detail}\n")


@app.command()
def ps(json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List sandboxrun's containers (label sandboxrun.managed=true) and scopes (units
    sandboxrun-*.scope), owner alive or not."""
    from sandboxrun import dockerapi, housekeeping
    from sandboxrun.backends import probe

    rows: list[dict[str, object]] = []
    try:
        containers = housekeeping.list_managed(dockerapi.connect(dockerapi.PROBE_TIMEOUT_S))
        rows += [{"kind": "container", **row.__dict__} for row in containers]
    except (SandboxUnavailableError, BackendError) as exc:
        sys.stderr.write(f"containers: skipped ({exc})\n")
    systemd = probe("systemd-scope")
    try:
        scopes = housekeeping.list_scopes() if systemd.available else []
    except BackendError as exc:
        scopes = []
        sys.stderr.write(f"scopes: skipped ({exc})\n")
    if not systemd.available:
        sys.stderr.write(f"scopes: skipped ({systemd.reason})\n")
    host = socket.gethostname()
    for scope in scopes:  # the same fields as a container row
        rows.append(
            {
                "kind": "scope",
                "id": scope.unit,
                "name": scope.unit,
                "status": scope.state,
                "owner_pid": scope.owner_pid,
                "owner_host": host,
                "created": None,
                "owner_alive": scope.owner_alive,
            }
        )
    if json_out:
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    for row in rows:
        alive = "owner alive" if row["owner_alive"] else "owner gone"
        owner = f"{row['owner_pid']}@{row['owner_host']}"
        ident = str(row["id"])[:12] if row["kind"] == "container" else "scope"
        sys.stdout.write(
            f"{ident:<12}  {row['name']!s:<24} {row['status']!s:<24} {owner:<24} {alive}\n"
        )


@app.command()
def clean(
    older_than: Annotated[float, typer.Option("--older-than", help="spill age, hours")] = 24.0,
    spill_dir: Annotated[Path | None, typer.Option("--spill-dir")] = None,
    all_: Annotated[bool, typer.Option("--all", help="every managed container/scope")] = False,
) -> None:
    """Remove managed containers and stop scopes whose owner is gone (--all: every one), and
    old spill files."""
    from sandboxrun import dockerapi, housekeeping
    from sandboxrun.backends import probe

    root = spill_dir or default_spill_root()
    removed = prune(root, older_than * 3600) if root.is_dir() else []
    noun = "directory" if len(removed) == 1 else "directories"
    sys.stdout.write(f"removed {len(removed)} spill {noun}\n")
    systemd = probe("systemd-scope")
    if systemd.available:
        try:
            scopes = [s for s in housekeeping.list_scopes() if all_ or not s.owner_alive]
            for scope in scopes:
                housekeeping.stop_scope(scope.unit)
            sys.stdout.write(f"stopped {len(scopes)} scope(s)\n")
        except BackendError as exc:
            sys.stdout.write(f"scopes: failed ({exc})\n")
    else:
        sys.stdout.write(f"scopes: skipped ({systemd.reason})\n")
    try:
        client = dockerapi.connect(dockerapi.PROBE_TIMEOUT_S)
    except SandboxUnavailableError as exc:
        sys.stdout.write(f"containers: skipped ({exc.reason})\n")
        return
    gone = [row for row in housekeeping.list_managed(client) if all_ or not row.owner_alive]
    for row in gone:
        housekeeping.remove(client, row.id)
    sys.stdout.write(f"removed {len(gone)} container(s)\n")


image_app = typer.Typer(no_args_is_help=True, help="Build sandbox images (offline too).")
app.add_typer(image_app, name="image")


def _progress(line: str) -> None:
    sys.stderr.write(f"  {line}\n")
    sys.stderr.flush()


@image_app.command("bootstrap")
def image_bootstrap(force: Annotated[bool, typer.Option("--force")] = False) -> None:
    """Debootstrap Debian from the host's apt sources and import it (no registry needed)."""
    from sandboxrun import images

    try:
        tag = images.bootstrap(_progress, force=force)
    except InputError as exc:
        raise fail(EXIT_USAGE, str(exc)) from None
    except (SandboxUnavailableError, BackendError) as exc:
        raise fail(EXIT_SANDBOX, str(exc)) from None
    sys.stdout.write(tag + "\n")


@image_app.command("build")
def image_build(
    base: Annotated[str | None, typer.Option("--base", help="BASE_IMAGE build argument")] = None,
    force: Annotated[bool, typer.Option("--force")] = False,
) -> None:
    """Build images/base as sandboxrun/base:<version> and :latest."""
    from sandboxrun import images

    try:
        tag = images.build(_progress, base=base, force=force)
    except InputError as exc:
        raise fail(EXIT_USAGE, str(exc)) from None
    except (SandboxUnavailableError, BackendError) as exc:
        raise fail(EXIT_SANDBOX, str(exc)) from None
    sys.stdout.write(tag + "\n")
