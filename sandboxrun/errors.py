"""The one error hierarchy of sandboxrun.

::

    SandboxrunError
    ├── InputError                  bad input; nothing ran (CLI exit 2)
    │   ├── WorkspaceError          workspace / workdir missing, not a directory, or escaping
    │   ├── EnvError                invalid environment names or values, refused secrets
    │   └── ConfigError             invalid limits, policy, sizes or options
    ├── SandboxUnavailableError     the backend cannot be used here (CLI exit 125)
    ├── PolicyRefusedError          the backend cannot give a guarantee asked for (exit 125)
    ├── BackendError                the backend failed while it was in use (exit 125)
    ├── SandboxFileError            ``read_file``/``write_file``/``list_dir`` failed (``.path``)
    │   ├── SandboxFileNotFoundError    also a ``FileNotFoundError``
    │   ├── SandboxIsADirectoryError    also an ``IsADirectoryError``
    │   ├── SandboxNotADirectoryError   also a ``NotADirectoryError``
    │   ├── SandboxPermissionError      also a ``PermissionError`` (masked, read-only too)
    │   └── SandboxFileTooLargeError    over ``max_bytes`` (``.size``, ``.limit``)
    └── ExecError                   raised only by ``ExecResult.check()``; carries ``.result``

A command that exits non-zero is *data* (``ExecResult.status == "failed"``), never an exception,
until the caller asks with ``ExecResult.check()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandboxrun.models import ExecResult


class SandboxrunError(Exception):
    """Root of every error sandboxrun raises on purpose."""


class InputError(SandboxrunError):
    """The caller's input is invalid; nothing was started."""


class WorkspaceError(InputError):
    """The workspace or working directory is missing, of the wrong kind, or escapes."""


class EnvError(InputError):
    """An environment variable name or value is invalid, or a secret was passed implicitly."""


class ConfigError(InputError):
    """A limit, size, policy or option value is invalid."""


class NoSuchSandbox(InputError):
    """No detached sandbox of that name lives here (``Sandbox.attach``, ``sandboxrun exec``)."""


class PoolExhaustedError(SandboxrunError):
    """No sandbox of a ``SandboxPool`` became ready within the acquire's wait; the message
    says what the pool holds and its last failed open."""


class SandboxUnavailableError(SandboxrunError):
    """The requested backend cannot run here; ``reason`` says why."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"backend {backend!r} is unavailable: {reason}")
        self.backend = backend
        self.reason = reason


class PolicyRefusedError(SandboxrunError):
    """The backend cannot enforce every requested guarantee, and the caller did not opt into
    less (``allow_degraded``), or asked for ``strict``. Nothing was started."""

    def __init__(
        self, backend: str, missing: list[str], why: str | None = None, *, strict: bool = False
    ) -> None:
        because = f" ({why})" if why else ""
        opt_in = (
            "--strict forbids running with less"
            if strict
            else "pass --allow-degraded (Policy(allow_degraded=True), "
            "SANDBOXRUN_ALLOW_DEGRADED=1) to run with less"
        )
        super().__init__(
            f"refusing to run: backend {backend!r} cannot enforce "
            f"{', '.join(missing)} here{because}; {opt_in}"
        )
        self.backend = backend
        self.missing = missing
        self.why = why


class BackendError(SandboxrunError):
    """The backend itself failed while in use (died, lost, protocol error)."""


class SandboxFileError(SandboxrunError):
    """A file operation in the sandbox failed; ``path`` is the path as given, ``errno`` the
    error number when there is one (a FIFO or a device has none: only regular files and
    directories are read, written and listed)."""

    def __init__(self, message: str, path: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno


class SandboxFileNotFoundError(SandboxFileError, FileNotFoundError):
    """The path (or a directory on the way) does not exist in the sandbox."""


class SandboxIsADirectoryError(SandboxFileError, IsADirectoryError):
    """A file was to be read or written, and the path is a directory."""


class SandboxNotADirectoryError(SandboxFileError, NotADirectoryError):
    """A directory was to be listed (or passed through), and the path is not one."""


class SandboxPermissionError(SandboxFileError, PermissionError):
    """The sandbox may not read or write the path: its mode, a read-only file system or
    workspace, or a masked path."""


class SandboxFileTooLargeError(SandboxFileError):
    """The file is larger than the ``max_bytes`` it was read with; nothing is returned."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(
            f"{path!r} is too large to read: {size} bytes, more than max_bytes={limit}", path
        )
        self.size = size
        self.limit = limit


class ExecError(SandboxrunError):
    """Raised by ``ExecResult.check()`` for any result that is not ``completed``. Its text
    ends with the last ``STDERR_TAIL`` characters of the command's stderr (as the result
    holds it: masked), which usually say why."""

    STDERR_TAIL = 800

    def __init__(self, result: ExecResult) -> None:
        detail = result.error or (
            f"exit code {result.exit_code}" if result.exit_code is not None else result.signal
        )
        text = f"command {result.argv!r} ended with status {result.status} ({detail})"
        stderr = result.stderr.rstrip()
        if stderr:
            cut = len(stderr) > self.STDERR_TAIL
            tail = stderr[-self.STDERR_TAIL :]
            text += f"; stderr{' (its end)' if cut else ''}:\n{'…' if cut else ''}{tail}"
        super().__init__(text)
        self.result = result
