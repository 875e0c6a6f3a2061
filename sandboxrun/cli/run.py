"""``sandboxrun run``: one command in a sandbox over the workspace."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, cast

import typer
from typer.core import TyperCommand

from sandboxrun.cli import settings
from sandboxrun.cli.app import app
from sandboxrun.cli.env_input import explicit_env
from sandboxrun.cli.options import (
    TTY_HABIT,
    RunLimits,
    check_run_limits,
    option_named,
    tty_habit,
)
from sandboxrun.cli.report import (
    EXIT_CANCELLED,
    EXIT_SANDBOX,
    EXIT_USAGE,
    command_line,
    denial_line,
    exit_status,
    fail,
    result_json,
    say,
    show_argv,
    summary,
    use_secrets,
    write_out,
)
from sandboxrun.engine.argv import quote_argv
from sandboxrun.errors import (
    BackendError,
    InputError,
    PolicyRefusedError,
    SandboxrunError,
    SandboxUnavailableError,
)

if TYPE_CHECKING:
    from sandboxrun.api.sandbox import Sandbox
    from sandboxrun.cli.terminal import LiveWriter
    from sandboxrun.engine.request import ExecRequest
    from sandboxrun.models import ExecResult, Policy, Root

OPTION_OF = {
    "timeout_s": "--timeout",
    "max_timeout_s": "--max-timeout",
    "idle_timeout_s": "--idle-timeout",
    "grace_s": "--grace",
    "max_output": "--max-output",
    "spill_max": "--spill-max",
    "memory_bytes": "--memory",
    "cpus": "--cpus",
    "pids": "--pids",
    "disk_bytes": "--disk",
}
"""The option behind a ``Limits`` field, for error messages."""


def checked_limits(values: dict[str, settings.Value]) -> RunLimits:
    """The limits among the settings in force, checked with the flags' messages (a bad value
    names where it came from: a flag, a variable, a project file)."""
    got = {key: value.value for key, value in values.items()}
    try:
        return check_run_limits(
            timeout=None if values["timeout"].source == "default" else got["timeout"],
            max_timeout=got["max_timeout"],
            idle_timeout=got["idle_timeout"],
            grace=settings.required(values, "grace"),
            max_output=settings.required(values, "max_output"),
            spill_max=settings.required(values, "spill_max"),
            memory=got["memory"],
            cpus=got["cpus"],
            pids=got["pids"],
            host_cpus=os.cpu_count(),
            disk=got["disk"],
        )
    except InputError as exc:
        raise type(exc)(settings.blame(str(exc), values)) from None


def checked_workspace_at(value: str) -> Literal["sandbox", "host"]:
    """``--workspace-at``'s value, or a usage error naming the two."""
    if value not in ("sandbox", "host"):
        raise InputError(
            f"invalid --workspace-at {value!r}: expected sandbox (/workspace) or host (the "
            "workspace's host path)"
        )
    return cast("Literal['sandbox', 'host']", value)


def image_in_force(values: dict[str, settings.Value], image_from: Path | None) -> str | None:
    """The ``image`` setting, or None under ``--image-from`` (built by ``built_image`` once
    everything else is checked). ``--image`` and ``--image-from`` together are refused, as is
    ``--image-from`` on a local backend; a project file's ``image`` yields to it."""
    image = values["image"]
    if image_from is None:
        return image.value
    if image.value is not None and image.source == "command line":
        raise InputError("--image and --image-from: give one of them")
    backend = values["backend"].value
    if backend not in (None, "auto", "docker"):
        raise InputError(f"--image-from needs the docker backend, not {backend}")
    from sandboxrun.image import source

    source.source(image_from)  # a path that cannot be built from is refused now
    return None


