"""``sandboxrun ps`` and ``clean`` as a user sees them: a table with a header, nothing about
backends that cannot be used here unless ``-v``, a real engine error still said, and ``clean``
pruning the spill root with the same caps as the automatic pruning."""

from __future__ import annotations

import json
import os
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import anyio
import pytest
from helpers import require_backend

from sandboxrun import Limits, Sandbox, backends
from sandboxrun.cli.admin_text import EMPTY, HEADER
from sandboxrun.engine.capture.spill import SpillDir, SpillSession

CLI = [sys.executable, "-m", "sandboxrun"]
NO_ENGINE = "unix:///nonexistent/docker.sock"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )


def header_of(stdout: str) -> str:
    return stdout.splitlines()[0]


def systemd_available() -> bool:
    return backends.probe("systemd-scope").available


# --- without docker (and, on this kind of host, without systemd) ------------------------------


def test_ps_without_any_backend_is_a_quiet_empty_table() -> None:
    if systemd_available():
        pytest.skip("systemd is usable here: its scopes are listed")
    done = cli("ps", env={"DOCKER_HOST": NO_ENGINE})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["  ".join(HEADER), EMPTY]
    assert done.stderr == ""  # was: "containers: skipped (...)" and "scopes: skipped (...)"
    verbose = cli("ps", "-v", env={"DOCKER_HOST": NO_ENGINE})
    assert verbose.returncode == 0
    assert "containers: skipped (no Docker engine socket at" in verbose.stderr
    assert "scopes: skipped (" in verbose.stderr
    as_json = cli("ps", "--json", env={"DOCKER_HOST": NO_ENGINE})
    assert json.loads(as_json.stdout) == [] and as_json.stderr == ""


def test_clean_without_any_backend_says_only_what_it_did(tmp_path: Path) -> None:
    if systemd_available():
        pytest.skip("systemd is usable here: its scopes are cleaned")
    done = cli("clean", env={"DOCKER_HOST": NO_ENGINE})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("spill: removed 0 directories")
    assert "skipped" not in done.stdout + done.stderr
    verbose = cli("clean", "--verbose", env={"DOCKER_HOST": NO_ENGINE})
    assert "containers: skipped" in verbose.stderr and "scopes: skipped" in verbose.stderr


# --- an engine that answers, but fails ----------------------------------------------------


class FailingEngine(BaseHTTPRequestHandler):
    """Answers the client's ping and version checks; every other call is a 500."""

    def _answer(self) -> None:
        if self.path.endswith("/_ping"):
            status, body, kind = 200, b"OK", "text/plain"
        elif self.path.endswith("/version"):
            status, body, kind = 200, b'{"ApiVersion": "1.41", "Version": "24.0.0"}', "json"
        else:
            status, body, kind = 500, b'{"message": "engine on fire"}', "json"
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if kind == "json" else kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        return

    def address_string(self) -> str:
        return "unix"


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def failing_engine(tmp_path: Path) -> Iterator[str]:
    server = UnixHTTPServer(str(tmp_path / "engine.sock"), FailingEngine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"unix://{tmp_path / 'engine.sock'}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_real_engine_error_is_still_said(failing_engine: str) -> None:
    done = cli("ps", env={"DOCKER_HOST": failing_engine})
    assert done.returncode == 1
    assert "containers: failed (" in done.stderr and "engine on fire" in done.stderr
    assert header_of(done.stdout) == "  ".join(HEADER)  # what could be listed still is
    cleaned = cli("clean", env={"DOCKER_HOST": failing_engine})
    assert cleaned.returncode == 1 and "containers: failed (" in cleaned.stderr
    assert cleaned.stdout.startswith("spill: removed")


# --- the real engine ----------------------------------------------------------------------


def our_containers() -> dict[str, str]:
    """This process's managed containers: id -> name."""
    import docker

    client = docker.from_env()
    try:
        found = client.containers.list(
            all=True,
            ignore_removed=True,
            filters={"label": ["sandboxrun.managed=true", f"sandboxrun.owner_pid={os.getpid()}"]},
        )
        return {str(c.id): str(c.name) for c in found}
    finally:
        client.close()


@pytest.mark.anyio
async def test_ps_lists_an_open_sandbox_under_the_header(workspace: Path) -> None:
    require_backend("docker")
    async with Sandbox(workspace, backend="docker"):
        ours = await anyio.to_thread.run_sync(our_containers)
        assert len(ours) == 1
        (cid, name), = ours.items()  # fmt: skip
        done = await anyio.to_thread.run_sync(lambda: cli("ps"))
        rows = await anyio.to_thread.run_sync(lambda: cli("ps", "--json"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = lines[0]
    assert header.split("  ")[0] == "ID" and "OWNER ALIVE" in header and EMPTY not in lines
    mine = [line for line in lines[1:] if name in line]
    assert len(mine) == 1
    row = mine[0]
    assert row.startswith(cid[:12]) and f"{os.getpid()}@" in row
    assert row[header.index("KIND") :].startswith("container ")
    assert row[header.index("OWNER ALIVE") :].startswith("yes ")
    assert row[header.index("AGE") :].rstrip()[-1] in "smh"
    if not systemd_available():
        assert "scopes" not in done.stderr
    listed = [r for r in json.loads(rows.stdout) if r["id"] == cid]  # --json: the same shape
    assert len(listed) == 1 and listed[0]["owner_alive"] is True
    assert set(listed[0]) == {
        "kind", "id", "name", "status", "owner_pid", "owner_host", "created", "owner_alive"
    }  # fmt: skip


@pytest.mark.anyio
async def test_clean_prunes_spill_with_the_caps_but_not_open_sandboxes(
    workspace: Path, spill_root: Path
) -> None:
    stale = SpillSession.create(spill_root)
    out = SpillDir(stale.path, "0123456789abcdef").open_file("stdout")
    out.write(b"x" * 3000)
    out.close()
    stale.close(keep=True)
    old = time.time() - 3 * 3600
    for path in [*stale.path.rglob("*"), stale.path]:
        os.utime(path, (old, old), follow_symlinks=False)
    env = {"DOCKER_HOST": NO_ENGINE}  # the spill part only: no engine, no container touched
    limits = Limits(max_output=1024)
    async with Sandbox(workspace, backend="process-group", limits=limits) as sb:
        result = await sb.exec(["seq", "1", "20000"])
        assert result.stdout_spill is not None
        kept = await anyio.to_thread.run_sync(lambda: cli("clean", env=env))
        assert kept.returncode == 0, kept.stderr
        assert kept.stdout.startswith("spill: removed 0 directories (0 B)")  # 3 h < 24 h
        assert "1 in use" in kept.stdout and "(caps: age 24h, total 1g)" in kept.stdout
        bad = await anyio.to_thread.run_sync(lambda: cli("clean", "--older-than", "soon"))
        assert bad.returncode == 125 and "--older-than" in bad.stderr
        pruned = await anyio.to_thread.run_sync(
            lambda: cli("clean", "--older-than", "90m", env=env)
        )
        assert pruned.returncode == 0, pruned.stderr
        assert pruned.stdout.startswith("spill: removed 1 directory (2.9 KiB)")
        assert "1 in use" in pruned.stdout and "age 90m" in pruned.stdout
        assert not stale.path.exists()
        assert Path(result.stdout_spill).exists()  # the open sandbox's files: never
        by_env = await anyio.to_thread.run_sync(
            lambda: cli("clean", env={**env, "SANDBOXRUN_SPILL_MAX_TOTAL": "0"})
        )
        assert "removed 0 directories" in by_env.stdout and "total 0" in by_env.stdout
        assert Path(result.stdout_spill).exists()
