"""``sandboxrun doctor``, ``ps`` and ``clean``: the host's backends and sandboxrun's leftovers."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from sandboxrun.cli import app
from sandboxrun.errors import BackendError, SandboxUnavailableError


def layer_rows() -> list[dict[str, object]]:
    """The local isolation layer, part by part: given here or not, why, and how to get it."""
    from sandboxrun.isolation import NAMESPACE_LAYERS, probe_host

    support = probe_host()
    ns = ", ".join(("network-none", *NAMESPACE_LAYERS))
    return [
        {
            "layer": "namespaces (bubblewrap)",
            "available": support.bwrap is not None,
            "gives": ns,
            "reason": support.bwrap_reason,
        },
        {
            "layer": "landlock",
            "available": support.landlock_abi > 0,
            "gives": f"writes only where the policy allows (ABI {support.landlock_abi})"
            if support.landlock_abi
            else "writes only where the policy allows",
            "reason": None
            if support.landlock_abi
            else "the kernel has no Landlock (CONFIG_SECURITY_LANDLOCK=y and lsm=...,landlock)",
        },
        {
            "layer": "seccomp",
            "available": support.seccomp,
            "gives": "no setuid/setgid file, no device node",
            "reason": None if support.seccomp else "the kernel has no seccomp filter support",
        },
    ]


@app.command()
def doctor(json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """For each backend: available or not and why, and the isolation it gives; then each part
    of the local isolation layer (process-group, systemd-scope): given here or why not."""
    from sandboxrun import backends

    probes = [backends.probe(name) for name in backends.ORDER]
    layers = layer_rows()
    if json_out:
        rows = [
            {
                "backend": p.backend,
                "available": p.available,
                "reason": p.reason,
                "isolation": list(p.isolation),
            }
            for p in probes
        ]
        sys.stdout.write(json.dumps({"backends": rows, "local_layers": layers}) + "\n")
        return
    for p in probes:
        state = "available" if p.available else "unavailable"
        detail = ", ".join(p.isolation) if p.available else p.reason
        sys.stdout.write(f"{p.backend:<14} {state:<12} {detail}\n")
    sys.stdout.write("local isolation layer:\n")
    for row in layers:
        state = "available" if row["available"] else "unavailable"
        detail = str(row["gives"] if row["available"] else row["reason"])
        sys.stdout.write(f"  {row['layer']!s:<24} {state:<12} {detail}\n")


@app.command()
def ps(json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List sandboxrun's containers (label sandboxrun.managed=true) and scopes (units
    sandboxrun-*.scope), owner alive or not."""
    from sandboxrun import dockerapi, housekeeping
    from sandboxrun.backends import probe

    rows: list[dict[str, object]] = []
    try:
        containers = housekeeping.list_managed(dockerapi.connect(dockerapi.PROBE_TIMEOUT_S))
        rows += [{"kind": "container", **row.__dict__} for row in containers]
    except (SandboxUnavailableError, BackendError) as exc:
        sys.stderr.write(f"containers: skipped ({exc})\n")
    systemd = probe("systemd-scope")
    try:
        scopes = housekeeping.list_scopes() if systemd.available else []
    except BackendError as exc:
        scopes = []
        sys.stderr.write(f"scopes: skipped ({exc})\n")
    if not systemd.available:
        sys.stderr.write(f"scopes: skipped ({systemd.reason})\n")
    host = socket.gethostname()
    for scope in scopes:  # the same fields as a container row
        rows.append(
            {
                "kind": "scope",
                "id": scope.unit,
                "name": scope.unit,
                "status": scope.state,
                "owner_pid": scope.owner_pid,
                "owner_host": host,
                "created": None,
                "owner_alive": scope.owner_alive,
            }
        )
    if json_out:
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    for row in rows:
        alive = "owner alive" if row["owner_alive"] else "owner gone"
        owner = f"{row['owner_pid']}@{row['owner_host']}"
        ident = str(row["id"])[:12] if row["kind"] == "container" else "scope"
        sys.stdout.write(
            f"{ident:<12}  {row['name']!s:<24} {row['status']!s:<24} {owner:<24} {alive}\n"
        )


@app.command()
def clean(
    older_than: Annotated[float, typer.Option("--older-than", help="spill age, hours")] = 24.0,
    spill_dir: Annotated[Path | None, typer.Option("--spill-dir")] = None,
    all_: Annotated[bool, typer.Option("--all", help="every managed container/scope")] = False,
) -> None:
    """Remove managed containers and stop scopes whose owner is gone (--all: every one), and
    old spill files."""
    from sandboxrun import dockerapi, housekeeping
    from sandboxrun.backends import probe
    from sandboxrun.spill import default_spill_root, prune

    root = spill_dir or default_spill_root()
    removed = prune(root, older_than * 3600) if root.is_dir() else []
    noun = "directory" if len(removed) == 1 else "directories"
    sys.stdout.write(f"removed {len(removed)} spill {noun}\n")
    systemd = probe("systemd-scope")
    if systemd.available:
        try:
            scopes = [s for s in housekeeping.list_scopes() if all_ or not s.owner_alive]
            for scope in scopes:
                housekeeping.stop_scope(scope.unit)
            sys.stdout.write(f"stopped {len(scopes)} scope(s)\n")
        except BackendError as exc:
            sys.stdout.write(f"scopes: failed ({exc})\n")
    else:
        sys.stdout.write(f"scopes: skipped ({systemd.reason})\n")
    try:
        client = dockerapi.connect(dockerapi.PROBE_TIMEOUT_S)
    except SandboxUnavailableError as exc:
        sys.stdout.write(f"containers: skipped ({exc.reason})\n")
        return
    gone = [row for row in housekeeping.list_managed(client) if all_ or not row.owner_alive]
    for row in gone:
        housekeeping.remove(client, row.id)
    sys.stdout.write(f"removed {len(gone)} container(s)\n")
