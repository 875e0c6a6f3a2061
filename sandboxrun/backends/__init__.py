"""Backends: how a sandbox is made. The contract is ``base``, the probe + fallback chain and
creation are ``registry``; ``local/``, ``systemd/`` and ``docker/`` implement it, over the
supervisor client (``client``, ``supervised``).

``auto`` probes docker -> systemd-scope -> process-group and takes the first one that can give
every guarantee asked for, recording why the better ones were not used; where none can, the run
is refused unless the caller opted into less (``allow_degraded``). An explicitly named backend
never falls back, and follows the same rule.

The names below resolve on first use (PEP 562): importing this package imports no backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandboxrun.backends.base import Backend, Context, Probe
    from sandboxrun.backends.registry import ORDER, check_name, create, probe, select

_LAZY = {
    "Backend": "sandboxrun.backends.base",
    "Context": "sandboxrun.backends.base",
    "Probe": "sandboxrun.backends.base",
    "ORDER": "sandboxrun.backends.registry",
    "check_name": "sandboxrun.backends.registry",
    "create": "sandboxrun.backends.registry",
    "probe": "sandboxrun.backends.registry",
    "select": "sandboxrun.backends.registry",
}

__all__ = ["ORDER", "Backend", "Context", "Probe", "check_name", "create", "probe", "select"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sandboxrun.backends' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
