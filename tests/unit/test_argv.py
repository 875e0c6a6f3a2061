"""Unit tests of sandboxrun.engine.argv, including torture runs through real /bin/bash and
/bin/sh."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from sandboxrun.engine.argv import (
    EXPLICIT_PATH_VAR,
    PATH_PREFIX,
    PATH_PREPEND_VAR,
    WRAPPED_ARGV0,
    join_path_prepend,
    quote_argv,
    shell_argv,
    validate_argv,
    wrapped_argv,
    wrapper_env,
)
from sandboxrun.errors import ConfigError

SHELLS = [s for s in ("/bin/bash", "/bin/sh", "/bin/dash") if Path(s).exists()]
# /bin/sh may be a link to dash or bash; test each real shell once.
SHELLS = list({os.path.realpath(s): s for s in SHELLS}.values())
if not SHELLS:  # pragma: no cover
    pytest.skip("no POSIX shell available", allow_module_level=True)

TORTURE_ARGS = [
    "plain",
    "with space",
    "  leading and trailing  ",
    "'single'",
    '"double"',
    "mixed ' \" quotes",
    "back\\slash",
    "trailing\\",
    "\\",
    "$(echo pwned)",
    "`echo pwned`",
    "$HOME",
    "${x}",
    "${x:-default}",
    "$'x'",
    "$0 $1 $@ $* $# $$ $?",
    "%n %s %% %d",
    "*",
    "?",
    "[a-z]*",
    "{a,b}",
    "~",
    "~root/x",
    "line1\nline2",
    "\n",
    "trailing newline\n",
    "tab\there",
    "\t",
    "\r\n",
    "-c",
    "--",
    "-e",
    "-n",
    "-",
    "--help",
    "",
    "",
    "ünïcødé ✓ 🎉 日本語",
    "x" * 100_000,
    ";",
    "a; rm -rf /nonexistent",
    "&&",
    "a && b",
    "|",
    "a | b",
    "||",
    "&",
    "#",
    "# comment",
    "a #b",
    "!",
    "!!",
    "!$",
    "\\n",
    "\x01\x1b[31mred\x7f",
    ">out",
    "<in",
    "2>&1",
    "(",
    ")",
    "=",
    "a=b",
    "IFS=x",
    "exec",
    'exec "$@"',
]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An empty home directory: no profile of the developer's interferes."""
    path = tmp_path / "home"
    path.mkdir()
    return path


def _env(home: Path, **extra: str) -> dict[str, str]:
    # Built from scratch: no ENV / BASH_ENV, nothing inherited from the test runner.
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **extra}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)


# --------------------------------------------------------------------------- validate_argv


def test_validate_argv_returns_a_list_copy() -> None:
    original = ("echo", "a b", "")
    checked = validate_argv(original)
    assert checked == ["echo", "a b", ""]
    assert isinstance(checked, list)
    source = ["x"]
    assert validate_argv(source) is not source


def test_validate_argv_refuses_empty() -> None:
    with pytest.raises(ConfigError, match="empty"):
        validate_argv([])


@pytest.mark.parametrize("value", ["ls -l", b"ls"])
def test_validate_argv_refuses_a_single_string(value: str) -> None:
    with pytest.raises(ConfigError, match="not a single string"):
        validate_argv(value)


@pytest.mark.parametrize("bad", [b"bytes", 3, None, Path("/bin/ls")])
def test_validate_argv_refuses_non_str_elements(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"argv\[2\]"):
        validate_argv(["echo", "ok", bad])  # type: ignore[list-item]


@pytest.mark.parametrize("index", [0, 1, 3])
def test_validate_argv_refuses_nul(index: int) -> None:
    argv = ["a", "b", "c", "d"]
    argv[index] = "x\0y"
    with pytest.raises(ConfigError, match=rf"argv\[{index}\] contains a NUL"):
        validate_argv(argv)


# --------------------------------------------------------------------------- quote_argv


def test_quote_argv_round_trips_through_shlex() -> None:
    assert shlex.split(quote_argv(TORTURE_ARGS)) == TORTURE_ARGS
    assert quote_argv(["echo", "a b"]) == "echo 'a b'"


@pytest.mark.parametrize("shell", SHELLS)
def test_quote_argv_is_pasteable_into_a_real_shell(shell: str, home: Path) -> None:
    script = quote_argv(["printf", "%s\\0", *TORTURE_ARGS])
    result = _run([shell, "-c", script], _env(home))
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"".join(a.encode() + b"\0" for a in TORTURE_ARGS)


