"""sandboxrun.integrations.inspect.mapping: sandboxrun results and errors as inspect_ai's contract
wants them."""

from __future__ import annotations

import errno
from typing import Any

import pytest
from inspect_ai.util import OutputLimitExceededError
from inspect_ai.util import SandboxUnavailableError as InspectUnavailable

from sandboxrun.errors import (
    BackendError,
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    SandboxIsADirectoryError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
    WorkspaceError,
)
from sandboxrun.integrations.inspect.mapping import (
    CWD_WRAPPER,
    OOM_NOTE,
    CwdPlan,
    file_error,
    missing_user_result,
    parse_passwd,
    passwd_entries,
    plan_cwd,
    returncode,
    sandbox_path,
    switch_user,
    to_inspect,
    user_verdict,
    with_wrapper,
)
from sandboxrun.models import ExecResult

WS = "/workspace"


def result(status: str = "completed", **fields: Any) -> ExecResult:
    base: dict[str, Any] = {
        "status": status,
        "duration_s": 0.1,
        "backend": "docker",
        "argv": ["x"],
        "run_id": "r",
    }
    if status in ("completed", "failed") and "exit_code" not in fields and "signal" not in fields:
        base["exit_code"] = 0 if status == "completed" else 1
    return ExecResult.model_validate({**base, **fields})


def convert(res: ExecResult, *, limit: int = 100, wrapped: bool = False, timeout: float = 5) -> Any:
    return to_inspect(
        res, limit=limit, limit_str="100 bytes", timeout=timeout, cmd=["prog", "a"], wrapped=wrapped
    )


# -- cwd ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cwd", "expected"),
    [
        (None, CwdPlan(None)),
        ("", CwdPlan(None)),
        (".", CwdPlan(None)),
        ("sub", CwdPlan("sub")),
        ("sub/dir/", CwdPlan("sub/dir")),
        ("sub/../other", CwdPlan("other")),
        ("/workspace", CwdPlan(None)),
        ("/workspace/", CwdPlan(None)),
        ("/workspace/a/b", CwdPlan("a/b")),
        ("/workspace/../etc", CwdPlan(None, "/etc")),
        ("/workspacex", CwdPlan(None, "/workspacex")),
        ("/tmp", CwdPlan(None, "/tmp")),
        ("/", CwdPlan(None, "/")),
        ("..", CwdPlan(None, "/")),
        ("../x", CwdPlan(None, "/x")),
        ("a/../../b", CwdPlan(None, "/b")),
    ],
)
def test_plan_cwd(cwd: str | None, expected: CwdPlan) -> None:
    assert plan_cwd(cwd, WS) == expected


def test_plan_cwd_host_root() -> None:
    assert plan_cwd("sub", "/tmp/ws") == CwdPlan("sub")
    assert plan_cwd("/tmp/ws/sub", "/tmp/ws") == CwdPlan("sub")
    assert plan_cwd("/tmp/wsx", "/tmp/ws") == CwdPlan(None, "/tmp/wsx")
    assert plan_cwd("/workspace/sub", "/tmp/ws") == CwdPlan(None, "/workspace/sub")


def test_with_wrapper() -> None:
    assert with_wrapper(CwdPlan(None), WS) == CwdPlan(None, WS)
    assert with_wrapper(CwdPlan("a/b"), WS) == CwdPlan(None, "/workspace/a/b")
    assert with_wrapper(CwdPlan(None, "/tmp"), WS) == CwdPlan(None, "/tmp")


def test_plan_argv() -> None:
    assert CwdPlan("sub").argv(["ls", "-l"]) == ["ls", "-l"]
    assert CwdPlan(None, "/tmp").argv(["ls"]) == [*CWD_WRAPPER, "/tmp", "ls"]
    assert CWD_WRAPPER[0].startswith("/")  # never found through the image's PATH


def test_sandbox_path() -> None:
    assert sandbox_path("~notes") == "./~notes"
    assert sandbox_path("~/x") == "./~/x"
    assert sandbox_path("a/~b") == "a/~b"
    assert sandbox_path("/tmp/x") == "/tmp/x"
    assert sandbox_path("rel") == "rel"


# -- exit status ----------------------------------------------------------------------------------
def test_returncode() -> None:
    assert returncode(result(exit_code=0)) == 0
    assert returncode(result("failed", exit_code=70)) == 70
    assert returncode(result("failed", signal="SIGTERM")) == 143
    assert returncode(result("failed", signal="SIGKILL")) == 137
    assert returncode(result("failed", signal="SIGNOSUCH")) == 1
    assert returncode(result("oom_killed", signal="SIGKILL")) == 137
    assert returncode(result("oom_killed")) == 137
    assert returncode(result("failed", exit_code=None)) == 1


