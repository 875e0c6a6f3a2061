from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import require_backend

LATE_FILES = (
    "tests/unit/",
    "tests/integration/test_images.py",
    "tests/integration/test_local_isolation.py",
    "tests/integration/test_pgroup_lifecycle.py",
    "tests/integration/test_ray_pool.py",
)
"""What ``SANDBOXRUN_TEST_LANE=late`` runs beside the item's of a local backend (see
``pytest_collection_modifyitems``): tests that need no quiet engine around them (the Ray
tests' containers belong to hosts of other names, which the engine's tests look past)."""


def late(item: pytest.Item) -> bool:
    """An item of the late lane: in one of ``LATE_FILES``, or run on a local backend (the
    ``backend`` parameter process-group or systemd-scope: the latter skips outside the
    systemd host, as in one run)."""
    path = Path(str(item.path)).resolve().relative_to(Path(__file__).resolve().parent.parent)
    if str(path).startswith(LATE_FILES):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("backend") in ("process-group", "systemd-scope")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``SANDBOXRUN_TEST_LANE``: ``early`` or ``late`` runs one share of the suite, the two
    shares together are all of it (scripts/test.sh runs them side by side: the early lane
    alongside the systemd test host, the late one after it); unset, every test runs."""
    lane = os.environ.get("SANDBOXRUN_TEST_LANE", "")
    if not lane:
        return
    if lane not in ("early", "late"):
        raise pytest.UsageError(f"SANDBOXRUN_TEST_LANE must be early or late, got {lane!r}")
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        (keep if late(item) == (lane == "late") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "sub" / "dir").mkdir(parents=True)
    (ws / "hello.txt").write_text("hello\n")
    return ws


@pytest.fixture(autouse=True)
def spill_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "spill"
    monkeypatch.setenv("SANDBOXRUN_SPILL_DIR", str(root))
    return root


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["process-group", "docker", "systemd-scope"])
def backend(request: pytest.FixtureRequest) -> str:
    """Conformance tests run on every backend; one whose probe fails is skipped with why."""
    return require_backend(str(request.param))


@pytest.fixture(params=["default", "engine"])
def tty_backend(
    request: pytest.FixtureRequest, backend: str, monkeypatch: pytest.MonkeyPatch
) -> str:
    """Terminals on every backend; docker both ways: through its supervisor, and through the
    engine's own terminal exec (its path for an image without python3)."""
    if request.param == "engine":
        if backend != "docker":
            pytest.skip("the engine's exec path is docker's")
        monkeypatch.setenv("SANDBOXRUN_DOCKER_SUPERVISOR", "0")
    return backend


@pytest.fixture(scope="session", autouse=True)
def no_leaked_containers() -> Iterator[None]:
    """The test session must leave no container labelled sandboxrun.managed behind: any made
    since it started whose owner is this process or is gone (another live session's containers
    are not ours to judge)."""
    started = time.time() - 1
    yield
    from sandboxrun.backends.docker import api as dockerapi
    from sandboxrun.backends.housekeeping import owner_alive

    try:
        client = dockerapi.connect(10)  # checks the socket first (docker-py would leak one)
    except Exception:  # no engine here: nothing can have leaked
        return
    try:
        managed = client.containers.list(
            all=True, ignore_removed=True, filters={"label": "sandboxrun.managed=true"}
        )
    except Exception:
        client.close()
        return
    left = [
        c
        for c in managed
        if int(c.labels.get("sandboxrun.created", "0")) >= started
        and (c.labels.get("sandboxrun.owner_pid") == str(os.getpid()) or not owner_alive(c.labels))
    ]
    for container in left:
        container.remove(force=True)
    client.close()
    assert not left, f"the tests leaked containers: {[c.name for c in left]}"
