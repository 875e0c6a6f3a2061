"""The layers of the package, enforced (docs/design.md, "Layers").

A module imports only from its own layer or a lower one: ``supervisor`` < the public leaves
(``errors``, ``models``, ``units``) < ``engine`` < ``backends`` < ``api`` and ``detached``
(peers) < ``integrations`` and ``image`` (peers: neither imports the other) < ``cli`` < the root
(``__init__``, ``__main__``, the kept paths). Every import counts: module level, lazy (inside a
function) and ``TYPE_CHECKING``.
``supervisor/`` runs inside the sandbox: the standard library only, Python 3.9, and the per-run
launcher loads no costly module.
"""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sandboxrun"
SUPERVISOR = PACKAGE / "supervisor"
RANKS = {
    "supervisor": 0,
    "errors": 1,
    "models": 1,
    "units": 1,
    "engine": 2,
    "backends": 3,
    "api": 4,
    "detached": 4,
    "integrations": 5,
    "image": 4,
    "cli": 6,
}
TOP = 7
"""The root package, ``__main__``, ``testing`` and the modules kept at their old paths."""
EAGER_INIT_OK = {"sandboxrun.cli": "registers the commands (start-up: test_cli_startup)"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(name: str) -> tuple[int, str]:
    """``(rank, layer name)`` of the sandboxrun module ``name``."""
    parts = name.split(".")
    if len(parts) < 2 or parts[1] not in RANKS:
        return TOP, "root"
    return RANKS[parts[1]], parts[1]


def imported(tree: ast.AST, known: set[str]) -> Iterator[tuple[int, str]]:
    """``(line, sandboxrun module)`` for every import of sandboxrun in ``tree``: a name of a
    ``from`` import that is a module counts as that module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sandboxrun":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] != "sandboxrun":
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in known:
                    yield node.lineno, sub
                elif node.module == "sandboxrun" and alias.name == "__version__":
                    continue  # a constant of the root, imports nothing
                else:
                    yield node.lineno, node.module


def violations(name: str, source: str, known: set[str]) -> list[str]:
    """What ``source`` (the module ``name``) imports against the layer rule."""
    rank, own = layer(name)
    found = []
    for line, target in imported(ast.parse(source), known):
        their_rank, theirs = layer(target)
        if their_rank > rank:
            found.append(f"{name}:{line} imports {target} ({own} -> {theirs})")
    return found


def test_every_import_goes_down_the_layers() -> None:
    known = set(modules())
    found = [v for n, p in modules().items() for v in violations(n, p.read_text(), known)]
    assert found == []


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("sandboxrun.engine.x", "from sandboxrun.api.sandbox import Sandbox\n"),
        ("sandboxrun.engine.x", "def f():\n    from sandboxrun.backends import registry\n"),
        (
            "sandboxrun.backends.x",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from sandboxrun.api import files\n",
        ),
        ("sandboxrun.supervisor.x", "import sandboxrun.errors\n"),
        ("sandboxrun.models", "from sandboxrun import engine\n"),
        ("sandboxrun.image.x", "from sandboxrun.integrations import blocking\n"),
        ("sandboxrun.api.x", "from sandboxrun import BlockingSandbox\n"),
    ],
)
def test_an_upward_import_is_found(name: str, source: str) -> None:
    """The rule can fail: an upward import, lazy or under TYPE_CHECKING, or between peers."""
    assert violations(name, source, set(modules())) != []


def test_an_import_down_or_sideways_is_allowed() -> None:
    known = set(modules())
    assert violations("sandboxrun.api.x", "from sandboxrun.engine import argv\n", known) == []
    assert violations("sandboxrun.cli.x", "from sandboxrun import __version__\n", known) == []
    assert violations("sandboxrun.errors", "from sandboxrun import models\n", known) == []


def test_subpackages_import_nothing_eagerly() -> None:
    """Importing a package (as every import of one of its modules does) costs nothing:
    only ``TYPE_CHECKING`` imports and lazy names (PEP 562) in an ``__init__``."""
    eager = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        name = module_name(init)
        if name == "sandboxrun" or name in EAGER_INIT_OK:
            continue
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.Import):
                cheap = all(a.name in {"importlib", "os"} for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                cheap = node.module in {"__future__", "typing"}
            else:
                continue
            if not cheap:
                eager.append(f"{name}: {ast.unparse(node)}")
    assert eager == []


def test_the_supervisor_imports_only_the_standard_library() -> None:
    siblings = {p.stem for p in SUPERVISOR.glob("*.py")}
    foreign = []
    for path in sorted(SUPERVISOR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [(node.module or "").split(".")[0]]
            else:
                continue
            for top in names:
                if top not in sys.stdlib_module_names and top not in siblings:
                    foreign.append(f"{path.name}:{node.lineno}: {top}")
    assert foreign == []


def test_the_supervisor_is_python_3_9_syntax() -> None:
    for path in sorted(SUPERVISOR.glob("*.py")):
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 9))


def _python39() -> str | None:
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for candidate in sorted(pyenv.glob("3.9*/bin/python3.9")):
        return str(candidate)
    found = shutil.which("python3.9")  # not pyenv's shim (it refuses a version not selected)
    return found if found and ".pyenv/shims" not in found else None


def test_the_supervisor_runs_under_python_3_9() -> None:
    """The oldest python3 the images promise imports every supervisor module and runs the
    confinement plan's parsing (``confine._strings``, once ``list | tuple``: 3.10+)."""
    python = _python39()
    if python is None:
        pytest.skip("no Python 3.9 interpreter here (python3.9 or pyenv's 3.9.*)")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"  # as the host imports them: a package
        "from supervisor import confine, launcher, launchwire, procfs, protocol, runner\n"
        "from supervisor import safeopen, scope_watch\n"
        "assert confine._strings(['/a', '/b']) == ['/a', '/b']\n"
        "assert confine._strings(('/a',)) == ['/a']\n"
        "sys.path[0] = sys.argv[2]\n"  # as the sandbox runs them: scripts side by side
        "for name in ('confine', 'protocol', 'procfs', 'launchwire', 'safeopen', 'runner',\n"
        "             'launcher', 'scope_watch'):\n"
        "    sys.modules.pop(name, None); __import__(name)\n"
        "print(sys.version_info[:2])\n"
    )
    done = subprocess.run(
        [python, "-I", "-S", "-B", "-c", code, str(PACKAGE), str(SUPERVISOR)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(3, 9)"


def test_the_launcher_loads_no_costly_module() -> None:
    """The launcher starts once per run (systemd-scope): it and the confinement it loads
    import none of json, typing, re, enum, contextlib, dataclasses."""
    code = (
        "import sys; base = set(sys.modules); sys.path.insert(0, sys.argv[1])\n"
        "import launcher, confine\n"
        "print(' '.join(sorted(set(sys.modules) - base)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", code, str(SUPERVISOR)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    loaded = set(done.stdout.split())
    assert "launcher" in loaded and "confine" in loaded
    costly = {"json", "typing", "re", "enum", "contextlib", "dataclasses"}
    assert loaded & costly == set()


def entry_points() -> list[str]:
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    targets = [project["scripts"]["sandboxrun"]]
    for group in project["entry-points"].values():
        targets.extend(group.values())
    return targets


@pytest.mark.parametrize("target", entry_points())
def test_every_entry_point_target_imports(target: str) -> None:
    module, _, attr = target.partition(":")
    loaded = importlib.import_module(module)
    assert not attr or callable(getattr(loaded, attr))


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        ("sandboxrun.blocking", "sandboxrun.integrations.blocking", ["BlockingSandbox"]),
        (
            "sandboxrun.inspect_config",
            "sandboxrun.integrations.inspect.config",
            ["SandboxrunConfig"],
        ),
        (
            "sandboxrun.pytest_plugin",
            "sandboxrun.integrations.pytest_plugin",
            ["sandbox", "async_sandbox", "pytest_addoption", "pytest_configure"],
        ),
        (
            "sandboxrun._inspect_registry",
            "sandboxrun.integrations.inspect.registry",
            ["SandboxrunSandboxEnvironment"],
        ),
    ],
)
def test_the_old_paths_still_import(old: str, new: str, names: list[str]) -> None:
    """The documented deep paths and the entry-point targets of installs made before the move
    (their metadata names the old module until reinstalled) give the very same objects."""
    before, after = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(before, name) is getattr(after, name)


RESULTS = "sandboxrun.engine.results"
"""The one module that builds an ``ExecResult`` and rewrites a finished one."""


def result_writes(source: str) -> list[str]:
    """Where ``source`` builds an ``ExecResult`` or rewrites a model with ``model_copy(update=)``
    (``models.replaced`` validates instead: inputs use it)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "ExecResult":
            found.append(f"{node.lineno}: ExecResult(...)")
        elif (
            isinstance(func, ast.Attribute)
            and func.attr == "model_copy"
            and (node.args or any(k.arg == "update" for k in node.keywords))
        ):
            found.append(f"{node.lineno}: .model_copy(update=...)")
    return found


def found_outside(owner: str, find: Callable[[str], list[str]]) -> dict[str, list[str]]:
    """What ``find`` finds in every module but ``owner``, by module; and ``owner`` must have
    some (so the check can see what it looks for)."""
    assert find(modules()[owner].read_text()), f"{owner} has none: the check sees nothing"
    return {
        name: hits
        for name, path in modules().items()
        if name != owner and (hits := find(path.read_text()))
    }


def test_only_the_engine_builds_or_rewrites_a_result() -> None:
    assert found_outside(RESULTS, result_writes) == {}


def test_a_result_written_elsewhere_is_found() -> None:
    source = "r = ExecResult(status='completed')\nr = r.model_copy(update={'error': 'x'})\n"
    assert result_writes(source) == ["1: ExecResult(...)", "2: .model_copy(update=...)"]
    assert result_writes("r = r.model_copy()\nreplaced(limits, max_output=1)\n") == []


SDK_BOUNDARY = "sandboxrun.backends.docker.api"
"""The one module that calls the docker SDK (and its transport, requests)."""


def sdk_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        sdk = [n for n in names if n.split(".")[0] in {"docker", "requests"}]
        found += [f"{node.lineno}: {n}" for n in sdk]
    return found


def test_only_the_sdk_boundary_imports_the_docker_sdk() -> None:
    assert found_outside(SDK_BOUNDARY, sdk_imports) == {}
    lazy = "def f():\n    import docker.errors\n    from requests import exceptions\n"
    assert sdk_imports(lazy) == ["2: docker.errors", "3: requests"]
    assert sdk_imports("from sandboxrun.backends.docker import api\nimport dockerfile\n") == []


def test_one_symlink_safe_walk() -> None:
    """Every walk that resolves symlinks itself is ``supervisor.safeopen``'s: no other module
    reads a link relative to a directory fd (``os.readlink(..., dir_fd=...)``)."""
    walkers = {
        name
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "readlink"
        and any(k.arg == "dir_fd" for k in node.keywords)
    }
    assert walkers == {"sandboxrun.supervisor.safeopen"}