# -- results ------------------------------------------------------------------------------------
def test_completed_and_failed() -> None:
    ok = convert(result(stdout="out", stderr="err", stdout_total_bytes=3, stderr_total_bytes=3))
    assert (ok.success, ok.returncode, ok.stdout, ok.stderr) == (True, 0, "out", "err")
    bad = convert(result("failed", exit_code=3))
    assert (bad.success, bad.returncode) == (False, 3)
    signalled = convert(result("failed", signal="SIGTERM"))
    assert (signalled.success, signalled.returncode) == (False, 143)


def test_timeout() -> None:
    with pytest.raises(TimeoutError, match="timed out after 2 seconds") as raised:
        convert(result("timed_out", timed_out=True, stdout="so far\n", stderr="e"), timeout=2)
    assert getattr(raised.value, "truncated_output", None) == "so far\ne"
    with pytest.raises(TimeoutError, match="default timeout") as quiet:
        to_inspect(
            result("timed_out", timed_out=True), limit=9, limit_str="9", timeout=None, cmd=["x"]
        )
    assert not hasattr(quiet.value, "truncated_output")


def test_timeout_wins_over_the_output_limit() -> None:
    with pytest.raises(TimeoutError):
        convert(result("timed_out", timed_out=True, stdout_total_bytes=10**9))


@pytest.mark.parametrize("status", ["sandbox_error", "cancelled"])
def test_unavailable(status: str) -> None:
    with pytest.raises(InspectUnavailable, match="container vanished"):
        convert(result(status, error="the container vanished"))


def test_spawn_errors() -> None:
    with pytest.raises(PermissionError) as raised:
        convert(result("spawn_error", exit_code=126, error="[Errno 13] Permission denied"))
    assert raised.value.filename == "prog" and raised.value.errno == errno.EACCES
    missing = convert(result("spawn_error", exit_code=127, error="No such file: 'prog'"))
    assert (missing.success, missing.returncode) == (False, 127)
    assert missing.stdout == "" and missing.stderr == "No such file: 'prog'\n"
    with pytest.raises(InspectUnavailable, match="cannot change directory"):
        convert(result("spawn_error", exit_code=127, error="no /bin/sh"), wrapped=True)


def test_output_limit_per_stream() -> None:
    exact = convert(result(stdout="a" * 100, stdout_total_bytes=100, stderr_total_bytes=100))
    assert exact.success and exact.stdout == "a" * 100
    for stream in ("stdout", "stderr"):
        over = result(
            "failed",
            exit_code=1,
            stdout="head[... 1 bytes omitted ...]tail",
            stderr="E",
            **{f"{stream}_total_bytes": 101},
        )
        with pytest.raises(OutputLimitExceededError) as raised:
            convert(over)
        assert raised.value.limit_str == "100 bytes"
        assert raised.value.truncated_output == "head[... 1 bytes omitted ...]tailE"


def test_oom_note() -> None:
    killed = convert(result("oom_killed", signal="SIGKILL", stderr="partial"))
    assert (killed.success, killed.returncode) == (False, 137)
    assert killed.stderr == "partial\n" + OOM_NOTE
    assert convert(result("oom_killed", signal="SIGKILL")).stderr == OOM_NOTE
    assert convert(result("oom_killed", stderr="line\n")).stderr == "line\n" + OOM_NOTE


def test_wrapper_refusal_is_a_permission_error() -> None:
    said = f"{CWD_WRAPPER[3]}: 1: exec: prog: Permission denied\n"
    with pytest.raises(PermissionError):
        convert(result("failed", exit_code=126, stderr=said), wrapped=True)
    # the same words from the command itself (or unwrapped, or with output) are its result
    assert convert(result("failed", exit_code=126, stderr=said)).returncode == 126
    noisy = result("failed", exit_code=126, stderr=said, stdout="out")
    assert convert(noisy, wrapped=True).returncode == 126
    other = result(
        "failed", exit_code=126, stderr=f"{CWD_WRAPPER[3]}: 1: exec: x: Permission denied"
    )
    assert convert(other, wrapped=True).returncode == 126
    two = result("failed", exit_code=126, stderr=said + said)
    assert convert(two, wrapped=True).returncode == 126
    assert convert(result("failed", exit_code=1, stderr=said), wrapped=True).returncode == 1


