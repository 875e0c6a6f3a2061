"""Sandbox images: the offline Debian bootstrap and the build of ``images/base``.

``bootstrap`` debootstraps Debian from the host's configured apt sources into a temporary
directory and ``docker import``s it as ``sandboxrun/bootstrap:<suite>``; ``build`` builds
``images/base`` on top of it (or on a pulled base where a registry works) as
``sandboxrun/base:<version>`` and ``:latest``. Both reuse what exists unless forced.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import docker.errors

from sandboxrun import dockerapi
from sandboxrun.aptsources import os_release_codename, parse_deb822, parse_one_line, pick_base
from sandboxrun.errors import BackendError, ConfigError

VERSION = "0.1.0"
BASE_REPO = "sandboxrun/base"
BASE_IMAGE = f"{BASE_REPO}:latest"
BOOTSTRAP_REPO = "sandboxrun/bootstrap"
PACKAGES = ("bash", "coreutils", "procps", "util-linux", "ca-certificates", "python3")
"""The offline bootstrap's packages (debootstrap's resolver handles a small set reliably);
``images/base/Dockerfile`` adds the project tools (make, compilers, pytest, node) with apt."""

Progress = Callable[[str], None]


def images_dir() -> Path:
    """``images/`` of a source checkout, or the copy shipped inside the wheel."""
    for candidate in (Path(__file__).parent / "_images", Path(__file__).parent.parent / "images"):
        if (candidate / "base" / "Dockerfile").is_file():
            return candidate
    raise ConfigError("cannot find the images/ directory (images/base/Dockerfile)")


def host_source(etc: Path = Path("/etc")) -> tuple[str, str]:
    """``(mirror URI, suite)`` from the host's apt configuration."""
    sources = []
    one_line = [
        etc / "apt" / "sources.list",
        *sorted((etc / "apt" / "sources.list.d").glob("*.list")),
    ]
    for path in one_line:
        if path.is_file():
            sources += parse_one_line(path.read_text(errors="replace"))
    for path in sorted((etc / "apt" / "sources.list.d").glob("*.sources")):
        sources += parse_deb822(path.read_text(errors="replace"))
    release = etc / "os-release"
    codename = os_release_codename(release.read_text()) if release.is_file() else None
    chosen = pick_base(sources, codename)
    return chosen.uri, chosen.suite


def image_exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        dockerapi.retrying(
            lambda: client.api.inspect_image(ref),  # type: ignore[no-untyped-call]
            what=f"inspect image {ref}",
        )
    except docker.errors.NotFound:
        return False
    return True


def bootstrap(progress: Progress, *, force: bool = False, etc: Path = Path("/etc")) -> str:
    """Create ``sandboxrun/bootstrap:<suite>`` from the host's apt sources; return its tag."""
    mirror, suite = host_source(etc)
    tag = f"{BOOTSTRAP_REPO}:{suite}"
    client = dockerapi.connect()
    if not force and image_exists(client, tag):
        progress(f"{tag} exists; reusing it")
        return tag
    tool = shutil.which("debootstrap")
    if tool is None:
        raise ConfigError("debootstrap is not installed (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise ConfigError(
            "the offline bootstrap needs root (debootstrap creates a root filesystem)"
        )
    work = Path(tempfile.mkdtemp(prefix="sandboxrun-bootstrap-", dir="/var/tmp"))
    try:
        rootfs = work / "rootfs"
        progress(f"debootstrap {suite} from {mirror} (from the host's apt sources)")
        cmd = [
            tool,
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            suite,
            str(rootfs),
            mirror,
        ]
        _stream(cmd, progress)
        tarball = work / "rootfs.tar"
        progress("packing the root filesystem")
        _stream(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."], progress)
        progress(f"docker import -> {tag}")
        dockerapi.once(
            lambda: client.api.import_image_from_file(
                str(tarball), repository=BOOTSTRAP_REPO, tag=suite, changes=['CMD ["/bin/bash"]']
            ),
            what="import the bootstrap image",
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tag


def _stream(cmd: list[str], progress: Progress) -> None:
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            progress(line.rstrip())
    if proc.returncode != 0:
        raise BackendError(f"{cmd[0]} failed with exit code {proc.returncode}")


def default_base(client: docker.DockerClient) -> str:
    """The bootstrap image when one exists (no registry needed), else the Dockerfile default."""
    for image in client.images.list(name=BOOTSTRAP_REPO):
        if image.tags:
            return str(image.tags[0])
    return "debian:bookworm-slim"


def build(progress: Progress, *, base: str | None = None, force: bool = False) -> str:
    """Build ``images/base`` as ``sandboxrun/base:<version>`` and ``:latest``; return the tag."""
    client = dockerapi.connect()
    tag = f"{BASE_REPO}:{VERSION}"
    if not force and image_exists(client, tag):
        progress(f"{tag} exists; reusing it")
        client.api.tag(tag, BASE_REPO, "latest")
        return tag
    base = base or default_base(client)
    progress(f"building {tag} on {base}")
    stream = client.api.build(
        path=str(images_dir() / "base"),
        tag=tag,
        buildargs={"BASE_IMAGE": base},
        pull=False,
        rm=True,
        forcerm=True,
        decode=True,
    )
    for chunk in stream:
        if "error" in chunk:
            raise BackendError(f"image build failed: {chunk['error']}")
        text = str(chunk.get("stream", "")).rstrip()
        if text:
            progress(text)
    client.api.tag(tag, BASE_REPO, "latest")
    return tag
