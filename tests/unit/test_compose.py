"""compose.yaml's `sandbox` service must give exactly the sandbox the docker backend creates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sandboxrun.backends.docker import config as cfg
from sandboxrun.models import Limits, Policy

ROOT = Path(__file__).resolve().parents[2]


def compose_sandbox() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    service: dict[str, Any] = data["services"]["sandbox"]
    return service


def backend_config() -> dict[str, Any]:
    return cfg.host_config(
        workspace=Path("/ws"),
        policy=Policy(),
        limits=Limits(),
        image="sandboxrun/base:latest",
        user="1000:1000",
        lbls=cfg.labels(Path("/ws")),
    )


def size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def test_compose_sandbox_matches_the_backend() -> None:
    svc, config = compose_sandbox(), backend_config()
    host = config["host_config"]
    assert svc["image"] == config["image"]
    assert svc["init"] is host["init"] is True
    assert svc["cap_drop"] == host["cap_drop"] == ["ALL"]
    assert svc["security_opt"] == host["security_opt"]
    assert svc["read_only"] is host["read_only"] is True
    tmpfs = dict(item.split(":", 1) for item in svc["tmpfs"])
    assert tmpfs == host["tmpfs"]
    assert svc["pids_limit"] == host["pids_limit"]
    assert size(svc["mem_limit"]) == host["mem_limit"] == size(svc["memswap_limit"])
    assert svc["network_mode"] == host["network_mode"] == "none"
    assert svc["logging"]["driver"] == host["log_config"]["Type"] == "none"
    assert svc["labels"][cfg.LABEL] == config["labels"][cfg.LABEL] == "true"
    assert svc["command"] == config["command"]
    assert svc["working_dir"] == config["working_dir"] == "/workspace"
    assert svc["environment"]["HOME"] == cfg.HOME
    [volume] = svc["volumes"]
    [mount] = host["mounts"]
    assert mount == {"Type": "bind", "Source": "/ws", "Target": "/workspace", "ReadOnly": False}
    assert volume["type"] == mount["Type"]
    assert volume["target"] == mount["Target"]
    assert volume["read_only"] is mount["ReadOnly"]


def test_read_only_policy_mounts_read_only() -> None:
    config = cfg.host_config(
        workspace=Path("/a:b,c"),
        policy=Policy(access="read-only"),
        limits=Limits(),
        image="img",
        user="1:1",
        lbls={},
    )
    [mount] = config["host_config"]["mounts"]
    assert mount["Source"] == "/a:b,c"  # one path: no "src:dst:mode" string to split
    assert mount["ReadOnly"] is True
    assert "binds" not in config["host_config"]


def test_compose_never_asks_for_dangerous_settings() -> None:
    svc = compose_sandbox()
    for key in ("privileged", "pid", "ipc", "devices", "cap_add", "userns_mode"):
        assert key not in svc
    assert not any("docker.sock" in str(v) for v in svc["volumes"])


def test_backend_config_never_asks_for_dangerous_settings() -> None:
    host = backend_config()["host_config"]
    for key in ("privileged", "pid_mode", "ipc_mode", "devices", "cap_add", "userns_mode"):
        assert key not in host
    assert all("docker.sock" not in m["Source"] for m in host["mounts"])
