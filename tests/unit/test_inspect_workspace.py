"""sandboxrun.integrations.inspect.workspace: private per-sample workspaces, their removal,
leftovers.

Real files under a private ``tempfile.tempdir`` (no engine: ``cleanup`` without a reachable
engine only removes workspaces)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from sandboxrun.errors import WorkspaceError
from sandboxrun.integrations.inspect import workspace as ws


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_parent_dir_is_private(private_tmp: Path) -> None:
    parent = ws.parent_dir()
    assert parent == private_tmp / f"sandboxrun-inspect-{os.geteuid()}"
    assert parent.stat().st_mode & 0o777 == 0o700
    assert ws.parent_dir() == parent  # again: reused


def test_parent_dir_refuses_a_shared_one(private_tmp: Path) -> None:
    shared = private_tmp / f"sandboxrun-inspect-{os.geteuid()}"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(WorkspaceError, match="not a private directory"):
        ws.parent_dir()
    shared.rmdir()
    shared.symlink_to(private_tmp)
    with pytest.raises(WorkspaceError, match="not a private directory"):
        ws.parent_dir()


def test_create_empty_and_named() -> None:
    path = ws.create()
    assert path.parent == ws.parent_dir() and list(path.iterdir()) == []
    pid, created = ws.parse_name(path.name)
    assert pid == os.getpid() and abs(created - time.time()) < 5


def test_create_copies_a_template(private_tmp: Path) -> None:
    template = private_tmp / "repo"
    (template / "src").mkdir(parents=True)
    (template / "src" / "main.py").write_text("print(1)\n")
    (template / "link").symlink_to("/etc/passwd")
    path = ws.create(template)
    assert (path / "src" / "main.py").read_text() == "print(1)\n"
    assert (path / "link").is_symlink() and os.readlink(path / "link") == "/etc/passwd"
    (path / "src" / "main.py").write_text("changed")
    assert (template / "src" / "main.py").read_text() == "print(1)\n"


def test_create_refuses_a_missing_template(private_tmp: Path) -> None:
    with pytest.raises(WorkspaceError, match="not a directory"):
        ws.create(private_tmp / "missing")
    assert list(ws.parent_dir().iterdir()) == []  # nothing half-made stays


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_create_gives_it_to_the_sandbox_user(private_tmp: Path) -> None:
    template = private_tmp / "repo"
    (template / "d").mkdir(parents=True)
    (template / "d" / "f").write_text("x")
    path = ws.create(template, owner=(4242, 4343))
    for entry in (path, path / "d", path / "d" / "f"):
        assert (entry.stat().st_uid, entry.stat().st_gid) == (4242, 4343)


def test_remove_whatever_the_modes() -> None:
    path = ws.create()
    (path / "locked" / "deeper").mkdir(parents=True)
    (path / "locked" / "deeper" / "f").write_text("x")
    (path / "locked" / "deeper").chmod(0o500)
    (path / "locked").chmod(0)
    ws._make_removable(path)  # what remove falls back to when rmtree is refused (not root)
    assert (path / "locked").stat().st_mode & 0o700 == 0o700
    assert (path / "locked" / "deeper").stat().st_mode & 0o700 == 0o700
    (path / "locked").chmod(0)
    ws.remove(path)
    assert not path.exists()
    ws.remove(path)  # idempotent


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("123-1700000000-abc", (123, 1700000000)),
        ("123-1700000000-a-b", (123, 1700000000)),
        ("123-x-abc", (None, 0)),
        ("notes", (None, 0)),
        ("1-2", (None, 0)),
    ],
)
def test_parse_name(name: str, parsed: tuple[int | None, int]) -> None:
    assert ws.parse_name(name) == parsed


def test_owner_alive() -> None:
    assert ws.owner_alive(os.getpid(), int(time.time()))
    assert not ws.owner_alive(os.getpid(), 1000)  # made before this process: a reused pid
    assert not ws.owner_alive(None, int(time.time()))
    assert not ws.owner_alive(2**22 + 12345, int(time.time()))  # above pid_max


def test_leftovers_and_cleanup_without_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ws, "_docker", lambda: None)
    mine = ws.create()
    parent = ws.parent_dir()
    dead = parent / f"{2**22 + 12345}-{int(time.time())}-old"
    dead.mkdir()
    (parent / "not-ours").mkdir()
    found = {item.path: item.owner_alive for item in ws.leftovers()}
    assert found == {mine: True, dead: False}
    assert ws.cleanup(None) == (0, 1, 1)
    assert mine.exists() and not dead.exists() and (parent / "not-ours").exists()
    assert ws.cleanup(mine.name) == (0, 1, 0)
    assert not mine.exists()
    assert ws.cleanup("no-such-name") == (0, 0, 0)
