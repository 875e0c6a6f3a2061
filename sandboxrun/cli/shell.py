"""``sandboxrun shell``: an interactive terminal in a sandbox, like ``docker exec -it``
(``docs/terminals.md``).

The user's terminal is put in raw mode and restored on every way out (the shell's exit, ^C
typed (it goes to the sandbox's foreground job), SIGTERM or SIGHUP to this process, the
sandbox's death). Keystrokes go to the sandbox's terminal as they are; its output comes back
through the interactive filter (``engine.terminal_text.InteractiveFilter``: no clipboard write,
no query, no passthrough) unless ``--raw``; a change of the window's size is passed on. The
exit status is the shell's (``report.exit_status``).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, cast

import typer

from sandboxrun.cli import settings
from sandboxrun.cli.app import app
from sandboxrun.cli.env_input import explicit_env
from sandboxrun.cli.report import EXIT_SANDBOX, exit_status, fail, use_secrets

if TYPE_CHECKING:
    from sandboxrun.api.sandbox import Sandbox
    from sandboxrun.api.terminal import Terminal
    from sandboxrun.cli.run import Access, Backend
    from sandboxrun.models import ExecResult

RESIZE_DEBOUNCE_S = 0.05
NOT_A_TTY = (
    "the input device is not a TTY: `sandboxrun shell` needs a terminal on stdin and stdout "
    "(use `sandboxrun run -i` to feed a command's stdin from a pipe)"
)


@app.command(context_settings={"allow_interspersed_args": False})
def shell(
    command: Annotated[
        list[str] | None, typer.Argument(metavar="[COMMAND]...", show_default=False)
    ] = None,
    workspace: Annotated[
        Path,
        typer.Option("-w", "--workspace", metavar="DIR", help="host directory to work on"),
    ] = Path(),
    workdir: Annotated[
        str | None,
        typer.Option("-C", "--workdir", metavar="PATH", help="working directory in the workspace"),
    ] = None,
    backend: Annotated[
        Literal["auto", "docker", "systemd-scope", "process-group"] | None,
        typer.Option("-b", "--backend", metavar="BACKEND", help="as for `sandboxrun run`"),
    ] = None,
    policy: Annotated[
        Literal["read-only", "workspace-write", "danger-full-access"] | None,
        typer.Option("--policy", metavar="POLICY", help="as for `sandboxrun run`"),
    ] = None,
    network: Annotated[
        Literal["none", "on"] | None,
        typer.Option("--network", metavar="none|on", help="as for `sandboxrun run`"),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "-e", "--env", metavar="NAME[=VALUE]", help="as for `sandboxrun run` (repeatable)"
        ),
    ] = None,
    env_file: Annotated[
        list[Path] | None,
        typer.Option("--env-file", metavar="FILE", help="as for `sandboxrun run` (repeatable)"),
    ] = None,
    image: Annotated[
        str | None, typer.Option("--image", metavar="IMAGE", help="docker image")
    ] = None,
    user: Annotated[str | None, typer.Option("--user", metavar="UID[:GID]")] = None,
    term: Annotated[
        str, typer.Option("--term", metavar="TERM", help="TERM in the sandbox (default: yours)")
    ] = "",
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="pass the sandbox's output to your terminal unfiltered (clipboard writes, "
            "queries and passthrough included)",
        ),
    ] = False,
) -> None:
    """Open an interactive shell (or COMMAND) on a terminal in a sandbox over the workspace,
    like `docker exec -it`; exit with its status. ^C goes to the sandbox's foreground job."""
    logging.getLogger("sandboxrun").addHandler(logging.NullHandler())
    logging.getLogger("sandboxrun").propagate = False
    if not (os.isatty(0) and os.isatty(1)):
        raise typer.Exit(fail(EXIT_SANDBOX, NOT_A_TTY).exit_code)
    from sandboxrun.cli.run import _error_exit

    try:
        import anyio

        from sandboxrun.api.sandbox import Sandbox
        from sandboxrun.models import Limits, Policy

        explicit = explicit_env(env or [], env_file or [], os.environ)
        use_secrets(explicit)
        given = {"backend": backend, "image": image, "policy": policy, "network": network}
        values = settings.in_force(given)
        sb = Sandbox(
            workspace,
            backend=cast("Backend", settings.required(values, "backend")),
            policy=Policy(
                access=cast("Access", settings.required(values, "policy")),
                network=cast("Literal['none', 'on']", settings.required(values, "network")),
            ),
            limits=Limits(),
            env=explicit,
            image=values["image"].value,
            user=user,
        )
        name = term or os.environ.get("TERM") or "xterm-256color"
        result = anyio.run(_session, sb, command or None, workdir, name, raw)
    except (typer.Exit, SystemExit):
        raise
    except (Exception, KeyboardInterrupt) as exc:
        raise _error_exit(exc, False) from None
    if result.status in ("sandbox_error", "spawn_error") and result.error:
        fail(exit_status(result), result.error)
    raise typer.Exit(exit_status(result))


async def _session(
    sb: Sandbox, argv: list[str] | None, workdir: str | None, term: str, raw: bool
) -> ExecResult:
    import termios
    import tty

    import anyio

    size = os.get_terminal_size(1)
    saved = termios.tcgetattr(0)
    async with sb:
        terminal = await sb.open_terminal(
            argv, rows=max(1, size.lines), cols=max(1, size.columns), term=term, workdir=workdir
        )
        try:
            tty.setraw(0)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_keys, terminal)
                tg.start_soon(_resizes, terminal)
                tg.start_soon(_hangups, terminal)
                await _screen(terminal, raw)
                tg.cancel_scope.cancel()
        finally:
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
        return await terminal.close()


async def _screen(terminal: Terminal, raw: bool) -> None:
    """The terminal's output to ours until its end."""
    from sandboxrun.engine.terminal_text import InteractiveFilter

    shown = None if raw else InteractiveFilter()
    offset = 0
    while True:
        chunk = await terminal.next_output(offset, 1 << 16)
        offset = chunk.next_offset
        data = chunk.data if shown is None else shown.feed(chunk.data, final=chunk.eof)
        _write(data)
        if chunk.eof:
            return


def _write(data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(1, view) :]
        except BlockingIOError:
            continue
        except OSError:  # our terminal is gone: nothing to show it on
            return


async def _keys(terminal: Terminal) -> None:
    """Our keystrokes to the sandbox's terminal, as they are (^C too)."""
    import anyio

    while True:
        await anyio.wait_readable(0)
        try:
            data = os.read(0, 4096)
        except BlockingIOError:
            continue
        if not data:
            return
        try:
            await terminal.write(data, timeout=None)
        except BrokenPipeError:
            return


async def _resizes(terminal: Terminal) -> None:
    """SIGWINCH: the new size of our window, debounced, to the sandbox's terminal."""
    import anyio

    with anyio.open_signal_receiver(signal.SIGWINCH) as received:
        async for _ in received:
            await anyio.sleep(RESIZE_DEBOUNCE_S)
            size = os.get_terminal_size(1)
            await terminal.resize(max(1, size.lines), max(1, size.columns))


async def _hangups(terminal: Terminal) -> None:
    """SIGTERM, SIGHUP or SIGINT sent to this process: the terminal is closed (our own
    terminal is restored on the way out)."""
    import anyio

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as received:
        async for _ in received:
            await terminal.close()
            return


__all__ = ["shell"]
