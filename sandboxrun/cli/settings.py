"""The command line's settings in one place (issue 20): each option of ``run`` that a project or
an operator sets once, from (in increasing precedence) the built-in default, the project's file
(``sandboxrun.toml``, or ``[tool.sandboxrun]`` in ``pyproject.toml``: the first found from the
current directory up), the ``SANDBOXRUN_*`` variable, and the command line. ``sandboxrun
config`` shows what is in force and where each value came from.

Values are kept as the command line would spell them (``"90s"``, ``"2g"``), so that they are
validated by the same code with the same messages as the flags; an error says where the value
came from.

A project's file may be the untrusted code's own (``sandboxrun run -- make test`` in a checkout):
it can narrow the sandbox, never widen it. ``policy = "danger-full-access"`` and ``network =
"on"`` there are refused; the command line and the variables are the operator's.

Pure but for ``find_file`` and ``read_file`` (``tomllib``; imported when a file is read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxrun.errors import ConfigError

FILE_NAME = "sandboxrun.toml"
PYPROJECT = "pyproject.toml"
CONFIG_VAR = "SANDBOXRUN_CONFIG"
"""A settings file to use instead of looking for one (``none``: no file)."""


@dataclass(frozen=True)
class Setting:
    option: str
    """The flag that sets it on the command line."""
    default: str | None
    """The built-in default, as the flag would spell it (None: none)."""
    choices: tuple[str, ...] = ()
    widening: tuple[str, ...] = ()
    """Values a project's file may not set: they widen the sandbox."""
    env_name: str | None = None
    """Its variable when not named after the flag (the spill caps' older names)."""

    @property
    def variable(self) -> str:
        derived = "SANDBOXRUN_" + self.option.removeprefix("--").replace("-", "_").upper()
        return self.env_name or derived


SETTINGS: dict[str, Setting] = {
    "backend": Setting("--backend", "auto", ("auto", "docker", "systemd-scope", "process-group")),
    "image": Setting("--image", None),
    "policy": Setting(
        "--policy",
        "workspace-write",
        ("read-only", "workspace-write", "danger-full-access"),
        widening=("danger-full-access",),
    ),
    "network": Setting("--network", "none", ("none", "on"), widening=("on",)),
    "timeout": Setting("--timeout", "120s"),
    "max_timeout": Setting("--max-timeout", None),
    "idle_timeout": Setting("--idle-timeout", None),
    "grace": Setting("--grace", "3s"),
    "max_output": Setting("--max-output", "64k"),
    "spill_max": Setting("--spill-max", "64m"),
    "root": Setting("--root", "read-only", ("read-only", "writable")),
    "disk": Setting("--disk", None),
    "memory": Setting("--memory", None),
    "cpus": Setting("--cpus", None),
    "pids": Setting("--pids", None),
    "spill_max_age": Setting("--older-than", "24h", env_name="SANDBOXRUN_SPILL_MAX_AGE"),
    "spill_max_total": Setting("--max-total", "1g", env_name="SANDBOXRUN_SPILL_MAX_TOTAL"),
}
"""Every setting, by its key in a file."""
SPILL_CAPS = ("spill_max_age", "spill_max_total")
"""``clean``'s settings, which the spill root's pruning reads from the environment."""


@dataclass(frozen=True)
class Value:
    value: str | None
    source: str
    """``default``, ``command line``, the variable's name, or the file and its section."""


@dataclass(frozen=True)
class ProjectFile:
    path: Path
    values: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.path} [tool.sandboxrun]" if self.path.name == PYPROJECT else str(self.path)


def find_file(start: Path, environ: Mapping[str, str]) -> Path | None:
    """The settings file in force: ``$SANDBOXRUN_CONFIG`` (``none``: no file), else the first
    ``sandboxrun.toml``, or ``pyproject.toml`` holding ``[tool.sandboxrun]``, from ``start``
    up to the root."""
    given = environ.get(CONFIG_VAR, "").strip()
    if given:
        return None if given.lower() == "none" else Path(given)
    for directory in [start, *start.parents]:
        candidate = directory / FILE_NAME
        if candidate.is_file():
            return candidate
        project = directory / PYPROJECT
        if project.is_file() and _has_section(project):
            return project
    return None