def built_image(
    image_from: Path,
    user: str | None,
    *,
    workspace: Path,
    policy: Policy,
    dry_run: bool = False,
) -> str | None:
    """``--image-from PATH`` built (or reused) now, its progress on stderr; ``--dry-run``: the
    tag when it is built already, nothing built. Called last, once every other input is
    checked, the docker backend's own refusals of ``workspace`` and the mounts included (a bad
    ``--user`` is refused before minutes of build)."""
    from sandboxrun.backends.docker.backend import precheck
    from sandboxrun.backends.docker.config import parse_user
    from sandboxrun.image import source

    if user is not None:
        parse_user(user)
    precheck(workspace, policy)

    if dry_run:
        return _planned_image(source.planned_tag(image_from))
    from sandboxrun.image.progress import Display

    with Display("image build") as display:
        try:
            made = source.build_from(image_from, display)
        except BaseException:
            display.failed()
            raise
        if not made.reused:
            display.done(f"made {made.tag} with {made.how}")
    return made.tag


def _planned_image(tag: str) -> str | None:
    """``--dry-run --image-from``: the image's tag when it is built already; else the default
    image stands in (the argv is the same; nothing is built by a dry run), and it is said."""
    from sandboxrun.backends.docker import api as dockerapi

    client = dockerapi.connect()
    try:
        if dockerapi.inspect_image(client, tag) is not None:
            return tag
    finally:
        client.close()
    say(f"sandboxrun: --dry-run: {tag} is not built yet (a run builds it): shown on the default")
    return None


def _is_tty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def ask_to_escalate(current: Policy, wider: Policy) -> bool:
    """``--ask``: on a terminal (stdin and stderr both), ask on stderr whether to re-run under
    ``wider`` and read the answer from stdin (the command's stdin is /dev/null unless ``-i``);
    without one never ask: say so and answer no."""
    from sandboxrun.engine.denial import describe_change

    change = describe_change(current, wider)
    if not (_is_tty(0) and _is_tty(2)):
        say(f"sandboxrun: --ask: no terminal to ask on, not re-running (re-run with {change})")
        return False
    try:
        say(f"sandboxrun: re-run with {change}? [y/N] ", end="")
        answer = sys.stdin.readline()
    except (OSError, ValueError, AttributeError):  # stdin closed or gone
        return False
    return answer.strip().lower() in ("y", "yes")


async def _execute(sb: Sandbox, request: ExecRequest, interactive: bool) -> ExecResult | None:
    """Open, run, close; SIGINT/SIGTERM at any moment cancel it (cleanup still runs: later
    signals are absorbed until it is done). ``interactive``: the CLI's stdin is forwarded to
    the command while it runs. None when cancelled before the command started."""
    import anyio

    from sandboxrun.cli.stdin_feed import forward_stdin
    from sandboxrun.engine.request import StdinStream

    result: ExecResult | None = None
    error: SandboxrunError | None = None
    work = anyio.CancelScope()

    async def watch() -> None:  # outside `work`: it keeps absorbing signals during cleanup
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                work.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        if interactive:
            stream = StdinStream()
            request = dataclasses.replace(request, stdin=stream)
            tg.start_soon(forward_stdin, stream)
        with work:
            try:
                async with sb:
                    result = await sb._run_request(request)
            except SandboxrunError as exc:  # raised after the task group, unwrapped
                error = exc
        tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return result if result is not None else sb.last_result


def _error_exit(exc: BaseException, json_out: bool) -> typer.Exit:
    """The error line (and ``--json`` error object) for an exception of the run: its exit."""
    from pydantic import ValidationError

    kind = type(exc).__name__
    if isinstance(exc, ValidationError):  # a limit the options' own checks let through
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        where = OPTION_OF.get(where, where)
        message = str(first["msg"]).removeprefix("Value error, ")
        return fail(
            EXIT_USAGE, f"invalid {where}: {message}", json_out=json_out, kind="ConfigError"
        )
    if isinstance(exc, InputError):
        option = option_named(str(exc))
        hint = TTY_HABIT if option == "--timeout" and tty_habit(command_line()) else None
        return fail(EXIT_USAGE, str(exc), json_out=json_out, kind=kind, option=option, hint=hint)
    if isinstance(exc, PolicyRefusedError):
        return fail(
            EXIT_SANDBOX,
            str(exc),
            json_out=json_out,
            kind=kind,
            backend=exc.backend,
            missing=exc.missing,
        )
    if isinstance(exc, SandboxUnavailableError):
        return fail(EXIT_SANDBOX, str(exc), json_out=json_out, kind=kind, backend=exc.backend)
    if isinstance(exc, BackendError):
        return fail(EXIT_SANDBOX, str(exc), json_out=json_out, kind=kind)
    if isinstance(exc, KeyboardInterrupt):
        return fail(EXIT_CANCELLED, "interrupted", json_out=json_out, kind="Cancelled")
    message = f"internal error: {kind}: {exc} (a bug: please report it"
    if os.environ.get("SANDBOXRUN_DEBUG"):
        import traceback

        say("".join(traceback.format_exception(exc)).rstrip("\n"))  # masked like any line
        message += ")"
    else:
        message += "; SANDBOXRUN_DEBUG=1 shows the traceback)"
    return fail(EXIT_SANDBOX, message, json_out=json_out, kind="InternalError")


