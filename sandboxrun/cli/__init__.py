"""The ``sandboxrun`` command line (typer). Exit statuses: see ``report.exit_status`` and
docs/cli.md.

Start-up is kept fast (``bench/cli_startup.py``): this package and its command modules import
only typer and the standard library at module level; the engine, pydantic models and anyio are
imported inside the commands that need them.

Every error is one ``sandboxrun: error: <message>`` line on stderr (at most one hint line
more); a command given ``--json`` also prints ``{"error": {...}}`` on stdout, also for errors
of the command line itself (``main`` runs the app with ``standalone_mode=False`` and formats
click's exceptions, never typer's boxes).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer

from sandboxrun.cli import (
    admin,
    app,
    detached,
    image,
    run,
    shell,
)  # registers the commands on cli.app

__all__ = ["admin", "detached", "image", "main", "run", "shell"]


def _click_errors() -> tuple[type[BaseException], ...]:
    """The exception classes of click's command-line errors: typer's vendored click (typer
    0.2x) and click itself (older typer). Evaluated only when an exception is on its way."""
    found: list[type[BaseException]] = [typer.TyperException]
    try:
        import click
    except ImportError:  # pragma: no cover - typer 0.2x no longer needs click
        return tuple(found)
    return (*found, click.ClickException)


def _json_asked(ctx: Any, argv: Sequence[str]) -> bool:
    """Whether the failing command has a ``--json`` option and its part of ``argv`` holds it."""
    from sandboxrun.cli.options import json_requested

    params = list(getattr(getattr(ctx, "command", None), "params", []))
    if not any("--json" in getattr(p, "opts", ()) for p in params):
        return False
    words = list(argv)
    for name in str(ctx.command_path).split()[1:]:  # skip to the failing command's own words
        if name in words:
            words = words[words.index(name) + 1 :]
    takes_value = {
        name
        for p in params
        if getattr(p, "param_type_name", "") == "option"
        and not getattr(p, "is_flag", False)
        and not getattr(p, "count", False)
        for name in [*p.opts, *getattr(p, "secondary_opts", [])]
    }
    return json_requested(words, takes_value)


def _command_line_error(exc: BaseException, argv: Sequence[str]) -> int:
    """Say a click error in sandboxrun's one style (and as JSON after ``--json``): its status."""
    from sandboxrun.cli.options import TTY_HABIT, tty_habit
    from sandboxrun.cli.report import EXIT_USAGE, fail

    status = int(getattr(exc, "exit_code", 2))
    usage = status == 2  # click's status for a usage error: sandboxrun's own, 125
    if usage:
        status = EXIT_USAGE
    if type(exc).__name__ == "NoArgsIsHelpError":  # bare `sandboxrun`: the help, as docker's
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        return 0
    ctx = getattr(exc, "ctx", None)
    format_message = getattr(exc, "format_message", None)
    message = str(format_message() if callable(format_message) else exc).strip().rstrip(".")
    message = message.replace("Value error, ", "")  # typer's pydantic coercion
    message = message[:1].lower() + message[1:]
    param = getattr(exc, "param", None)
    is_option = getattr(param, "param_type_name", None) == "option"
    names: list[str] = list(getattr(param, "opts", None) or []) if is_option else []
    option = max(names, key=len) if names else None
    hint = f"Try '{ctx.command_path} --help' for help." if ctx is not None else None
    if type(exc).__name__ == "NoSuchOption":
        message, hint = _unknown_option(exc, ctx, hint)
    if ctx is not None and str(ctx.command_path).endswith(" run") and tty_habit(argv):
        hint = TTY_HABIT
    json_out = ctx is not None and _json_asked(ctx, argv)
    kind = "UsageError" if usage else type(exc).__name__
    return fail(status, message, json_out=json_out, kind=kind, hint=hint, option=option).exit_code


def _unknown_option(exc: BaseException, ctx: Any, hint: str | None) -> tuple[str, str | None]:
    """``no such option: --x``, with the options it may have meant (``close_options``: real
    ones, never click's far guesses) and, for a ``docker run`` habit, what it is here."""
    from sandboxrun.cli.options import DOCKER_HABITS, close_options

    word = str(getattr(exc, "option_name", "") or "")
    known = [n for p in getattr(getattr(ctx, "command", None), "params", []) for n in p.opts]
    close = close_options(word, known)
    message = f"no such option: {word}"
    if close:
        message += f" (did you mean {' or '.join(close)}?)"
    return message, DOCKER_HABITS.get(word.split("=", 1)[0], hint)


def main(args: Sequence[str] | None = None) -> None:
    """The ``sandboxrun`` console script (``args``: the words after the program name)."""
    from sandboxrun.cli.options import assignments_in
    from sandboxrun.cli.report import use_command_line, use_secrets

    argv = list(sys.argv[1:] if args is None else args)
    use_secrets(assignments_in(argv))  # until `run` knows its -e values: click's errors too
    use_command_line(argv)
    if argv[:1] == ["exec"]:  # its fast path: typer's own parsing costs ~150 ms
        from sandboxrun.cli.exec_args import parse

        parsed = parse(argv[1:])
        if parsed is not None:
            sys.exit(detached.exec_main(parsed))
    try:
        code = app.app(args=argv, prog_name="sandboxrun", standalone_mode=False)
    except _click_errors() as exc:
        code = _command_line_error(exc, argv)
    except typer.Abort:
        from sandboxrun.cli.report import fail

        code = fail(130, "interrupted").exit_code  # click's word for ^C (KeyboardInterrupt)
    sys.exit(code if isinstance(code, int) else 0)
