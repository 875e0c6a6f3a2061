"""``sandboxrun image bootstrap|build``: sandbox images, offline too."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from sandboxrun.cli import app
from sandboxrun.cli.report import EXIT_SANDBOX, EXIT_USAGE, fail
from sandboxrun.errors import BackendError, InputError, SandboxUnavailableError

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
