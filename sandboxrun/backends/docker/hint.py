"""What to say when the docker backend's image is not on the engine: how to get it.

Only the default image (``sandboxrun/base``) is built by ``sandboxrun image bootstrap &&
sandboxrun image build``; any other is pulled where a registry is reachable, or built. Whether one
is reachable is asked of the engine itself (it is the engine that pulls): the distribution
endpoint resolves the image's manifest without pulling it, within the probe's deadline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from sandboxrun.backends.docker.api import Client as DockerClient

DEFAULT_REPO = "sandboxrun/base"
_UNREACHABLE = (
    "dial tcp",
    "no such host",
    "i/o timeout",
    "connection refused",
    "network is unreachable",
    "no route to host",
    "tls handshake timeout",
    "context deadline exceeded",
    "proxyconnect",
    "server misbehaving",
)


@dataclass(frozen=True)
class RegistryAnswer:
    state: Literal["has", "lacks", "unreachable", "unknown"]
    detail: str = ""


def repository(image: str) -> str:
    """``docker.io/sandboxrun/base:1@sha256:..`` -> ``sandboxrun/base``."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        name = name.removeprefix(prefix)
    return name


def is_default_image(image: str) -> bool:
    return repository(image) == DEFAULT_REPO


def classify(status: int | None, explanation: str) -> RegistryAnswer:
    """The engine's answer to a distribution inspect that failed."""
    detail = re.sub(r'^(?:Get|Head) "[^"]*":\s*', "", explanation.strip())
    detail = detail if len(detail) <= 160 else detail[:157] + "..."
    lowered = explanation.lower()
    if any(marker in lowered for marker in _UNREACHABLE):
        return RegistryAnswer("unreachable", detail)
    if status in (401, 403, 404) or "manifest unknown" in lowered or "not found" in lowered:
        return RegistryAnswer("lacks", detail)
    return RegistryAnswer("unknown", detail)


def message(image: str, answer: RegistryAnswer | None) -> str:
    """The probe's reason when ``image`` is not on the engine (``None``: nothing asked)."""
    if is_default_image(image):
        return (
            f"image {image} not found (build it: sandboxrun image bootstrap && "
            "sandboxrun image build)"
        )
    missing = f"image {image} is not on this Docker engine"
    build = (
        f"build it (docker build -t {image} DIR, "
        f"or sandboxrun image build --context DIR --tag {image})"
    )
    if answer is None or answer.state == "unknown":
        why = f" (the registry did not say: {answer.detail})" if answer and answer.detail else ""
        return (
            f"{missing}{why}: pull it (docker pull {image}) if a registry is reachable, or {build}"
        )
    if answer.state == "has":
        return f"{missing}: pull it (docker pull {image})"
    if answer.state == "lacks":
        return (
            f"{missing}, and its registry has no such image or needs a login "
            f"({answer.detail}): check the name, docker login, or {build}"
        )
    return (
        f"{missing}, and no registry is reachable from the engine ({answer.detail}): "
        f"{build}, or load it (docker load -i FILE)"
    )


def ask_registry(client: DockerClient, image: str) -> RegistryAnswer:
    """Whether the engine's registry has ``image``, without pulling it (the client's deadline
    bounds the wait)."""
    from sandboxrun.backends.docker import api as dockerapi
    from sandboxrun.errors import BackendError

    try:
        refused = dockerapi.registry_has(client, image)
    except BackendError as exc:
        return RegistryAnswer("unknown", str(exc))
    return RegistryAnswer("has") if refused is None else classify(*refused)


def missing_image(client: DockerClient, image: str) -> str:
    """The probe's reason for a missing image, with how to get it."""
    if is_default_image(image):
        return message(image, None)
    return message(image, ask_registry(client, image))
