"""The image tools' raw lines read as phases, on lines captured from real runs (image_logs/):
a whole debootstrap of bookworm, debootstrap failures, the legacy builder's stream (Engine API
chunks and the default image's build log); BuildKit's plain progress as buildx prints it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandboxrun.image.phases import (
    BootstrapPhases,
    BuildKitPhases,
    LegacyPhases,
    LineSplitter,
    Phase,
    clean,
    is_noise,
    shorten,
)

LOGS = Path(__file__).parent / "image_logs"


def names(parser: BootstrapPhases | LegacyPhases | BuildKitPhases, lines: list[str]) -> list[str]:
    """The distinct phase names in order (what the plain display prints a line for)."""
    seen: list[str] = []
    for line in lines:
        phase = parser.feed(line)
        if phase is not None and (not seen or seen[-1] != phase.name):
            seen.append(phase.name)
    return seen


def phases(
    parser: BootstrapPhases | LegacyPhases | BuildKitPhases, lines: list[str]
) -> list[Phase | None]:
    return [parser.feed(line) for line in lines]


# -- helpers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain", "plain"),
        ("trailing blanks \t ", "trailing blanks"),
        ("I: Retrieving InRelease \n", "I: Retrieving InRelease"),
        ("\x1b[91mto-stderr", "to-stderr"),
        ("\x1b[0mRemoving intermediate container 1", "Removing intermediate container 1"),
        ("\x1b[1;31mred\x1b[0m", "red"),
        ("10%\r50%\r100%", "100%"),
        ("done\r\n", "done"),
        ("", ""),
    ],
)
def test_clean(raw: str, shown: str) -> None:
    assert clean(raw) == shown


def test_shorten() -> None:
    assert shorten("a   b\n c") == "a b c"
    assert shorten("x" * 72) == "x" * 72
    long = shorten("word " * 40)
    assert len(long) <= 72 and long.endswith("...")
    assert shorten("abcdef", 5) == "ab..."


def test_noise() -> None:
    assert is_noise("DEPRECATED: The legacy builder is deprecated and will be removed in a future")
    assert is_noise("  DEPRECATED: The legacy builder is deprecated")
    assert not is_noise("Step 1/2 : FROM x")


def test_line_splitter_joins_cut_chunks_and_cleans() -> None:
    lines = LineSplitter()
    assert lines.feed("Step 1/6 : ARG X") == []
    assert lines.feed("\n") == ["Step 1/6 : ARG X"]
    assert lines.feed("\x1b[91mto-stderr\n\x1b[0m") == ["to-stderr"]
    assert lines.feed("Removing intermediate container 1\n ---> 2\n") == [
        "Removing intermediate container 1",
        " ---> 2",
    ]
    assert lines.feed("no newline") == []
    assert lines.flush() == ["no newline"]
    assert lines.flush() == []
    assert lines.feed("\n\n") == ["", ""]


# -- debootstrap ------------------------------------------------------------------------------


def test_a_whole_bootstrap_of_bookworm() -> None:
    lines = (LOGS / "debootstrap-bookworm.log").read_text().splitlines()
    parser = BootstrapPhases()
    assert names(parser, lines) == [
        "debootstrap: fetching the package index",
        "debootstrap: resolving dependencies",
        "debootstrap: retrieving packages",
        "debootstrap: extracting packages",
        "debootstrap: installing core packages",
        "debootstrap: unpacking required packages",
        "debootstrap: configuring required packages",
        "debootstrap: unpacking the base system",
        "debootstrap: configuring the base system",
        "debootstrap: base system installed",
    ]
    assert parser.retrieved == 114  # 116 Retrieving lines: InRelease and Packages are no packages
    assert parser.error is None and parser.warnings == []


def test_bootstrap_details_count_packages_per_phase() -> None:
    lines = (LOGS / "debootstrap-bookworm.log").read_text().splitlines()
    parser = BootstrapPhases()
    last: dict[str, str] = {}
    first: dict[str, str] = {}
    for phase in phases(parser, lines):
        if phase is not None and phase.detail:
            first.setdefault(phase.name, phase.detail)
            last[phase.name] = phase.detail
    assert first["debootstrap: retrieving packages"] == "#1 adduser"
    assert last["debootstrap: retrieving packages"] == "#114 zlib1g"
    assert first["debootstrap: extracting packages"] == "#1 adduser"
    assert last["debootstrap: extracting packages"] == "#88 zlib1g"
    assert last["debootstrap: unpacking required packages"].startswith("#")
    assert last["debootstrap: configuring the base system"] == "#23 ca-certificates"


def test_bootstrap_phase_text() -> None:
    parser = BootstrapPhases()
    parser.feed("I: Resolving dependencies of required packages...")
    phase = parser.feed("I: Retrieving libc6 2.36-9+deb12u10")
    assert phase == Phase("debootstrap: retrieving packages", "#1 libc6")
    assert phase.text() == "debootstrap: retrieving packages (#1 libc6)"
    assert Phase("x").text() == "x"


@pytest.mark.parametrize(
    "line",
    [
        "I: Validating adduser 3.134",  # one package validated: no change
        "I: Chosen extractor for .deb packages: dpkg-deb",
        "I: Keyring file not available at /x; switching to https mirror https://y",
        "dpkg: warning: something",  # not a debootstrap message
        "",
        "I:",
        "I: Unpacking adduser...",  # before any phase: nothing to count it in
    ],
)
def test_bootstrap_lines_that_change_nothing(line: str) -> None:
    assert BootstrapPhases().feed(line) is None


def test_bootstrap_unpack_outside_a_section_is_its_own_phase() -> None:
    parser = BootstrapPhases()
    parser.feed("I: Installing core packages...")
    assert parser.feed("I: Unpacking bash...") == Phase(
        "debootstrap: unpacking packages", "#1 bash"
    )
    assert parser.feed("I: Configuring bash...") == Phase(
        "debootstrap: configuring packages", "#1 bash"
    )


@pytest.mark.parametrize(
    ("log", "error", "last"),
    [
        (  # a suite debootstrap has no script for
            ["E: No such script: /usr/share/debootstrap/scripts/nosuchsuite"],
            "No such script: /usr/share/debootstrap/scripts/nosuchsuite",
            None,
        ),
        (  # the mirror is unreachable
            [
                "I: Target architecture can be executed",
                "I: Retrieving InRelease ",
                "I: Retrieving Release ",
                "E: Failed getting release file http://127.0.0.1:9/debian/dists/bookworm/Release",
            ],
            "Failed getting release file http://127.0.0.1:9/debian/dists/bookworm/Release",
            "debootstrap: fetching the package index",
        ),
        (  # a package the suite does not have
            [
                "I: Validating Packages ",
                "I: Resolving dependencies of required packages...",
                "I: Resolving dependencies of base packages...",
                "I: Checking component main on http://deb.debian.org/debian...",
                "E: Couldn't find these debs: no-such-pkg-xyz",
            ],
            "Couldn't find these debs: no-such-pkg-xyz",
            "debootstrap: resolving dependencies",
        ),
    ],
    ids=["no-script", "no-mirror", "no-package"],
)
def test_bootstrap_failures_keep_the_error(log: list[str], error: str, last: str | None) -> None:
    parser = BootstrapPhases()
    seen = names(parser, log)
    assert parser.error == error
    assert (seen[-1] if seen else None) == last


def test_bootstrap_errors_and_warnings_accumulate() -> None:
    parser = BootstrapPhases()
    assert parser.feed("W: Cannot check Release signature; keyring file not available") is None
    assert parser.feed("E: first") is None
    assert parser.feed("E: second") is None
    assert parser.warnings == ["Cannot check Release signature; keyring file not available"]
    assert parser.error == "first; second"


# -- the legacy builder -----------------------------------------------------------------------


def legacy_lines(name: str) -> tuple[list[str], str | None]:
    """A captured Engine API build stream, as ``images`` reads it: lines, and the error."""
    chunks = json.loads((LOGS / "legacy-build.json").read_text())[name]
    splitter, lines, error = LineSplitter(), [], None
    for chunk in chunks:
        error = chunk.get("error", error)
        lines += splitter.feed(chunk.get("stream", ""))
    return lines + splitter.flush(), error


def test_legacy_build_of_a_tiny_context() -> None:
    lines, error = legacy_lines("ok")
    parser = LegacyPhases()
    result = phases(parser, lines)
    assert error is None
    assert [p.name for p in result if p is not None and not p.detail] == [
        "step 1/6 ARG BASE_IMAGE=debian:bookworm-slim",
        "step 2/6 FROM ${BASE_IMAGE}",
        "step 3/6 RUN echo to-stdout; echo to-stderr >&2; sh -c 'exit 0'",
        "step 4/6 COPY hello.txt /hello.txt",
        "step 5/6 LABEL x=y",
        "recording the base and context in labels",  # step 6/6 LABEL sandboxrun.test=capture
    ]
    details = [p.detail for p in result if p is not None and p.detail]
    assert details == ["to-stdout", "to-stderr"]  # the RUN's output, colour codes gone


def test_legacy_label_steps_of_sandboxrun_are_one_phase() -> None:
    lines = [
        "Step 4/7 : LABEL x=y",
        "Step 5/7 : LABEL sandboxrun.base=sandboxrun/bootstrap:bookworm",
        " ---> Running in 6785cafd0245",
        "Step 6/7 : LABEL sandboxrun.base-id=sha256:4ce7badc0b54c728b890e9fda4b14ecd2d0c90c2d8",
        "Step 7/7 : LABEL sandboxrun.context=sha256:96e412110540459d292b8b5489f61445105047914f",
    ]
    assert names(LegacyPhases(), lines) == [
        "step 4/7 LABEL x=y",
        "recording the base and context in labels",
    ]


def test_legacy_cached_steps_say_so() -> None:
    lines, _ = legacy_lines("cached")
    details = [p.detail for p in phases(LegacyPhases(), lines) if p is not None and p.detail]
    assert details == ["cached"] * 4


def test_legacy_failure_knows_its_step() -> None:
    lines, error = legacy_lines("fail")
    parser = LegacyPhases()
    names(parser, lines)
    assert parser.step == "step 3/4 RUN echo about to fail; echo oops >&2; exit 3"
    assert error == (
        "The command '/bin/sh -c echo about to fail; echo oops >&2; exit 3' returned a non-zero "
        "code: 3"
    )


def test_legacy_base_missing_fails_at_from() -> None:
    lines, error = legacy_lines("nobase")
    parser = LegacyPhases()
    names(parser, lines)
    assert parser.step == "step 2/6 FROM ${BASE_IMAGE}"
    assert error is not None and "no such host" in error


def test_legacy_build_of_the_default_image() -> None:
    lines = [clean(line) for line in (LOGS / "legacy-base-build.log").read_text().splitlines()]
    parser = LegacyPhases()
    seen = names(parser, lines)
    assert [name.split(" ", 2)[1] for name in seen] == [f"{i}/9" for i in range(1, 10)]
    assert seen[3].startswith("step 4/9 RUN set -eux; if ! dpkg -s $PACKAGES")
    assert all(len(name) <= 72 for name in seen)
    details = {p.detail for p in phases(LegacyPhases(), lines) if p is not None}
    assert "Get:1 http://deb.debian.org/debian bookworm InRelease [15..." in details  # cut
    assert all(len(d) <= 60 for d in details)
    assert not any(d.startswith(("--->", "Removing", "Successfully", "\x1b")) for d in details)


def test_legacy_lines_before_a_step_or_noise_change_nothing() -> None:
    parser = LegacyPhases()
    assert parser.feed("Sending build context to Docker daemon  2.048kB") is None
    parser.feed("Step 1/1 : FROM x")
    assert parser.feed("DEPRECATED: The legacy builder is deprecated and will be removed") is None
    assert parser.feed("") is None
    assert parser.feed("Successfully tagged x:1") is None


# -- BuildKit (docker buildx build --progress=plain) ------------------------------------------

BUILDKIT_OK = """\
#0 building with "default" instance using docker driver

