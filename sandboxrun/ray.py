"""``sandboxrun.ray``: warm sandboxes across the nodes of a Ray cluster (``pip install
'sandboxrun[ray]'``). See ``docs/scaling.md`` and ``sandboxrun.integrations.ray.pool``."""

from __future__ import annotations

try:
    import ray as _ray  # noqa: F401  (only to say clearly what is missing)
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sandboxrun.ray needs Ray: pip install 'sandboxrun[ray]' (or ray>=2.40)"
    ) from exc

from sandboxrun.integrations.ray.pool import RayPoolStats, RayRun, RaySession, SandboxPool

__all__ = ["RayPoolStats", "RayRun", "RaySession", "SandboxPool"]
