"""Start-up stays light: ``sandboxrun --help`` and ``import sandboxrun`` load neither pydantic,
anyio, the docker SDK nor rich (their import is most of the cost; bench/cli_startup.py measures it).
Timing is a benchmark's job; what is loaded is checked here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "pydantic",
    "anyio",
    "docker",
    "rich",
    "psutil",
    "sandboxrun.models",
    "sandboxrun.api.sandbox",
    "sandboxrun.engine.request",
    "sandboxrun.engine.supervise",
    "sandboxrun.backends.registry",
)
TYPER_LOADS = ("pydantic",)
"""typer (0.2x) coerces a command's parameters through pydantic ``TypeAdapter`` s once it builds
that command: a subcommand's ``--help`` loads pydantic itself (not our models)."""

PROBE = """
import io, json, sys, contextlib
argv, heavy = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if argv is None:
    import sandboxrun
else:
    from sandboxrun.cli import main
    sys.argv = ["sandboxrun", *argv]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main()
        except SystemExit:
            pass
loaded = {m for m in sys.modules for h in heavy if m == h or m.startswith(h + ".")}
print(json.dumps(sorted(loaded)))
"""


@pytest.mark.parametrize(
    "argv",
    [None, ["--help"], ["run", "--help"], ["ps", "--help"], ["image", "--help"], ["--version"]],
    ids=["import", "help", "run-help", "ps-help", "image-help", "version"],
)
def test_startup_loads_nothing_heavy(argv: list[str] | None) -> None:
    top_level = argv is None or argv[0].startswith("-")
    heavy = HEAVY if top_level else tuple(h for h in HEAVY if h not in TYPER_LOADS)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(heavy)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert json.loads(out.splitlines()[-1]) == []


def test_lazy_public_names_resolve() -> None:
    import sandboxrun

    for name in sandboxrun.__all__:
        assert getattr(sandboxrun, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = sandboxrun.nope
    assert set(dir(sandboxrun)) >= set(sandboxrun.__all__)