def _has_section(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "[tool.sandboxrun]" in text.replace(" ", "")


def read_file(path: Path) -> ProjectFile:
    """The settings of a ``sandboxrun.toml`` (its top level) or of a ``pyproject.toml`` (its
    ``[tool.sandboxrun]`` table), checked (``parse_values``)."""
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"settings file {path}: no such file ({CONFIG_VAR})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"settings file {path}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"settings file {path}: not valid TOML: {exc}") from None
    if path.name == PYPROJECT:
        section = data.get("tool", {}).get("sandboxrun", {})
        where = f"{path} [tool.sandboxrun]"
    else:
        section, where = data, str(path)
    return ProjectFile(path, parse_values(section, where))


def parse_values(section: object, where: str) -> dict[str, str]:
    """A file's table as settings: known keys only (dashes or underscores), strings or
    numbers, a choice among the setting's choices, nothing that widens the sandbox."""
    import difflib

    if not isinstance(section, dict):
        raise ConfigError(f"{where}: expected a table of settings")
    out: dict[str, str] = {}
    for raw_key, raw in section.items():
        key = str(raw_key).replace("-", "_")
        setting = SETTINGS.get(key)
        if setting is None:
            close = difflib.get_close_matches(key, list(SETTINGS), n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            known = ", ".join(SETTINGS)
            raise ConfigError(f"{where}: unknown setting {raw_key!r}{hint}; known: {known}")
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise ConfigError(f"{where}: {raw_key} must be a string or a number, got {raw!r}")
        value = str(raw)
        if setting.choices and value not in setting.choices:
            choices = ", ".join(setting.choices)
            raise ConfigError(f"{where}: {raw_key} = {value!r} is not one of {choices}")
        if value in setting.widening:
            raise ConfigError(
                f"{where}: {raw_key} = {value!r}: a project's settings cannot widen the "
                f"sandbox (the file may be the code's own); pass {setting.option} {value} or "
                f"set {setting.variable}"
            )
        out[key] = value
    return out


def resolve(
    given: Mapping[str, str | None],
    environ: Mapping[str, str],
    project: ProjectFile | None,
) -> dict[str, Value]:
    """Every setting's value in force and its source: the command line (``given``: the flag's
    value, None when not given), else the variable, else the project's file, else the
    default. A variable with a choice not among them is refused naming it."""
    out: dict[str, Value] = {}
    for key, setting in SETTINGS.items():
        variable = setting.variable
        from_env = environ.get(variable, "").strip()
        if given.get(key) is not None:
            out[key] = Value(given[key], "command line")
        elif from_env:
            if setting.choices and from_env not in setting.choices:
                choices = ", ".join(setting.choices)
                raise ConfigError(f"{variable}={from_env!r} is not one of {choices}")
            out[key] = Value(from_env, variable)
        elif project is not None and key in project.values:
            out[key] = Value(project.values[key], project.where)
        else:
            out[key] = Value(setting.default, "default")
    return out


def blame(message: str, values: Mapping[str, Value]) -> str:
    """``message`` (an option's error: ``--memory must be ...``) with where the value came
    from when that was not the command line."""
    for key, setting in SETTINGS.items():
        value = values.get(key)
        if value is None or value.source in ("command line", "default"):
            continue
        if message.startswith((setting.option, f"invalid {setting.option}")):
            return f"{message} (from {value.source}: {key} = {value.value!r})"
    return message


def lines(values: Mapping[str, Value]) -> list[str]:
    """``sandboxrun config``'s table: ``KEY  VALUE  SOURCE`` a line."""
    shown = [(key, "-" if v.value is None else v.value, v.source) for key, v in values.items()]
    width = max(len(k) for k, _, _ in shown)
    vwidth = max(len(v) for _, v, _ in shown)
    return [f"{k:<{width}}  {v:<{vwidth}}  {s}" for k, v, s in shown]


def in_force(
    given: Mapping[str, str | None],
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> dict[str, Value]:
    """``resolve`` with this process's environment and the settings file found from ``cwd``
    (default: the current directory)."""
    import os

    env = os.environ if environ is None else environ
    found = find_file(Path.cwd() if cwd is None else cwd, env)
    return resolve(given, env, None if found is None else read_file(found))


def export_spill_caps(values: Mapping[str, Value]) -> None:
    """Put a file's spill caps in this process's environment, where the spill root's pruning
    reads them (a variable already set stays: it came first)."""
    import os

    for key in SPILL_CAPS:
        value = values.get(key)
        if value is not None and value.value is not None and value.source != "default":
            os.environ.setdefault(SETTINGS[key].variable, value.value)


def required(values: Mapping[str, Value], key: str) -> str:
    """The value of a setting that has a default (it is never None: ``resolve`` falls back to
    ``SETTINGS[key].default``)."""
    value = values[key].value
    if value is None:
        raise ValueError(f"the setting {key!r} has no default")
    return value
