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


class ExecError(SandboxrunError):
    """Raised by ``ExecResult.check()`` for any result that is not ``completed``."""

    def __init__(self, result: ExecResult) -> None:
        detail = result.error or (
            f"exit code {result.exit_code}" if result.exit_code is not None else result.signal
        )
        super().__init__(f"command {result.argv!r} ended with status {result.status} ({detail})")
        self.result = result
