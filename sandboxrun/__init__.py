"""sandboxrun: run untrusted commands against a host workspace with OS-level isolation.

The public API. See ``docs/api.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandboxrun.api.files import DirEntry
    from sandboxrun.api.jobs import Job, JobChunk, JobLines
    from sandboxrun.api.pool import PoolStats, SandboxPool
    from sandboxrun.api.sandbox import Sandbox, run
    from sandboxrun.api.shell import Shell, ShellResult
    from sandboxrun.api.terminal import (
        Foreground,
        OutputWait,
        Terminal,
        TerminalScreen,
        TerminalText,
    )
    from sandboxrun.detached.handle import DetachedSandbox
    from sandboxrun.errors import (
        BackendError,
        ConfigError,
        EnvError,
        ExecError,
        InputError,
        NoSuchSandbox,
        PolicyRefusedError,
        PoolExhaustedError,
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
    from sandboxrun.image.source import image_from
    from sandboxrun.integrations.blocking import BlockingJob, BlockingSandbox
    from sandboxrun.models import Denial, ExecResult, Limits, Mount, Policy

__version__ = "0.1.0"

_LAZY = {
    "BackendError": "sandboxrun.errors",
    "ConfigError": "sandboxrun.errors",
    "EnvError": "sandboxrun.errors",
    "ExecError": "sandboxrun.errors",
    "InputError": "sandboxrun.errors",
    "PolicyRefusedError": "sandboxrun.errors",
    "SandboxFileError": "sandboxrun.errors",
    "SandboxFileNotFoundError": "sandboxrun.errors",
    "SandboxFileTooLargeError": "sandboxrun.errors",
    "SandboxIsADirectoryError": "sandboxrun.errors",
    "SandboxNotADirectoryError": "sandboxrun.errors",
    "SandboxPermissionError": "sandboxrun.errors",
    "SandboxrunError": "sandboxrun.errors",
    "SandboxUnavailableError": "sandboxrun.errors",
    "PoolExhaustedError": "sandboxrun.errors",
    "PoolStats": "sandboxrun.api.pool",
    "SandboxPool": "sandboxrun.api.pool",
    "WorkspaceError": "sandboxrun.errors",
    "BlockingJob": "sandboxrun.integrations.blocking",
    "BlockingSandbox": "sandboxrun.integrations.blocking",
    "DirEntry": "sandboxrun.api.files",
    "DetachedSandbox": "sandboxrun.detached.handle",
    "NoSuchSandbox": "sandboxrun.errors",
    "Job": "sandboxrun.api.jobs",
    "JobChunk": "sandboxrun.api.jobs",
    "JobLines": "sandboxrun.api.jobs",
    "Denial": "sandboxrun.models",
    "ExecResult": "sandboxrun.models",
    "Limits": "sandboxrun.models",
    "Mount": "sandboxrun.models",
    "Policy": "sandboxrun.models",
    "Sandbox": "sandboxrun.api.sandbox",
    "Shell": "sandboxrun.api.shell",
    "ShellResult": "sandboxrun.api.shell",
    "Foreground": "sandboxrun.api.terminal",
    "OutputWait": "sandboxrun.api.terminal",
    "Terminal": "sandboxrun.api.terminal",
    "TerminalScreen": "sandboxrun.api.terminal",
    "TerminalText": "sandboxrun.api.terminal",
    "run": "sandboxrun.api.sandbox",
    "image_from": "sandboxrun.image.source",
}
"""Where each public name lives: imported on first use (PEP 562), so that ``import sandboxrun``
and the CLI's start-up do not pay for pydantic, anyio and the docker SDK (bench/cli_startup.py)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sandboxrun' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "BackendError",
    "BlockingJob",
    "BlockingSandbox",
    "ConfigError",
    "Denial",
    "DetachedSandbox",
    "DirEntry",
    "EnvError",
    "ExecError",
    "ExecResult",
    "Foreground",
    "InputError",
    "Job",
    "JobChunk",
    "JobLines",
    "Limits",
    "Mount",
    "NoSuchSandbox",
    "OutputWait",
    "Policy",
    "PolicyRefusedError",
    "PoolExhaustedError",
    "PoolStats",
    "Sandbox",
    "SandboxFileError",
    "SandboxFileNotFoundError",
    "SandboxFileTooLargeError",
    "SandboxIsADirectoryError",
    "SandboxNotADirectoryError",
    "SandboxPermissionError",
    "SandboxPool",
    "SandboxUnavailableError",
    "SandboxrunError",
    "Shell",
    "ShellResult",
    "Terminal",
    "TerminalScreen",
    "TerminalText",
    "WorkspaceError",
    "__version__",
    "image_from",
    "run",
]
