"""The registry: the probe + fallback chain and the one place a backend is created.

``auto`` probes docker -> systemd-scope -> process-group and takes the first one that can give
every guarantee asked for, recording why the better ones were not used; where none can, the run
is refused unless the caller opted into less (``allow_degraded``). An explicitly named backend
never falls back, and follows the same rule.
"""

from __future__ import annotations

import importlib

from sandboxrun.backends.base import Backend, Context, Probe, log
from sandboxrun.errors import ConfigError, PolicyRefusedError, SandboxUnavailableError
from sandboxrun.models import BackendName, Policy, required_guarantees

ORDER: tuple[BackendName, ...] = ("docker", "systemd-scope", "process-group")


def probe(name: BackendName, image: str | None = None, policy: Policy | None = None) -> Probe:
    """Whether ``name`` can run here, and what it gives (under ``policy``: the local
    backends' isolation layer depends on it)."""
    if name == "process-group":
        from sandboxrun.backends.local.pgroup import probe_pgroup

        return probe_pgroup(policy)
    if name == "docker":
        from sandboxrun.backends.docker.backend import probe_docker
        from sandboxrun.backends.docker.config import BASE_IMAGE

        return probe_docker(image or BASE_IMAGE)
    from sandboxrun.backends.systemd.backend import probe_systemd

    return probe_systemd(policy)


def missing_for(result: Probe, ctx: Context) -> list[str]:
    """The guarantees ``ctx`` asks for that the probed backend cannot give."""
    return [g for g in required_guarantees(ctx.policy, ctx.limits) if g not in result.isolation]


def refusal(result: Probe, ctx: Context, missing: list[str]) -> PolicyRefusedError:
    why = result.support.why_not(missing) if result.support is not None else None
    return PolicyRefusedError(result.backend, missing, why or None, strict=ctx.policy.strict)


CLASSES: dict[BackendName, tuple[str, str]] = {
    "process-group": ("sandboxrun.backends.local.pgroup", "ProcessGroupBackend"),
    "docker": ("sandboxrun.backends.docker.backend", "DockerBackend"),
    "systemd-scope": ("sandboxrun.backends.systemd.backend", "SystemdScopeBackend"),
}
"""Each backend's class, imported when it is created: one constructor, ``cls(ctx)``."""


def create(name: BackendName, ctx: Context) -> Backend:
    where = CLASSES.get(name)
    if where is None:
        raise SandboxUnavailableError(name, probe(name).reason or "unavailable")
    cls: type[Backend] = getattr(importlib.import_module(where[0]), where[1])
    return cls(ctx)


def check_name(requested: str) -> BackendName:
    for name in ORDER:
        if name == requested:
            return name
    raise ConfigError(f"unknown backend {requested!r}: expected auto, {', '.join(ORDER)}")


def select(requested: str, ctx: Context) -> tuple[Backend, str | None]:
    """The backend to use and, under ``auto``, why better ones were skipped (else None).

    Fail closed: a backend that cannot give every guarantee the policy and limits ask for is
    used only with ``allow_degraded`` (never under ``strict``); ``auto`` takes the first that
    gives them all, else (with ``allow_degraded``) the first available one, else refuses
    (``PolicyRefusedError``) naming what this host cannot give."""
    degraded_ok = ctx.policy.allow_degraded and not ctx.policy.strict
    if requested != "auto":
        name = check_name(requested)
        result = probe(name, ctx.image, ctx.policy)
        if not result.available:
            raise SandboxUnavailableError(name, result.reason or "unavailable")
        missing = missing_for(result, ctx)
        if missing and not degraded_ok:
            raise refusal(result, ctx, missing)
        return create(name, ctx), None
    skipped: list[str] = []
    first: tuple[Probe, list[str]] | None = None
    for name in ORDER:
        result = probe(name, ctx.image, ctx.policy)
        if not result.available:
            skipped.append(f"{name}: {result.reason}")
            continue
        missing = missing_for(result, ctx)
        if not missing:
            reason = "; ".join(skipped) or None
            if reason:
                log.warning("sandboxrun: falling back to %s: %s", name, reason)
            return create(name, ctx), reason
        skipped.append(f"{name}: cannot enforce {', '.join(missing)}")
        first = first or (result, missing)
    if first is None:
        raise SandboxUnavailableError("auto", "; ".join(skipped))
    if not degraded_ok:
        raise refusal(first[0], ctx, first[1])
    reason = "; ".join(skipped)
    log.warning("sandboxrun: falling back to %s, degraded: %s", first[0].backend, reason)
    return create(first[0].backend, ctx), reason
