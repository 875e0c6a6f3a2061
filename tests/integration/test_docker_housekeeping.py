"""`sandboxrun ps` / `sandboxrun clean` against the real engine."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from helpers import kill_watchdog, require_backend, wait_until

from sandboxrun.backends.docker.config import BASE_IMAGE

CLI = [sys.executable, "-m", "sandboxrun"]


@pytest.fixture
def client() -> Iterator[docker.DockerClient]:
    require_backend("docker")
    c = docker.from_env()
    yield c
    c.close()


def managed_ids(client: docker.DockerClient, owner: int | None = None) -> set[str]:
    found = client.containers.list(
        all=True, ignore_removed=True, filters={"label": "sandboxrun.managed=true"}
    )
    return {
        str(c.id)
        for c in found
        if owner is None or c.labels.get("sandboxrun.owner_pid") == str(owner)
    }


def test_clean_removes_the_container_of_a_killed_owner_only(
    client: docker.DockerClient, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a supervised container removes itself when its owner dies: `clean` is for the others
    monkeypatch.setenv("SANDBOXRUN_DOCKER_SUPERVISOR", "0")
    code = textwrap.dedent(
        f"""
        import anyio
        from sandboxrun import Sandbox
        async def main():
            async with Sandbox({str(workspace)!r}, backend="docker") as sb:
                print("open", flush=True)
                await anyio.sleep(300)
        anyio.run(main)
        """
    )
    stranger = client.containers.create(BASE_IMAGE, ["sleep", "infinity"])  # not ours: no label
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "open"
        ours = managed_ids(client, owner.pid)
        assert len(ours) == 1
        rows = json.loads(subprocess.run([*CLI, "ps", "--json"], capture_output=True, text=True,
                                         check=True).stdout)  # fmt: skip
        assert [r["owner_alive"] for r in rows if r["id"] in ours] == [True]
        subprocess.run([*CLI, "clean"], capture_output=True, text=True, check=True)
        assert managed_ids(client, owner.pid) == ours  # a live owner's container stays
        kill_watchdog(owner.pid)  # killed with its owner: the container stays for `clean`
        owner.kill()
        owner.wait()
        rows = json.loads(subprocess.run([*CLI, "ps", "--json"], capture_output=True, text=True,
                                         check=True).stdout)  # fmt: skip
        assert [r["owner_alive"] for r in rows if r["id"] in ours] == [False]
        done = subprocess.run([*CLI, "clean"], capture_output=True, text=True, check=True)
        assert "removed" in done.stdout
        assert wait_until(lambda: not managed_ids(client, owner.pid), 10)
        stranger.reload()  # still there: never touched
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
        stranger.remove(force=True)
        for cid in managed_ids(client, owner.pid):
            client.api.remove_container(cid, force=True)


def test_clean_counts_a_container_that_removed_itself_meanwhile(
    client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead owner's supervised container removes itself: it may be gone between `clean`'s
    listing and its removal. That is no failure (exit 0, counted), and the rows after it are
    still removed; the engine really answers "no such container" here."""
    from typer.testing import CliRunner

    from sandboxrun.backends import housekeeping
    from sandboxrun.cli.app import app

    gone = client.containers.create(BASE_IMAGE, ["true"])
    gone.remove(force=True)  # a real id the engine no longer has
    doomed = client.containers.create(BASE_IMAGE, ["sleep", "infinity"])  # not labelled: ours
    rows = [
        housekeeping.Managed(str(gone.id), "gone", "exited", None, "", 0, False),
        housekeeping.Managed(str(doomed.id), "doomed", "created", None, "", 0, False),
    ]
    monkeypatch.setattr(housekeeping, "list_managed", lambda _client: rows)  # these two only
    try:
        done = CliRunner().invoke(app, ["clean", "--spill-dir", str(tmp_path)])
        assert done.exit_code == 0, done.output
        assert "removed 2 container(s)" in done.output
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(str(doomed.id))  # the row after the vanished one went too
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            doomed.remove(force=True)
