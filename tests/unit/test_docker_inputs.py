"""Pure parts of the docker backend's input handling: the exec environment (explicit variables
win, PATH travels to the wrapper) and the UTF-8 checks the Engine API needs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxrun.backends.docker import config as cfg
from sandboxrun.engine.argv import EXPLICIT_PATH_VAR, PATH_PREPEND_VAR
from sandboxrun.errors import ConfigError, EnvError, WorkspaceError

BUILT = {
    "PATH": "/host/bin",
    "HOME": "/host/home",
    "TMPDIR": "/host/tmp",
    "SHELL": "/bin/zsh",
    "LANG": "C.UTF-8",
}
MARKER = ("SANDBOXRUN_RUN_ID", "r1")
ODD = os.fsdecode(b"x\xff")


def test_exec_env_drops_host_paths_by_default() -> None:
    env = cfg.exec_env(BUILT, explicit=(), marker=MARKER, prepend=())
    assert env == {"HOME": cfg.HOME, "LANG": "C.UTF-8", "SANDBOXRUN_RUN_ID": "r1"}


@pytest.mark.parametrize("name", ["HOME", "TMPDIR", "SHELL"])
def test_exec_env_keeps_an_explicit_host_path(name: str) -> None:
    env = cfg.exec_env(BUILT, explicit={name}, marker=MARKER, prepend=())
    assert env[name] == BUILT[name]


def test_exec_env_sends_an_explicit_path_to_the_wrapper_only() -> None:
    env = cfg.exec_env(BUILT, explicit={"PATH"}, marker=MARKER, prepend=["/opt/x", "/opt/y"])
    assert "PATH" not in env  # the engine finds the shell by the image's PATH
    assert env[EXPLICIT_PATH_VAR] == "/host/bin"
    assert env[PATH_PREPEND_VAR] == "/opt/x:/opt/y"
    assert env["HOME"] == cfg.HOME


def test_exec_env_marker_cannot_be_overridden() -> None:
    env = cfg.exec_env({**BUILT, MARKER[0]: "forged"}, explicit=(), marker=MARKER, prepend=())
    assert env[MARKER[0]] == "r1"


def test_check_utf8_accepts_any_unicode() -> None:
    text = "ünï ✓ 🎉 \x01"
    cfg.check_utf8(argv=[text], script=text, env={text: text}, workdir=f"/workspace/{text}")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"argv": ["echo", "ok", ODD]}, ConfigError, r"argv\[2\] 'x\\xff' is not valid UTF-8"),
        ({"script": f"echo {ODD}"}, ConfigError, "shell script is not valid UTF-8"),
        ({"env": {ODD: "1"}}, EnvError, r"name 'x\\xff' is not valid UTF-8"),
        ({"env": {"SECRET": ODD}}, EnvError, "variable 'SECRET' is not valid UTF-8"),
        ({"workdir": f"/workspace/{ODD}"}, WorkspaceError, r"'/workspace/x\\xff'"),
    ],
)
def test_check_utf8_refuses_naming_the_argument(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    args: dict[str, object] = {"argv": None, "script": None, "env": {}, "workdir": "/workspace"}
    args.update(kwargs)
    with pytest.raises(error, match=message) as info:
        cfg.check_utf8(**args)  # type: ignore[arg-type]
    assert "Docker Engine API" in str(info.value)
    str(info.value).encode("utf-8")  # printable as is


def test_check_utf8_never_shows_a_value_and_cuts_long_arguments() -> None:
    with pytest.raises(EnvError) as info:
        cfg.check_utf8(argv=None, script=None, env={"K": "hunter2" + ODD}, workdir="/w")
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError) as cut:
        cfg.check_utf8(argv=["a" * 1000 + ODD], script=None, env={}, workdir="/w")
    assert len(str(cut.value)) < 300


def test_check_workspace_utf8() -> None:
    cfg.check_workspace_utf8(Path("/tmp/ünï:b,c"))
    with pytest.raises(WorkspaceError, match=r"workspace '/tmp/x\\xff' is not valid UTF-8"):
        cfg.check_workspace_utf8(Path(f"/tmp/{ODD}"))
