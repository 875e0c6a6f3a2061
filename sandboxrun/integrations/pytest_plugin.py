"""pytest plugin (entry point ``pytest11``): the ``sandbox`` and ``async_sandbox`` fixtures.

``def test_tool(sandbox): assert sandbox.exec(["echo", "hi"]).stdout == "hi\\n"``. The sandbox is
opened for the test and closed after it (nothing of it is left behind), on ``tmp_path`` unless
told otherwise. Options, the closest first: the ``@pytest.mark.sandboxrun(...)`` marker (of the
test, then its class, its module), the command line (``--sandboxrun-backend``,
``--sandboxrun-image``), the ini file (``sandboxrun_backend``, ``sandboxrun_image``). See
docs/pytest.md.

Loading the plugin is cheap and changes nothing for a test that does not use its fixtures: this
module imports only pytest and the standard library at import time (sandboxrun's models,
anyio and the docker SDK are imported when a fixture is set up), and a fixture of the same
name in a project's conftest or test module overrides the plugin's, as pytest's own rules say.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sandboxrun.api.sandbox import Sandbox
    from sandboxrun.integrations.blocking import BlockingSandbox

BACKENDS = ("auto", "docker", "systemd-scope", "process-group")
LOCAL_BACKENDS = ("systemd-scope", "process-group")
MARKER = "sandboxrun"
SANDBOX_OPTIONS = frozenset(
    {"env", "pass_env", "pass_proxy", "path_prepend", "user", "login", "login_shell"}
)
"""Marker keywords passed as they are to ``Sandbox(...)``."""
MARKER_OPTIONS = frozenset(
    {"backend", "image", "workspace", "network", "access", "policy", "limits"} | SANDBOX_OPTIONS
)
MARKER_HELP = (
    "sandboxrun(backend=None, image=None, workspace=None, network=None, access=None, "
    "policy=None, limits=None, env=None, ...): options of the sandbox and async_sandbox "
    "fixtures (docs/pytest.md)"
)


@dataclasses.dataclass(frozen=True)
class SandboxOptions:
    """What the fixtures open: resolved from markers, the command line and the ini file."""

    backend: str = "auto"
    image: str | None = None
    workspace: Path | None = None
    """None: the test's ``tmp_path``."""
    network: str | None = None
    access: str | None = None
    policy: Any = None
    limits: Any = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The other ``Sandbox(...)`` keywords (``SANDBOX_OPTIONS``)."""


def resolve_options(
    markers: Iterable[Mapping[str, Any]],
    *,
    cli_backend: str | None = None,
    cli_image: str | None = None,
    ini_backend: str = "",
    ini_image: str = "",
    rootpath: Path,
) -> SandboxOptions:
    """The fixtures' options. ``markers``: the keywords of every ``sandboxrun`` marker, the
    closest first (a keyword of a closer marker wins). A relative ``workspace`` is relative to
    ``rootpath`` (pytest's rootdir). An image from the command line or the ini file applies
    unless the backend is a local one (an image is a docker option); a marker's always does.
    Raises ``pytest.UsageError`` for an unknown keyword, a bad backend or a marker argument
    that is not a keyword."""
    merged: dict[str, Any] = {}
    for kwargs in markers:
        unknown = sorted(set(kwargs) - MARKER_OPTIONS)
        if unknown:
            raise pytest.UsageError(
                f"@pytest.mark.{MARKER}: unknown option {', '.join(unknown)} "
                f"(known: {', '.join(sorted(MARKER_OPTIONS))})"
            )
        for key, value in kwargs.items():
            merged.setdefault(key, value)
    backend = str(merged.pop("backend", None) or cli_backend or ini_backend or "auto")
    if backend not in BACKENDS:
        raise pytest.UsageError(
            f"sandboxrun backend {backend!r} is not one of {', '.join(BACKENDS)}"
        )
    image = merged.pop("image", None)
    if image is None and backend not in LOCAL_BACKENDS:
        image = cli_image or ini_image or None
    workspace = merged.pop("workspace", None)
    return SandboxOptions(
        backend=backend,
        image=image,
        workspace=None if workspace is None else rootpath / Path(os.fspath(workspace)),
        network=merged.pop("network", None),
        access=merged.pop("access", None),
        policy=merged.pop("policy", None),
        limits=merged.pop("limits", None),
        extra=merged,
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sandboxrun", "the sandbox fixture of sandboxrun")
    group.addoption(
        "--sandboxrun-backend",
        dest="sandboxrun_backend",
        default=None,
        choices=BACKENDS,
        help="backend of the sandbox fixture (default: the ini option sandboxrun_backend, "
        "else auto: the best one available here)",
    )
    group.addoption(
        "--sandboxrun-image",
        dest="sandboxrun_image",
        default=None,
        metavar="IMAGE",
        help="docker image of the sandbox fixture (default: the ini option sandboxrun_image, "
        "else sandboxrun's default image)",
    )
    parser.addini(
        "sandboxrun_backend", "backend of the sandbox fixture (default: auto)", default=""
    )
    parser.addini(
        "sandboxrun_image",
        "docker image of the sandbox fixture (default: sandboxrun's)",
        default="",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)


def options_for(request: pytest.FixtureRequest) -> SandboxOptions:
    """The options of the test that asked for a fixture."""
    markers = []
    for marker in request.node.iter_markers(MARKER):
        if marker.args:
            raise pytest.UsageError(
                f"@pytest.mark.{MARKER} takes keywords only, e.g. backend='docker'"
            )
        markers.append(marker.kwargs)
    config = request.config
    return resolve_options(
        markers,
        cli_backend=config.getoption("sandboxrun_backend"),
        cli_image=config.getoption("sandboxrun_image"),
        ini_backend=str(config.getini("sandboxrun_backend")),
        ini_image=str(config.getini("sandboxrun_image")),
        rootpath=config.rootpath,
    )


def new_sandbox(request: pytest.FixtureRequest) -> Sandbox:
    """A ``Sandbox`` (not yet open) made from the test's options."""
    from sandboxrun.api.sandbox import Sandbox
    from sandboxrun.models import Policy

    options = options_for(request)
    policy = options.policy if options.policy is not None else Policy()
    update = {
        key: value
        for key, value in (("network", options.network), ("access", options.access))
        if value is not None
    }
    if update:
        policy = Policy.model_validate({**policy.model_dump(), **update})
    workspace = options.workspace or request.getfixturevalue("tmp_path")
    return Sandbox(
        workspace,
        backend=options.backend,
        image=options.image,
        policy=policy,
        limits=options.limits,
        **options.extra,
    )


@pytest.fixture
def sandbox(request: pytest.FixtureRequest) -> Iterator[BlockingSandbox]:
    """An open sandbox with blocking methods (``sandboxrun.integrations.blocking.BlockingSandbox``):
    ``sandbox.exec([...])``, ``start``, ``read_file``, ``write_file``, ``list_dir``; closed
    after the test. Workspace: ``tmp_path`` unless ``@pytest.mark.sandboxrun(workspace=...)``."""
    from sandboxrun.integrations.blocking import BlockingSandbox

    with BlockingSandbox.open(new_sandbox(request)) as opened:
        yield opened


@pytest.fixture
async def async_sandbox(
    request: pytest.FixtureRequest, anyio_backend: Any
) -> AsyncIterator[Sandbox]:
    """The same sandbox as ``sandbox`` for async tests (``@pytest.mark.anyio``): the
    ``Sandbox`` itself, opened in the test's event loop."""
    async with new_sandbox(request) as opened:
        yield opened
