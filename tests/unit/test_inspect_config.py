"""sandboxrun.integrations.inspect.config: the inspect sandbox's YAML config and what it becomes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from sandboxrun.errors import ConfigError
from sandboxrun.integrations.inspect.config import (
    CONFIG_FILES,
    NO_TIMEOUT_S,
    SandboxrunConfig,
    load_config,
    parse_config,
)
from sandboxrun.models import DEFAULT_MAX_OUTPUT, Limits, Policy


def test_defaults() -> None:
    config = load_config(None)
    assert config == SandboxrunConfig()
    assert config.backend == "docker" and config.image is None and config.user is None
    assert config.policy() == Policy(access="workspace-write", network="none")
    limits = config.limits()
    assert limits.timeout_s == NO_TIMEOUT_S and limits.max_timeout_s is None
    assert limits.spill_max == 0 and limits.max_output == DEFAULT_MAX_OUTPUT
    assert (limits.memory_bytes, limits.cpus, limits.pids) == (None, None, None)
    assert limits.grace_s == Limits().grace_s
    assert config.workspace_path() is None
    assert CONFIG_FILES[:2] == ("sandboxrun.yaml", "sandboxrun.yml")  # its own first
    assert "compose.yaml" in CONFIG_FILES and "Dockerfile" in CONFIG_FILES  # docker-compatible


def test_every_field(tmp_path: Path) -> None:
    text = """
backend: auto
image: sandboxrun/base:latest
user: "1000:1000"
workspace: repo
workspace_mode: shared
access: read-only
network: "on"
allow_degraded: true
memory: 512m
cpus: 1.5
pids: 64
grace: 1
default_timeout: 90
env: {CI: "1"}
pass_env: [JAVA_HOME]
mask_output: false
login: each
login_shell: /bin/sh
"""
    (tmp_path / "cfg.yaml").write_text(text)
    config = load_config(str(tmp_path / "cfg.yaml"))
    assert config.workspace_path() == tmp_path / "repo"
    assert config.policy() == Policy(
        access="read-only", network="on", allow_degraded=True, mask_output=False
    )
    limits = config.limits()
    assert (limits.memory_bytes, limits.cpus, limits.pids) == (512 << 20, 1.5, 64)
    assert (limits.timeout_s, limits.grace_s) == (90, 1)
    assert limits.max_timeout_s is None
    assert config.env == {"CI": "1"} and config.pass_env == ["JAVA_HOME"]
    assert (config.login, config.login_shell, config.user) == ("each", "/bin/sh", "1000:1000")
    assert config.workspace_mode == "shared" and config.backend == "auto"


def test_memory_as_bytes() -> None:
    assert parse_config({"memory": 64 << 20}).limits().memory_bytes == 64 << 20


def test_long_default_timeout_is_not_clamped() -> None:
    limits = parse_config({"default_timeout": 2 * NO_TIMEOUT_S}).limits()
    assert limits.timeout_s == 2 * NO_TIMEOUT_S and limits.max_timeout_s is None
    assert limits.effective_timeout(3650 * 86400.0) == 3650 * 86400.0  # an exec's own timeout


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"colour": "blue"}, "colour"),
        ({"backend": "kubernetes"}, "backend"),
        ({"memory": "lots"}, "invalid memory 'lots'"),
        ({"memory": "1.5"}, "whole number"),
        ({"cpus": 0.001}, "cpus"),
        ({"cpus": float("inf")}, "cpus"),
        ({"pids": 0}, "pids"),
        ({"grace": -1}, "grace"),
        ({"grace": 601}, "grace_s"),
        ({"default_timeout": 0}, "default_timeout"),
        ({"default_timeout": float("nan")}, "default_timeout"),
        ({"env": ["A=1"]}, "env"),
        ({"workspace_mode": "move"}, "workspace_mode"),
    ],
)
def test_invalid(data: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match="invalid") as raised:
        parse_config(data)
    assert words in str(raised.value)


def test_workspace_paths(tmp_path: Path) -> None:
    assert parse_config({"workspace": "/abs/repo"}, base=tmp_path).workspace == "/abs/repo"
    assert parse_config({"workspace": "rel"}, base=tmp_path).workspace == str(tmp_path / "rel")
    assert parse_config({"workspace": "rel"}).workspace == "rel"  # no base: as given
    home = parse_config({"workspace": "~/repo"}, base=tmp_path).workspace
    assert home == str(Path("~/repo").expanduser())


def test_yaml_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(str(empty)) == SandboxrunConfig()
    listed = tmp_path / "list.yaml"
    listed.write_text("- docker\n")
    with pytest.raises(ConfigError, match="expected a mapping, got list"):
        load_config(str(listed))
    broken = tmp_path / "broken.yaml"
    broken.write_text("memory: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(broken))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.yaml"))


def test_models() -> None:
    model = SandboxrunConfig(memory="1g", network="on")
    assert load_config(model) == model
    assert parse_config(model.model_dump()) == model  # config_deserialize's round trip

    class Other(BaseModel):
        services: dict[str, str] = {}

    with pytest.raises(ConfigError, match="services"):
        load_config(Other())
