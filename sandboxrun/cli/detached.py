"""``sandboxrun create``, ``exec``, ``ls`` and ``rm``: sandboxes that outlive one call
(``sandboxrun.detached``). ``exec`` imports only the standard library and the client: it costs
a few milliseconds more than the CLI's own start-up."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

import typer

from sandboxrun.cli.app import app

if TYPE_CHECKING:
    from sandboxrun.cli.exec_args import ExecArgs

Backend = Literal["auto", "docker", "systemd-scope", "process-group"]
Access = Literal["read-only", "workspace-write", "danger-full-access"]


def _fail(exc: BaseException, json_out: bool) -> NoReturn:
    from sandboxrun.cli.report import EXIT_SANDBOX, EXIT_USAGE, fail
    from sandboxrun.errors import InputError

    code = EXIT_USAGE if isinstance(exc, InputError) else EXIT_SANDBOX
    raise fail(code, str(exc), json_out=json_out, kind=type(exc).__name__) from None


@app.command()
def create(
    name: Annotated[
        str | None,
        typer.Option("--name", metavar="NAME", help="its name (default: sbx-<8 hex digits>)"),
    ] = None,
    workspace: Annotated[
        Path, typer.Option("-w", "--workspace", metavar="DIR", help="host directory it works on")
    ] = Path(),
    backend: Annotated[
        Backend | None,
        typer.Option("-b", "--backend", metavar="BACKEND", help="as run's (default: auto)"),
    ] = None,
    image: Annotated[
        str | None, typer.Option("--image", metavar="IMAGE", help="docker image, as run's")
    ] = None,
    image_from: Annotated[
        Path | None,
        typer.Option("--image-from", metavar="PATH", help="docker image built from PATH, as run's"),
    ] = None,
    policy: Annotated[
        Access | None,
        typer.Option("--policy", metavar="POLICY", help="as run's (default: workspace-write)"),
    ] = None,
    network: Annotated[
        Literal["none", "on"] | None,
        typer.Option("--network", metavar="none|on", help="as run's (default: none)"),
    ] = None,
    root_fs: Annotated[
        Literal["read-only", "writable"] | None,
        typer.Option("--root", metavar="read-only|writable", help="as run's (default: read-only)"),
    ] = None,
    disk: Annotated[
        str | None, typer.Option("--disk", metavar="SIZE", help="as run's (default: none)")
    ] = None,
    timeout: Annotated[
        str | None,
        typer.Option(
            "-t",
            "--timeout",
            metavar="DURATION",
            help="each exec's timeout unless it gives its own -t (default: 120s)",
        ),
    ] = None,
    grace: Annotated[
        str | None, typer.Option("--grace", metavar="DURATION", help="as run's (default: 3s)")
    ] = None,
    memory: Annotated[str | None, typer.Option("--memory", metavar="SIZE", help="as run's")] = None,
    cpus: Annotated[str | None, typer.Option("--cpus", metavar="N", help="as run's")] = None,
    pids: Annotated[str | None, typer.Option("--pids", metavar="N", help="as run's")] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("-e", "--env", metavar="NAME[=VALUE]", help="as run's, for every exec"),
    ] = None,
    env_file: Annotated[
        list[Path] | None, typer.Option("--env-file", metavar="FILE", help="as run's")
    ] = None,
    pass_env: Annotated[
        list[str] | None, typer.Option("--pass-env", metavar="NAME", help="as run's")
    ] = None,
    user: Annotated[
        str | None, typer.Option("--user", metavar="UID[:GID]", help="as run's (docker only)")
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="as run's")] = False,
    allow_degraded: Annotated[
        bool,
        typer.Option("--allow-degraded", envvar="SANDBOXRUN_ALLOW_DEGRADED", help="as run's"),
    ] = False,
    no_mask: Annotated[bool, typer.Option("--no-mask", help="as run's")] = False,
    mounts: Annotated[
        list[str] | None,
        typer.Option("--mount", metavar="SRC:DST[:ro|rw]", help="as run's (repeatable)"),
    ] = None,
    workspace_at: Annotated[
        str, typer.Option("--workspace-at", metavar="sandbox|host", help="as run's")
    ] = "sandbox",
    ttl: Annotated[
        str | None,
        typer.Option(
            "--ttl", metavar="DURATION", help="remove it this long after creation (default: never)"
        ),
    ] = None,
    idle_ttl: Annotated[
        str | None,
        typer.Option(
            "--idle-ttl",
            metavar="DURATION",
            help="remove it after this long with no command running (default: never)",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print its info as JSON")] = False,
) -> None:
    """Create a sandbox that lives until `sandboxrun rm NAME` (or its TTL): print its name.

    `sandboxrun exec NAME -- COMMAND` runs commands in it, in milliseconds."""
    try:
        import dataclasses

        from sandboxrun.cli import settings
        from sandboxrun.cli.env_input import explicit_env
        from sandboxrun.cli.report import json_line, use_secrets, write_out
        from sandboxrun.cli.run import (
            built_image,
            checked_limits,
            checked_workspace_at,
            image_in_force,
        )
        from sandboxrun.detached import client
        from sandboxrun.units import parse_duration

        explicit = explicit_env(env or [], env_file or [], os.environ)
        use_secrets(None if no_mask else explicit)
        given = {
            "backend": backend, "image": image, "policy": policy, "network": network,
            "timeout": timeout, "max_timeout": None, "idle_timeout": None, "grace": grace,
            "max_output": None, "spill_max": None, "memory": memory, "cpus": cpus, "pids": pids,
            "root": root_fs, "disk": disk,
        }  # fmt: skip
        values = settings.in_force(given)
        checked = checked_limits(values)
        ttl_s = None if ttl is None else parse_duration(ttl, what="--ttl")
        idle_ttl_s = None if idle_ttl is None else parse_duration(idle_ttl, what="--idle-ttl")
        spec: dict[str, Any] = {
            "workspace": str(workspace.resolve()),
            "backend": "docker" if image_from else settings.required(values, "backend"),
            "image": image_in_force(values, image_from),
            "user": user,
            "env": explicit,
            "pass_env": list(pass_env or []),
            "policy": {
                "access": settings.required(values, "policy"),
                "network": settings.required(values, "network"),
                "strict": strict,
                "allow_degraded": allow_degraded,
                "mask_output": not no_mask,
                "workspace_at": checked_workspace_at(workspace_at),
                "root": settings.required(values, "root"),
            },
            "limits": dataclasses.asdict(checked),
        }
        if mounts:  # checked here, before a keeper starts: a refusal names the mount
            from sandboxrun.api.request import checked_mounts
            from sandboxrun.models import Policy

            asked = Policy(**spec["policy"], mounts=tuple(mounts))
            resolved = checked_mounts(asked, Path(spec["workspace"]))
            spec["policy"]["mounts"] = [m.model_dump() for m in resolved]
        if image_from is not None:  # everything else checked: build now
            from sandboxrun.engine.paths import Workspace
            from sandboxrun.models import Policy

            root = Workspace.open(workspace).root  # (the keeper checks it too, after the build)
            spec["image"] = built_image(
                image_from, user, workspace=root, policy=Policy(**spec["policy"])
            )
        made = client.create(
            spec,
            name=name,
            ttl_s=ttl_s,
            idle_ttl_s=idle_ttl_s,
        )
    except (typer.Exit, SystemExit):
        raise
    except Exception as exc:
        _fail(exc, json_out)
    if json_out:
        write_out((json_line(made) + "\n").encode())
    else:
        write_out(f"{made['name']}\n")


@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_(
    name: Annotated[str, typer.Argument(metavar="NAME", help="the sandbox (sandboxrun ls)")],
    command: Annotated[list[str], typer.Argument(metavar="COMMAND", help="what to run")],
    timeout: Annotated[
        str | None,
        typer.Option("-t", "--timeout", metavar="DURATION", help="as run's (default: create's)"),
    ] = None,
    idle_timeout: Annotated[
        str | None, typer.Option("--idle-timeout", metavar="DURATION", help="as run's")
    ] = None,
    workdir: Annotated[
        str | None, typer.Option("-C", "--workdir", metavar="PATH", help="as run's")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("-e", "--env", metavar="NAME[=VALUE]", help="as run's")
    ] = None,
    shell: Annotated[
        bool, typer.Option("--shell", help="COMMAND is one shell script, run by the login shell")
    ] = False,
    interactive: Annotated[
        bool, typer.Option("-i", "--interactive", help="pass this program's stdin to COMMAND")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Run COMMAND in the sandbox NAME (made by `sandboxrun create`) and exit with its status,
    as `sandboxrun run` does. Options go before NAME (as docker exec's)."""
    from sandboxrun.cli.exec_args import ExecArgs

    args = ExecArgs(
        name=name,
        command=command[1:] if command[:1] == ["--"] else list(command),
        timeout=timeout,
        idle_timeout=idle_timeout,
        workdir=workdir,
        env=list(env or []),
        shell=shell,
        interactive=interactive,
        json=json_out,
    )
    raise typer.Exit(exec_main(args))