#1 [internal] load build definition from Dockerfile
#1 transferring dockerfile: 2.47kB done
#1 DONE 0.0s

#2 [internal] load metadata for docker.io/sandboxrun/bootstrap:bookworm
#2 DONE 0.0s

#3 [internal] load .dockerignore
#3 transferring context: 2B done
#3 DONE 0.0s

#4 [1/4] FROM docker.io/sandboxrun/bootstrap:bookworm
#4 DONE 0.0s

#5 [internal] load build context
#5 transferring context: 30B done
#5 DONE 0.0s

#6 [2/4] RUN set -eux; apt-get update
#6 0.234 + apt-get update
#6 0.734 Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]
#6 DONE 12.3s

#7 [3/4] COPY profile.sh /etc/profile.d/00-sandboxrun-path.sh
#7 CACHED

#8 [4/4] WORKDIR /workspace
#8 DONE 0.0s

#9 exporting to image
#9 exporting layers
#9 exporting layers 0.2s done
#9 writing image sha256:f6cb23d714a676d7f85c3db80be5d104cdaaa39c0d27ecd66755d81f1f383e5b done
#9 naming to docker.io/sandboxrun/base:0.1.0 done
#9 DONE 0.2s
"""

BUILDKIT_FAIL = """\
#10 [3/4] RUN cat /hello
#0 0.131 hello
#10 DONE 0.2s

