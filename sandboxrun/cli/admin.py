"""``sandboxrun doctor``, ``ps`` and ``clean``: the host's backends and sandboxrun's leftovers.

Heavy modules (docker, psutil, pydantic models) are imported inside the commands."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sandboxrun.cli.app import app
from sandboxrun.cli.report import EXIT_USAGE, fail, say
from sandboxrun.errors import BackendError, ConfigError, SandboxUnavailableError

if TYPE_CHECKING:
    from sandboxrun.backends.docker.api import Client as DockerClient


def layer_rows() -> list[dict[str, object]]:
    """The local isolation layer, part by part: given here or not, why, and how to get it."""
    from sandboxrun.backends.local.isolation import NAMESPACE_LAYERS, probe_host

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


VERBOSE = typer.Option(
    "-v", "--verbose", help="also say which backends are unavailable here, and why"
)


def _problem(line: str) -> None:
    say(line)  # an engine's error text, neutralized like every line sandboxrun writes


def _engine(verbose: bool) -> DockerClient | None:
    """The engine's client, or None when there is none (said only with ``-v``)."""
    from sandboxrun.backends.docker import api as dockerapi

    try:
        return dockerapi.connect(dockerapi.PROBE_TIMEOUT_S)
    except SandboxUnavailableError as exc:
        if verbose:
            _problem(f"containers: skipped ({exc.reason})")
        return None


def _ps_rows(verbose: bool) -> tuple[list[dict[str, object]], bool]:
    """The rows of ``ps --json``, and whether an available backend failed (said on stderr)."""
    from sandboxrun.backends import housekeeping
    from sandboxrun.backends.registry import probe

    rows: list[dict[str, object]] = []
    failed = False
    client = _engine(verbose)
    if client is not None:
        try:
            rows += [
                {"kind": "container", **row.__dict__} for row in housekeeping.list_managed(client)
            ]
        except BackendError as exc:
            failed = True
            _problem(f"containers: failed ({exc})")
        finally:
            client.close()
    systemd = probe("systemd-scope")
    scopes: list[housekeeping.ManagedScope] = []
    if not systemd.available:
        if verbose:
            _problem(f"scopes: skipped ({systemd.reason})")
    else:
        try:
            scopes = housekeeping.list_scopes()
        except BackendError as exc:
            failed = True
            _problem(f"scopes: failed ({exc})")
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
    return rows, failed


@app.command()
def ps(
    json_out: Annotated[bool, typer.Option("--json", help="one JSON list of rows")] = False,
    verbose: Annotated[bool, VERBOSE] = False,
) -> None:
    """List sandboxrun's containers (label sandboxrun.managed=true) and scopes (units
    sandboxrun-*.scope): a table with a header, or "no sandboxes running". An unavailable
    backend is skipped silently (said with -v); an available one that fails is said on
    stderr and the exit status is 1."""
    import time

    from sandboxrun.cli.admin_text import ps_table

    rows, failed = _ps_rows(verbose)
    if json_out:
        sys.stdout.write(json.dumps(rows) + "\n")
    else:
        sys.stdout.write("".join(line + "\n" for line in ps_table(rows, time.time())))
    sys.stdout.flush()
    if failed:
        raise typer.Exit(1)


def _clean_spill(root: Path, older_than: str | None, max_total: str | None, dry_run: bool) -> str:
    from sandboxrun.cli.admin_text import spill_line
    from sandboxrun.engine.capture.prune import caps_from_env, parse_age, parse_total, prune
    from sandboxrun.units import format_duration, format_size

    caps = caps_from_env()
    if older_than is not None:
        caps = dataclasses.replace(caps, max_age_s=parse_age(older_than, what="--older-than"))
    if max_total is not None:
        caps = dataclasses.replace(caps, max_total=parse_total(max_total, what="--max-total"))
    report = prune(root, caps, dry_run=dry_run)
    shown = (
        "off" if caps.max_age_s is None else format_duration(caps.max_age_s),
        "off" if caps.max_total is None else format_size(caps.max_total),
    )
    return spill_line(
        root,
        len(report.removed),
        report.freed_bytes,
        report.in_use,
        report.left_bytes,
        shown,
        complete=report.complete,
        dry_run=dry_run,
    )


def _clean_scopes(all_: bool, verbose: bool, dry_run: bool) -> bool:
    """Stop the managed scopes whose owner is gone (``all_``: every one; ``dry_run``: only
    name them); False on a failure (said on stderr)."""
    from sandboxrun.backends import housekeeping
    from sandboxrun.backends.registry import probe

    systemd = probe("systemd-scope")
    if not systemd.available:
        if verbose:
            _problem(f"scopes: skipped ({systemd.reason})")
        return True
    try:
        scopes = [s for s in housekeeping.list_scopes() if all_ or not s.owner_alive]
        for scope in [] if dry_run else scopes:
            housekeeping.stop_scope(scope.unit)
    except BackendError as exc:
        _problem(f"scopes: failed ({exc})")
        return False
    if dry_run:
        names = "".join(f" {scope.unit}" for scope in scopes)
        sys.stdout.write(f"would stop {len(scopes)} scope(s){':' if names else ''}{names}\n")
    else:
        sys.stdout.write(f"stopped {len(scopes)} scope(s)\n")
    return True