# --------------------------------------------------------------------------- join_path_prepend


@pytest.mark.parametrize(
    ("dirs", "expected"),
    [
        ([], ""),
        (["/a"], "/a"),
        (["/a", "/b c", "/$x'\""], "/a:/b c:/$x'\""),
        (("/opt/bin", "/"), "/opt/bin:/"),
    ],
)
def test_join_path_prepend(dirs: list[str], expected: str) -> None:
    assert join_path_prepend(dirs) == expected


@pytest.mark.parametrize("bad", ["", "/a:b", ":", "/a\0", "relative", "./bin", "~/bin"])
def test_join_path_prepend_refuses(bad: str) -> None:
    with pytest.raises(ConfigError, match="entry 1"):
        join_path_prepend(["/ok", bad])


def test_join_path_prepend_refuses_a_single_string() -> None:
    with pytest.raises(ConfigError, match="not a single string"):
        join_path_prepend("/usr/bin")


# --------------------------------------------------------------------------- builders: shape


def test_shell_argv_shape() -> None:
    script = "echo 'hi' \"$x\" # c\n"
    assert shell_argv(script) == ["bash", "-lc", PATH_PREFIX + script, "bash"]
    sh = "/bin/sh"
    assert shell_argv(script, shell=sh) == [sh, "-lc", PATH_PREFIX + script, sh]


def test_wrapped_argv_shape() -> None:
    assert wrapped_argv(("ls", "-l", "")) == [
        "bash",
        "-lc",
        PATH_PREFIX + 'exec "$@"',
        WRAPPED_ARGV0,
        "ls",
        "-l",
        "",
    ]
    dash = "/bin/dash"
    assert wrapped_argv(["x"], shell=dash)[0] == dash


def test_path_prefix_mentions_only_the_variables() -> None:
    assert PATH_PREPEND_VAR == "SANDBOXRUN_PATH_PREPEND"
    assert EXPLICIT_PATH_VAR == "SANDBOXRUN_EXPLICIT_PATH"
    assert PATH_PREFIX.endswith("; ")
    assert f"unset {EXPLICIT_PATH_VAR} {PATH_PREPEND_VAR}; " in PATH_PREFIX
    assert "\n" not in PATH_PREFIX  # the script's line numbers stay right


@pytest.mark.parametrize("shell", ["", "ba\0sh", "bin/bash", "./bash"])
def test_bad_shell_is_refused(shell: str) -> None:
    with pytest.raises(ConfigError, match="shell"):
        shell_argv("true", shell=shell)
    with pytest.raises(ConfigError, match="shell"):
        wrapped_argv(["true"], shell=shell)


def test_shell_argv_refuses_nul_in_script() -> None:
    with pytest.raises(ConfigError, match="NUL"):
        shell_argv("echo a\0b")


def test_wrapped_argv_refuses_empty_and_nul() -> None:
    with pytest.raises(ConfigError, match="empty"):
        wrapped_argv([])
    with pytest.raises(ConfigError, match=r"argv\[1\]"):
        wrapped_argv(["echo", "\0"])


@pytest.mark.parametrize("argv0", ["-c", "--", "-", "-la"])
def test_wrapped_argv_refuses_a_leading_dash_program(argv0: str) -> None:
    with pytest.raises(ConfigError, match="starts with '-'"):
        wrapped_argv([argv0, "x"])


# --------------------------------------------------------------------------- wrapped_argv: torture


@pytest.mark.parametrize("shell", SHELLS)
def test_wrapped_argv_delivers_every_argument_verbatim(shell: str, home: Path) -> None:
    result = _run(wrapped_argv(["printf", "%s\\0", *TORTURE_ARGS], shell=shell), _env(home))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(b"\0")[:-1] == [a.encode() for a in TORTURE_ARGS]
    assert result.stderr == b""


@pytest.mark.parametrize("shell", SHELLS)
def test_wrapped_argv_many_arguments(shell: str, home: Path) -> None:
    args = [f"arg {i} $i '{i}'" for i in range(2000)]
    result = _run(wrapped_argv(["printf", "%s\\0", *args], shell=shell), _env(home))
    assert result.stdout.split(b"\0")[:-1] == [a.encode() for a in args]


@pytest.mark.parametrize("shell", SHELLS)
def test_wrapped_argv_program_path_with_odd_characters(shell: str, tmp_path: Path) -> None:
    odd = tmp_path / "d i r'\"$HOME`x`;&|#*"
    odd.mkdir()
    program = odd / "show args"
    program.write_text('#!/bin/sh\nprintf \'%s\\0\' "$0" "$@"\n')
    program.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    result = _run(wrapped_argv([str(program), "-c", "$x"], shell=shell), _env(home))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{program}\0-c\0$x\0".encode()


