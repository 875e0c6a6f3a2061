"""The validated, backend-neutral description of one command (internal)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sandboxrun.models import Limits, Policy

Sink = Callable[[str, bytes], None]
"""Live output sink: called with ``("stdout" | "stderr", chunk)`` as chunks arrive."""


@dataclass(frozen=True)
class ExecRequest:
    run_id: str
    argv: list[str] | None
    """The caller's argv (argv mode), or None in shell mode."""
    script: str | None
    """The caller's shell script (shell mode), or None in argv mode."""
    env: dict[str, str]
    path_prepend: list[str]
    workdir: Path
    """Resolved host working directory, inside the workspace."""
    workdir_rel: PurePosixPath
    """The working directory relative to the workspace root."""
    stdin: bytes | None
    timeout_s: float
    limits: Limits
    policy: Policy
    sink: Sink | None = None
    explicit: frozenset[str] = frozenset()
    """Names in ``env`` the caller gave explicitly (``--env``, ``env=``): every backend passes
    them as given, never replacing or dropping them (``PATH`` is re-applied after the login
    profile, see ``argv.EXPLICIT_PATH_VAR``)."""