#11 [4/4] RUN cat /non-existing-file
#11 0.102 cat: /non-existing-file: No such file or directory
#11 ERROR: process "/bin/sh -c cat /non-existing-file" did not complete successfully: exit code: 1
------
 > [4/4] RUN cat /non-existing-file:
#11 0.102 cat: /non-existing-file: No such file or directory
------
Dockerfile:6
--------------------
   6 | >>> RUN cat /non-existing-file
--------------------
ERROR: failed to solve: process "/bin/sh -c cat /non-existing-file" did not complete \
successfully: exit code: 1
"""


def test_buildkit_build() -> None:
    parser = BuildKitPhases()
    result = phases(parser, BUILDKIT_OK.splitlines())
    assert names(BuildKitPhases(), BUILDKIT_OK.splitlines()) == [
        "preparing",
        "step 1/4 FROM docker.io/sandboxrun/bootstrap:bookworm",
        "preparing",
        "step 2/4 RUN set -eux; apt-get update",
        "step 3/4 COPY profile.sh /etc/profile.d/00-sandboxrun-path.sh",
        "step 4/4 WORKDIR /workspace",
        "exporting",
    ]
    details = [p.detail for p in result if p is not None]
    assert "+ apt-get update" in details  # the timestamp is not part of the output
    assert "cached" in details
    assert "load build definition from Dockerfile" in " ".join(details)
    assert parser.error is None and parser.step == "step 4/4 WORKDIR /workspace"


def test_buildkit_failure_keeps_the_step_and_the_final_error() -> None:
    parser = BuildKitPhases()
    names(parser, BUILDKIT_FAIL.splitlines())
    assert parser.step == "step 4/4 RUN cat /non-existing-file"
    assert parser.error == (
        'process "/bin/sh -c cat /non-existing-file" did not complete successfully: exit code: 1'
    )


@pytest.mark.parametrize(
    ("line", "name"),
    [
        (
            "#12 [ 1/16] FROM docker.io/library/python:3.9",
            "step 1/16 FROM docker.io/library/python:3.9",
        ),
        ("#6 [deps 1/5] FROM node:18", "step deps 1/5 FROM node:18"),
        ("#24 [linux/amd64->arm64 ytdlp 3/3] RUN x", "step linux/amd64->arm64 ytdlp 3/3 RUN x"),
        ("#12 exporting to docker image format", "exporting"),
        ("#12 sending tarball", "exporting"),
        ("#3 [auth] library/node:pull token for registry-1.docker.io", "preparing"),
        ("#2 resolve image config for docker-image://docker.io/docker/dockerfile:1.6", "preparing"),
    ],
)
def test_buildkit_vertex_names(line: str, name: str) -> None:
    phase = BuildKitPhases().feed(line)
    assert phase is not None and phase.name == name


def test_buildkit_a_late_preparation_does_not_leave_the_step() -> None:
    parser = BuildKitPhases()
    parser.feed("#4 [1/2] FROM x")
    assert parser.feed("#5 [internal] load build context") is None
    assert parser.feed("#5 transferring context: 30B done") == Phase(
        "preparing", "transferring context: 30B done"
    )


@pytest.mark.parametrize(
    "line",
    [
        '#0 building with "default" instance using docker driver',
        "#4 ...",
        "#4 DONE 0.1s",
        "#99 0.1 output of a vertex never opened",
        "------",
        " > [4/4] RUN cat /x:",
        "Dockerfile:6",
        "WARNING: buildx: git was not found in the system",
        "",
    ],
)
def test_buildkit_lines_that_change_nothing(line: str) -> None:
    parser = BuildKitPhases()
    parser.feed("#4 [1/2] FROM x")
    assert parser.feed(line) is None
    assert parser.error is None


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("ERROR: failed to solve: boom", "boom"),
        ("ERROR: failed to build: failed to solve: boom", "boom"),
        ("error: failed to solve: boom", "boom"),
        ("ERROR: failed to solve: sandboxrun/x:1: not found", "sandboxrun/x:1: not found"),
    ],
)
def test_buildkit_final_errors(line: str, error: str) -> None:
    parser = BuildKitPhases()
    parser.feed(line)
    assert parser.error == error