class _RunCommand(TyperCommand):
    """``run``'s usage line: ``[OPTIONS] [--] COMMAND [ARGS]...`` (typer would print the
    argument as ``{COMMAND}...``)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return ["[OPTIONS] [--] COMMAND [ARGS]..."]


Backend = Literal["auto", "docker", "systemd-scope", "process-group"]
Access = Literal["read-only", "workspace-write", "danger-full-access"]


@app.command(cls=_RunCommand, context_settings={"allow_interspersed_args": False})
def run(
    command: Annotated[list[str], typer.Argument(metavar="COMMAND", hidden=True)],
    workspace: Annotated[
        Path,
        typer.Option(
            "-w", "--workspace", metavar="DIR", help="host directory the command works on"
        ),
    ] = Path(),
    workdir: Annotated[
        str | None,
        typer.Option(
            "-C",
            "--workdir",
            metavar="PATH",
            help="working directory, relative to the workspace; escapes are refused "
            "(default: the workspace)",
            show_default=False,
        ),
    ] = None,
    backend: Annotated[
        Backend | None,
        typer.Option(
            "-b",
            "--backend",
            metavar="BACKEND",
            help="docker, systemd-scope or process-group; auto: the first of them that is "
            "available (a named backend never falls back) (default: auto)",
            show_default=False,
        ),
    ] = None,
    policy: Annotated[
        Access | None,
        typer.Option(
            "--policy",
            metavar="POLICY",
            help="read-only (workspace and system read-only), workspace-write (the workspace "
            "is writable) or danger-full-access (no isolation) (default: workspace-write)",
            show_default=False,
        ),
    ] = None,
    network: Annotated[
        Literal["none", "on"] | None,
        typer.Option(
            "--network",
            metavar="none|on",
            help="none: no network; on: network (default: none)",
            show_default=False,
        ),
    ] = None,
    root: Annotated[
        Literal["read-only", "writable"] | None,
        typer.Option(
            "--root",
            metavar="read-only|writable",
            help="the file system outside the workspace: writable is an ephemeral root, "
            "thrown away with the sandbox, docker only (apt-get, adduser: with --user 0) "
            "(default: read-only)",
            show_default=False,
        ),
    ] = None,
    disk: Annotated[
        str | None,
        typer.Option(
            "--disk",
            metavar="SIZE",
            help="the most a writable root may hold, at least 1m: past it the commands are "
            "killed and the root discarded (default: none)",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        str | None,
        typer.Option(
            "-t",
            "--timeout",
            metavar="DURATION",
            help="wall-clock limit, then TERM, --grace, KILL and exit 124; any DURATION "
            "(default: 120s, or --max-timeout when lower)",
            show_default=False,
        ),
    ] = None,
    max_timeout: Annotated[
        str | None,
        typer.Option(
            "--max-timeout",
            metavar="DURATION",
            help="an operator's cap: a larger --timeout is refused, never shortened "
            "(default: none)",
            show_default=False,
        ),
    ] = None,
    idle_timeout: Annotated[
        str | None,
        typer.Option(
            "--idle-timeout",
            metavar="DURATION",
            help="end the run like --timeout (exit 124) after DURATION without any output on "
            "stdout or stderr (default: none)",
            show_default=False,
        ),
    ] = None,
    grace: Annotated[
        str | None,
        typer.Option(
            "--grace",
            metavar="DURATION",
            help="time between TERM and KILL when the run is stopped (0 to 10m) (default: 3s)",
            show_default=False,
        ),
    ] = None,
    max_output: Annotated[
        str | None,
        typer.Option(
            "--max-output",
            metavar="SIZE",
            help="bytes of each stream the result keeps in memory, head + tail (at least 64) "
            "(default: 64k)",
            show_default=False,
        ),
    ] = None,
    spill_max: Annotated[
        str | None,
        typer.Option(
            "--spill-max",
            metavar="SIZE",
            help="cap of each stream's spill file, which holds the full output (0: none) "
            "(default: 64m)",
            show_default=False,
        ),
    ] = None,
    keep_spill: Annotated[
        bool,
        typer.Option(
            "--keep-spill",
            help="keep the spill files after the run (the summary and --json name them); "
            "default: removed with the sandbox",
        ),
    ] = False,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "-e",
            "--env",
            metavar="NAME[=VALUE]",
            help="set a variable; NAME alone takes its value from this environment; "
            "repeatable, the only way in for secret-shaped names (default: none)",
            show_default=False,
        ),
    ] = None,
    env_file: Annotated[
        list[Path] | None,
        typer.Option(
            "--env-file",
            metavar="FILE",
            help="read variables from FILE, one NAME=VALUE (or NAME) a line as docker's; "
            "repeatable; -e wins (default: none)",
            show_default=False,
        ),
    ] = None,
    pass_env: Annotated[
        list[str] | None,
        typer.Option(
            "--pass-env",
            metavar="NAME",
            help="copy a host variable; repeatable, refused for secret-shaped names "
            "(default: none)",
            show_default=False,
        ),
    ] = None,
    pass_proxy: Annotated[
        bool,
        typer.Option("--pass-proxy", help="copy the host's proxy and CA variables"),
    ] = False,
    path_prepend: Annotated[
        list[str] | None,
        typer.Option(
            "--path-prepend",
            metavar="DIR",
            help="put the absolute DIR first in PATH; repeatable (default: none)",
            show_default=False,
        ),
    ] = None,
    shell: Annotated[
        bool,
        typer.Option("--shell", help="COMMAND is one shell script, run by the login shell"),
    ] = False,
    login_shell: Annotated[
        str | None,
        typer.Option(
            "--login-shell",
            metavar="PATH",
            help="the login shell inside the sandbox (default: the user's when it is bash, "
            "zsh, sh or dash, else bash, else sh)",
            show_default=False,
        ),
    ] = None,
    login_each: Annotated[
        bool,
        typer.Option("--login-each", help="a login shell per command (no environment snapshot)"),
    ] = False,
    memory: Annotated[
        str | None,
        typer.Option(
            "--memory",
            metavar="SIZE",
            help="memory limit, at least 6m; a bare number is bytes (default: none)",
            show_default=False,
        ),
    ] = None,
    cpus: Annotated[
        str | None,
        typer.Option(
            "--cpus",
            metavar="N",
            help="CPU limit in CPUs, e.g. 0.5 or 2: from 0.01 up to this host's CPU count "
            "(default: none)",
            show_default=False,
        ),
    ] = None,
    pids: Annotated[
        str | None,
        typer.Option(
            "--pids",
            metavar="N",
            help="most processes and threads at once, at least 1 (default: none)",
            show_default=False,
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            metavar="IMAGE",
            help="docker image, docker only (default: sandboxrun/base:latest)",
            show_default=False,
        ),
    ] = None,
    image_from: Annotated[
        Path | None,
        typer.Option(
            "--image-from",
            metavar="PATH",
            help="docker image built from PATH, a Dockerfile or a directory with one (once per "
            "content: reused while it and its base are unchanged; default: none)",
            show_default=False,
        ),
    ] = None,
    user: Annotated[
        str | None,
        typer.Option(
            "--user",
            metavar="UID[:GID]",
            help="user the command runs as, docker only (default: yours; the workspace "
            "owner's when you are root)",
            show_default=False,
        ),
    ] = None,
    interactive: Annotated[
        bool,
        typer.Option(
            "-i",
            "--interactive",
            help="pass this program's stdin to COMMAND, streamed as it arrives; without -i "
            "COMMAND's stdin is closed (/dev/null)",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the argv that would run, run nothing")
    ] = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict", help="refuse (exit 125) when the backend cannot give every guarantee"
        ),
    ] = False,
    allow_degraded: Annotated[
        bool,
        typer.Option(
            "--allow-degraded",
            envvar="SANDBOXRUN_ALLOW_DEGRADED",
            help="run even where the backend cannot give every guarantee asked for",
        ),
    ] = False,
    mounts: Annotated[
        list[str] | None,
        typer.Option(
            "--mount",
            metavar="SRC:DST[:ro|rw]",
            help="show the host path SRC at DST, read-only unless :rw; repeatable (sockets, "
            "kernel paths and targets over the workspace are refused; default: none)",
            show_default=False,
        ),
    ] = None,
    workspace_at: Annotated[
        str,
        typer.Option(
            "--workspace-at",
            metavar="sandbox|host",
            help="where the command starts: /workspace on every backend (sandbox; a local "
            "one without bubblewrap has only the host path), or the workspace's host path on "
            "the local backends (host) (default: sandbox)",
            show_default=False,
        ),
    ] = "sandbox",
    mask: Annotated[
        list[str] | None,
        typer.Option(
            "--mask",
            metavar="PATH",
            help="hide PATH from the command; repeatable (default: none)",
            show_default=False,
        ),
    ] = None,
    no_mask: Annotated[
        bool, typer.Option("--no-mask", help="do not mask secret values in the output")
    ] = False,
    ask: Annotated[
        bool,
        typer.Option("--ask", help="on a denial, ask (on a terminal) to re-run with more access"),
    ] = False,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help='print one JSON object on stdout: the result, or {"error": ...}; output is '
            "not shown live",
        ),
    ] = False,
) -> None:
    """Run COMMAND [ARGS]... in a sandbox over the workspace and exit with its status.

    Options end at COMMAND's first word; put -- before COMMAND when that starts with -.
    Durations: 90, 90s, 1.5s, 500ms, 10m, 1h (a bare number is seconds). Sizes: k, m, g
    suffixes (KiB, MiB, GiB; a bare number is bytes)."""
    logging.getLogger("sandboxrun").addHandler(logging.NullHandler())
    logging.getLogger("sandboxrun").propagate = False
    try:
        import anyio

        from sandboxrun.api.sandbox import Sandbox
        from sandboxrun.cli.terminal import LiveWriter
        from sandboxrun.engine import results
        from sandboxrun.models import Limits, Policy

        explicit = explicit_env(env or [], env_file or [], os.environ)
        use_secrets(None if no_mask else explicit)  # everything said from now on is masked
        if shell and len(command) != 1:
            raise InputError("--shell takes exactly one COMMAND string (quote the script)")
        given = {
            "backend": backend, "image": image, "policy": policy, "network": network,
            "timeout": timeout, "max_timeout": max_timeout, "idle_timeout": idle_timeout,
            "grace": grace, "max_output": max_output, "spill_max": spill_max,
            "memory": memory, "cpus": cpus, "pids": pids, "root": root, "disk": disk,
        }  # fmt: skip
        values = settings.in_force(given)
        settings.export_spill_caps(values)  # the spill root's pruning reads them
        checked = checked_limits(values)
        backend = cast("Backend", settings.required(values, "backend"))
        policy = cast("Access", settings.required(values, "policy"))
        network = cast("Literal['none', 'on']", settings.required(values, "network"))
        image = image_in_force(values, image_from)
        if image_from is not None:
            backend = "docker"  # what it builds is a docker image (auto: docker's own refusal)
        limits = Limits(**dataclasses.asdict(checked))
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
                mounts=tuple(mounts or ()),
                workspace_at=checked_workspace_at(workspace_at),
                root=cast("Root", settings.required(values, "root")),
            ),
            limits=limits,
            env=explicit,
            pass_env=pass_env or [],
            pass_proxy=pass_proxy,
            path_prepend=path_prepend or [],
            image=image,
            user=user,
            login="each" if login_each else "snapshot",
            login_shell=login_shell,
            keep_spill=keep_spill,
        )
        request = sb._prepare(
            None if shell else command,
            shell=command[0] if shell else None,
            workdir=workdir,
            sink=live,
        )
        if image_from is not None:  # everything else checked: build now
            sb.image = built_image(
                image_from, user, workspace=sb.workspace.root, policy=sb.policy, dry_run=dry_run
            )
        if dry_run:
            chosen, _ = sb._choose_backend()
            planned = chosen.plan(request).shown  # InputError: what would not run is refused
            write_out(show_argv(quote_argv(planned), terminal=_is_tty(1)))
            raise typer.Exit(0)
        try:
            outcome = anyio.run(_execute, sb, request, interactive)
        finally:
            if live is not None:
                live.close()
            for message in sb.close_errors:  # e.g. a container left behind
                say(f"sandboxrun: warning: {message}")
        if outcome is None:
            _cancelled_before_start(json_out)
        result = outcome
        if ask and not json_out:  # --json: never
            result, live, shown_denial = _offer_escalation(sb, request, result, live, interactive)
        if sb.close_errors and json_out:  # --json readers learn of it too (stderr has it)
            result = results.amend(result, warnings=sb.close_errors)
    except (typer.Exit, SystemExit):
        raise
    except (Exception, KeyboardInterrupt) as exc:
        raise _error_exit(exc, json_out) from None
    _report(
        result,
        live,
        json_out=json_out,
        keep_spill=keep_spill,
        timeout_s=request.timeout_s,
        memory_bytes=sb.limits.memory_bytes,
        denial_shown=shown_denial,
    )


def _offer_escalation(
    sb: Sandbox,
    request: ExecRequest,
    result: ExecResult,
    live: LiveWriter | None,
    interactive: bool,
) -> tuple[ExecResult, LiveWriter | None, bool]:
    """``--ask``: a refusal the sandbox could lift (its denial names a wider policy) is said,
    and the command runs again under that policy if the user agrees. ``(the result to report,
    the live writer it was shown with, whether its denial was said already)``."""
    import anyio

    from sandboxrun.cli.terminal import LiveWriter
    from sandboxrun.engine import results

    wider = result.denial.escalate_to if result.denial is not None else None
    if wider is None or wider == sb.policy:
        return result, live, False
    say(denial_line(result) or "")
    if not ask_to_escalate(sb.policy, wider):
        return result, live, True
    widened, again = sb._escalated(request, wider)
    live = LiveWriter()
    again = dataclasses.replace(again, sink=live)
    try:
        outcome = anyio.run(_execute, widened, again, interactive)
    finally:
        live.close()
        for message in widened.close_errors:
            say(f"sandboxrun: warning: {message}")
    if outcome is None:
        _cancelled_before_start(json_out=False)
    return results.amend(outcome, escalated_from=sb.policy), live, False


def _report(
    result: ExecResult,
    live: LiveWriter | None,
    *,
    json_out: bool,
    keep_spill: bool,
    timeout_s: float,
    memory_bytes: int | None,
    denial_shown: bool,
) -> NoReturn:
    """Say the result (stderr: warnings and the summary line; ``--json``: the result object on
    stdout) and exit with the command's status."""
    from sandboxrun.engine import results

    if result.fallback_reason:
        say(f"sandboxrun: warning: falling back to {result.backend}: {result.fallback_reason}")
    if result.missing_guarantees:
        say(
            f"sandboxrun: warning: {result.backend} cannot enforce: "
            f"{', '.join(result.missing_guarantees)}"
        )
    if json_out:
        # without --keep-spill the spill files are gone with the sandbox: the result names none
        shown = result if keep_spill else results.amend(result, drop_spill=True)
        write_out((result_json(shown) + "\n").encode())  # valid UTF-8 whatever the locale
    else:
        for warning in result.warnings:
            say(f"sandboxrun: warning: {warning}")
    line = summary(
        result,
        live.stats if live else None,
        shown_live=not json_out,
        spill_kept=keep_spill,
        timeout_s=timeout_s,
        memory_bytes=memory_bytes,
        denial_shown=denial_shown,
    )
    if line:
        say(line)
    raise typer.Exit(exit_status(result))


def _cancelled_before_start(json_out: bool) -> NoReturn:
    raise fail(
        EXIT_CANCELLED,
        "cancelled before the command started",
        json_out=json_out,
        kind="Cancelled",
    )
