"""The message for an image that is not on the engine: the default image is built by sandboxrun,
any other is pulled where its registry has it, else built or loaded."""

from __future__ import annotations

import pytest

from sandboxrun.backends.docker.hint import (
    RegistryAnswer,
    classify,
    is_default_image,
    message,
    repository,
)

DIAL = (
    'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io on '
    "10.255.255.53:53: no such host"
)  # this engine's answer (no registry reachable here)


@pytest.mark.parametrize(
    ("image", "repo"),
    [
        ("python:3.12-slim", "python"),
        ("python", "python"),
        ("sandboxrun/base:latest", "sandboxrun/base"),
        ("sandboxrun/base", "sandboxrun/base"),
        ("docker.io/sandboxrun/base:0.1.0", "sandboxrun/base"),
        ("sandboxrun/base@sha256:abc", "sandboxrun/base"),
        ("sandboxrun/base:1@sha256:abc", "sandboxrun/base"),
        ("localhost:5000/team/img:2", "localhost:5000/team/img"),
        ("localhost:5000/team/img", "localhost:5000/team/img"),
        ("sandboxrun/base-dev:1", "sandboxrun/base-dev"),
    ],
)
def test_repository(image: str, repo: str) -> None:
    assert repository(image) == repo


def test_only_sandboxrun_base_is_the_default_image() -> None:
    assert is_default_image("sandboxrun/base:latest")
    assert is_default_image("sandboxrun/base:0.1.0")
    assert not is_default_image("sandboxrun/bootstrap:bookworm")
    assert not is_default_image("python:3.12-slim")
    assert not is_default_image("example.com/sandboxrun/base:1")


@pytest.mark.parametrize(
    ("status", "explanation", "state"),
    [
        (500, DIAL, "unreachable"),
        (500, 'Get "https://r.example/v2/": net/http: TLS handshake timeout', "unreachable"),
        (500, "dial tcp 10.0.0.1:443: i/o timeout", "unreachable"),
        (500, "dial tcp 127.0.0.1:5000: connect: connection refused", "unreachable"),
        (500, "Get https://x/v2/: context deadline exceeded", "unreachable"),
        (401, "errors:\ndenied: requested access to the resource is denied", "lacks"),
        (403, "forbidden", "lacks"),
        (404, "manifest unknown", "lacks"),
        (500, "manifest unknown: manifest unknown", "lacks"),
        (500, "something else entirely", "unknown"),
        (None, "", "unknown"),
    ],
)
def test_classify(status: int | None, explanation: str, state: str) -> None:
    assert classify(status, explanation).state == state


def test_classify_trims_the_url_and_bounds_the_detail() -> None:
    answer = classify(500, DIAL)
    assert (
        answer.detail == "dial tcp: lookup registry-1.docker.io on 10.255.255.53:53: no such host"
    )
    assert len(classify(500, "x" * 500).detail) == 160


def test_default_image_says_how_sandboxrun_builds_it() -> None:
    for answer in (None, RegistryAnswer("has"), RegistryAnswer("unreachable", "x")):
        assert message("sandboxrun/base:latest", answer) == (
            "image sandboxrun/base:latest not found (build it: sandboxrun image bootstrap && "
            "sandboxrun image build)"
        )


def test_an_image_the_registry_has_is_pulled() -> None:
    text = message("python:3.12-slim", RegistryAnswer("has"))
    assert text == (
        "image python:3.12-slim is not on this Docker engine: "
        "pull it (docker pull python:3.12-slim)"
    )


def test_without_a_registry_build_or_load_it() -> None:
    text = message("python:3.12-slim", classify(500, DIAL))
    assert text.startswith(
        "image python:3.12-slim is not on this Docker engine, and no registry is reachable from "
        "the engine (dial tcp: lookup registry-1.docker.io"
    )
    assert "docker build -t python:3.12-slim DIR" in text
    assert "sandboxrun image build --context DIR --tag python:3.12-slim" in text
    assert "docker load -i FILE" in text
    assert "docker pull" not in text and "image bootstrap" not in text


def test_a_registry_without_the_image() -> None:
    text = message("team/tool:1", RegistryAnswer("lacks", "manifest unknown"))
    assert "its registry has no such image or needs a login (manifest unknown)" in text
    assert "docker login" in text and "docker build -t team/tool:1 DIR" in text


@pytest.mark.parametrize(
    "answer", [None, RegistryAnswer("unknown"), RegistryAnswer("unknown", "slow")]
)
def test_an_unknown_registry_gives_both_ways(answer: RegistryAnswer | None) -> None:
    text = message("python:3.12-slim", answer)
    assert "pull it (docker pull python:3.12-slim) if a registry is reachable, or build it" in text
    assert ("(the registry did not say: slow)" in text) == bool(answer and answer.detail)
    assert "image bootstrap" not in text
