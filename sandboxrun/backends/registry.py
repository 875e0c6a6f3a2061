"""The registry: the probe + fallback chain and the one place a backend is created.

``auto`` probes docker -> systemd-scope -> process-group and takes the first one that can give
every guarantee asked for, recording why the better ones were not used; where none can, the run
is refused unless the caller opted into less (``allow_degraded``). An explicitly named backend
never falls back, and follows the same rule.
"""

from __future__ import annotations

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


def create(name: BackendName, ctx: Context) -> Backend:
    if name == "process-group":
        from sandboxrun.backends.local.pgroup import ProcessGroupBackend

        return ProcessGroupBackend(
            ctx.limits.grace_s, ctx.policy, ctx.workspace.root, ctx.path_prepend
        )
    if name == "docker":
        from sandboxrun.backends.docker.backend import DockerBackend

        return DockerBackend(ctx.workspace, ctx.policy, ctx.limits, ctx.image, ctx.user)
    if name == "systemd-scope":
        from sandboxrun.backends.systemd.backend import SystemdScopeBackend

        return SystemdScopeBackend(
            limits=ctx.limits,
            policy=ctx.policy,
            workspace=ctx.workspace.root,
            tools=ctx.path_prepend,
        )
    raise SandboxUnavailableError(name, probe(name).reason or "unavailable")


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
