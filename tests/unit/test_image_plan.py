"""What an image build decides from its facts: the builder, the buildx argv, reuse or rebuild."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxrun.image.plan import (
    LABEL_BASE,
    LABEL_BASE_ID,
    LABEL_CONTEXT,
    Builder,
    Recorded,
    base_of,
    buildx_argv,
    choose_builder,
    context_digest,
    decide,
    project_tag,
    short_id,
)

BUILDX_OK = (0, "github.com/docker/buildx v0.17.1 257815a\n")
BUILDX_MISSING = (
    1,
    "docker: unknown command: docker buildx\n\nRun 'docker --help' for more information\n",
)


@pytest.mark.parametrize(
    ("cli", "buildx", "env", "kind", "why"),
    [
        ("/usr/bin/docker", BUILDX_OK, {}, "buildkit", "github.com/docker/buildx v0.17.1 257815a"),
        ("/usr/bin/docker", (0, ""), {}, "buildkit", "docker buildx"),
        (
            "/usr/bin/docker",
            BUILDX_MISSING,  # this host: docker 28 CLI without the buildx plugin
            {},
            "legacy",
            "docker buildx is not installed (exit 1: docker: unknown command: docker buildx)",
        ),
        ("/usr/bin/docker", (127, ""), {}, "legacy", "docker buildx is not installed (exit 127)"),
        (
            None,
            None,
            {},
            "legacy",
            "BuildKit needs the docker CLI with buildx; no docker CLI found",
        ),
        ("/usr/bin/docker", None, {}, "legacy", "docker buildx was not probed"),
        ("/usr/bin/docker", BUILDX_OK, {"DOCKER_BUILDKIT": "0"}, "legacy", "DOCKER_BUILDKIT=0"),
        ("/usr/bin/docker", BUILDX_OK, {"DOCKER_BUILDKIT": "false"}, "legacy", "DOCKER_BUILDKIT=0"),
        (
            "/usr/bin/docker",
            BUILDX_OK,
            {"DOCKER_BUILDKIT": "1"},
            "buildkit",
            "github.com/docker/buildx v0.17.1 257815a",
        ),
        ("/usr/bin/docker", BUILDX_MISSING, {"DOCKER_BUILDKIT": "1"}, "legacy", None),
    ],
)
def test_choose_builder(
    cli: str | None, buildx: tuple[int, str] | None, env: dict[str, str], kind: str, why: str | None
) -> None:
    builder = choose_builder(cli, buildx, env)
    assert builder.kind == kind
    if why is not None:
        assert builder.why == why
    assert builder.label == ("BuildKit" if kind == "buildkit" else "the legacy builder")


def test_builder_labels() -> None:
    assert Builder("buildkit", "x").label == "BuildKit"
    assert Builder("legacy", "x").label == "the legacy builder"


def test_buildx_argv() -> None:
    argv = buildx_argv(
        "/usr/bin/docker",
        tag="sandboxrun/base:0.1.0",
        context=Path("/src/images/base"),
        build_args={"BASE_IMAGE": "sandboxrun/bootstrap:bookworm"},
        labels={LABEL_BASE: "sandboxrun/bootstrap:bookworm", LABEL_BASE_ID: "sha256:ab"},
    )
    assert argv == [
        "/usr/bin/docker",
        "buildx",
        "build",
        "--load",
        "--progress=plain",
        "--tag",
        "sandboxrun/base:0.1.0",
        "--build-arg",
        "BASE_IMAGE=sandboxrun/bootstrap:bookworm",
        "--label",
        "sandboxrun.base=sandboxrun/bootstrap:bookworm",
        "--label",
        "sandboxrun.base-id=sha256:ab",
        "/src/images/base",
    ]


A = Recorded("sandboxrun/bootstrap:bookworm", "sha256:" + "a" * 64, "sha256:ctx1")
TAG = "sandboxrun/base:0.1.0"


def test_recorded_labels_round_trip() -> None:
    assert A.labels() == {
        LABEL_BASE: A.base,
        LABEL_BASE_ID: A.base_id,
        LABEL_CONTEXT: A.context,
    }
    assert Recorded.from_labels(A.labels()) == A
    assert Recorded.from_labels({**A.labels(), "other": "x"}) == A
    assert Recorded.from_labels({LABEL_BASE: A.base, LABEL_BASE_ID: A.base_id}) == Recorded(
        A.base, A.base_id, ""
    )
    assert Recorded.from_labels({LABEL_BASE: A.base}) is None
    assert Recorded.from_labels({}) is None
    assert Recorded.from_labels(None) is None


def test_short_id() -> None:
    assert short_id("sha256:" + "0123456789abcdef" * 4) == "0123456789ab"
    assert short_id("4ce7badc0b54") == "4ce7badc0b54"


def test_first_build_says_nothing() -> None:
    assert decide(TAG, None, False, A, force=False).reuse is False
    assert decide(TAG, None, False, A, force=True).message is None


def test_same_base_and_context_reuses() -> None:
    decision = decide(TAG, A, True, A, force=False)
    assert decision.reuse is True
    assert decision.message == (
        f"reusing {TAG} (built on sandboxrun/bootstrap:bookworm, aaaaaaaaaaaa; --force rebuilds it)"
    )


def test_force_rebuilds() -> None:
    decision = decide(TAG, A, True, A, force=True)
    assert (decision.reuse, decision.message) == (False, f"rebuilding {TAG} (--force)")


def test_an_image_without_a_recorded_base_is_rebuilt() -> None:
    decision = decide(TAG, None, True, A, force=False)
    assert decision.reuse is False
    assert (
        decision.message == f"rebuilding {TAG}: it records no base (built by an older sandboxrun)"
    )


def test_another_base_ref_rebuilds() -> None:
    wanted = Recorded("debian:bookworm-slim", "sha256:" + "b" * 64, A.context)
    decision = decide(TAG, A, True, wanted, force=False)
    assert decision.reuse is False
    assert decision.message == (
        f"rebuilding {TAG}: base changed from sandboxrun/bootstrap:bookworm (aaaaaaaaaaaa) "
        "to debian:bookworm-slim (bbbbbbbbbbbb)"
    )


def test_same_ref_other_image_rebuilds() -> None:
    wanted = Recorded(A.base, "sha256:" + "c" * 64, A.context)
    decision = decide(TAG, A, True, wanted, force=False)
    assert decision.reuse is False
    assert decision.message == (
        f"rebuilding {TAG}: base sandboxrun/bootstrap:bookworm changed from aaaaaaaaaaaa "
        "to cccccccccccc"
    )


def test_changed_context_rebuilds() -> None:
    wanted = Recorded(A.base, A.base_id, "sha256:ctx2")
    decision = decide(TAG, A, True, wanted, force=False)
    assert (decision.reuse, decision.message) == (
        False,
        f"rebuilding {TAG}: its build context changed",
    )


def test_context_digest() -> None:
    one = [("Dockerfile", False, b"FROM x\n"), ("profile.sh", False, b"PATH=/bin\n")]
    digest = context_digest(one)
    assert digest.startswith("sha256:") and len(digest) == 7 + 64
    assert context_digest(list(one)) == digest
    assert context_digest([one[0], ("profile.sh", False, b"PATH=/usr/bin\n")]) != digest
    assert context_digest([one[0], ("profile.sh", True, b"PATH=/bin\n")]) != digest  # mode
    assert context_digest([one[0], ("other.sh", False, b"PATH=/bin\n")]) != digest  # name
    assert context_digest([one[0]]) != digest
    # no ambiguity between where a name ends and its content starts
    assert context_digest([("ab", False, b"c")]) != context_digest([("a", False, b"bc")])


def test_buildx_argv_without_the_cache_under_force() -> None:
    args = {"tag": "t:1", "context": Path("/ctx"), "build_args": {}, "labels": {}}
    assert "--no-cache" in buildx_argv("docker", no_cache=True, **args)  # type: ignore[arg-type]
    assert "--no-cache" not in buildx_argv("docker", **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "base"),
    [
        ("ARG BASE_IMAGE=debian\nFROM ${BASE_IMAGE}\nRUN x\n", None),
        ("ARG BASE_IMAGE\nfrom $BASE_IMAGE AS build\n", None),
        ("FROM sandboxrun/base:latest\nUSER root\n", "sandboxrun/base:latest"),
        (
            "# syntax=docker/dockerfile:1\nFROM --platform=linux/amd64 python:3.12 AS b\n",
            "python:3.12",
        ),
        ("RUN nothing\n", None),
    ],
)
def test_base_of_a_dockerfile(text: str, base: str | None) -> None:
    assert base_of(text) == base


def test_project_tag_is_named_by_content() -> None:
    assert project_tag("sha256:" + "ab" * 32) == "sandboxrun/project:" + "ab" * 6


def test_which_file_is_the_dockerfile_is_part_of_the_digest() -> None:
    files = [("Dockerfile", False, b"FROM x\n"), ("alt.Dockerfile", False, b"FROM y\n")]
    default = context_digest(files)
    assert context_digest(files, dockerfile="Dockerfile") == default  # old digests kept
    alt = context_digest(files, dockerfile="alt.Dockerfile")
    assert alt != default and context_digest(files, dockerfile="sub/Dockerfile") != alt


def test_buildx_argv_names_a_dockerfile_other_than_the_contexts() -> None:
    common = {"tag": "t", "context": Path("/ctx"), "build_args": {}, "labels": {}}
    plain = buildx_argv("docker", **common)  # type: ignore[arg-type]
    same = buildx_argv("docker", **common, dockerfile=Path("/ctx/Dockerfile"))  # type: ignore[arg-type]
    assert plain == same and "--file" not in plain
    other = buildx_argv("docker", **common, dockerfile=Path("/ctx/env/Dockerfile.gpu"))  # type: ignore[arg-type]
    assert other[other.index("--file") + 1] == "/ctx/env/Dockerfile.gpu" and other[-1] == "/ctx"


def test_content_in_chunks_digests_as_bytes_do() -> None:
    whole = [("a", False, b"hello world"), ("b", True, b"")]
    chunked = [("a", False, (11, [b"hello", b" ", b"world"])), ("b", True, (0, []))]
    assert context_digest(chunked) == context_digest(whole)


def test_final_base_follows_the_stages() -> None:
    from sandboxrun.image.plan import final_base

    assert final_base("FROM a:1\nRUN x\n") == "a:1"
    assert final_base("FROM a:1 AS build\nFROM b:2\nCOPY --from=build /x /x\n") == "b:2"
    assert final_base("FROM a:1 AS base\nFROM base AS dev\nFROM dev\n") == "a:1"
    assert final_base("FROM --platform=linux/amd64 c:3 as x\n") == "c:3"
    assert final_base("RUN nothing\n") is None
    # a FROM word inside a continued instruction is not an instruction
    assert final_base("FROM a:1\nRUN echo \\\n  from foo\n") == "a:1"
    assert final_base("FROM a:1\nRUN echo \\  \r\n  FROM foo AS bar\n") == "a:1"


def test_dockerignore_leaves_out_what_the_engine_is_not_sent(tmp_path: Path) -> None:
    """A file ``.dockerignore`` excludes changes nothing the build sees: it neither counts in
    the digest (no rebuild when it changes) nor is read (a large dataset is not hashed)."""
    from sandboxrun.image.build import context_files
    from sandboxrun.image.source import planned_tag

    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "app.py").write_text("print(1)\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (tmp_path / "data" / "keep.txt").write_text("kept\n")
    (tmp_path / "notes.md").write_text("x\n")
    (tmp_path / ".dockerignore").write_text(
        "# comment\n\ndata/\n!data/keep.txt\n*.md\nDockerfile\n"
    )
    names = [name for name, _, _ in context_files(tmp_path)]
    assert names == [".dockerignore", "Dockerfile", "app.py", "data/keep.txt"]  # Dockerfile: always
    tag = planned_tag(tmp_path)
    (tmp_path / "data" / "big.bin").write_bytes(b"\1" * 2000)
    (tmp_path / "notes.md").write_text("changed\n")
    assert planned_tag(tmp_path) == tag  # ignored: no new image
    (tmp_path / "data" / "keep.txt").write_text("changed\n")
    assert planned_tag(tmp_path) != tag
    (tmp_path / ".dockerignore").unlink()
    assert "notes.md" in [name for name, _, _ in context_files(tmp_path)]
