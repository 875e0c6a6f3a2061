"""Sandbox images: the offline Debian bootstrap and the build of ``images/base``.

``bootstrap`` debootstraps Debian from the host's configured apt sources into a temporary
directory and ``docker import``s it as ``sandboxrun/bootstrap:<suite>``; ``build`` builds
``images/base`` on top of it (or on a pulled base where a registry works) as
``sandboxrun/base:<version>`` and ``:latest``, with BuildKit where ``docker buildx`` is
installed, else the Engine API's legacy builder. A build records its base (ref and image id) and
a digest of its context in labels and is reused only when all three still match; the bootstrap
is reused when it exists. ``--force`` rebuilds either. Both report to a ``Progress``
(``image_progress``), raw tool lines and parsed phases (``image_phases``).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sandboxrun.backends.docker import api as dockerapi
from sandboxrun.backends.docker.api import Client as DockerClient
from sandboxrun.backends.docker.config import BASE_IMAGE, BASE_REPO, VERSION
from sandboxrun.errors import BackendError, ConfigError
from sandboxrun.image.aptsources import os_release_codename, parse_deb822, parse_one_line, pick_base
from sandboxrun.image.phases import (
    BootstrapPhases,
    BuildKitPhases,
    LegacyPhases,
    LineSplitter,
    Phase,
    clean,
)
from sandboxrun.image.plan import (
    Builder,
    Content,
    Recorded,
    base_of,
    buildx_argv,
    choose_builder,
    context_digest,
    decide,
    final_base,
    project_tag,
)
from sandboxrun.image.progress import Progress

BASE_TAG = f"{BASE_REPO}:{VERSION}"
BOOTSTRAP_REPO = "sandboxrun/bootstrap"
PACKAGES = ("bash", "coreutils", "procps", "util-linux", "ca-certificates", "python3")
"""The offline bootstrap's packages (debootstrap's resolver handles a small set reliably);
``images/base/Dockerfile`` adds the project tools (make, compilers, pytest, node) with apt."""
BUILD_READ_TIMEOUT_S = 3600
"""How long a build may print nothing (a long compile) before the engine is given up on."""

__all__ = ["BASE_IMAGE", "PACKAGES", "ImageResult", "Progress", "bootstrap", "build"]


class _Parser(Protocol):
    error: str | None

    def feed(self, line: str) -> Phase | None: ...


@dataclass(frozen=True)
class ImageResult:
    tag: str
    reused: bool
    how: str = ""
    """How it was made: ``BuildKit``, ``the legacy builder``, ``debootstrap`` ("" if reused)."""


def images_dir() -> Path:
    """``images/`` of a source checkout, or the copy shipped inside the wheel."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_images", package.parent / "images"):
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


def _inspect(client: DockerClient, ref: str) -> dict[str, object] | None:
    return dockerapi.inspect_image(client, ref)


def image_exists(client: DockerClient, ref: str) -> bool:
    return _inspect(client, ref) is not None


def _feed(progress: Progress, parser: _Parser | None, line: str) -> None:
    progress.raw(line)
    phase = parser.feed(line) if parser is not None else None
    if phase is not None:
        progress.phase(phase.name, phase.detail)


def _stream(cmd: list[str], progress: Progress, parser: _Parser | None) -> int:
    """Run ``cmd``, its stdout and stderr as one stream of lines; its exit status."""
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        raise BackendError(f"cannot run {cmd[0]}: {exc}") from exc
    with proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            _feed(progress, parser, clean(line))
    return proc.returncode


# -- the offline bootstrap -----------------------------------------------------------------------