# -- file errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("error", "kind", "code"),
    [
        (SandboxFileNotFoundError("m", "p"), FileNotFoundError, errno.ENOENT),
        (SandboxIsADirectoryError("m", "p"), IsADirectoryError, errno.EISDIR),
        (SandboxNotADirectoryError("m", "p"), NotADirectoryError, errno.ENOTDIR),
        (SandboxPermissionError("m", "p"), PermissionError, errno.EACCES),
        (SandboxPermissionError("m", "p", errno.EROFS), PermissionError, errno.EROFS),
        (SandboxFileTooLargeError("p", 10, 5), OSError, errno.EFBIG),
        (SandboxFileError("a FIFO", "p"), OSError, errno.EINVAL),
        (SandboxFileError("disk full", "p", errno.ENOSPC), OSError, errno.ENOSPC),
        (BackendError("gone"), OSError, errno.EIO),
    ],
)
def test_file_error(error: Exception, kind: type[OSError], code: int) -> None:
    assert isinstance(error, (SandboxFileError, BackendError))
    mapped = file_error(error, "given/name")
    assert type(mapped) is kind
    assert isinstance(mapped, OSError)
    assert (mapped.errno, mapped.filename) == (code, "given/name")
    assert "given/name" in str(mapped)


def test_file_error_messages() -> None:
    assert "directory" in str(file_error(SandboxIsADirectoryError("m", "/etc"), "/etc"))
    escaping = file_error(WorkspaceError("path '../x' escapes the workspace"), "../x")
    assert isinstance(escaping, PermissionError) and "escapes" in str(escaping)


# -- users ----------------------------------------------------------------------------------------
PASSWD = """root:x:0:0:root:/root:/bin/bash
daemon:x:1:1::/usr/sbin:/usr/sbin/nologin
broken line
nouid:x::0::/:/bin/sh
root:x:7:7:duplicate:/:/bin/sh
nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin
"""


def test_parse_passwd() -> None:
    assert parse_passwd(PASSWD) == {"root": 0, "daemon": 1, "nobody": 65534}
    assert parse_passwd("") == {}


@pytest.mark.parametrize(
    ("user", "uid", "verdict"),
    [
        ("0", 0, "own"),
        ("0", 1000, "other"),
        ("1000", 1000, "own"),
        ("root", 0, "own"),
        ("root", 1000, "other"),
        ("nobody", 65534, "own"),
        ("ghost", 0, "missing"),
    ],
)
def test_user_verdict(user: str, uid: int, verdict: str) -> None:
    assert user_verdict(user, uid=uid, users=parse_passwd(PASSWD)) == verdict


def test_missing_user_result() -> None:
    missing = missing_user_result("ghost")
    assert (missing.success, missing.returncode, missing.stdout) == (False, 126, "")
    assert "ghost" in missing.stderr


WITH_HOMES = (
    "root:x:0:0:root:/root:/bin/bash\n"
    "sandbox:x:1000:1000::/home/sandbox:/bin/bash\n"
    "bob:x:1001:1002:,,,:/home/bob:/bin/bash\n"
    "bob:x:7:7::/elsewhere:/bin/sh\n"  # the first line of a name wins
    "broken:x:notanumber:1::/:/bin/sh\n"
    "short:x:5\n"
)


def test_passwd_entries() -> None:
    entries = passwd_entries(WITH_HOMES)
    assert entries == {
        "root": (0, 0, "/root"),
        "sandbox": (1000, 1000, "/home/sandbox"),
        "bob": (1001, 1002, "/home/bob"),
    }
    assert parse_passwd(WITH_HOMES) == {"root": 0, "sandbox": 1000, "bob": 1001}


def test_switch_user_by_name_and_by_uid() -> None:
    entries = passwd_entries(WITH_HOMES)
    words, env = switch_user("bob", entries, {"A": "1", "HOME": "/given"})
    assert words == ["setpriv", "--reuid=1001", "--regid=1002", "--init-groups", "--"]
    assert env == {"A": "1", "HOME": "/given", "USER": "bob", "LOGNAME": "bob"}
    words, env = switch_user("1000", entries, None)  # a uid with a name: its groups, its home
    assert words[1:4] == ["--reuid=1000", "--regid=1000", "--init-groups"]
    assert env == {"HOME": "/home/sandbox", "USER": "sandbox", "LOGNAME": "sandbox"}
    words, env = switch_user("4242", entries, None)  # no entry: gid 0, no groups, home /
    assert words[1:4] == ["--reuid=4242", "--regid=0", "--clear-groups"]
    assert env == {"HOME": "/"}
    with pytest.raises(ValueError, match="no user 'eve'"):
        switch_user("eve", entries, None)
