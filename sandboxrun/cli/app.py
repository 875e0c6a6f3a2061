"""The Typer application the command modules register on (``admin``, ``image``, ``run``;
``sandboxrun.cli`` imports them). Its own module, so that the command modules import it from
here and not from the package that imports them."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    help="Run untrusted commands against a workspace with OS-level isolation.",
)


def _print_version(value: bool) -> None:
    if value:
        from sandboxrun import __version__

        sys.stdout.write(f"sandboxrun {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="print the version (sandboxrun X.Y.Z) and exit",
        ),
    ] = False,
) -> None:
    """Run untrusted commands against a workspace with OS-level isolation."""
