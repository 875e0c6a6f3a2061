"""The ``sandboxrun`` command line (typer). Exit statuses: see ``report.exit_status`` and
docs/cli.md.

Start-up is kept fast (``bench/cli_startup.py``): this package and its command modules import
only typer and the standard library at module level; the engine, pydantic models and anyio are
imported inside the commands that need them.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Run untrusted commands against a workspace with OS-level isolation.",
)

from sandboxrun.cli import admin, image, run  # noqa: E402  (registers the commands)

__all__ = ["admin", "app", "image", "main", "run"]


def main() -> None:
    """The ``sandboxrun`` console script."""
    app(prog_name="sandboxrun")
