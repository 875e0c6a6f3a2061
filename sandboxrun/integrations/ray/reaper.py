"""``Reaper``: the per-node backstop of a Ray pool, the body of a Ray actor.

A sandbox's supervisor ends it when its owner dies; what an owner SIGKILLed between the
container's creation and the supervisor's connect leaves is removed here. The reaper sees only
this node's leftovers: managed containers whose ``owner_host`` is this node's name and whose
``owner_pid`` is dead (``sandboxrun.backends.housekeeping.owner_alive``, the rule of
``sandboxrun clean``), and scopes whose owner is gone. Another host's sandboxes, or one whose
owner lives, are never touched.
"""

from __future__ import annotations

import contextlib
import socket

import anyio
import anyio.to_thread

from sandboxrun.backends import housekeeping
from sandboxrun.errors import BackendError, SandboxUnavailableError


class Reaper:
    """``sweep`` on demand, and every ``interval_s`` in the background once ``start``ed."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.removed = 0

    def host(self) -> str:
        return socket.gethostname()

    async def start(self) -> str:
        """Begin the periodic sweep; this node's name."""
        import asyncio

        async def loop() -> None:
            while True:
                await anyio.sleep(self.interval_s)
                with contextlib.suppress(Exception):
                    await self.sweep()

        self._loop = asyncio.get_running_loop().create_task(loop())
        return self.host()

    async def sweep(self) -> dict[str, object]:
        """Remove this node's leftovers now: what was removed and what could not be."""
        return await anyio.to_thread.run_sync(self._sweep)

    def _sweep(self) -> dict[str, object]:
        from sandboxrun.backends.docker import api as dockerapi
        from sandboxrun.backends.registry import probe

        removed: list[str] = []
        problems: list[str] = []
        try:
            client: dockerapi.Client | None = dockerapi.connect(dockerapi.PROBE_TIMEOUT_S)
        except SandboxUnavailableError:
            client = None  # no engine here: nothing of docker to reap
        if client is not None:
            try:
                for row in housekeeping.list_managed(client):
                    if row.owner_alive:
                        continue
                    try:
                        with contextlib.suppress(dockerapi.NotFoundError):
                            housekeeping.remove(client, row.id)
                        removed.append(row.id)
                    except BackendError as exc:
                        problems.append(f"container {row.id[:12]}: {exc}")
            except BackendError as exc:
                problems.append(f"containers: {exc}")
            finally:
                client.close()
        if probe("systemd-scope").available:
            try:
                for scope in housekeeping.list_scopes():
                    if not scope.owner_alive:
                        housekeeping.stop_scope(scope.unit)
                        removed.append(scope.unit)
            except BackendError as exc:
                problems.append(f"scopes: {exc}")
        self.removed += len(removed)
        return {"host": self.host(), "removed": removed, "problems": problems}
