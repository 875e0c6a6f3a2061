"""What an image build will do, decided from facts gathered elsewhere. Pure, no I/O.

- ``choose_builder``: BuildKit (``docker buildx build --load``) when ``docker buildx version``
  works, else the Engine API's legacy builder;
- ``Recorded`` / ``decide``: a built image records its base (ref and image id) and a digest of
  its build context in labels; an existing image is reused only when all three match.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

LABEL_BASE = "sandboxrun.base"
LABEL_BASE_ID = "sandboxrun.base-id"
LABEL_CONTEXT = "sandboxrun.context"


@dataclass(frozen=True)
class Builder:
    kind: Literal["buildkit", "legacy"]
    why: str
    """What the choice rests on: the buildx version, or why BuildKit is not used."""

    @property
    def label(self) -> str:
        return "BuildKit" if self.kind == "buildkit" else "the legacy builder"


def choose_builder(
    docker_cli: str | None, buildx: tuple[int, str] | None, env: Mapping[str, str]
) -> Builder:
    """``docker_cli``: the docker CLI's path (None: not installed); ``buildx``: the exit status
    and output of ``docker buildx version`` (None: not run). ``DOCKER_BUILDKIT=0`` asks for the
    legacy builder, as it does of ``docker build``."""
    if env.get("DOCKER_BUILDKIT", "").strip().lower() in ("0", "false", "no"):
        return Builder("legacy", "DOCKER_BUILDKIT=0")
    if docker_cli is None:
        return Builder("legacy", "BuildKit needs the docker CLI with buildx; no docker CLI found")
    if buildx is None:
        return Builder("legacy", "docker buildx was not probed")
    code, output = buildx
    first = output.strip().splitlines()[0].strip() if output.strip() else ""
    if code != 0:
        why = f": {first}" if first else ""
        return Builder("legacy", f"docker buildx is not installed (exit {code}{why})")
    return Builder("buildkit", first or "docker buildx")


def buildx_argv(
    docker_cli: str,
    *,
    tag: str,
    context: Path,
    build_args: Mapping[str, str],
    labels: Mapping[str, str],
    no_cache: bool = False,
    dockerfile: Path | None = None,
) -> list[str]:
    """``docker buildx build --load``: the image lands in the engine's store, as with the legacy
    builder; plain progress, one line per event, for the phase parser. ``no_cache``: every
    step runs again (``--force``)."""
    argv = [docker_cli, "buildx", "build", "--load", "--progress=plain", "--tag", tag]
    if no_cache:
        argv.append("--no-cache")
    if dockerfile is not None and dockerfile != context / "Dockerfile":
        argv += ["--file", str(dockerfile)]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    return [*argv, str(context)]


@dataclass(frozen=True)
class Recorded:
    """What an image was built from: its base's ref and image id, its context's digest."""

    base: str
    base_id: str
    context: str

    def labels(self) -> dict[str, str]:
        return {LABEL_BASE: self.base, LABEL_BASE_ID: self.base_id, LABEL_CONTEXT: self.context}

    @classmethod
    def from_labels(cls, labels: Mapping[str, str] | None) -> Recorded | None:
        labels = labels or {}
        if LABEL_BASE not in labels or LABEL_BASE_ID not in labels:
            return None
        return cls(labels[LABEL_BASE], labels[LABEL_BASE_ID], labels.get(LABEL_CONTEXT, ""))


def short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


@dataclass(frozen=True)
class Decision:
    reuse: bool
    message: str | None
    """What to tell the user (None: nothing worth saying, e.g. a first build)."""


def decide(
    tag: str, existing: Recorded | None, exists: bool, wanted: Recorded, *, force: bool
) -> Decision:
    """Reuse ``tag`` only when it exists and was built on the same base (ref and id) from the
    same context."""
    if not exists:
        return Decision(False, None)
    if force:
        return Decision(False, f"rebuilding {tag} (--force)")
    if existing is None:
        return Decision(
            False, f"rebuilding {tag}: it records no base (built by an older sandboxrun)"
        )
    if existing.base != wanted.base:
        return Decision(
            False,
            f"rebuilding {tag}: base changed from {existing.base} ({short_id(existing.base_id)}) "
            f"to {wanted.base} ({short_id(wanted.base_id)})",
        )
    if existing.base_id != wanted.base_id:
        return Decision(
            False,
            f"rebuilding {tag}: base {wanted.base} changed from {short_id(existing.base_id)} "
            f"to {short_id(wanted.base_id)}",
        )
    if existing.context != wanted.context:
        return Decision(False, f"rebuilding {tag}: its build context changed")
    return Decision(
        True,
        f"reusing {tag} (built on {wanted.base}, {short_id(wanted.base_id)}; --force rebuilds it)",
    )


Content = bytes | tuple[int, Iterable[bytes]]
"""A file's content: its bytes, or ``(size, chunks)`` read as they are hashed."""


def context_digest(
    files: Iterable[tuple[str, bool, Content]], *, dockerfile: str = "Dockerfile"
) -> str:
    """A digest of a build context: ``(relative path, executable, content)`` per file, in path
    order (read lazily: one chunk in memory at a time), and which of its files is the
    Dockerfile (``Dockerfile``, the default, leaves the digest as it always was)."""
    digest = hashlib.sha256()
    if dockerfile != "Dockerfile":
        digest.update(f"dockerfile\0{dockerfile}\0".encode())
    for name, executable, content in files:
        size, chunks = (len(content), (content,)) if isinstance(content, bytes) else content
        digest.update(f"{name}\0{int(executable)}\0{size}\0".encode())
        for chunk in chunks:
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)", re.IGNORECASE | re.MULTILINE)


def base_of(dockerfile: str) -> str | None:
    """The first stage's base of a Dockerfile's text when it is not ``${BASE_IMAGE}`` (the
    build argument sandboxrun passes, offline: the bootstrap); None when it uses it."""
    found = _FROM.search(dockerfile)
    if found is None:
        return None
    ref = found.group(1)
    return None if ref in ("${BASE_IMAGE}", "$BASE_IMAGE") else ref


_STAGE = re.compile(
    r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE | re.MULTILINE
)


def final_base(dockerfile: str) -> str | None:
    """The image the final stage is built on (through earlier stages it names), or None for
    a Dockerfile with no FROM: what the result depends on, for ``Recorded``."""
    stages: dict[str, str] = {}
    last: str | None = None
    joined = re.sub(r"\\[ \t]*\r?\n", " ", dockerfile)  # a continued line is one instruction
    for match in _STAGE.finditer(joined):
        ref, alias = match.group(1), match.group(2)
        ref = stages.get(ref.lower(), ref)
        if alias:
            stages[alias.lower()] = ref
        last = ref
    return last


def project_tag(digest: str) -> str:
    """The tag of a context that is not sandboxrun's own, built without ``--tag``: named by its
    content, so that the default tags (``sandboxrun/base``) never move."""
    return f"sandboxrun/project:{digest.removeprefix('sha256:')[:12]}"
