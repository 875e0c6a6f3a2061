"""The command line with docker's and GNU timeout's habits (issue 20), as a user types it:
every case here failed before (exit 2 for usage errors, no ``-e NAME``, no ``--env-file``,
click's far suggestions, ``-it`` read as ``-i -t bash``, a bare ``[Errno 2]`` for a quoted
script, ``clean`` without ``--dry-run`` reading a bare number as hours, no ``-h``)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from helpers import cli

from sandboxrun.engine.capture.spill import SpillDir, SpillSession

SECRET = "tok-9f8e7d6c5b4a"


def run_pg(workspace: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = cli("run", "-w", str(workspace), "-b", "process-group", *args, env=env)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("words", [["-h"], ["run", "-h"], ["clean", "-h"], []])
def test_h_is_help_and_a_bare_call_shows_it(words: list[str]) -> None:
    proc = cli(*words)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: sandboxrun" in proc.stdout + proc.stderr


def test_e_name_takes_the_value_of_this_environment_masked(workspace: Path) -> None:
    env = {**os.environ, "API_TOKEN": SECRET}
    script = 'test "$API_TOKEN" = ' + SECRET + ' && echo same; echo "$API_TOKEN"'
    rc, out, err = run_pg(workspace, "-e", "API_TOKEN", "--", "sh", "-c", script, env=env)
    assert rc == 0, err
    assert out == "same\n[masked:API_TOKEN]\n"  # in the command, masked in its output
    assert SECRET not in out + err
    unset = {k: v for k, v in os.environ.items() if k != "API_TOKEN"}
    rc, _, err = run_pg(workspace, "-e", "API_TOKEN", "--", "true", env=unset)
    assert rc == 125 and "no such variable is set here" in err


def test_env_file_variables_reach_the_command_masked_and_e_wins(workspace: Path) -> None:
    env_file = workspace.parent / "vars.env"
    env_file.write_text(f"# test\nGH_TOKEN={SECRET}\nMODE=file\nQ='kept'\n")
    script = 'echo "$GH_TOKEN|$MODE|$Q"'
    rc, out, err = run_pg(
        workspace, "--env-file", str(env_file), "-e", "MODE=flag", "--", "sh", "-c", script
    )
    assert rc == 0, err
    assert out == "[masked:GH_TOKEN]|flag|'kept'\n"
    rc, out, err = run_pg(workspace, "--env-file", str(env_file), "--dry-run", "--", "true")
    assert rc == 0 and SECRET not in out + err
    env_file.write_text(f"GOOD=1\n{SECRET}\n")  # a value on a line of its own, by mistake
    rc, out, err = run_pg(workspace, "--env-file", str(env_file), "--", "true")
    assert rc == 125 and f"{env_file} line 2" in err and SECRET not in err


@pytest.mark.parametrize(
    ("args", "first", "hint"),
    [
        (["--bogus", "--", "true"], "no such option: --bogus", "Try 'sandboxrun run --help'"),
        (["--tiemout", "5", "--", "true"], "(did you mean --timeout?)", "Try"),
        (["-it", "bash"], "missing argument 'COMMAND'", "-t is --timeout here"),
        (["-ti", "bash"], "invalid --timeout 'i'", "sandboxrun shell"),
        (["--rm", "--", "true"], "no such option: --rm", "always removes its sandbox"),
    ],
)
def test_usage_errors_exit_125_and_explain_docker_habits(
    workspace: Path, args: list[str], first: str, hint: str
) -> None:
    rc, out, err = run_pg(workspace, *args)
    assert rc == 125 and out == ""
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("sandboxrun: error: ") and first in lines[0]
    assert hint in lines[1]
    assert "--cpus" not in err and "--user" not in err  # no far guesses


def test_a_quoted_script_without_shell_says_to_pass_shell(workspace: Path) -> None:
    rc, out, err = run_pg(workspace, "ls -la | wc")
    assert rc == 127
    assert "No such file or directory: ls -la | wc" in err and "pass --shell" in err
    rc, out, _ = run_pg(workspace, "--json", "ls -la | wc")
    assert rc == 127 and "pass --shell" in json.loads(out)["error"]
    rc, out, err = run_pg(workspace, "--shell", "ls -a | wc -l")
    assert rc == 0 and int(out) >= 3, err


def _closed(root: Path, age_s: float) -> Path:
    session = SpillSession.create(root)
    spill = SpillDir(session.path, "run1").open_file("stdout")
    spill.write(b"x" * 10)
    spill.close()
    session.close(keep=True)
    when = time.time() - age_s
    for dirpath, dirnames, filenames in os.walk(session.path, topdown=False):
        for name in [*dirnames, *filenames]:
            os.utime(Path(dirpath) / name, (when, when), follow_symlinks=False)
    os.utime(session.path, (when, when))
    return session.path


def test_clean_dry_run_and_a_bare_age_in_seconds(tmp_path: Path) -> None:
    root = tmp_path / "spill"
    root.mkdir(mode=0o700)
    old, young = _closed(root, 200), _closed(root, 30)
    proc = cli("clean", "--dry-run", "--spill-dir", str(root), "--older-than", "90")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("spill: would remove 1 directory (10 B)"), proc.stdout
    assert "would remove" in proc.stdout.splitlines()[-1]  # containers: named, not removed
    assert old.exists() and young.exists()  # a dry run removes nothing


def test_settings_from_the_project_apply_and_say_where_from(workspace: Path) -> None:
    """A project sets run's options once (pyproject.toml [tool.sandboxrun]); a variable beats
    it, a flag beats both; `sandboxrun config` says what is in force and where from."""
    (workspace / "pyproject.toml").write_text(
        '[tool.sandboxrun]\nbackend = "process-group"\ntimeout = "1s"\ngrace = "0.2s"\n'
    )
    start = time.monotonic()
    proc = cli("run", "--", "sleep", "30", cwd=workspace)  # no -b, no -t: the file's
    assert proc.returncode == 124, proc.stderr
    assert time.monotonic() - start < 15
    proc = cli("run", "-t", "30s", "--json", "--", "true", cwd=workspace)
    assert proc.returncode == 0 and json.loads(proc.stdout)["backend"] == "process-group"
    shown = cli("config", cwd=workspace, env={**os.environ, "SANDBOXRUN_GRACE": "1s"})
    assert shown.returncode == 0, shown.stderr
    table = {line.split()[0]: line.split(None, 2)[1:] for line in shown.stdout.splitlines()[1:]}
    where = f"{workspace / 'pyproject.toml'} [tool.sandboxrun]"
    assert shown.stdout.splitlines()[0] == f"settings file: {where}"
    assert table["timeout"] == ["1s", where] and table["grace"] == ["1s", "SANDBOXRUN_GRACE"]
    assert table["policy"] == ["workspace-write", "default"]


def test_a_projects_settings_cannot_widen_the_sandbox(workspace: Path) -> None:
    (workspace / "sandboxrun.toml").write_text('policy = "danger-full-access"\nnetwork = "on"\n')
    proc = cli("run", "-b", "process-group", "--", "touch", "ran", cwd=workspace)
    assert proc.returncode == 125
    assert "a project's settings cannot widen the sandbox" in proc.stderr
    assert not (workspace / "ran").exists()
    (workspace / "sandboxrun.toml").write_text('memory = "1k"\n')
    proc = cli("run", "-b", "process-group", "--", "true", cwd=workspace)
    assert proc.returncode == 125
    assert f"(from {workspace / 'sandboxrun.toml'}: memory = '1k')" in proc.stderr


def test_a_missing_image_under_auto_says_what_b_docker_says(workspace: Path) -> None:
    """``--image`` with the image missing: under ``auto`` the same clear "image not found" as
    ``-b docker`` (exit 125), not "need the docker backend" about a fallback."""
    from helpers import require_backend

    require_backend("docker")
    image = "sandboxrun/no-such-image:0"
    auto = cli("run", "-w", str(workspace), "--image", image, "--", "true")
    named = cli("run", "-w", str(workspace), "-b", "docker", "--image", image, "--", "true")
    assert auto.returncode == named.returncode == 125, (auto.stderr, named.stderr)
    first = "sandboxrun: error: backend 'docker' is unavailable: image sandboxrun/no-such-image:0"
    assert auto.stderr.startswith(first), auto.stderr
    assert named.stderr.startswith(first), named.stderr
    assert "need the docker backend" not in auto.stderr


def test_mount_is_read_only_unless_rw_and_refusals_name_it(workspace: Path, tmp_path: Path) -> None:
    """issue 20: ``--mount SRC:DST[:ro|rw]`` (there was none, for read-only data or a cache)."""
    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()
    (data / "in.txt").write_text("data\n")
    cache.mkdir()
    script = (
        "cat /var/tmp/d/in.txt; touch /var/tmp/d/no 2>/dev/null || echo ro; echo c > /var/tmp/c/f"
    )
    rc, out, err = run_pg(
        workspace, "--mount", f"{data}:/var/tmp/d", "--mount", f"{cache}:/var/tmp/c:rw",
        "--", "sh", "-c", script,
    )  # fmt: skip
    assert (rc, out) == (0, "data\nro\n"), err
    assert (cache / "f").read_text() == "c\n" and not (data / "no").exists()
    rc, _, err = run_pg(workspace, "--mount", f"{data}:/var/tmp/d", "--", "touch", "/var/tmp/d/no")
    assert rc == 1 and "it is in the read-only mount" in err and ":rw writes there" in err, err
    assert "danger-full-access" not in err  # which would refuse --mount: not a way out
    door = socket.socket(socket.AF_UNIX)
    door.bind(str(tmp_path / "agent.sock"))
    for spec, words in [
        (f"{data}:/workspace/x", "the target is at, in or around the workspace"),
        (f"{tmp_path}/agent.sock:/s", "is a socket"),
        (f"{data}", "expected SRC:DST[:ro|rw]"),
        (f"{data}:/no-such-dir-here", "the target must be an existing directory here"),
    ]:
        rc, _, err = run_pg(workspace, "--mount", spec, "--", "true")
        assert rc == 125 and words in err and err.count("\n") == 1, (spec, err)
    door.close()
