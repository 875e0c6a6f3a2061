"""Pure translations between sandboxrun and inspect_ai's ``SandboxEnvironment`` contract.

- ``plan_cwd``: an ``exec``'s ``cwd`` as sandboxrun's ``workdir`` (inside the workspace) or,
  elsewhere in the sandbox, a ``cd`` wrapper launched by absolute path;
- ``to_inspect``: a sandboxrun ``ExecResult`` as inspect's ``ExecResult``, or the exception
  inspect expects (``TimeoutError``, ``PermissionError``, ``OutputLimitExceededError``,
  ``SandboxUnavailableError``);
- ``file_error``: a sandboxrun file error as the built-in ``OSError`` inspect expects;
- ``user_verdict``: whether ``exec(user=...)`` names the sandbox's own user;
- ``sandbox_path``: a file path of inspect's as sandboxrun's file API takes it.

No I/O (tests/unit/test_inspect_mapping.py covers every branch).
"""

from __future__ import annotations

import errno
import os
import posixpath
import signal
from dataclasses import dataclass
from typing import Literal

from inspect_ai.util import ExecResult as InspectResult
from inspect_ai.util import OutputLimitExceededError
from inspect_ai.util import SandboxUnavailableError as InspectUnavailable

from sandboxrun.errors import (
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    SandboxIsADirectoryError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
    SandboxrunError,
    WorkspaceError,
)
from sandboxrun.models import KILLED_BY_LIMIT, ExecResult

CWD_WRAPPER = ("/bin/sh", "-c", 'cd -- "$1" || exit 1; shift; exec "$@"', "sandboxrun-cwd")
"""Runs the command in a directory outside the workspace (sandboxrun's ``workdir`` is always
inside it): launched by absolute path, the command then found through the ``exec``'s PATH."""

OOM_NOTE = "[sandboxrun] the command was killed: out of memory (the sandbox's memory limit)\n"


@dataclass(frozen=True)
class CwdPlan:
    """``workdir``: sandboxrun's (relative to the workspace; None: its root). ``wrap``: the
    absolute directory the ``CWD_WRAPPER`` changes to (None: no wrapper)."""

    workdir: str | None
    wrap: str | None = None

    def argv(self, cmd: list[str]) -> list[str]:
        return list(cmd) if self.wrap is None else [*CWD_WRAPPER, self.wrap, *cmd]


def plan_cwd(cwd: str | None, root: str) -> CwdPlan:
    """Where to run: ``cwd`` None is the workspace (``root``: its path as the sandbox sees it,
    ``/workspace`` on docker); a relative ``cwd`` is relative to it. Inside the workspace
    (lexically) sandboxrun's own ``workdir`` is used; ``with_wrapper`` gives the fallback for
    a ``workdir`` the host refuses (a symlink that leaves the workspace: the sandbox decides)."""
    if cwd is None or cwd == "":
        return CwdPlan(None)
    full = posixpath.normpath(posixpath.join(root, cwd))
    if full == root:
        return CwdPlan(None)
    if full.startswith(root.rstrip("/") + "/"):
        return CwdPlan(full[len(root.rstrip("/")) + 1 :])
    return CwdPlan(None, full)


def with_wrapper(plan: CwdPlan, root: str) -> CwdPlan:
    """The same directory, reached by the ``cd`` wrapper (the sandbox resolves its links)."""
    if plan.wrap is not None:
        return plan
    return CwdPlan(None, root if plan.workdir is None else posixpath.join(root, plan.workdir))


def sandbox_path(file: str) -> str:
    """inspect's path as sandboxrun's: a relative ``~name`` is a file of the workspace (for
    sandboxrun ``~`` is the sandbox's HOME; inspect has no such shorthand)."""
    return f"./{file}" if file.startswith("~") else file


def returncode(result: ExecResult) -> int:
    """The exit status as a shell reports it: 128+N for a death by signal N."""
    if result.exit_code is not None:
        return result.exit_code
    if result.signal is not None:
        try:
            return 128 + int(signal.Signals[result.signal])
        except KeyError:
            pass
    return 128 + int(signal.SIGKILL) if result.status in KILLED_BY_LIMIT else 1


def _timeout_error(result: ExecResult, timeout: float | None) -> TimeoutError:
    shown = "the sandbox's default timeout" if timeout is None else f"{timeout:g} seconds"
    error = TimeoutError(f"Command timed out after {shown}")
    partial = result.stdout + result.stderr
    if partial:
        error.truncated_output = partial  # type: ignore[attr-defined]  # inspect reads it with getattr
    return error


def to_inspect(
    result: ExecResult,
    *,
    limit: int,
    limit_str: str,
    timeout: float | None,
    cmd: list[str],
    wrapped: bool = False,
) -> InspectResult[str]:
    """inspect's result for ``result``, or the exception inspect's contract asks for.

    ``limit``: inspect's exec output limit in bytes (per stream; ``limit_str`` as inspect
    words it): a stream over it raises ``OutputLimitExceededError`` carrying what sandboxrun
    kept (head and tail, with the ``[... N bytes omitted ...]`` marker). ``wrapped``: the
    command ran under ``CWD_WRAPPER``, whose shell reports a command it could not run."""
    if result.status == "timed_out":
        raise _timeout_error(result, timeout)
    if result.status == "sandbox_error":
        raise InspectUnavailable(
            f"The sandbox could not run the command: {result.error or 'the backend failed'}"
        )
    if result.status == "cancelled":
        raise InspectUnavailable(
            f"The sandbox was closed during the command: {result.error or 'cancelled'}"
        )
    if result.status == "spawn_error":
        if wrapped:  # the wrapper shell itself could not start
            raise InspectUnavailable(f"The sandbox cannot change directory: {result.error}")
        if result.exit_code == 126:
            raise PermissionError(
                errno.EACCES, f"Permission denied executing command ({result.error})", cmd[0]
            )
        return InspectResult(False, returncode(result), "", f"{result.error}\n")
    if result.stdout_total_bytes > limit or result.stderr_total_bytes > limit:
        raise OutputLimitExceededError(limit_str, truncated_output=result.stdout + result.stderr)
    code = returncode(result)
    stderr = result.stderr
    if result.status in KILLED_BY_LIMIT:
        note = OOM_NOTE if result.status == "oom_killed" else f"[sandboxrun] {result.error}\n"
        stderr += ("\n" if stderr and not stderr.endswith("\n") else "") + note
    elif wrapped and code == 126 and _wrapper_refused(result, cmd[0]):
        raise PermissionError(errno.EACCES, "Permission denied executing command", cmd[0])
    return InspectResult(code == 0, code, result.stdout, stderr)


