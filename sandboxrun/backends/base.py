"""The backend contract: ``Backend``, what a probe says (``Probe``) and what a backend is created
for (``Context``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from sandboxrun.backends.local.isolation import HostSupport
from sandboxrun.engine.paths import Workspace
from sandboxrun.engine.request import ExecRequest
from sandboxrun.engine.supervise import RunFacts
from sandboxrun.models import BackendName, ExecResult, Limits, Policy

log = logging.getLogger("sandboxrun")


@dataclass(frozen=True)
class Probe:
    backend: BackendName
    available: bool
    reason: str | None
    """Why it is unavailable (None when available)."""
    isolation: tuple[str, ...]
    """The guarantees this backend can give, by ``ExecResult.isolation`` names."""
    support: HostSupport | None = None
    """For the local backends: what this host's isolation layer can give, and why not."""


class Backend(Protocol):
    """One way to run commands. Opened once per ``Sandbox``, then many ``exec`` calls."""

    name: BackendName

    async def open(self) -> None:
        """Acquire what the backend needs. A failure releases whatever was acquired."""

    def command(self, request: ExecRequest) -> list[str]:
        """The argv of the command itself as this backend spawns it (``ExecResult.argv``)."""

    def describe(self, request: ExecRequest) -> list[str]:
        """The whole argv that would run ``request`` (``--dry-run``), secrets redacted."""

    def isolation(self, request: ExecRequest) -> list[str]:
        """The guarantees that would really be enforced for ``request``."""

    def check_request(self, request: ExecRequest) -> None:
        """Raise an ``InputError`` when this backend cannot carry ``request`` exactly (e.g. bytes
        that are not UTF-8 through docker's JSON API). Called before anything runs."""

    async def exec(
        self, request: ExecRequest, facts: RunFacts
    ) -> tuple[ExecResult, BaseException | None]:
        """Run one command to its end and return its result. A non-zero exit is data. When the
        caller's scope was cancelled, cleanup is done first and the cancellation exception is
        returned beside the (``cancelled``) result for the caller to re-raise."""

    async def close(self) -> None:
        """Release everything; bounded, safe to call twice."""


@dataclass(frozen=True)
class Context:
    """What a backend is created for: one sandbox's workspace, policy, limits and options."""

    workspace: Workspace
    policy: Policy
    limits: Limits
    image: str | None = None
    user: str | None = None
    path_prepend: tuple[str, ...] = ()
