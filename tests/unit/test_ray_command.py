"""What a Ray pool checks of a command's options on the driver, before any slot is taken:
each malformed option is a ``ConfigError`` naming it (on the node it would cost the slot, or
a session). The argv's rules: test_ray_placement.py."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxrun.errors import ConfigError
from sandboxrun.integrations.ray.pool import checked_options, command


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"env": ["A"]}, "env must be a mapping"),
        ({"env": {"A": 1}}, "env must be a mapping"),
        ({"env": {1: "a"}}, "env must be a mapping"),
        ({"env": "A=1"}, "env must be a mapping"),
        ({"stdin": 5}, "stdin must be bytes"),
        ({"stdin": ["a"]}, "stdin must be bytes"),
        ({"pass_env": "HOME"}, "pass_env must be a list"),
        ({"pass_env": (x for x in ["HOME"])}, "pass_env must be a list"),
        ({"pass_env": [b"HOME"]}, "pass_env must be a list"),
        ({"path_prepend": [1]}, "path_prepend must be a list"),
        ({"path_prepend": "/opt/bin"}, "path_prepend must be a list"),
        ({"workdir": 3}, "workdir must be a string"),
        ({"shell": ["echo"]}, "shell must be a string"),
        ({"stdin": "\udc80"}, "stdin is a string that is not valid Unicode"),
        ({"timeout": "5"}, "timeout must be a number"),
        ({"timeout": 0}, "timeout must be a number"),
        ({"idle_timeout": float("nan")}, "idle_timeout must be a number"),
    ],
)
def test_a_malformed_option_is_refused_by_name(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        command(["true"], options)


def test_well_formed_options_are_sent_in_plain_types() -> None:
    from types import MappingProxyType

    args, sent = command(
        ["cat"],
        {
            "env": MappingProxyType({"A": "1"}),
            "pass_env": ("HOME",),
            "path_prepend": ("/opt/bin",),
            "stdin": "h\u00e9",
            "workdir": None,
            "timeout": 5,
            "idle_timeout": None,
        },
    )
    assert args == ["cat"]
    assert sent == {
        "env": {"A": "1"},
        "pass_env": ["HOME"],
        "path_prepend": ["/opt/bin"],
        "stdin": "h\u00e9".encode(),
        "workdir": None,
        "timeout": 5,
        "idle_timeout": None,
    }
    assert type(sent["env"]) is dict
    assert checked_options({"stdin": bytearray(b"x")}) == {"stdin": b"x"}
    assert checked_options({"stdin": None, "env": None}) == {"stdin": None, "env": None}


def test_none_is_an_option_not_given() -> None:
    assert command(["true"], {"pass_env": None, "path_prepend": None}) == (["true"], {})
    with pytest.raises(ConfigError, match="give a command"):
        command(None, {"shell": None})
    assert command("echo hi", {"shell": None}) == (None, {"shell": "echo hi"})
