"""Checks shared by the conformance tests."""

from __future__ import annotations

import time

import anyio.to_thread
import docker.errors

from sandboxrun import Sandbox
from sandboxrun.backends.docker.backend import DockerBackend


def container_processes(backend: DockerBackend) -> list[str]:
    """Command lines of every process in the sandbox container (the engine's `top`)."""
    assert backend.session.client is not None and backend.session.container_id is not None
    for _ in range(5):  # `top` runs ps on the host, which fails now and then as processes exit
        try:
            top = backend.session.client.api.top(
                backend.session.container_id, ps_args="-eo pid,args"
            )
            break
        except docker.errors.APIError:
            time.sleep(0.1)
    else:
        top = backend.session.client.api.top(backend.session.container_id, ps_args="-eo pid,args")
    column = top["Titles"].index("COMMAND") if "COMMAND" in top["Titles"] else -1
    pid = top["Titles"].index("PID") if "PID" in top["Titles"] else 0
    own = {backend.session.init_pid, backend.session.supervisor_pid, *backend.session.keep} - {None}
    # the container's own processes (init, main, the supervisor) by their host pids
    return [str(row[column]) for row in top["Processes"] if int(row[pid]) not in own]


async def assert_container_clean(sb: Sandbox) -> None:
    """On docker, only the init and the main process (the supervisor, or an idle ``sleep``)
    may be left in the container."""
    backend = sb.backend
    if not isinstance(backend, DockerBackend):
        return
    for _ in range(20):  # a killed process may stay a zombie until its parent reaps it
        procs = await anyio.to_thread.run_sync(container_processes, backend)
        main = ("docker-init", "sleep infinity")
        extra = (
            procs
            if backend.session.init_pid
            else [p for p in procs if not any(m in p for m in main)]
        )
        if not extra:
            return
        await anyio.sleep(0.1)
    live = [p for p in extra if "<defunct>" not in p]
    assert not live, f"processes of the exec left in the container: {extra}"


def assert_scope_gone(backend: str, run_id: str) -> None:
    """On systemd-scope, the run's unit is inactive or gone (not just its processes)."""
    if backend != "systemd-scope":
        return
    from helpers import wait_until

    from sandboxrun.backends.systemd import config as cfg
    from sandboxrun.backends.systemd.backend import unit_active

    unit = cfg.unit_name(run_id)
    assert wait_until(lambda: not unit_active(unit), 5), f"unit of run {run_id} is still active"