def bootstrap(progress: Progress, *, force: bool = False, etc: Path = Path("/etc")) -> ImageResult:
    """Create ``sandboxrun/bootstrap:<suite>`` from the host's apt sources."""
    mirror, suite = host_source(etc)
    tag = f"{BOOTSTRAP_REPO}:{suite}"
    client = dockerapi.connect()
    try:
        if not force and image_exists(client, tag):
            progress.note(f"reusing {tag} (--force rebuilds it)")
            return ImageResult(tag, reused=True)
        tool = shutil.which("debootstrap")
        if tool is None:
            raise ConfigError("debootstrap is not installed (apt-get install debootstrap)")
        if os.geteuid() != 0:
            raise ConfigError(
                "the offline bootstrap needs root (debootstrap creates a root filesystem)"
            )
        progress.note(f"debootstrap {suite} from {mirror} (the host's apt sources)")
        _debootstrap(client, progress, tool, mirror, suite)
    finally:
        client.close()
    return ImageResult(tag, reused=False, how="debootstrap")


def _debootstrap(
    client: DockerClient, progress: Progress, tool: str, mirror: str, suite: str
) -> None:
    work = Path(tempfile.mkdtemp(prefix="sandboxrun-bootstrap-", dir="/var/tmp"))
    try:
        rootfs = work / "rootfs"
        cmd = [
            tool,
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            suite,
            str(rootfs),
            mirror,
        ]
        parser = BootstrapPhases()
        progress.phase("debootstrap: starting")
        code = _stream(cmd, progress, parser)
        if code != 0:
            why = parser.error or "see its log above"
            raise BackendError(f"debootstrap failed with exit code {code}: {why}")
        tarball = work / "rootfs.tar"
        progress.phase("packing the root filesystem")
        code = _stream(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."], progress, None
        )
        if code != 0:
            raise BackendError(f"tar failed with exit code {code}")
        progress.phase(f"importing it as {BOOTSTRAP_REPO}:{suite}")
        dockerapi.import_image(
            client,
            str(tarball),
            repository=BOOTSTRAP_REPO,
            tag=suite,
            changes=['CMD ["/bin/bash"]'],
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- the build ------------------------------------------------------------------------------------


def default_base(client: DockerClient) -> str:
    """The bootstrap image when one exists (no registry needed), else the Dockerfile default."""
    tags = dockerapi.image_tags(client, BOOTSTRAP_REPO)
    return tags[0] if tags else "debian:bookworm-slim"


def dockerignore(context: Path) -> list[str] | None:
    """The patterns of ``context``'s ``.dockerignore`` as the engine's client reads them (blank
    lines and ``#`` comments dropped), or None without one."""
    file = context / ".dockerignore"
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc.strerror}") from None
    return [line.strip() for line in text.splitlines() if line.strip() and line.strip()[0] != "#"]


def context_files(
    context: Path, dockerfile: str = "Dockerfile"
) -> Iterator[tuple[str, bool, Content]]:
    """Every file of a build context that is sent to the engine (what ``.dockerignore``
    leaves, matched by the docker SDK's own matcher; the Dockerfile always), in path order,
    each read in chunks as it is hashed (``context_digest``); ``ConfigError`` naming a file
    that cannot be read (docker could not send it either)."""
    patterns = dockerignore(context)
    sent: set[str] | None = None
    if patterns:
        sent = dockerapi.sent_paths(str(context), patterns, dockerfile)
    try:
        paths = sorted(p for p in context.rglob("*") if p.is_symlink() or p.is_file())
        for path in paths:
            name = path.relative_to(context).as_posix()
            if sent is not None and name not in sent and name != dockerfile:
                continue
            if path.is_symlink():
                yield name, False, str(path.readlink()).encode()
            else:
                st = path.stat()
                yield name, bool(st.st_mode & stat.S_IXUSR), (st.st_size, _chunks(path))
    except OSError as exc:
        raise ConfigError(
            f"cannot read the build context {context}: {exc.filename}: {exc.strerror}"
        ) from None


def _chunks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    try:
        with path.open("rb") as file:
            while chunk := file.read(size):
                yield chunk
    except OSError as exc:
        raise ConfigError(f"cannot read the build context's file {path}: {exc.strerror}") from None


