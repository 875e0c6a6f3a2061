"""The pytest plugin's option resolution (pure logic) and its import cost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxrun.integrations.pytest_plugin import BACKENDS, SandboxOptions, resolve_options

ROOT = Path("/project")


def test_defaults() -> None:
    assert resolve_options([], rootpath=ROOT) == SandboxOptions()
    assert SandboxOptions().backend == "auto"
    assert SandboxOptions().workspace is None  # the test's tmp_path


@pytest.mark.parametrize(
    ("marker", "cli", "ini", "expected"),
    [
        (None, None, "", "auto"),
        (None, None, "docker", "docker"),
        (None, "process-group", "docker", "process-group"),
        ("systemd-scope", "process-group", "docker", "systemd-scope"),
        ("docker", None, "", "docker"),
    ],
)
def test_backend_precedence_marker_cli_ini(
    marker: str | None, cli: str | None, ini: str, expected: str
) -> None:
    markers = [{"backend": marker}] if marker else []
    options = resolve_options(markers, cli_backend=cli, ini_backend=ini, rootpath=ROOT)
    assert options.backend == expected


def test_closest_marker_wins_keyword_by_keyword() -> None:
    closest = {"network": "on"}
    module = {"network": "none", "backend": "process-group", "access": "read-only"}
    options = resolve_options([closest, module], rootpath=ROOT)
    assert (options.network, options.backend, options.access) == (
        "on",
        "process-group",
        "read-only",
    )


@pytest.mark.parametrize(
    ("marker", "backend", "cli", "ini", "expected"),
    [
        (None, "auto", "img:cli", "img:ini", "img:cli"),
        (None, "docker", None, "img:ini", "img:ini"),
        (None, "process-group", "img:cli", "img:ini", None),  # a docker option only
        (None, "systemd-scope", None, "img:ini", None),
        ("img:marker", "process-group", "img:cli", "", "img:marker"),  # asked for: kept
        ("img:marker", "docker", "img:cli", "img:ini", "img:marker"),
        (None, "auto", None, "", None),
    ],
)
def test_image(
    marker: str | None, backend: str, cli: str | None, ini: str, expected: str | None
) -> None:
    markers = [{"backend": backend, **({"image": marker} if marker else {})}]
    options = resolve_options(markers, cli_image=cli, ini_image=ini, rootpath=ROOT)
    assert options.image == expected


def test_workspace_relative_to_rootdir_absolute_kept() -> None:
    assert resolve_options([{"workspace": "ws/a"}], rootpath=ROOT).workspace == ROOT / "ws/a"
    assert resolve_options([{"workspace": Path("/abs")}], rootpath=ROOT).workspace == Path("/abs")


def test_other_keywords_pass_through() -> None:
    marker = {"env": {"CI": "1"}, "user": "1000", "policy": "P", "limits": "L"}
    options = resolve_options([marker], rootpath=ROOT)
    assert options.extra == {"env": {"CI": "1"}, "user": "1000"}
    assert (options.policy, options.limits) == ("P", "L")


def test_unknown_keyword_and_backend_refused() -> None:
    with pytest.raises(pytest.UsageError, match="unknown option netwrok"):
        resolve_options([{"netwrok": "on"}], rootpath=ROOT)
    with pytest.raises(pytest.UsageError, match="'dokcer' is not one of"):
        resolve_options([{"backend": "dokcer"}], rootpath=ROOT)
    with pytest.raises(pytest.UsageError, match="is not one of"):
        resolve_options([], ini_backend="podman", rootpath=ROOT)
    assert "auto" in BACKENDS


def test_loading_the_plugin_imports_nothing_heavy() -> None:
    probe = (
        "import sys, json; import sandboxrun.integrations.pytest_plugin; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'anyio', 'docker', 'psutil') or m in ('sandboxrun.models', "
        "'sandboxrun.api.sandbox', 'sandboxrun.integrations.blocking'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    assert json.loads(out) == []
