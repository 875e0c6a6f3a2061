"""The login-shell environment snapshot: the login profile runs once per sandbox, not per command.

The first command of a sandbox (under a lock per key: concurrent first commands share it) runs
``SCRIPT`` inside the sandbox, through the same backend, as a ``raw`` request in that command's
scope and within its timeout (``Logins.resolve``): it picks the shell (the user's login shell
when it is bash, zsh, sh or dash; else bash, else sh; or the ``--login-shell`` given), prints
it, then becomes ``<shell> -l -c 'env -0'`` with the sandbox's ``PATH`` prepends in front (so
the profile can use those tools). What it prints is the snapshot, kept per ``(mode, path
prepends)`` (the ``MAX_KEYS`` most recently used). Every command then gets (``exec_env``): the
snapshot; the request's variables that were given explicitly or differ from the environment
the snapshot was taken with (``Snapshot.base``: a ``--pass-env`` of this command only, say);
the variables sandboxrun owns (run marker, ``PWD``, the isolation layer's ``HOME``/``TMPDIR``);
the path prepends in front of ``PATH``. An argv then runs as is (no shell at all); a script
runs under ``<shell> -c`` (no login). A snapshot that fails (no such shell, the profile exits,
30 s) turns that key to ``each``: each of its commands runs its own login shell
(``argv.wrapped_argv`` / ``argv.shell_argv``), with a warning (secrets masked) logged once and
added to the first such result. A snapshot cut by the command's deadline, a cancellation or a
``sandbox_error`` is not kept (``NotRun``, or the cancellation, for that command)."""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

import anyio

from sandboxrun.engine.argv import join_path_prepend
from sandboxrun.engine.capture.redact import Redactor, redactor_for
from sandboxrun.engine.env import RESERVED_PREFIX
from sandboxrun.engine.request import ExecRequest, LoginMode, Sink, Snapshot
from sandboxrun.errors import ConfigError
from sandboxrun.models import ExecResult, replaced

log = logging.getLogger("sandboxrun")

SNAPSHOT_TIMEOUT_S = 30.0
MIN_LOGIN_PIDS = 8
"""Below this ``pids`` limit no login shell is attempted (its profile forks: ``id``, ``tput``;
under ``pids=1`` the snapshot and every per-command login shell would fail): an argv runs
directly on the local backends, a script under its own login shell, as they always did."""
"""A snapshot's own time limit (less when the command's deadline comes first)."""
MAX_KEYS = 8
"""Snapshots kept per sandbox (one per set of path prepends): the least recently used goes."""
MAX_OUTPUT = 8 * 1024 * 1024
"""A snapshot's output beyond this is a failure (a profile that floods stdout)."""
DROPPED = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})
"""The shell's own bookkeeping: never part of a snapshot (nor is any ``SANDBOXRUN_*``)."""
ENV_FRAME_SUFFIX = "-env"
POSIX_SHELLS = ("bash", "zsh", "sh", "dash")

SCRIPT = r"""marker=$1 shell=$2 prepend=$3 mode=$4
if [ -z "$shell" ]; then
  uid=$(id -u 2>/dev/null) || uid=
  entry=
  if [ -n "$uid" ]; then
    entry=$(getent passwd "$uid" 2>/dev/null) || entry=
    if [ -z "$entry" ] && [ -r /etc/passwd ]; then
      while IFS=: read -r n p u rest; do
        if [ "$u" = "$uid" ]; then entry="$n:$p:$u:$rest"; break; fi
      done </etc/passwd
    fi
  fi
  case $entry in *:*:*:*) user_shell=${entry##*:} ;; *) user_shell= ;; esac
  case ${user_shell##*/} in
    bash|zsh|sh|dash) if [ -x "$user_shell" ]; then shell=$user_shell; fi ;;
  esac
  if [ -z "$shell" ]; then
    shell=$(command -v bash 2>/dev/null) || shell=
    case $shell in /*) ;; *) shell=$(command -v sh 2>/dev/null) || shell= ;; esac
    case $shell in /*) ;; *) shell=/bin/sh ;; esac
  fi
fi
if [ -n "$prepend" ]; then PATH=$prepend${PATH:+:$PATH}; export PATH; fi
printf '\000%s\000%s\000' "$marker" "$shell"
if [ "$mode" = select ]; then exit 0; fi
exec "$shell" -l -c 'printf "\000%s-env\000" "$1"; exec env -0' "$shell" "$marker"
"""
"""POSIX sh, run as ``/bin/sh -c SCRIPT sandboxrun-login MARKER SHELL PREPEND MODE``: picks the
shell (``SHELL`` empty: from the user's passwd entry, ``getent`` else ``/etc/passwd``), prints
``\\0MARKER\\0SHELL\\0``; in mode ``env`` then ``\\0MARKER-env\\0`` and ``env -0`` from the
login shell (whatever the profile prints to stdout comes before that frame)."""