def probe_builder() -> Builder:
    """BuildKit when ``docker buildx version`` works here, else the legacy builder."""
    docker_cli = shutil.which("docker")
    buildx: tuple[int, str] | None = None
    if docker_cli is not None:
        try:
            done = subprocess.run(
                [docker_cli, "buildx", "version"],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=15,
                check=False,
                stdin=subprocess.DEVNULL,
            )
            buildx = done.returncode, (done.stdout + done.stderr)
        except (OSError, subprocess.TimeoutExpired) as exc:
            buildx = 1, str(exc)
    return choose_builder(docker_cli, buildx, os.environ)


def _base_id(client: DockerClient, ref: str, progress: Progress, *, own: bool = False) -> str:
    """The base's image id, pulling it first when it is not on the engine. ``own``: it is the
    Dockerfile's own FROM (not a base sandboxrun chose)."""
    found = _inspect(client, ref)
    if found is None:
        progress.phase(f"pulling the base {ref}")
        try:
            for chunk in dockerapi.pull(client, ref):
                status = " ".join(str(chunk.get(k, "")) for k in ("id", "status", "progress"))
                _feed(progress, None, status.strip())
                if "error" in chunk:
                    raise BackendError(str(chunk["error"]))
        except BackendError as exc:
            hint = (
                "pull, load or build it, or change the Dockerfile's FROM"
                if own
                else "pull, load or build it, or build on the offline bootstrap "
                "(sandboxrun image bootstrap, then image build without --base)"
            )
            raise BackendError(
                f"the base image {ref} is not on this Docker engine and cannot be pulled "
                f"({exc}): {hint}"
            ) from exc
        found = _inspect(client, ref)
        if found is None:
            raise BackendError(f"the base image {ref} was pulled but cannot be found")
    return str(found["Id"])


def build(
    progress: Progress,
    *,
    base: str | None = None,
    force: bool = False,
    tag: str | None = None,
    context: Path | None = None,
    dockerfile: Path | None = None,
    say_reuse: bool = True,
) -> ImageResult:
    """Build ``context`` (``images/base``) as ``tag`` (``sandboxrun/base:<version>``, and then
    ``:latest`` too; another context: ``project_tag`` of its content) on ``base`` (the offline
    bootstrap where one exists, else the Dockerfile's default); reuse an existing ``tag`` built
    on the same base from the same context. ``dockerfile``: a file of ``context`` other than
    its ``Dockerfile``. A Dockerfile with a FROM of its own records that base (a rebuilt
    ``sandboxrun/base`` rebuilds what is built on it). ``say_reuse``: note a reuse (``run
    --image-from`` reuses silently)."""
    own = images_dir() / "base"
    context = context if context is not None else own
    file = dockerfile if dockerfile is not None else context / "Dockerfile"
    if not file.is_file():
        raise ConfigError(f"no Dockerfile in the build context {context}")
    name = _inside(file, context)
    ours = context.resolve() == own.resolve() and name == "Dockerfile"
    text = file.read_text(encoding="utf-8", errors="replace")
    fixed_base = base_of(text)
    if fixed_base is not None and base is not None:
        raise ConfigError(
            f"--base {base}: {file} does not use it (its FROM is {fixed_base}, not ${{BASE_IMAGE}})"
        )
    digest = context_digest(context_files(context, name), dockerfile=name)
    aliases = [BASE_IMAGE] if tag is None and ours else []
    tag = tag or (BASE_TAG if ours else project_tag(digest))
    client = dockerapi.connect()
    try:
        base = (
            base
            or concrete_base(fixed_base and final_base(text))  # what the result is built on
            or concrete_base(fixed_base)  # (a final stage on scratch or an ARG: the first's)
            or default_base(client)
        )
        wanted = Recorded(
            base, _base_id(client, base, progress, own=fixed_base is not None), digest
        )
        existing = _inspect(client, tag)
        labels = _labels(existing)
        decision = decide(
            tag, Recorded.from_labels(labels), existing is not None, wanted, force=force
        )
        if decision.message and (say_reuse or not decision.reuse):
            progress.note(decision.message)
        if decision.reuse:
            _alias(client, tag, aliases)
            return ImageResult(tag, reused=True)
        builder = probe_builder()
        progress.raw(f"builder: {builder.label} ({builder.why})")
        if decision.message is None:
            on = base if fixed_base is None else f"{fixed_base} (its Dockerfile's own FROM)"
            progress.note(f"building {tag} on {on}")
        if builder.kind == "buildkit":
            _build_buildx(progress, builder, tag, context, name, wanted, no_cache=force)
        else:
            _build_legacy(client, progress, tag, context, name, wanted, no_cache=force)
        _alias(client, tag, aliases)
    finally:
        client.close()
    return ImageResult(tag, reused=False, how=builder.label)


