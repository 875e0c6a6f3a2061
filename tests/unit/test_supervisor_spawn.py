"""``supervisor.spawn``: execvp's outcome with a lookup per PATH directory, on real processes
(each spawned child is reaped here, as the runner reaps it)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sandboxrun.supervisor.spawn import candidates, spawn


def run(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Spawn, read stdout to EOF, reap: ``(exit code, stdout)``."""
    out_r, out_w = os.pipe()
    null = os.open(os.devnull, os.O_RDWR)
    try:
        pid = spawn(argv, env, str(cwd), [null, out_w, null])
    finally:
        os.close(out_w)
        os.close(null)
    with os.fdopen(out_r, "rb") as out:
        data = out.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), data


def script(path: Path, body: str, mode: int = 0o755) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(mode)


def test_candidates_follow_the_commands_own_path() -> None:
    assert candidates("tool", {"PATH": "/a:/b"}) == ["/a/tool", "/b/tool"]
    assert candidates("./tool", {"PATH": "/a"}) == ["./tool"]
    assert candidates("/x/tool", {}) == ["/x/tool"]
    assert candidates("tool", {}) == [os.path.join(d, "tool") for d in os.defpath.split(":")]


def test_found_past_a_directory_where_it_cannot_run(tmp_path: Path) -> None:
    script(tmp_path / "one" / "t", "#!/bin/sh\necho one\n", 0o644)
    script(tmp_path / "two" / "t", "#!/bin/sh\necho two\n")
    env = {"PATH": f"{tmp_path}/none:{tmp_path}/one:{tmp_path}/two"}
    assert run(["t"], env, tmp_path) == (0, "two\n")


def test_found_past_a_missing_interpreter(tmp_path: Path) -> None:
    script(tmp_path / "one" / "t", "#!/no/such/interpreter\n")
    script(tmp_path / "two" / "t", "#!/bin/sh\necho two\n")
    assert run(["t"], {"PATH": f"{tmp_path}/one:{tmp_path}/two"}, tmp_path) == (0, "two\n")


def test_the_first_real_failure_is_reported_by_the_commands_name(tmp_path: Path) -> None:
    script(tmp_path / "one" / "t", "#!/bin/sh\n", 0o644)
    with pytest.raises(OSError) as caught:
        spawn(["t"], {"PATH": f"{tmp_path}/none:{tmp_path}/one:{tmp_path}/two"}, "/", [0, 1, 2])
    assert (caught.value.errno, caught.value.filename) == (errno.EACCES, "t")


def test_nowhere_on_path_is_enoent(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        spawn(["sbr-none"], {"PATH": f"{tmp_path}/a:{tmp_path}/b"}, "/", [0, 1, 2])
    assert caught.value.filename == "sbr-none"


def test_a_missing_working_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        spawn(["true"], {"PATH": os.defpath}, str(tmp_path / "gone"), [0, 1, 2])
    assert caught.value.filename == str(tmp_path / "gone")


def test_argv0_and_the_working_directory_are_the_commands(tmp_path: Path) -> None:
    script(tmp_path / "bin" / "show", '#!/bin/sh\necho "$0 $(pwd)"\n')
    code, out = run(["show"], {"PATH": f"{tmp_path}/x:{tmp_path}/bin"}, tmp_path / "bin")
    assert (code, out) == (0, f"{tmp_path}/bin/show {tmp_path}/bin\n")


@pytest.mark.parametrize("entry", [".", "", "bin"])
def test_a_relative_path_entry_is_looked_up_in_the_commands_directory(
    tmp_path: Path, entry: str
) -> None:
    work = tmp_path / "work"
    script(work / ("bin" if entry == "bin" else ".") / "rc", "#!/bin/sh\necho relative\n")
    script(tmp_path / "later" / "rc", "#!/bin/sh\necho later\n")
    env = {"PATH": f"{entry}:{tmp_path}/later"}
    assert run(["rc"], env, work) == (0, "relative\n")


def test_a_failure_that_is_not_the_exec_is_not_retried_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork refused (the sandbox at its process limit) must not make a program of the same
    name further down PATH run instead."""
    import subprocess

    script(tmp_path / "one" / "t", "#!/bin/sh\necho one\n")
    script(tmp_path / "two" / "t", "#!/bin/sh\necho two\n")

    tried: list[object] = []

    def refused(self: object, args: object, executable: object, *rest: object) -> None:
        tried.append(executable)
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refused)
    with pytest.raises(BlockingIOError):
        spawn(["t"], {"PATH": f"{tmp_path}/one:{tmp_path}/two"}, str(tmp_path), [0, 1, 2])
    assert tried == [f"{tmp_path}/one/t"]


def test_a_directory_of_the_name_that_is_the_cwd_is_passed_over(tmp_path: Path) -> None:
    (tmp_path / "one" / "tool").mkdir(parents=True)
    script(tmp_path / "two" / "tool", "#!/bin/sh\necho two\n")
    env = {"PATH": f"{tmp_path}/one:{tmp_path}/two"}
    assert run(["tool"], env, tmp_path / "one" / "tool") == (0, "two\n")