@pytest.mark.parametrize("shell", SHELLS)
def test_wrapped_argv_execs_in_place_and_propagates_status(shell: str, home: Path) -> None:
    with subprocess.Popen(
        wrapped_argv(["sh", "-c", 'echo "$$"; exit 7'], shell=shell),
        env=_env(home),
        stdout=subprocess.PIPE,
    ) as proc:
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 7
    assert int(out) == proc.pid  # no intermediate shell is left between us and the command


@pytest.mark.parametrize("shell", SHELLS)
def test_wrapped_argv_missing_program_is_127(shell: str, home: Path) -> None:
    result = _run(wrapped_argv(["no-such-program-xyz"], shell=shell), _env(home))
    assert result.returncode == 127
    assert b"no-such-program-xyz" in result.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_wrapped_argv_runs_the_program_not_a_builtin_or_function(
    shell: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text("echo() { printf 'FUNCTION\\n'; }\n")
    (home / ".bash_profile").write_text("echo() { printf 'FUNCTION\\n'; }\n")
    result = _run(wrapped_argv(["echo", "-n", "real"], shell=shell), _env(home))
    assert result.stdout == b"real"


# --------------------------------------------------------------------------- shell_argv: torture

TORTURE_SCRIPTS: list[tuple[str, bytes | None]] = [
    ("echo one\necho two", b"one\ntwo\n"),
    ("echo one\necho two\n", b"one\ntwo\n"),
    ("\n\n   echo leading-blank-lines", b"leading-blank-lines\n"),
    ("", b""),
    ("\n", b""),
    ("cat <<'EOF'\n$HOME `x` $(y) \\\n  'q' \"d\"\nEOF\necho after", None),
    ("x=42\ncat <<EOF\nv=$x \\$x\nEOF", b"v=42 $x\n"),
    ("cat <<-EOF\n\tindented\n\tEOF\n", b"indented\n"),
    ('printf "%s" "$0"', None),
    ('printf "[%s]" "$#" "$@"', b"[0]"),
    ("# leading comment\necho ok # trailing comment\n# end", b"ok\n"),
    ("#!/bin/sh\necho shebang-line-is-a-comment", b"shebang-line-is-a-comment\n"),
    ("# only a comment", b""),
    ("echo a \\\nb", b"a b\n"),
    ("echo a\\\n", b"a\n"),
    ("echo 'it''s' \"$((1+2))\" 'x\\y'", b"its 3 x\\y\n"),
    ("printf '%s|' 'single $HOME' \"dq \\$HOME \\\"q\\\"\" `echo bt`", None),
    ("echo a; echo b && echo c | tr c C; false || echo d", b"a\nb\nC\nd\n"),
    ("f() { echo \"f:$1\"; }\nf 'x y'", b"f:x y\n"),
    ("case x in x) echo matched;; *) echo no;; esac", b"matched\n"),
    ('set -u\necho "${PATH:+has-path}"', b"has-path\n"),
    ("set -e\nfalse\necho unreachable", None),
    ("exit 3", None),
    ("echo ünïcødé 🎉", "ünïcødé 🎉\n".encode()),
    ('echo "$LINENO"', None),  # dash leaves LINENO empty under -c; bash: see below
    ('\necho "$LINENO"', None),
    ('echo "${SANDBOXRUN_PATH_PREPEND-unset}"', b"unset\n"),
    ('echo "${SANDBOXRUN_EXPLICIT_PATH-unset}"', b"unset\n"),
    ("(echo sub)", b"sub\n"),
    ("{ echo group; }", b"group\n"),
    ("  \t echo indented", b"indented\n"),
    ("echo %n %s %%", b"%n %s %%\n"),
    ("x='$(echo no)'; echo \"$x\"", b"$(echo no)\n"),
]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(("script", "expected"), TORTURE_SCRIPTS)
def test_shell_argv_runs_scripts_verbatim(
    shell: str, script: str, expected: bytes | None, home: Path
) -> None:
    result = _run(shell_argv(script, shell=shell), _env(home))
    # The oracle: the same script run directly, without login and without the prefix.
    oracle = _run([shell, "-c", script, shell], _env(home))
    assert (result.returncode, result.stdout, result.stderr) == (
        oracle.returncode,
        oracle.stdout,
        oracle.stderr,
    )
    if expected is not None:
        assert result.stdout == expected
        assert result.returncode == 0


@pytest.mark.parametrize("shell", SHELLS)
def test_shell_argv_dollar_zero_is_the_shell(shell: str, home: Path) -> None:
    result = _run(shell_argv('printf "%s" "$0"', shell=shell), _env(home))
    assert result.stdout == shell.encode()


@pytest.mark.parametrize("shell", SHELLS)
def test_shell_argv_exit_status(shell: str, home: Path) -> None:
    assert _run(shell_argv("exit 3", shell=shell), _env(home)).returncode == 3
    assert _run(shell_argv("set -e\nfalse\necho no", shell=shell), _env(home)).returncode == 1


@pytest.mark.skipif(not Path("/bin/bash").exists(), reason="needs bash")
def test_shell_argv_keeps_line_numbers(home: Path) -> None:
    script = 'echo "$LINENO"\n\necho "$LINENO"\n( exit 1 ) && :\nno-such-command-xyz'
    bash = "/bin/bash"
    result = _run(shell_argv(script, shell=bash), _env(home))
    assert result.stdout == b"1\n3\n"
    assert b"line 5: no-such-command-xyz" in result.stderr


def test_shell_argv_with_a_bare_shell_name(home: Path) -> None:
    bare = "sh"
    result = _run(shell_argv("echo $0", shell=bare), _env(home))
    assert result.stdout == b"sh\n"


# --------------------------------------------------------------------------- PATH prepend

ODD_DIR_NAMES = [
    "plain",
    "with space",
    "dollar$HOME${x}",
    "quote'single",
    'quote"double',
    "back`tick`$(id)",
    "semi;colon&amp|pipe",
    "glob*?[x]",
    "tab\tand\nnewline",
    "ünï 🎉",
    "-dash",
]


def _login_home(tmp_path: Path, profile: str) -> Path:
    """A home whose login profiles (bash and sh) run ``profile``."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text(profile)
    (home / ".bash_profile").write_text(profile)
    return home


def _tool_dir(parent: Path, name: str, output: str) -> Path:
    directory = parent / name
    directory.mkdir(parents=True)
    tool = directory / "foo"
    tool.write_text(f"#!/bin/sh\necho {output}\n")
    tool.chmod(0o755)
    return directory


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", ODD_DIR_NAMES)
def test_path_prepend_runs_after_a_profile_that_assigns_path(
    shell: str, name: str, tmp_path: Path
) -> None:
    decoy = _tool_dir(tmp_path, "decoy", "decoy")
    home = _login_home(tmp_path, f"PATH={shlex.quote(str(decoy))}:/usr/bin:/bin\nexport PATH\n")
    wanted = _tool_dir(tmp_path / "tools", name, "wanted")
    env = _env(home, **{PATH_PREPEND_VAR: join_path_prepend([str(wanted)])})
    script = 'command -v foo; foo; printf "%s" "$PATH"'
    result = _run(shell_argv(script, shell=shell), env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().split("\n")
    found = "\n".join(lines[: name.count("\n") + 1])
    assert found == str(wanted / "foo")
    assert result.stdout.decode().endswith(f"wanted\n{wanted}:{decoy}:/usr/bin:/bin")


@pytest.mark.parametrize("shell", SHELLS)
def test_path_prepend_with_wrapped_argv_and_several_dirs(shell: str, tmp_path: Path) -> None:
    home = _login_home(tmp_path, "PATH=/usr/bin:/bin\n")
    first = _tool_dir(tmp_path, "first dir", "first")
    second = _tool_dir(tmp_path, "second$dir", "second")
    env = _env(home, **{PATH_PREPEND_VAR: join_path_prepend([str(first), str(second)])})
    result = _run(wrapped_argv(["foo"], shell=shell), env)
    assert result.stdout == b"first\n"
    result = _run(wrapped_argv(["env"], shell=shell), env)
    assert f"PATH={first}:{second}:/usr/bin:/bin\n".encode() in result.stdout
    assert PATH_PREPEND_VAR.encode() not in result.stdout  # unset before the command runs


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("value", [None, ""])
def test_no_prepend_leaves_the_profile_path_alone(
    shell: str, value: str | None, tmp_path: Path
) -> None:
    home = _login_home(tmp_path, "PATH=/usr/bin:/bin\n")
    extra = {} if value is None else {PATH_PREPEND_VAR: value}
    result = _run(shell_argv('printf "%s" "$PATH"', shell=shell), _env(home, **extra))
    assert result.stdout == b"/usr/bin:/bin"


@pytest.mark.parametrize("shell", SHELLS)
def test_prepend_survives_set_u_and_an_unset_path(shell: str, tmp_path: Path) -> None:
    home = _login_home(tmp_path, "set -u\nunset PATH\n")
    tools = _tool_dir(tmp_path, "tools", "found")
    env = _env(home, **{PATH_PREPEND_VAR: str(tools)})
    result = _run(shell_argv('foo; printf "%s" "$PATH"', shell=shell), env)
    assert result.returncode == 0, result.stderr
    # No trailing ':' (which would mean "the current directory").
    assert result.stdout == f"found\n{tools}".encode()


# --------------------------------------------------------------------------- explicit PATH


@pytest.mark.parametrize(
    ("explicit", "prepend", "expected"),
    [
        (None, [], {}),
        (None, ["/a", "/b c"], {PATH_PREPEND_VAR: "/a:/b c"}),
        ("/x:/y", [], {EXPLICIT_PATH_VAR: "/x:/y"}),
        ("", [], {EXPLICIT_PATH_VAR: ""}),
        ("/x", ("/a",), {EXPLICIT_PATH_VAR: "/x", PATH_PREPEND_VAR: "/a"}),
    ],
)
def test_wrapper_env(explicit: str | None, prepend: list[str], expected: dict[str, str]) -> None:
    assert wrapper_env(explicit_path=explicit, prepend=prepend) == expected


def test_wrapper_env_refuses() -> None:
    with pytest.raises(ConfigError, match="NUL"):
        wrapper_env(explicit_path="/a\0", prepend=[])
    with pytest.raises(ConfigError, match="not a single string"):
        wrapper_env(explicit_path=None, prepend="/usr/bin")
    with pytest.raises(ConfigError, match="absolute"):
        wrapper_env(explicit_path=None, prepend=["rel"])


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", ODD_DIR_NAMES)
@pytest.mark.parametrize("mode", ["shell", "argv"])
def test_explicit_path_wins_over_a_profile_that_assigns_path(
    shell: str, name: str, mode: str, tmp_path: Path
) -> None:
    decoy = _tool_dir(tmp_path, "decoy", "decoy")
    home = _login_home(tmp_path, f"PATH={shlex.quote(str(decoy))}:/usr/bin:/bin\nexport PATH\n")
    wanted = _tool_dir(tmp_path / "tools", name, "wanted")
    explicit = f"{wanted}:/usr/bin:/bin"
    env = _env(home, **wrapper_env(explicit_path=explicit, prepend=[]))
    if mode == "shell":
        result = _run(shell_argv('foo; printf "%s" "$PATH"', shell=shell), env)
    else:
        result = _run(wrapped_argv(["sh", "-c", 'foo; printf "%s" "$PATH"'], shell=shell), env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wanted\n{explicit}".encode()


@pytest.mark.parametrize("shell", SHELLS)
def test_prepend_goes_before_an_explicit_path(shell: str, tmp_path: Path) -> None:
    home = _login_home(tmp_path, "PATH=/profile/bin\n")
    first = _tool_dir(tmp_path, "first", "first")
    env = _env(home, **wrapper_env(explicit_path="/usr/bin:/bin", prepend=[str(first)]))
    result = _run(wrapped_argv(["env"], shell=shell), env)
    assert f"PATH={first}:/usr/bin:/bin\n".encode() in result.stdout
    assert b"SANDBOXRUN_" not in result.stdout  # both wrapper variables are unset
    assert _run(wrapped_argv(["foo"], shell=shell), env).stdout == b"first\n"


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("profile", ["set -u\nunset PATH\n", "PATH=/profile/bin\n"])
def test_an_empty_explicit_path_is_kept_empty(shell: str, profile: str, tmp_path: Path) -> None:
    home = _login_home(tmp_path, profile)
    env = _env(home, **wrapper_env(explicit_path="", prepend=[]))
    result = _run(shell_argv('printf "[%s]" "$PATH"', shell=shell), env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"[]"


@pytest.mark.parametrize("shell", SHELLS)
def test_explicit_path_survives_set_u_and_an_unset_path(shell: str, tmp_path: Path) -> None:
    home = _login_home(tmp_path, "set -u\nunset PATH\n")
    tools = _tool_dir(tmp_path, "tools", "found")
    env = _env(home, **wrapper_env(explicit_path=f"{tools}:/bin", prepend=["/opt/x"]))
    result = _run(shell_argv('foo; printf "%s" "$PATH"', shell=shell), env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"found\n/opt/x:{tools}:/bin".encode()
