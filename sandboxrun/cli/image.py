"""``sandboxrun image bootstrap|build``: sandbox images, offline too.

The tag goes to stdout (scripts read it); the progress display, notes and errors to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sandboxrun.cli.app import app
from sandboxrun.cli.report import EXIT_SANDBOX, EXIT_USAGE, fail
from sandboxrun.errors import BackendError, InputError, SandboxUnavailableError

if TYPE_CHECKING:
    from sandboxrun.image.build import ImageResult
    from sandboxrun.image.progress import Display

image_app = typer.Typer(no_args_is_help=True, help="Build sandbox images (offline too).")
app.add_typer(image_app, name="image")

Verbose = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Show the raw debootstrap / build log lines (by default only the phases; the "
        "last 20 lines are shown when it fails).",
    ),
]


def _finish(display: Display, result: ImageResult) -> None:
    if result.reused:
        display.close()
    else:
        display.done(f"made {result.tag} with {result.how}")
    sys.stdout.write(result.tag + "\n")


def _failed(display: Display, exc: Exception) -> typer.Exit:
    display.failed()
    code = EXIT_USAGE if isinstance(exc, InputError) else EXIT_SANDBOX
    return fail(code, str(exc))


@image_app.command("bootstrap")
def image_bootstrap(
    force: Annotated[
        bool, typer.Option("--force", help="Bootstrap again even if the image exists.")
    ] = False,
    verbose: Verbose = False,
) -> None:
    """Debootstrap Debian from the host's apt sources and import it as
    sandboxrun/bootstrap:<suite> (no registry needed; root and debootstrap are)."""
    from sandboxrun.image import build as images
    from sandboxrun.image.progress import Display

    with Display("image bootstrap", verbose=verbose) as display:
        try:
            result = images.bootstrap(display, force=force)
        except (InputError, SandboxUnavailableError, BackendError) as exc:
            raise _failed(display, exc) from None
        _finish(display, result)


@image_app.command("build")
def image_build(
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            help="The base image (BASE_IMAGE build argument). Default: the offline bootstrap "
            "(sandboxrun/bootstrap:<suite>) if it exists, else debian:bookworm-slim. A "
            "different base than the existing image's rebuilds it.",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Rebuild even if the image is up to date.")
    ] = False,
    tag: Annotated[
        str | None,
        typer.Option(
            "--tag",
            help="The image to build. Default: sandboxrun/base:<version>, also tagged :latest.",
        ),
    ] = None,
    context: Annotated[
        Path | None,
        typer.Option(
            "--context",
            help="The build context (a directory with a Dockerfile taking ARG BASE_IMAGE). "
            "Default: sandboxrun's images/base.",
        ),
    ] = None,
    verbose: Verbose = False,
) -> None:
    """Build images/base as sandboxrun/base:<version> and :latest, with BuildKit where docker
    buildx is installed, else the legacy builder. Reuses the image when its recorded base (ref
    and id) and build context are unchanged."""
    from sandboxrun.image import build as images
    from sandboxrun.image.progress import Display

    with Display("image build", verbose=verbose) as display:
        try:
            result = images.build(display, base=base, force=force, tag=tag, context=context)
        except (InputError, SandboxUnavailableError, BackendError) as exc:
            raise _failed(display, exc) from None
        _finish(display, result)
