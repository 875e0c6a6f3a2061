"""An image per task: ``--image-from PATH``, ``sandboxrun.image_from(PATH)``, inspect's
``sandbox=("sandboxrun", "Dockerfile")``.

PATH is a Dockerfile (its directory is the build context) or a directory with a
``Dockerfile``. The image is ``image build --context`` of it: tagged by the content of its
context (``sandboxrun/project:<digest>``), built once and reused while the context and the base
are unchanged; the default tags never move.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandboxrun.errors import ConfigError
from sandboxrun.image.build import ImageResult, build, context_files
from sandboxrun.image.plan import context_digest, project_tag
from sandboxrun.image.progress import Progress


@dataclass(frozen=True)
class Source:
    context: Path
    dockerfile: Path


class _Silent:
    """A ``Progress`` that shows nothing (``image_from`` called without one)."""

    def phase(self, name: str, detail: str = "") -> None:
        pass

    def raw(self, line: str) -> None:
        pass

    def note(self, message: str) -> None:
        pass


def source(path: str | Path, dockerfile: str | None = None) -> Source:
    """Where ``path`` builds from (``dockerfile``: with a directory, its Dockerfile's path in
    it); ``ConfigError`` naming ``path`` when it cannot."""
    where = Path(path).expanduser()
    if dockerfile is not None and not where.is_dir():
        raise ConfigError(f"cannot build an image from {path}: a dockerfile needs a directory")
    if where.is_dir():
        name = dockerfile or "Dockerfile"
        file = where / name
        if not file.is_file():
            raise ConfigError(f"cannot build an image from {path}: the directory has no {name}")
        return Source(where.absolute(), file.absolute())
    if where.is_file():
        return Source(where.absolute().parent, where.absolute())
    if where.exists():
        raise ConfigError(f"cannot build an image from {path}: not a file or directory")
    raise ConfigError(f"cannot build an image from {path}: no such file or directory")


def planned_tag(path: str | Path) -> str:
    """The tag ``image_from(path)`` gives, without building (``run --dry-run``)."""
    src = source(path)
    name = src.dockerfile.relative_to(src.context).as_posix()
    return project_tag(context_digest(context_files(src.context, name), dockerfile=name))


def build_from(
    path: str | Path,
    progress: Progress | None = None,
    *,
    dockerfile: str | None = None,
    force: bool = False,
) -> ImageResult:
    """Build ``path`` (a Dockerfile or a directory with one; ``dockerfile``: its Dockerfile)
    unless an image of that content on that base exists (a reuse is not announced)."""
    src = source(path, dockerfile)
    return build(
        progress if progress is not None else _Silent(),
        context=src.context,
        dockerfile=src.dockerfile,
        force=force,
        say_reuse=False,
    )


def image_from(path: str | Path, *, force: bool = False) -> str:
    """The image of ``path`` (a Dockerfile, or a directory with one), built the first time and
    reused while its build context and base are unchanged: the tag to give ``Sandbox(image=)``.
    Blocking (a build can take minutes: call it in a thread from async code). ``force``:
    build again, without the cache. ``ConfigError`` for a path that cannot be built from,
    ``BackendError`` for a failed build, ``SandboxUnavailableError`` without a Docker engine."""
    return build_from(path, force=force).tag
