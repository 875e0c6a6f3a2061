"""inspect's ``sandbox=("sandboxrun", "Dockerfile" | "compose.yaml")``: a compose file with one
service as the sandboxrun config (pure; the real evals are in tests/integration)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sandboxrun.errors import ConfigError
from sandboxrun.integrations.inspect.compose import is_compose_file, is_dockerfile, settings
from sandboxrun.integrations.inspect.config import load_config

BASE = Path("/tasks/t1")


HOST = {"FROM_HOST": "host-value", "TAG": "v2", "EMPTY": ""}


def one(service: dict[str, Any], **top: Any) -> dict[str, Any]:
    data = {"services": {"default": service}, **top}
    return settings(data, where="compose.yaml", base=BASE, env=HOST)


def test_names() -> None:
    for name in ("Dockerfile", "Dockerfile.gpu", "task.Dockerfile", "/x/y/Dockerfile"):
        assert is_dockerfile(name), name
    for name in ("dockerfile", "Dockerfile2", "compose.yaml", "x.dockerfile"):
        assert not is_dockerfile(name), name
    for name in ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml"):
        assert is_compose_file(name) and is_compose_file(f"/t/{name}"), name
    assert is_compose_file("t1.compose.yaml")
    assert not is_compose_file("sandboxrun.yaml") and not is_compose_file("compose.json")


def test_an_image_and_everything_taken() -> None:
    got = one(
        {
            "image": "python:3.12",
            "environment": {"A": "1", "FLAG": True, "N": 5, "FROM_HOST": None, "UNSET": None},
            "working_dir": "/workspace/src/",
            "user": 1000,
            "network_mode": "none",
            "mem_limit": "512M",
            "cpus": "1.5",
            "pids_limit": 64,
            "command": "tail -f /dev/null",
            "init": True,
            "x-default": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "read_only": True,
        },
        version="3",
    )
    assert got == {
        "backend": "docker",
        "image": "python:3.12",
        "env": {"A": "1", "FLAG": "true", "N": "5", "FROM_HOST": "host-value"},  # UNSET: left out
        "working_dir": "/workspace/src",
        "user": "1000",
        "network": "none",
        "memory": "512m",
        "cpus": 1.5,
        "pids": 64,
    }


def test_build_forms() -> None:
    assert one({"build": "."})["image_from"] == str(BASE)
    assert one({"build": "/abs/ctx"})["image_from"] == "/abs/ctx"
    got = one({"build": {"context": "env", "dockerfile": "docker/Dockerfile.x"}, "image": "n"})
    assert got["image_from"] == str(BASE / "env") and got["dockerfile"] == "docker/Dockerfile.x"
    assert "image" not in got  # compose tags the build with it: the build is what runs
    assert one({"build": {}})["image_from"] == str(BASE)


def test_environment_as_a_list_and_limits_from_deploy() -> None:
    got = one(
        {
            "image": "i",
            "environment": ["A=1", "B=x=y", "C", "FROM_HOST"],
            "network_mode": "bridge",
            "deploy": {"resources": {"limits": {"memory": "1g", "cpus": 0.5, "pids": 10}}},
        }
    )
    assert got["env"] == {"A": "1", "B": "x=y", "FROM_HOST": "host-value"}  # C is unset here
    assert (got["memory"], got["cpus"], got["pids"], got["network"]) == ("1g", 0.5, 10, "on")
    assert one({"image": "i"})["network"] == "none"  # sandboxrun's default: a network is asked for
    assert "pids" not in one({"image": "i", "pids_limit": -1})  # -1: unlimited


def test_read_only_false_asks_for_a_writable_root() -> None:
    def of(service: dict[str, Any]) -> dict[str, Any]:
        return settings({"services": {"s": {"image": "i", **service}}}, where="c", base=BASE)

    assert of({"read_only": False})["root"] == "writable"
    assert "root" not in of({}) and "root" not in of({"read_only": True})  # read-only


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"services": {"a": {"image": "i"}, "b": {"image": "j"}}},
         "2 services (a, b); a sandboxrun sandbox is one container"),
        ({"services": {}}, "no services"),
        ({"services": {"s": {"image": "i"}}, "volumes": {"v": {}}}, "top-level `volumes`"),
        ({"services": {"s": {"image": "i", "volumes": ["cache:/c"]}}},
         "service s: volume 'cache:/c' is not a bind mount"),
        ({"services": {"s": {"image": "i", "volumes": [{"type": "volume", "source": "v"}]}}},
         "is not a bind mount; a sandboxrun sandbox has no named volumes"),
        ({"services": {"s": {"image": "i", "volumes": "/a:/b"}}}, "`volumes` must be a list"),
        ({"services": {"s": {"image": "i", "privileged": True}}}, "`privileged`"),
        ({"services": {"s": {"image": "i", "ports": ["80:80"]}}}, "`ports`"),
        ({"services": {"s": {"image": "i", "network_mode": "host"}}}, "network_mode 'host'"),
        ({"services": {"s": {"image": "i", "read_only": "no"}}}, "read_only 'no'"),
        ({"services": {"s": {"image": "i", "security_opt": ["seccomp=unconfined"]}}},
         "security_opt 'seccomp=unconfined'"),
        ({"services": {"s": {"build": {"context": ".", "args": {"A": "1"}}}}}, "build `args`"),
        ({"services": {"s": {"build": {"context": ".", "no_cache": True}}}}, "build `no_cache`"),
        ({"services": {"s": {"image": "i", "cpus": True}}}, "cpus True is not a number"),
        ({"services": {"s": {"image": "i", "cpus": [1]}}}, "cpus [1] is not a number"),
        ({"services": {"s": {"image": "i", "pids_limit": [1]}}}, "pids_limit [1] is not a number"),
        ({"services": {"s": {"image": "i", "pids_limit": 1.5}}}, "not a whole number"),
        ({"services": {"s": {"image": "i", "mem_limit": True}}}, "mem_limit True is not a number"),
        ({"services": {"s": {"image": "i", "mem_limit": "1g",
                             "deploy": {"resources": {"limits": {"memory": "2g"}}}}}},
         "mem_limit '1g' and deploy.resources.limits.memory '2g' differ"),
        ({"services": {"s": {"image": "i", "deploy": {"resources": ["limits"]}}}},
         "`deploy.resources` must be a mapping"),
        ({"services": {"s": {"image": "i", "deploy": {"resources": {"limits": ["memory"]}}}}},
         "`deploy.resources.limits` must be a mapping"),
        ({"services": {"s": {"image": "i-${X:?required}"}}}, "only $NAME, ${NAME}"),
        ({"services": {"s": {"image": "i-${X:-${TAG}}"}}}, "only $NAME, ${NAME}"),  # nested
        ({"services": {"s": {"image": "i-${X:-a$TAG}"}}}, "only $NAME, ${NAME}"),
        ({"services": {"s": {}}}, "needs `image` or `build`"),
        ({"services": {"s": {"image": "i", "working_dir": "src"}}}, "must be an absolute path"),
        ({"services": {"s": {"image": "i", "cpus": "lots"}}}, "cpus 'lots' is not a number"),
        ({"services": {"s": {"image": "i", "deploy": {"replicas": 2}}}}, "deploy `replicas`"),
        ({"services": {"s": {"image": "i", "environment": "A=1"}}}, "mapping or a list"),
        (["not", "a", "mapping"], "not a compose file"),
    ],
)  # fmt: skip
def test_refused_in_one_line_by_name(data: Any, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(data, where="compose.yaml", base=BASE)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("compose.yaml: ")


def test_load_config_from_a_dockerfile_and_a_compose_file(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM sandboxrun/base:latest\n")
    config = load_config(str(tmp_path / "Dockerfile"))
    assert config.image_from == str(tmp_path / "Dockerfile") and config.image is None
    (tmp_path / "compose.yaml").write_text(
        yaml.safe_dump(
            {"services": {"default": {"build": ".", "mem_limit": "1g", "working_dir": "/w"}}}
        )
    )
    config = load_config(str(tmp_path / "compose.yaml"))
    assert config.image_from == str(tmp_path) and config.working_dir == "/w"
    assert config.limits().memory_bytes == 1 << 30 and config.backend == "docker"
    other = tmp_path / "eval-env.yaml"  # any name: a mapping with services is a compose file
    other.write_text(yaml.safe_dump({"services": {"a": {"image": "i"}, "b": {"image": "j"}}}))
    with pytest.raises(ConfigError, match=r"eval-env.yaml: 2 services \(a, b\)"):
        load_config(str(other))
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "missing" / "Dockerfile"))


def test_inspects_compose_config_model(tmp_path: Path) -> None:
    compose = pytest.importorskip("inspect_ai.util._sandbox.compose")
    model = compose.ComposeConfig.model_validate(
        {"services": {"default": {"image": "img", "x-default": True, "cpus": 2}}}
    )
    config = load_config(model)
    assert (config.image, config.cpus, config.network) == ("img", 2.0, "none")


def test_sandboxrun_yaml_image_from_is_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "sandboxrun.yaml").write_text("image_from: env/\nbackend: docker\n")
    assert load_config(str(tmp_path / "sandboxrun.yaml")).image_from == str(tmp_path / "env")
    (tmp_path / "both.yaml").write_text("image_from: env\nimage: x\n")
    with pytest.raises(ConfigError, match="image or image_from, not both"):
        load_config(str(tmp_path / "both.yaml"))
    (tmp_path / "local.yaml").write_text("image_from: env\nbackend: process-group\n")
    with pytest.raises(ConfigError, match="image_from needs the docker backend"):
        load_config(str(tmp_path / "local.yaml"))


def test_bind_volumes_are_mounts_read_write_unless_ro() -> None:
    got = one(
        {
            "image": "i",
            "volumes": [
                "./data:/data:ro",
                "/abs:/abs",
                "./cache:/var/tmp/c:rw,z",
                {"type": "bind", "source": "./s", "target": "/t", "read_only": True},
            ],
        }
    )
    assert got["mounts"] == [
        f"{BASE}/data:/data:ro",
        "/abs:/abs:rw",
        f"{BASE}/cache:/var/tmp/c:rw",
        f"{BASE}/s:/t:ro",
    ]


def test_config_mounts_are_relative_to_the_file_and_parsed(tmp_path: Path) -> None:
    (tmp_path / "sandboxrun.yaml").write_text("mounts: ['data:/data', '/x:/y:rw']\n")
    config = load_config(str(tmp_path / "sandboxrun.yaml"))
    assert config.mounts == [f"{tmp_path}/data:/data:ro", "/x:/y:rw"]
    assert config.policy().mounts[1].read_only is False
    (tmp_path / "bad.yaml").write_text("mounts: ['nocolon']\n")
    with pytest.raises(ConfigError, match="expected SRC:DST"):
        load_config(str(tmp_path / "bad.yaml"))


def test_variables_are_substituted_as_compose_does() -> None:
    got = one(
        {
            "image": "task-${TAG}",
            "environment": {
                "A": "$TAG", "B": "${NOPE-fallback}", "C": "${EMPTY:-filled}",
                "D": "${EMPTY-kept}", "E": "$$TAG", "F": "${NOPE}",
            },
        }
    )  # fmt: skip
    assert got["image"] == "task-v2"
    assert got["env"] == {"A": "v2", "B": "fallback", "C": "filled", "D": "", "E": "$TAG", "F": ""}


def test_sample_metadata_reaches_a_compose_file(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text(
        "services:\n  default:\n    image: ctf-${SAMPLE_METADATA_CHALLENGE_NAME}\n"
    )
    config = load_config(str(tmp_path / "compose.yaml"), {"challenge name": "web1"})
    assert config.image == "ctf-web1"


def test_user_root_and_a_bad_user() -> None:
    assert one({"image": "i", "user": "root"})["user"] == "0:0"
    assert one({"image": "i", "user": "1000:1000"})["user"] == "1000:1000"


def test_a_bad_user_is_refused_when_the_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text("services:\n  s:\n    image: i\n    user: app\n")
    with pytest.raises(ConfigError, match="invalid sandboxrun config: user"):
        load_config(str(tmp_path / "compose.yaml"))
