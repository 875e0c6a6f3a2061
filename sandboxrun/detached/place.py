"""Where detached sandboxes live: a runtime directory private to one uid, and per sandbox a lock
(held by its keeper for its whole life), a socket, a state file and a log.

The directory is ``SANDBOXRUN_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/sandboxrun``, else
``/tmp/sandboxrun-<uid>``; it must be a real directory owned by this uid with no access for
anyone else (made so when missing). A directory that is not (a link, another owner, group or
world access) is refused: someone else could plant a socket there."""

from __future__ import annotations

import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from sandboxrun.errors import ConfigError, InputError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
"""A sandbox name: 1-40 letters, digits, ``_.-``, not starting with a punctuation mark."""
SOCKET_MAX = 107
"""The longest unix socket path the kernel takes (``sun_path`` is 108 bytes with its NUL)."""


def check_name(name: str) -> str:
    """``name`` when it is a valid sandbox name, else ``InputError`` naming the rule."""
    if not NAME.fullmatch(name):
        raise InputError(
            f"bad sandbox name {name!r}: 1-40 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def new_name() -> str:
    """A fresh name for a sandbox created without ``--name``: ``sbx-`` and 8 hex digits."""
    return f"sbx-{secrets.token_hex(4)}"


def runtime_dir(env: dict[str, str] | None = None, uid: int | None = None) -> Path:
    """The runtime directory's path (not checked: ``ensure_dir`` does that)."""
    from sandboxrun.backends.secrets import runtime_dir as where

    return where(dict(os.environ) if env is None else env, uid)


def unsafe_reason(st: os.stat_result, uid: int) -> str | None:
    """Why a directory with status ``st`` (from ``lstat``) cannot hold this uid's sandboxes,
    or None when it can."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != uid:
        return f"it belongs to uid {st.st_uid}, not {uid}"
    if st.st_mode & 0o077:
        return f"others have access to it (mode {stat.S_IMODE(st.st_mode):04o}, want 0700)"
    return None


def parent_reason(path: Path, uid: int) -> str | None:
    """Why the directories holding ``path`` (where they really are) would let another user
    swap it for one of theirs, or None: each must belong to root or ``uid``, and be writable
    by no one else unless sticky (as ``/tmp``)."""
    real = Path(os.path.realpath(path.parent))
    for ancestor in (real, *real.parents):
        try:
            st = ancestor.stat()
        except OSError as exc:
            return f"{ancestor} cannot be checked ({exc.strerror})"
        if st.st_uid not in (0, uid):
            return f"{ancestor}, which holds it, belongs to uid {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            mode = stat.S_IMODE(st.st_mode)
            return f"{ancestor}, which holds it, can be written by others (mode {mode:04o})"
    return None


def ensure_dir(path: Path, *, create: bool = True) -> Path:
    """``path``, made (mode 0700) when missing and ``create``; ``ConfigError`` when it is not
    private to this uid (nothing in it is trusted then)."""
    uid = os.getuid()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return path
        try:
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            path.mkdir(0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(f"cannot make the runtime directory {path}: {exc.strerror}") from None
        st = os.lstat(path)
    except PermissionError:
        raise ConfigError(
            f"the runtime directory {path} is not readable by uid {uid}: its sandboxes "
            "belong to another user"
        ) from None
    why = unsafe_reason(st, uid) or parent_reason(path, uid)
    if why is not None:
        raise ConfigError(
            f"the runtime directory {path} is not private: {why} "
            "(set SANDBOXRUN_RUNTIME_DIR to a directory of your own)"
        )
    return path


@dataclass(frozen=True)
class Place:
    """The files of one detached sandbox."""

    dir: Path
    name: str

    @property
    def lock(self) -> Path:
        return self.dir / f"{self.name}.lock"

    @property
    def socket(self) -> Path:
        return self.dir / f"{self.name}.sock"

    @property
    def state(self) -> Path:
        return self.dir / f"{self.name}.json"

    @property
    def log(self) -> Path:
        return self.dir / f"{self.name}.log"

    def check_socket_path(self) -> None:
        """``ConfigError`` when the socket's path is too long for the kernel."""
        if len(os.fsencode(self.socket)) > SOCKET_MAX:
            raise ConfigError(
                f"the runtime directory {self.dir} is too deep for a unix socket "
                f"({len(os.fsencode(self.socket))} > {SOCKET_MAX} bytes): set "
                "SANDBOXRUN_RUNTIME_DIR to a shorter path"
            )


def place(name: str, directory: Path | None = None, *, create: bool = False) -> Place:
    """The files of the sandbox ``name`` (checked) in the (checked) runtime directory."""
    return Place(ensure_dir(directory or runtime_dir(), create=create), check_name(name))


def names_in(directory: Path) -> list[str]:
    """The names of the sandboxes with a lock file in ``directory``, sorted."""
    try:
        entries = [entry.name for entry in directory.iterdir()]
    except FileNotFoundError:
        return []
    found = (e[: -len(".lock")] for e in entries if e.endswith(".lock"))
    return sorted(n for n in found if NAME.fullmatch(n))
