"""Building the argv that starts the user's command. Pure: nothing here spawns anything.

Commands run under a POSIX login shell (``bash -l``, ``sh -l``), so the login profile sets
``PATH`` and friends first. The profile may *assign* ``PATH``; directories that must come first
(tool shims, a venv's ``bin``) are therefore prepended by ``PATH_PREFIX``, which is part of the
``-c`` script and so runs *after* the profile; a ``PATH`` the caller gave explicitly is put back
by the same prefix, before the prepend, so that it wins over the profile's. Both travel in
environment variables (``EXPLICIT_PATH_VAR``, ``PATH_PREPEND_VAR``; build them with
``wrapper_env``) and are never interpolated into the script text, so no quoting of them is ever
needed. The user's script or argv is
likewise never quoted or rewritten: a script is appended verbatim after the prefix, and an argv
is passed as positional parameters to ``exec "$@"``.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from sandboxrun.errors import ConfigError

if TYPE_CHECKING:
    from sandboxrun.engine.request import ExecRequest

PATH_PREPEND_VAR = "SANDBOXRUN_PATH_PREPEND"
EXPLICIT_PATH_VAR = "SANDBOXRUN_EXPLICIT_PATH"
PATH_PREFIX = (
    f'if [ -n "${{{EXPLICIT_PATH_VAR}+x}}" ]; then '
    f'PATH="${EXPLICIT_PATH_VAR}"; export PATH; fi; '
    f'if [ -n "${{{PATH_PREPEND_VAR}-}}" ]; then '
    f'PATH="${PATH_PREPEND_VAR}${{PATH:+:$PATH}}"; export PATH; fi; '
    f"unset {EXPLICIT_PATH_VAR} {PATH_PREPEND_VAR}; "
)
"""POSIX sh snippet: when ``$SANDBOXRUN_EXPLICIT_PATH`` is set (even empty), make it ``PATH``
(replacing what the login profile assigned); then prepend ``$SANDBOXRUN_PATH_PREPEND`` (if
non-empty) to ``PATH``; export it; unset both variables. ``${PATH:+:$PATH}`` avoids a trailing
``:`` (= the current directory) when ``PATH`` is empty or unset; ``${VAR+x}`` and ``${VAR-}``
keep it safe under ``set -u``."""
WRAPPED_ARGV0 = "sandboxrun"
"""``$0`` of the wrapper shell in ``wrapped_argv`` (shows up in the shell's own error messages)."""


def validate_argv(argv: Sequence[str]) -> list[str]:
    """A checked copy of ``argv``: non-empty, every element a ``str`` without NUL."""
    if isinstance(argv, str | bytes):
        raise ConfigError("argv must be a sequence of strings, not a single string")
    checked = list(argv)
    if not checked:
        raise ConfigError("argv is empty: nothing to run")
    for index, arg in enumerate(checked):
        if not isinstance(arg, str):
            raise ConfigError(f"argv[{index}] is a {type(arg).__name__}, not a str")
        if "\0" in arg:
            raise ConfigError(f"argv[{index}] contains a NUL byte")
    return checked


def quote_argv(argv: Sequence[str]) -> str:
    """A shell-pasteable rendering of ``argv`` (for ``--dry-run`` and logs)."""
    return shlex.join(argv)


def join_path_prepend(dirs: Sequence[str]) -> str:
    """The value for ``PATH_PREPEND_VAR``: absolute directories joined with ``:``, in order."""
    if isinstance(dirs, str):
        raise ConfigError("path prepend must be a sequence of directories, not a single string")
    for index, directory in enumerate(dirs):
        if not directory or ":" in directory or "\0" in directory:
            raise ConfigError(
                f"path prepend entry {index} ({directory!r}) must be non-empty "
                "and contain no ':' or NUL"
            )
        if not directory.startswith("/"):
            # A relative PATH entry resolves against the (untrusted) working directory.
            raise ConfigError(f"path prepend entry {index} ({directory!r}) must be absolute")
    return ":".join(dirs)


def wrapper_env(*, explicit_path: str | None, prepend: Sequence[str]) -> dict[str, str]:
    """The variables ``PATH_PREFIX`` reads, each only when needed: ``EXPLICIT_PATH_VAR`` when
    the caller gave ``PATH`` explicitly (``explicit_path``; re-applied after the login profile)
    and ``PATH_PREPEND_VAR`` (``join_path_prepend(prepend)``) when there is anything to prepend.
    """
    env: dict[str, str] = {}
    if explicit_path is not None:
        if "\0" in explicit_path:
            raise ConfigError("the explicit PATH contains a NUL byte")
        env[EXPLICIT_PATH_VAR] = explicit_path
    if isinstance(prepend, str) or prepend:
        env[PATH_PREPEND_VAR] = join_path_prepend(prepend)
    return env


def _check_shell(shell: str) -> None:
    if not shell or "\0" in shell:
        raise ConfigError(f"shell {shell!r} must be non-empty and contain no NUL")
    if "/" in shell and not shell.startswith("/"):
        raise ConfigError(f"shell {shell!r} must be an absolute path or a bare command name")


def shell_argv(script: str, *, shell: str = "bash") -> list[str]:
    """``[shell, "-lc", PATH_PREFIX + script, shell]``: run ``script`` under a login shell.

    The script is appended verbatim; inside it ``$0`` is ``shell`` and ``"$@"`` is empty.
    """
    _check_shell(shell)
    if "\0" in script:
        raise ConfigError("script contains a NUL byte")
    return [shell, "-lc", PATH_PREFIX + script, shell]


def wrapped_argv(argv: Sequence[str], *, shell: str = "bash") -> list[str]:
    """``[shell, "-lc", PATH_PREFIX + 'exec "$@"', "sandboxrun", *argv]``.

    The login profile runs first, then the shell replaces itself with ``argv``, received
    positionally and therefore byte-for-byte unchanged. ``argv[0]`` must not start with ``-``.
    """
    _check_shell(shell)
    checked = validate_argv(argv)
    if checked[0].startswith("-"):
        # bash's ``exec`` would take it as an option (``exec -c`` clears the environment) and
        # dash's ``exec`` does not accept ``--``: there is no portable way to exec such a name.
        raise ConfigError(f"argv[0] {checked[0]!r} starts with '-'; name the file ./{checked[0]}")
    return [shell, "-lc", PATH_PREFIX + 'exec "$@"', WRAPPED_ARGV0, *checked]


def uses_snapshot(request: ExecRequest) -> bool:
    return request.login == "snapshot" and request.snapshot is not None


def command(request: ExecRequest, default_shell: str, *, local: bool = False) -> list[str]:
    """The argv of ``request``: as is (``raw``, or under a snapshot; on a ``local`` backend
    an argv also when no login shell can run: ``direct_argv``), a script under
    ``<shell> -c``; else (``each``)
    under its own login shell (``argv.wrapped_argv``)."""
    shell = request.login_shell or default_shell
    direct = request.login == "raw" or uses_snapshot(request)
    if local and request.direct_argv and request.script is None:
        return list(request.argv or [])
    if request.script is not None:
        if not direct:
            return shell_argv(request.script, shell=shell)
        if "\0" in request.script:
            raise ConfigError("script contains a NUL byte")
        return [shell, "-c", request.script]
    assert request.argv is not None
    return list(request.argv) if direct else wrapped_argv(request.argv, shell=shell)


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def exec_env(
    request: ExecRequest,
    *,
    owned: Mapping[str, str],
    drop: Collection[str] = (),
    utf8_only: bool = False,
) -> dict[str, str]:
    """A command's environment under the snapshot, in increasing precedence: the snapshot;
    the request's variables given explicitly or differing from ``Snapshot.base`` (those named
    in ``drop`` only when explicit); ``owned`` (sandboxrun's own: the caller leaves out what was
    given explicitly); then ``path_prepend`` in front of ``PATH`` (the snapshot's ``PATH``
    loses its own copies of those directories; an explicit ``PATH`` is kept as given).
    ``utf8_only``: snapshot entries that are not UTF-8 are left out (docker's JSON API)."""
    snap = request.snapshot
    assert snap is not None
    env = {k: v for k, v in snap.env.items() if not utf8_only or is_utf8(k + v)}
    for name, value in request.env.items():
        if name in request.explicit or (name not in drop and snap.base.get(name) != value):
            env[name] = value
    env.update(owned)
    if request.path_prepend:
        joined = join_path_prepend(request.path_prepend)
        rest = env.get("PATH", "")
        if "PATH" not in request.explicit:
            rest = ":".join(p for p in rest.split(":") if p not in request.path_prepend)
        env["PATH"] = f"{joined}:{rest}" if rest else joined
    return env


_SHELL_SIGNS = frozenset(" \t\n|&;<>()$`*?[]{}'\"")


def script_hint(argv: Sequence[str] | None) -> str | None:
    """Why a one-word argv that holds blanks or shell syntax (``"ls -la | wc"``) found no
    program: the whole word was taken as a program's name. None for any other argv."""
    if not argv or len(argv) != 1 or not any(c in _SHELL_SIGNS for c in argv[0]):
        return None
    return (
        "the whole word was taken as one program's name: pass --shell to run it as a shell "
        "script (shell= in the API), or give the program and its arguments as separate words"
    )