def _wrapper_refused(result: ExecResult, program: str) -> bool:
    """The wrapper's shell, not the command, said it could not execute ``program``: one line,
    nothing on stdout (dash: ``sandboxrun-cwd: 1: exec: PROG: Permission denied``)."""
    lines = result.stderr.strip().splitlines()
    return (
        not result.stdout.strip()
        and len(lines) == 1
        and lines[0].startswith(CWD_WRAPPER[3] + ":")
        and f"{program}: Permission denied" in lines[0]
    )


def file_error(exc: SandboxrunError, path: str) -> Exception:
    """The exception inspect expects for a failed ``read_file``/``write_file`` of ``path``:
    the built-in ``OSError`` subclass with ``errno``, ``strerror`` and ``filename`` set
    (inspect's tool errors show them); over the size limit: ``OutputLimitExceededError`` is
    raised by the caller, which knows the limit."""
    kinds: list[tuple[type[SandboxrunError], type[OSError], int]] = [
        (SandboxFileNotFoundError, FileNotFoundError, errno.ENOENT),
        (SandboxIsADirectoryError, IsADirectoryError, errno.EISDIR),
        (SandboxNotADirectoryError, NotADirectoryError, errno.ENOTDIR),
        (SandboxPermissionError, PermissionError, errno.EACCES),
    ]
    for theirs, ours, code in kinds:
        if isinstance(exc, theirs):
            number = exc.errno if isinstance(exc, SandboxFileError) and exc.errno else code
            return ours(number, os.strerror(number), path)
    if isinstance(exc, WorkspaceError):  # `..` or a symlink out of the workspace
        return PermissionError(errno.EACCES, str(exc), path)
    if isinstance(exc, SandboxFileTooLargeError):
        return OSError(errno.EFBIG, str(exc), path)
    if isinstance(exc, SandboxFileError):
        return OSError(exc.errno or errno.EINVAL, str(exc), path)
    return OSError(errno.EIO, str(exc), path)


Verdict = Literal["own", "missing", "other"]


def parse_passwd(text: str) -> dict[str, int]:
    """``name -> uid`` from an ``/etc/passwd``'s text (malformed lines skipped)."""
    return {name: entry[0] for name, entry in passwd_entries(text).items()}


def passwd_entries(text: str) -> dict[str, tuple[int, int, str]]:
    """``name -> (uid, gid, home)`` from an ``/etc/passwd``'s text (malformed lines skipped;
    the first line of a name wins, as ``getpwnam``)."""
    users: dict[str, tuple[int, int, str]] = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 6 and fields[0] and fields[2].isdigit() and fields[3].isdigit():
            users.setdefault(fields[0], (int(fields[2]), int(fields[3]), fields[5]))
    return users


def switch_user(
    user: str, entries: dict[str, tuple[int, int, str]], env: dict[str, str] | None
) -> tuple[list[str], dict[str, str]]:
    """How a uid-0 sandbox that may change uid (a writable root on docker: ``SETUID`` and
    ``SETGID``) runs a command as ``user`` (a name in ``entries``, or a decimal uid): the
    ``setpriv`` words before it (util-linux: real and effective ids, the user's groups; a uid
    without an entry gets gid 0 and no groups, as ``docker exec --user`` gives it) and its
    environment with ``HOME``, ``USER``, ``LOGNAME`` as ``docker exec --user`` sets them
    (where the caller did not). An image without ``setpriv`` (busybox) answers 127."""
    name: str | None = user
    if user.isdecimal():
        name = next((n for n, entry in entries.items() if entry[0] == int(user)), None)
    elif user not in entries:
        raise ValueError(f"no user {user!r} in the sandbox's /etc/passwd")
    uid, gid, home = entries[name] if name is not None else (int(user), 0, "/")
    groups = "--init-groups" if name is not None else "--clear-groups"
    words = ["setpriv", f"--reuid={uid}", f"--regid={gid}", groups, "--"]
    given = dict(env or {})
    for key, value in (("HOME", home), ("USER", name), ("LOGNAME", name)):
        if value is not None:
            given.setdefault(key, value)
    return words, given


def user_verdict(user: str, *, uid: int, users: dict[str, int]) -> Verdict:
    """``own``: ``user`` (a name or a decimal uid) is the sandbox's user ``uid``; ``missing``:
    no such user in the sandbox's ``/etc/passwd`` (``users``); ``other``: another user."""
    if user.isdecimal():
        return "own" if int(user) == uid else "other"
    found = users.get(user)
    if found is None:
        return "missing"
    return "own" if found == uid else "other"


def missing_user_result(user: str) -> InspectResult[str]:
    """What ``docker exec --user`` answers for a user the image does not have."""
    return InspectResult(
        False, 126, "", f"unable to find user {user}: no matching entries in passwd file\n"
    )