def exec_main(args: ExecArgs) -> int:
    """``sandboxrun exec``'s work, whoever parsed its words: the exit status."""
    from sandboxrun.cli.report import say, write_out
    from sandboxrun.detached import client

    json_out = args.json
    try:
        request: dict[str, Any] = {"json": json_out}
        if not args.command:
            raise _input_error("missing COMMAND after NAME")
        if args.command[0] in OWN_OPTIONS:
            raise _input_error(
                f"{args.command[0]} after NAME is taken as COMMAND: exec's options go before "
                f"NAME (sandboxrun exec {args.command[0]} ... {args.name} -- COMMAND)"
            )
        if args.shell:
            if len(args.command) != 1:
                raise _input_error("--shell takes exactly one COMMAND string (quote the script)")
            request["shell"] = args.command[0]
        else:
            request["argv"] = list(args.command)
        if args.timeout is not None:
            request["timeout"] = _duration(args.timeout, "--timeout")
        if args.idle_timeout is not None:
            request["idle_timeout"] = _duration(args.idle_timeout, "--idle-timeout")
        if args.workdir is not None:
            request["workdir"] = args.workdir
        if args.env:
            from sandboxrun.cli.env_input import explicit_env
            from sandboxrun.cli.report import use_secrets

            request["env"] = explicit_env(args.env, [], os.environ)
            use_secrets(request["env"])
        conn = client.connect(args.name, timeout=None)
    except Exception as exc:
        return _failure(exc, json_out)
    writer = _Out(quiet=json_out)
    cancels = [0]

    def cancel(signum: int, frame: object) -> None:
        cancels[0] += 1
        if cancels[0] > 1:  # a second one: leave (the keeper cancels the run when we go)
            conn.close()
            os._exit(130)
        try:
            conn.send({"op": "cancel"})
        except OSError:
            os._exit(130)

    signal.signal(signal.SIGINT, cancel)
    signal.signal(signal.SIGTERM, cancel)
    try:
        stdin = (lambda: os.read(0, 1 << 16)) if args.interactive else None
        final = client.run_exec(conn, request, writer, stdin)
    except Exception as exc:
        writer.flush()
        return _failure(exc, json_out)
    finally:
        conn.close()
    writer.flush()
    if json_out:
        write_out(str(final["result"]) + "\n")
    for line in final.get("notes") or []:
        say(str(line))
    return int(final["exit"])


