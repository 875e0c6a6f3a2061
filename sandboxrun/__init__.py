"""sandboxrun: run untrusted commands against a host workspace with OS-level isolation.

The public API. See ``docs/api.md``.
"""

from sandboxrun.errors import (
    BackendError,
    ConfigError,
    EnvError,
    ExecError,
    InputError,
    PolicyRefusedError,
    SandboxrunError,
    SandboxUnavailableError,
    WorkspaceError,
)
from sandboxrun.models import Denial, ExecResult, Limits, Policy
from sandboxrun.sandbox import Sandbox, run

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "ConfigError",
    "Denial",
    "EnvError",
    "ExecError",
    "ExecResult",
    "InputError",
    "Limits",
    "Policy",
    "PolicyRefusedError",
    "Sandbox",
    "SandboxUnavailableError",
    "SandboxrunError",
    "WorkspaceError",
    "__version__",
    "run",
]
