"""``api.request.build``: one command validated into an ``ExecRequest`` from a sandbox's
``Defaults``, with no process and no backend (pure but for the workspace's paths)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from sandboxrun.api.request import Defaults, build, check_encodable, check_mask, new_run_id
from sandboxrun.engine.paths import Workspace
from sandboxrun.errors import ConfigError, InputError
from sandboxrun.models import Limits, Policy

NONE: dict[str, Any] = {
    "shell": None,
    "workdir": None,
    "env": None,
    "pass_env": (),
    "timeout": None,
    "stdin": None,
    "path_prepend": (),
    "sink": None,
    "idle_timeout": None,
}


def defaults(root: Path, **changes: Any) -> Defaults:
    base_calls: list[int] = []

    def base() -> dict[str, str]:
        base_calls.append(1)
        return {"PATH": "/usr/bin", "BASE": "1"}

    values: dict[str, Any] = {
        "workspace": Workspace.open(root),
        "policy": Policy(),
        "limits": Limits(),
        "env": {"SANDBOX": "s"},
        "pass_env": (),
        "pass_proxy": False,
        "path_prepend": (),
        "host_env": {"PATH": "/usr/bin", "HOSTONLY": "h", "PASSED": "p"},
        "login": "snapshot",
        "base": base,
    }
    values.update(changes)
    return Defaults(**values)


def make(d: Defaults, argv: list[str] | None = None, **options: Any) -> Any:
    return build(d, argv, **{**NONE, **options})


def test_exactly_one_of_argv_and_script(tmp_path: Path) -> None:
    d = defaults(tmp_path)
    with pytest.raises(ConfigError, match="exactly one"):
        make(d)
    with pytest.raises(ConfigError, match="exactly one"):
        make(d, ["true"], shell="true")
    with pytest.raises(ConfigError, match="NUL"):
        make(d, shell="a\0b")


@pytest.mark.parametrize(
    "options",
    [
        {"shell": "echo \ud800"},
        {"workdir": "\ud800"},
        {"env": {"A": "\ud800"}},
        {"env": {"\ud800": "x"}},
    ],
)
def test_unencodable_values_are_refused_by_value(tmp_path: Path, options: dict[str, Any]) -> None:
    argv = None if "shell" in options else ["true"]
    with pytest.raises(ConfigError, match="cannot be passed to a process"):
        make(defaults(tmp_path), argv, **options)
    with pytest.raises(ConfigError, match="cannot be passed"):
        check_encodable("x\ud800")


def test_a_command_without_variables_takes_the_sandboxs_base(tmp_path: Path) -> None:
    request = make(defaults(tmp_path), ["true"])
    assert request.env == {"PATH": "/usr/bin", "BASE": "1"}
    assert request.explicit == frozenset({"SANDBOX"})
    assert request.argv == ["true"] and request.script is None
    assert request.workdir == tmp_path.resolve() and request.workdir_rel == PurePosixPath(".")


def test_given_variables_build_the_environment_afresh(tmp_path: Path) -> None:
    request = make(defaults(tmp_path), ["true"], env={"GIVEN": "g"}, pass_env=["PASSED"])
    assert request.env["GIVEN"] == "g" and request.env["PASSED"] == "p"
    assert request.env["SANDBOX"] == "s" and "HOSTONLY" not in request.env
    assert "BASE" not in request.env  # not the base: built from the host env and the options
    assert request.explicit == frozenset({"SANDBOX", "GIVEN"})


def test_workdir_is_resolved_inside_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    d = defaults(tmp_path)
    assert make(d, ["true"], workdir="a/b").workdir_rel == PurePosixPath("a/b")
    assert make(d, ["true"], workdir="/workspace/a").workdir_rel == PurePosixPath("a")
    with pytest.raises(InputError, match="escapes the workspace"):
        make(d, ["true"], workdir="../outside")


def test_timeouts_are_checked_not_shortened(tmp_path: Path) -> None:
    d = defaults(tmp_path, limits=Limits(timeout_s=5, max_timeout_s=10))
    assert make(d, ["true"]).timeout_s == 5
    assert make(d, ["true"], timeout=7).timeout_s == 7
    with pytest.raises(ConfigError, match="above max_timeout_s"):
        make(d, ["true"], timeout=11)
    with pytest.raises(ConfigError, match="positive finite"):
        make(d, ["true"], timeout=0)
    with pytest.raises(ConfigError, match="idle_timeout"):
        make(d, ["true"], idle_timeout=-1)
    assert make(d, ["true"], idle_timeout=2).limits.idle_timeout_s == 2


def test_path_prepend_joins_the_sandboxs_and_the_commands(tmp_path: Path) -> None:
    d = defaults(tmp_path, path_prepend=("/opt/a",))
    assert make(d, ["true"], path_prepend=["/opt/b"]).path_prepend == ["/opt/a", "/opt/b"]
    with pytest.raises(ConfigError):
        make(d, ["true"], path_prepend=["/opt/with:colon"])


def test_every_request_has_a_new_run_id(tmp_path: Path) -> None:
    d = defaults(tmp_path)
    ids = {make(d, ["true"]).run_id for _ in range(50)} | {new_run_id() for _ in range(50)}
    assert len(ids) == 100 and all(len(i) == 16 for i in ids)


def test_a_mask_may_not_hold_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    root = (tmp_path / "ws").resolve()
    check_mask(str(tmp_path / "ws" / "secret"), root)  # inside it: fine
    with pytest.raises(ConfigError, match="holds the workspace"):
        check_mask(str(tmp_path), root)
    with pytest.raises(ConfigError, match="expected a path"):
        check_mask("", root)
