"""What an image build will do, decided from facts gathered elsewhere. Pure, no I/O.

- ``choose_builder``: BuildKit (``docker buildx build --load``) when ``docker buildx version``
  works, else the Engine API's legacy builder;
- ``Recorded`` / ``decide``: a built image records its base (ref and image id) and a digest of
  its build context in labels; an existing image is reused only when all three match.
"""

from __future__ import annotations

import hashlib
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
) -> list[str]:
    """``docker buildx build --load``: the image lands in the engine's store, as with the legacy
    builder; plain progress, one line per event, for the phase parser."""
    argv = [docker_cli, "buildx", "build", "--load", "--progress=plain", "--tag", tag]
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


def context_digest(files: Iterable[tuple[str, bool, bytes]]) -> str:
    """A digest of a build context: ``(relative path, executable, content)`` per file, in path
    order (read lazily: one file in memory at a time)."""
    digest = hashlib.sha256()
    for name, executable, content in files:
        digest.update(f"{name}\0{int(executable)}\0{len(content)}\0".encode())
        digest.update(content)
    return "sha256:" + digest.hexdigest()