def _clean_containers(all_: bool, verbose: bool, dry_run: bool) -> bool:
    """Remove the managed containers whose owner is gone (``all_``: every one); one already
    gone or being removed (it removes itself once its supervisor sees its owner die) counts
    as removed, and one that fails does not stop the others (``dry_run``: only name them).
    False on a failure (said on stderr)."""
    from sandboxrun.backends import housekeeping
    from sandboxrun.backends.docker import api as dockerapi

    client = _engine(verbose)
    if client is None:
        return True
    removed, ok = 0, True
    try:
        gone = [row for row in housekeeping.list_managed(client) if all_ or not row.owner_alive]
        if dry_run:
            names = "".join(f" {row.id[:12]}" for row in gone)
            colon = ":" if names else ""
            sys.stdout.write(f"would remove {len(gone)} container(s){colon}{names}\n")
            return True
        for row in gone:
            try:
                with contextlib.suppress(dockerapi.NotFoundError):  # removed meanwhile
                    housekeeping.remove(client, row.id)
                removed += 1
            except BackendError as exc:
                ok = False
                _problem(f"containers: cannot remove {row.id[:12]} ({exc})")
    except BackendError as exc:
        _problem(f"containers: failed ({exc})")
        return False
    finally:
        client.close()
    sys.stdout.write(f"removed {removed} container(s)\n")
    return ok


@app.command()
def clean(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="AGE",
            help="spill age cap: 90m, 36h (a bare number is seconds); 'off' for none "
            "[default: $SANDBOXRUN_SPILL_MAX_AGE, else 24h]",
            show_default=False,
        ),
    ] = None,
    max_total: Annotated[
        str | None,
        typer.Option(
            "--max-total",
            metavar="SIZE",
            help="spill size cap: the oldest closed sandboxes' files go until the spill root "
            "holds at most this (512m, 2g; 'off' for none) "
            "[default: $SANDBOXRUN_SPILL_MAX_TOTAL, else 1g]",
            show_default=False,
        ),
    ] = None,
    spill_dir: Annotated[
        Path | None,
        typer.Option(
            "--spill-dir", metavar="DIR", help="the spill root [default: the one runs use]"
        ),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="every managed container/scope")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="say what would be removed, remove nothing")
    ] = False,
    verbose: Annotated[bool, VERBOSE] = False,
) -> None:
    """Remove managed containers and stop scopes whose owner is gone (--all: every one), and
    prune the spill root to its caps (the files of open sandboxes are never touched). An
    unavailable backend is skipped silently (said with -v); an available one that fails is
    said on stderr and the exit status is 1."""
    from sandboxrun.cli import settings
    from sandboxrun.engine.capture.spill import default_spill_root

    failed = False
    try:
        settings.export_spill_caps(settings.in_force({}))  # a project's caps, under the flags
        root = spill_dir or default_spill_root()
        sys.stdout.write(_clean_spill(root, older_than, max_total, dry_run))
        sys.stdout.write("\n")
    except ConfigError as exc:
        raise fail(EXIT_USAGE, str(exc)) from None
    except OSError as exc:
        failed = True
        _problem(f"spill: failed ({exc})")
    failed = not _clean_scopes(all_, verbose, dry_run) or failed
    failed = not _clean_containers(all_, verbose, dry_run) or failed
    sys.stdout.flush()
    if failed:
        raise typer.Exit(1)


@app.command("config")
def config_(
    json_out: Annotated[
        bool, typer.Option("--json", help="one JSON object: the file, and each setting")
    ] = False,
) -> None:
    """Print the settings in force for `run` here (and `clean`'s spill caps), and where each
    came from: the command line, a SANDBOXRUN_* variable, the project's sandboxrun.toml or
    pyproject.toml [tool.sandboxrun] (the first found from this directory up; a project's
    file cannot widen the sandbox), or the default."""
    import os

    from sandboxrun.cli import settings

    try:
        found = settings.find_file(Path.cwd(), os.environ)
        project = None if found is None else settings.read_file(found)
        values = settings.resolve({}, os.environ, project)
    except ConfigError as exc:
        raise fail(EXIT_USAGE, str(exc), json_out=json_out, kind="ConfigError") from None
    where = "none" if project is None else project.where
    if json_out:
        shown = {k: {"value": v.value, "source": v.source} for k, v in values.items()}
        sys.stdout.write(json.dumps({"file": where, "settings": shown}) + "\n")
        return
    if project is None:
        where = (
            f"none (no {settings.FILE_NAME}, nor {settings.PYPROJECT} with [tool.sandboxrun], "
            f"from {Path.cwd()} up; {settings.CONFIG_VAR} names one)"
        )
    sys.stdout.write(f"settings file: {where}\n")
    sys.stdout.write("".join(line + "\n" for line in settings.lines(values)))