def script_argv(marker: str, shell: str | None, prepend: str, mode: str) -> list[str]:
    return ["/bin/sh", "-c", SCRIPT, "sandboxrun-login", marker, shell or "", prepend, mode]


def check_login_shell(shell: str | None) -> None:
    """``--login-shell``: an absolute path or a bare command name, no NUL."""
    if shell is None:
        return
    if not shell or "\0" in shell or ("/" in shell and not shell.startswith("/")):
        raise ConfigError(f"--login-shell {shell!r}: expected an absolute path or a command name")


def parse_output(out: bytes, marker: str) -> tuple[str | None, dict[str, str] | None]:
    """``(shell, env)`` from ``SCRIPT``'s stdout; either is None when its frame is missing.
    Entries that are not ``NAME=VALUE`` and the ``DROPPED`` / ``SANDBOXRUN_*`` names are left
    out; bytes that are not UTF-8 are kept (``os.fsdecode``)."""
    tag = os.fsencode(marker)
    shell: str | None = None
    head = b"\0" + tag + b"\0"
    at = out.find(head)
    if at >= 0:
        rest = out[at + len(head) :]
        end = rest.find(b"\0")
        if end > 0:
            shell = os.fsdecode(rest[:end])
    frame = b"\0" + tag + os.fsencode(ENV_FRAME_SUFFIX) + b"\0"
    at = out.rfind(frame)
    if at < 0:
        return shell, None
    env: dict[str, str] = {}
    for entry in out[at + len(frame) :].split(b"\0"):
        raw_name, sep, raw_value = entry.partition(b"=")
        if not sep or not raw_name:
            continue
        name, value = os.fsdecode(raw_name), os.fsdecode(raw_value)
        if name in DROPPED or name.startswith(RESERVED_PREFIX):
            continue
        env[name] = value
    return shell, env


def _key(request: ExecRequest) -> Key:
    return ("each",) if request.login == "each" else ("snapshot", *request.path_prepend)


class NotRun(Exception):
    """The command is not started: ``status`` ``timed_out`` (its deadline passed while its
    snapshot was taken or waited for) or ``sandbox_error`` (the sandbox itself failed the
    snapshot run, e.g. its container died). Nothing is kept: the next command tries again."""

    def __init__(self, status: Literal["timed_out", "sandbox_error"], error: str) -> None:
        super().__init__(error)
        self.status: Literal["timed_out", "sandbox_error"] = status


Run = Callable[[ExecRequest], Awaitable[ExecResult]]
"""Runs a request as is in the sandbox (a cancellation of the run is re-raised)."""
Key = tuple[str, ...]
Saved = tuple[tuple[Key, "_State"], ...]
"""A ``Logins``' snapshots at one moment (``Logins.saved``): what a pooled sandbox had when it
was made, given back to each of its next holders (``Logins.restore``)."""


@dataclass
class _State:
    shell: str | None
    snapshot: Snapshot | None
    warning: str | None = None
    reported: bool = False