def _inside(file: Path, context: Path) -> str:
    """``file``'s path in ``context`` (a Dockerfile outside its context is refused)."""
    try:
        return file.resolve().relative_to(context.resolve()).as_posix()
    except ValueError:
        raise ConfigError(
            f"the Dockerfile {file} is not inside its build context {context}"
        ) from None


def concrete_base(fixed: str | None) -> str | None:
    """A Dockerfile's own FROM when it names one image (not ``scratch``, no ``$ARG`` in it)."""
    if fixed is None or "$" in fixed or fixed.lower() == "scratch":
        return None
    return fixed


def _labels(inspected: dict[str, object] | None) -> dict[str, str]:
    config = (inspected or {}).get("Config")
    labels = config.get("Labels") if isinstance(config, dict) else None
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def _alias(client: DockerClient, tag: str, aliases: list[str]) -> None:
    for alias in aliases:
        dockerapi.tag_image(client, tag, alias)


def _failed(parser: LegacyPhases | BuildKitPhases, error: str) -> BackendError:
    where = f" at {parser.step}" if parser.step else ""
    return BackendError(f"image build failed{where}: {error}")


def _build_legacy(
    client: DockerClient,
    progress: Progress,
    tag: str,
    context: Path,
    dockerfile: str,
    wanted: Recorded,
    *,
    no_cache: bool,
) -> None:
    parser, lines = LegacyPhases(), LineSplitter()
    error: str | None = None
    try:
        stream = dockerapi.build(
            client,
            path=str(context),
            dockerfile=dockerfile,
            tag=tag,
            buildargs={"BASE_IMAGE": wanted.base},
            labels=wanted.labels(),
            pull=False,
            nocache=no_cache,
            rm=True,
            forcerm=True,
            timeout=BUILD_READ_TIMEOUT_S,
        )
        for chunk in stream:
            if "error" in chunk:
                error = str(chunk["error"]).strip()
            for line in lines.feed(str(chunk.get("stream") or chunk.get("status") or "")):
                _feed(progress, parser, line)
    except BackendError as exc:
        error = f"docker: {exc}"
    for line in lines.flush():
        _feed(progress, parser, line)
    if error is not None:
        raise _failed(parser, error)


def _build_buildx(
    progress: Progress,
    builder: Builder,
    tag: str,
    context: Path,
    dockerfile: str,
    wanted: Recorded,
    *,
    no_cache: bool,
) -> None:
    docker_cli = shutil.which("docker") or "docker"
    argv = buildx_argv(
        docker_cli,
        tag=tag,
        context=context,
        dockerfile=context / dockerfile,
        build_args={"BASE_IMAGE": wanted.base},
        labels=wanted.labels(),
        no_cache=no_cache,
    )
    parser = BuildKitPhases()
    code = _stream(argv, progress, parser)
    if code != 0:
        raise _failed(parser, parser.error or f"docker buildx build exited with {code}")