OWN_OPTIONS = frozenset(
    ["-t", "--timeout", "--idle-timeout", "-C", "--workdir", "-e", "--env", "--shell", "-i",
     "--interactive", "--json"]
)  # fmt: skip


def _failure(exc: BaseException, json_out: bool) -> int:
    try:
        _fail(exc, json_out)
    except typer.Exit as done:
        return int(done.exit_code)


class _Out:
    """The output as it comes: raw bytes to stdout/stderr, control sequences neutralized on a
    terminal (as ``run`` does)."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self.fds = {"stdout": 1, "stderr": 2}
        self.sanitizers: dict[str, Any] = {}
        for stream, fd in self.fds.items():
            if os.isatty(fd):
                from sandboxrun.engine.sanitize import TerminalSanitizer

                self.sanitizers[stream] = TerminalSanitizer()

    def __call__(self, stream: str, data: bytes) -> None:
        if self.quiet or stream not in self.fds:
            return
        sanitizer = self.sanitizers.get(stream)
        if sanitizer is not None:
            data = sanitizer.feed(data)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fds[stream], view) :]
        except OSError:
            self.quiet = self.quiet or stream == "stdout"  # a reader gone: the rest not shown

    def flush(self) -> None:
        for stream, sanitizer in self.sanitizers.items():
            tail = sanitizer.flush() if hasattr(sanitizer, "flush") else b""
            if tail:
                self(stream, tail)


def _input_error(message: str) -> Exception:
    from sandboxrun.errors import InputError

    return InputError(message)


def _duration(text: str, option: str) -> float:
    from sandboxrun.units import parse_duration

    return parse_duration(text, what=option)


@app.command("ls")
def ls(
    json_out: Annotated[bool, typer.Option("--json", help="one JSON object a line")] = False,
) -> None:
    """List the sandboxes made by `sandboxrun create` (yours)."""
    from sandboxrun.cli.report import json_line, write_out
    from sandboxrun.detached import client

    try:
        found = client.listing()
    except Exception as exc:
        _fail(exc, json_out)
    if json_out:
        write_out("".join(json_line(item) + "\n" for item in found))
        return
    from sandboxrun.units import format_duration

    rows = [("NAME", "BACKEND", "RUNNING", "EXPIRES", "WORKSPACE")]
    for item in found:
        if "error" in item:
            rows.append((item["name"], "?", "?", "?", item["error"]))
            continue
        left = [v for v in (item.get("expires_in_s"), item.get("idle_expires_in_s")) if v]
        expires = format_duration(max(0.0, min(left))) if left else "never"
        rows.append(
            (item["name"], str(item["backend"]), str(item["running"]), expires, item["workspace"])
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = (
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[4]]) for r in rows
    )
    write_out("".join(line.rstrip() + "\n" for line in lines))


@app.command("rm")
def rm(
    names: Annotated[list[str], typer.Argument(metavar="NAME...", help="the sandboxes")],
    force: Annotated[
        bool,
        typer.Option(
            "-f", "--force", help="end commands still running (else refused); kill a stuck keeper"
        ),
    ] = False,
) -> None:
    """Remove sandboxes made by `sandboxrun create`, with every process: nothing is left."""
    from sandboxrun.cli.report import EXIT_SANDBOX, EXIT_USAGE, say
    from sandboxrun.detached import client
    from sandboxrun.errors import InputError

    status = 0
    for name in names:
        try:
            answer = client.remove(name, force=force)
        except Exception as exc:
            say(f"sandboxrun: error: {exc}")
            status = status or (EXIT_USAGE if isinstance(exc, InputError) else EXIT_SANDBOX)
            continue
        for warning in answer.get("warnings") or []:
            say(f"sandboxrun: warning: {warning}")
        sys.stdout.write(f"{name}\n")
    sys.stdout.flush()
    raise typer.Exit(status)
