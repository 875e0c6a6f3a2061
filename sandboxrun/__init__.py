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
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    SandboxIsADirectoryError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
    SandboxrunError,
    SandboxUnavailableError,
    WorkspaceError,
)
from sandboxrun.files import DirEntry
from sandboxrun.jobs import Job, JobChunk, JobLines
from sandboxrun.models import Denial, ExecResult, Limits, Policy
from sandboxrun.sandbox import Sandbox, run

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "ConfigError",
    "Denial",
    "DirEntry",
    "EnvError",
    "ExecError",
    "ExecResult",
    "InputError",
    "Job",
    "JobChunk",
    "JobLines",
    "Limits",
    "Policy",
    "PolicyRefusedError",
    "Sandbox",
    "SandboxFileError",
    "SandboxFileNotFoundError",
    "SandboxFileTooLargeError",
    "SandboxIsADirectoryError",
    "SandboxNotADirectoryError",
    "SandboxPermissionError",
    "SandboxUnavailableError",
    "SandboxrunError",
    "WorkspaceError",
    "__version__",
    "run",
]