class Logins:
    """One sandbox's login shells: the snapshots (or the chosen shell, ``each``) per key, the
    ``MAX_KEYS`` most recently used kept. ``base``: the environment a snapshot is taken with
    (what ``Sandbox._prepare`` builds for a command adding no variables of its own; called per
    snapshot); ``explicit``: the sandbox's explicit names."""

    def __init__(
        self,
        mode: LoginMode,
        shell: str | None,
        base: Callable[[], Mapping[str, str]] = dict,
        explicit: Collection[str] = (),
    ) -> None:
        if mode not in ("snapshot", "each"):
            raise ConfigError(f"login={mode!r}: expected 'snapshot' or 'each'")
        check_login_shell(shell)
        self.mode: LoginMode = mode
        self.shell = shell
        self._base = base
        self._explicit = frozenset(explicit)
        self._states: OrderedDict[Key, _State] = OrderedDict()
        self._locks: dict[Key, tuple[anyio.Lock, int]] = {}
        """Per key, while some command takes or waits for its snapshot: the lock, how many."""

    def rebase(self, base: Callable[[], Mapping[str, str]]) -> None:
        """Take later snapshots with ``base`` (a pooled sandbox's snapshots handed to the
        ``Sandbox`` object of its next holder: the same environment, built by it)."""
        self._base = base

    def saved(self) -> Saved:
        """The snapshots (and failed ones) taken so far, as they are now."""
        return tuple((key, dataclasses.replace(state)) for key, state in self._states.items())

    def restore(self, saved: Saved) -> None:
        """Keep exactly the snapshots of ``saved``: any taken since is forgotten (a pooled
        sandbox's next holder must not get an environment its last holder's profile made:
        ``$HOME`` is the holder's to write). Only while no command of the sandbox runs."""
        if self._locks:
            raise RuntimeError("a login snapshot is being taken")
        self._states = OrderedDict((key, dataclasses.replace(state)) for key, state in saved)

    async def resolve(self, request: ExecRequest, run: Run) -> tuple[ExecRequest, str | None]:
        """``request`` with its login shell and snapshot filled in (taken first if needed by
        ``run``, a raw request at the workspace root, in the command's scope: a cancellation
        propagates and keeps nothing), its ``timeout_s`` less the time that took, and the
        warning to report with its result (once per failed snapshot). Raises ``NotRun``."""
        ready = self.ready(request)
        if ready is not None:
            return ready
        deadline = time.monotonic() + request.timeout_s
        mode: LoginMode = "each" if request.login == "each" else "snapshot"
        key = _key(request)
        async with self._locked(key, deadline, request.timeout_s):
            state = self._states.get(key)
            if state is None:
                state = await self._take(mode, request, run, deadline)
                self._states[key] = state
                while len(self._states) > MAX_KEYS:
                    self._states.popitem(last=False)
        left = deadline - time.monotonic()
        if left <= 0:
            raise NotRun("timed_out", _out_of_time(request.timeout_s))
        return self._resolved(dataclasses.replace(request, timeout_s=left), state)

    def ready(
        self, request: ExecRequest, *, consume: bool = True
    ) -> tuple[ExecRequest, str | None] | None:
        """What ``resolve`` gives when nothing has to run for it (a raw request, a ``pids``
        limit no login shell fits, or the snapshot already taken), else None. ``consume``:
        a failed snapshot's warning counts as reported (False: only looked at, for a command
        that may still be refused)."""
        if request.login == "raw":
            return request, None
        pids = request.limits.pids
        if pids is not None and pids < MIN_LOGIN_PIDS:
            return dataclasses.replace(request, login="each", direct_argv=True), None
        key = _key(request)
        state = self._states.get(key)
        if state is None:
            return None
        self._states.move_to_end(key)
        return self._resolved(request, state, consume)

    @staticmethod
    def _resolved(
        request: ExecRequest, state: _State, consume: bool = True
    ) -> tuple[ExecRequest, str | None]:
        warning = None
        if state.warning is not None and not state.reported:
            state.reported, warning = consume, state.warning
        in_force: LoginMode = "snapshot" if state.snapshot is not None else "each"
        resolved = dataclasses.replace(
            request,
            login=in_force,
            login_shell=state.shell,
            snapshot=state.snapshot,
        )
        return resolved, warning

    @asynccontextmanager
    async def _locked(self, key: Key, deadline: float, timeout: float) -> AsyncIterator[None]:
        """Hold ``key``'s lock (one per key: a cached key never waits); ``NotRun`` when the
        deadline passes first."""
        lock, users = self._locks.get(key, (anyio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            acquired = False
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                await lock.acquire()
                acquired = True
            if not acquired:
                raise NotRun("timed_out", _out_of_time(timeout))
            try:
                yield
            finally:
                lock.release()
        finally:
            lock, users = self._locks[key]
            if users > 1:
                self._locks[key] = (lock, users - 1)
            else:
                del self._locks[key]

    async def _take(
        self, mode: LoginMode, request: ExecRequest, run: Run, deadline: float
    ) -> _State:
        marker = f"sandboxrun-login-{secrets.token_hex(8)}"
        out = bytearray()
        overflow = False

        def sink(stream: str, chunk: bytes) -> None:
            nonlocal overflow
            if stream == "stdout" and not overflow:
                out.extend(chunk)
                overflow = len(out) > MAX_OUTPUT

        joined = join_path_prepend(request.path_prepend) if request.path_prepend else ""
        argv = script_argv(marker, self.shell, joined, "select" if mode == "each" else "env")
        budget = min(SNAPSHOT_TIMEOUT_S, deadline - time.monotonic())
        if budget <= 0:
            raise NotRun("timed_out", _out_of_time(request.timeout_s))
        snap = snapshot_request(request, argv, sink, self._base(), self._explicit, budget)
        result = await run(snap)  # an exception (a cancellation, a backend gone) keeps nothing
        if result.status == "sandbox_error":
            raise NotRun("sandbox_error", result.error or "sandbox_error")
        if result.status == "timed_out" and budget < SNAPSHOT_TIMEOUT_S:
            raise NotRun("timed_out", _out_of_time(request.timeout_s))
        # masked as the sandbox's output would be (the run itself is not: it carries the env)
        why = failure(result, redactor_for(dataclasses.replace(snap, policy=request.policy)))
        shell, env = parse_output(bytes(out), marker) if not overflow else (None, None)
        shell = self.shell or shell
        if mode == "each":
            return _State(shell, None)
        if why is None and env is None:
            why = "over 8 MiB of output" if overflow else "it printed no environment"
        if why is not None or env is None:
            warning = (
                f"the login-shell environment snapshot failed ({why}): each command of this "
                "sandbox with these path prepends runs its own login shell instead"
            )
            log.warning("sandboxrun: %s", warning)
            return _State(shell, None, warning)
        return _State(shell, Snapshot(env=env, base=dict(snap.env)))


def snapshot_request(
    request: ExecRequest,
    argv: list[str],
    sink: Sink,
    base: Mapping[str, str],
    explicit: frozenset[str],
    timeout: float,
) -> ExecRequest:
    """The raw request that takes ``request``'s snapshot: ``argv`` at the workspace root, with
    ``base`` (``explicit``: the sandbox's own names), unmasked output to ``sink`` only."""
    root = request.workdir
    for _ in request.workdir_rel.parts:
        root = root.parent
    return dataclasses.replace(
        request,
        run_id=secrets.token_hex(8),
        argv=argv,
        script=None,
        env=dict(base),
        path_prepend=[],
        workdir=root,
        workdir_rel=PurePosixPath("."),
        stdin=None,
        timeout_s=timeout,
        limits=replaced(request.limits, spill_max=0, idle_timeout_s=None),
        policy=replaced(request.policy, mask_output=False),
        sink=sink,
        explicit=explicit,
        login="raw",
        login_shell=None,
        snapshot=None,
    )


def _out_of_time(timeout: float) -> str:
    return (
        f"the login-shell environment snapshot used up the timeout ({timeout:g}s): "
        "the command was not started"
    )


def failure(result: ExecResult, redactor: Redactor | None = None) -> str | None:
    """Why a snapshot run failed, or None when it exited 0; its last line of stderr (or error)
    masked by ``redactor`` (before it is cut: no secret's prefix is left)."""
    if result.status == "completed" and result.exit_code == 0:
        return None
    said = (result.stderr or result.error or "").strip().splitlines()
    last = said[-1] if said else ""
    if redactor is not None and last:
        last = os.fsdecode(redactor.feed(os.fsencode(last)) + redactor.flush())
    detail = f": {last[:200]}" if last else ""
    if result.status == "timed_out":
        return f"the login shell did not finish within {SNAPSHOT_TIMEOUT_S:g} s"
    if result.exit_code is not None:
        return f"the login shell exited with status {result.exit_code}{detail}"
    return f"{result.status}{detail}"
