"""Settings in one place (issue 20): precedence, the files, what a project's file may not set."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxrun.cli.settings import (
    SETTINGS,
    ProjectFile,
    blame,
    find_file,
    lines,
    parse_values,
    read_file,
    resolve,
)
from sandboxrun.errors import ConfigError


def project(**values: str) -> ProjectFile:
    return ProjectFile(Path("/p/sandboxrun.toml"), dict(values))


def test_precedence_flag_then_variable_then_file_then_default() -> None:
    env = {"SANDBOXRUN_TIMEOUT": "7s", "SANDBOXRUN_MEMORY": "1g"}
    got = resolve({"memory": "2g"}, env, project(timeout="5", memory="3g", pids="9"))
    assert (got["memory"].value, got["memory"].source) == ("2g", "command line")
    assert (got["timeout"].value, got["timeout"].source) == ("7s", "SANDBOXRUN_TIMEOUT")
    assert (got["pids"].value, got["pids"].source) == ("9", "/p/sandboxrun.toml")
    assert (got["grace"].value, got["grace"].source) == ("3s", "default")
    assert (got["image"].value, got["image"].source) == (None, "default")
    assert set(got) == set(SETTINGS)


def test_variables_are_named_after_the_flags() -> None:
    assert SETTINGS["max_timeout"].variable == "SANDBOXRUN_MAX_TIMEOUT"
    assert SETTINGS["backend"].variable == "SANDBOXRUN_BACKEND"
    got = resolve({}, {"SANDBOXRUN_SPILL_MAX_AGE": "2h"}, None)
    assert (got["spill_max_age"].value, got["spill_max_age"].source) == (
        "2h",
        "SANDBOXRUN_SPILL_MAX_AGE",
    )
    with pytest.raises(ConfigError, match="SANDBOXRUN_BACKEND='dockr' is not one of auto"):
        resolve({}, {"SANDBOXRUN_BACKEND": "dockr"}, None)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"policy": "danger-full-access"}, "cannot widen the sandbox"),
        ({"network": "on"}, "pass --network on or set SANDBOXRUN_NETWORK"),
        ({"timeuot": "5"}, "unknown setting 'timeuot' (did you mean 'timeout'?)"),
        ({"backend": "nope"}, "backend = 'nope' is not one of auto, docker"),
        ({"timeout": True}, "must be a string or a number"),
        ({"memory": ["1g"]}, "must be a string or a number"),
    ],
)
def test_a_projects_file_is_checked_and_cannot_widen(
    table: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=r"where\.toml") as caught:
        parse_values(table, "where.toml")
    assert message in str(caught.value)


def test_file_values_are_spelled_like_flags() -> None:
    got = parse_values({"timeout": 90, "max-output": "1m", "cpus": 0.5, "policy": "read-only"}, "f")
    assert got == {"timeout": "90", "max_output": "1m", "cpus": "0.5", "policy": "read-only"}


def test_find_file_walks_up_and_prefers_sandboxrun_toml(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_file(deep, {}) is None or not str(find_file(deep, {})).startswith(str(tmp_path))
    (tmp_path / "pyproject.toml").write_text("[project]\nname='x'\n")  # no section: not ours
    assert find_file(deep, {}) is None or not str(find_file(deep, {})).startswith(str(tmp_path))
    (tmp_path / "a" / "pyproject.toml").write_text('[tool.sandboxrun]\ntimeout = "5m"\n')
    assert find_file(deep, {}) == tmp_path / "a" / "pyproject.toml"
    (tmp_path / "a" / "sandboxrun.toml").write_text('timeout = "6m"\n')
    assert find_file(deep, {}) == tmp_path / "a" / "sandboxrun.toml"
    assert find_file(deep, {"SANDBOXRUN_CONFIG": "none"}) is None
    assert find_file(deep, {"SANDBOXRUN_CONFIG": "/x.toml"}) == Path("/x.toml")
    assert read_file(tmp_path / "a" / "pyproject.toml").values == {"timeout": "5m"}
    assert read_file(tmp_path / "a" / "sandboxrun.toml").values == {"timeout": "6m"}


def test_read_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        read_file(tmp_path / "missing.toml")
    bad = tmp_path / "sandboxrun.toml"
    bad.write_text("timeout = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_file(bad)


def test_blame_names_where_a_bad_value_came_from() -> None:
    got = resolve({}, {}, project(memory="1k"))
    message = blame("--memory must be at least 6m, got '1k'", got)
    assert message.endswith("(from /p/sandboxrun.toml: memory = '1k')")
    assert blame("--memory x", resolve({"memory": "1k"}, {}, None)) == "--memory x"


def test_lines_show_each_value_and_source() -> None:
    shown = lines(resolve({}, {"SANDBOXRUN_IMAGE": "me/img:1"}, None))
    assert any(line.split() == ["image", "me/img:1", "SANDBOXRUN_IMAGE"] for line in shown)
    assert any(line.split() == ["memory", "-", "default"] for line in shown)
