"""The local backends' uid rule, its pure part: which paths another uid can resolve (what
bubblewrap as that uid can mount over or bind), by mode bits, ACLs taken as granting."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxrun.backends.owner import closed_above, masks_for, may_search, owner_of, reaches

UID, GID = 1000, 1000


def st(mode: int, uid: int = 0, gid: int = 0, kind: int = stat.S_IFDIR) -> os.stat_result:
    return os.stat_result((kind | mode, 0, 0, 0, uid, gid, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("mode", "uid", "gid", "expected"),
    [
        (0o700, UID, 0, True),  # its own: the owner's bits
        (0o070, UID, GID, False),  # its own, owner bits clear: the group's do not count
        (0o070, 0, GID, True),  # its group's
        (0o707, 0, GID, False),  # its group, group bits clear: the others' do not count
        (0o001, 0, 0, True),  # others may search
        (0o755, 0, 0, True),
        (0o750, 0, 0, False),
        (0o700, 0, 0, False),  # /root
        (0o666, 0, 0, False),  # read, but no search
    ],
)
def test_may_search_picks_one_class_of_bits(mode: int, uid: int, gid: int, expected: bool) -> None:
    assert may_search(st(mode, uid, gid), UID, GID) is expected


def tree(modes: dict[str, os.stat_result]) -> Callable[[str], os.stat_result]:
    def lstat(path: str) -> os.stat_result:
        if path not in modes:
            raise FileNotFoundError(path)
        return modes[path]

    return lstat


def test_reaches_needs_search_on_every_directory_above() -> None:
    open_tree = tree({"/": st(0o755), "/home": st(0o755), "/home/u": st(0o700, UID, GID)})
    assert reaches(Path("/home/u/.ssh"), UID, GID, open_tree, lambda _: False)
    closed = tree({"/": st(0o755), "/root": st(0o700)})
    assert not reaches(Path("/root/.pyenv/bin"), UID, GID, closed, lambda _: False)
    assert not reaches(Path("/root/x"), UID, GID, closed, lambda _: False)
    assert reaches(Path("/root"), UID, GID, closed, lambda _: False)  # (only / is above it)


def test_reaches_is_false_for_a_missing_or_non_directory_parent() -> None:
    assert not reaches(Path("/gone/x"), UID, GID, tree({"/": st(0o755)}), lambda _: False)
    file_parent = tree({"/": st(0o755), "/f": st(0o644, kind=stat.S_IFREG)})
    assert not reaches(Path("/f/x"), UID, GID, file_parent, lambda _: False)
    link_parent = tree({"/": st(0o755), "/l": st(0o777, kind=stat.S_IFLNK)})
    assert not reaches(Path("/l/x"), UID, GID, link_parent, lambda _: False)  # (paths are real)


def test_an_acl_counts_as_granting_search() -> None:
    """An ACL may grant what the bits do not: taken as reachable (masked; a wrong guess fails
    the start loudly), never as out of reach (a secret left unmasked)."""
    closed = tree({"/": st(0o755), "/srv": st(0o700)})
    assert reaches(Path("/srv/x"), UID, GID, closed, lambda p: p == "/srv")
    assert not reaches(Path("/srv/x"), UID, GID, closed, lambda p: False)


def test_owner_of_is_none_unless_root_and_another_uid(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        assert owner_of(tmp_path) is None
        return
    assert owner_of(tmp_path) is None  # root's own workspace
    os.chown(tmp_path, 4242, 4343)
    assert owner_of(tmp_path) == (4242, 4343)
    assert owner_of(tmp_path / "missing") is None


def test_a_secret_the_uid_cannot_resolve_masks_the_closed_directory_above_it() -> None:
    """Never left open on a guess: an unsearchable directory above it (another's 0700 home,
    one with an ACL that may grant it) is masked whole; one of its own is open whatever its
    bits (it can chmod it), and so is what lies above the paths the sandbox binds."""
    modes = {
        "/": st(0o755),
        "/root": st(0o700),
        "/home": st(0o755),
        "/home/other": st(0o700, 2000, 2000),
        "/home/acl": st(0o700, 2000, 2000),
        "/home/u": st(0o700, UID, GID),
        "/home/u/shut": st(0o000, UID, GID),
        "/srv": st(0o700),
        "/srv/ws": st(0o755, UID, GID),
        "/etc": st(0o755),
    }
    secrets = [
        Path("/root/.ssh"),
        Path("/root/.aws"),
        Path("/home/other/.ssh"),
        Path("/home/acl/.ssh"),
        Path("/home/u/.ssh"),
        Path("/home/u/shut/.netrc"),
        Path("/srv/ws/.git-credentials"),
        Path("/etc/shadow"),
    ]
    got = masks_for(secrets, UID, GID, (Path("/srv/ws"),), tree(modes), lambda p: p == "/home/acl")
    assert got == [
        Path("/root"),  # once, for both
        Path("/home/other"),
        Path("/home/acl"),  # an ACL: masked whole, never a mount bwrap could not make
        Path("/home/u/.ssh"),
        Path("/home/u/shut"),  # its own, but shut: bwrap could not resolve what is in it
        Path("/srv/ws/.git-credentials"),  # /srv is closed, but the workspace is bound
        Path("/etc/shadow"),
    ]


def test_closed_above_is_optimistic_about_an_acl_only_when_asked() -> None:
    modes = {"/": st(0o755), "/srv": st(0o700)}
    acl = lambda p: True  # noqa: E731 - / too: never masked whole
    assert closed_above(Path("/srv/x"), UID, GID, tree(modes), acl) == Path("/srv")
    found = closed_above(Path("/srv/x"), UID, GID, tree(modes), acl, optimistic=True)
    assert found is None


def test_a_plan_of_the_owner_takes_a_user_namespace_and_no_cap_drop(tmp_path: Path) -> None:
    from sandboxrun.backends.local.isolation import HostSupport, LocalPlan
    from sandboxrun.models import Policy

    support = HostSupport("/usr/bin/bwrap", None, 7, True)
    ws = tmp_path / "ws"
    ws.mkdir()
    own = LocalPlan(Policy(), ws, (), support, run_as=(UID, GID))
    argv = own.bwrap_argv(["x"])
    assert "--unshare-user" in argv and "--cap-drop" not in argv
    assert not own.as_root
    assert "non-root" in own.layers()
    if os.geteuid() == 0:
        root = LocalPlan(Policy(), ws, (), support)
        assert root.as_root and "non-root" not in root.layers()
        assert "--cap-drop" in root.bwrap_argv(["x"])


def test_a_failed_trial_is_believed_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """A root invoker whose Python the owner cannot run pays the trial once a minute, not at
    every open; a trial that timed out (a busy host) is tried again at once."""
    import subprocess

    from sandboxrun.backends import owner

    calls: list[list[str]] = []

    def failing(argv: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1, b"", b"python3: Permission denied\n")

    monkeypatch.setattr(owner, "FAILS", {})
    monkeypatch.setattr(subprocess, "run", failing)
    first = owner.owner_start(4242, 4242, None, ())
    assert first is not None and "Permission denied" in first
    assert owner.owner_start(4242, 4242, None, ()) == first and len(calls) == 1
    assert owner.owner_start(4343, 4343, None, ()) is not None and len(calls) == 2
    monkeypatch.setattr(owner, "FAIL_TTL_S", 0.0)
    assert owner.owner_start(4242, 4242, None, ()) == first and len(calls) == 3

    def timing_out(argv: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        calls.append(argv)
        raise subprocess.TimeoutExpired(argv, 10)

    def refused(argv: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        calls.append(argv)
        raise PermissionError(13, "Permission denied", argv[0])

    monkeypatch.setattr(owner, "FAIL_TTL_S", 60.0)
    monkeypatch.setattr(subprocess, "run", refused)  # exec refused: believed too
    assert "Permission denied" in (owner.owner_start(4545, 4545, None, ()) or "")
    assert "Permission denied" in (owner.owner_start(4545, 4545, None, ()) or "")
    assert len(calls) == 4
    monkeypatch.setattr(subprocess, "run", timing_out)
    assert "cannot start it" in (owner.owner_start(4444, 4444, None, ()) or "")
    assert "cannot start it" in (owner.owner_start(4444, 4444, None, ()) or "")
    assert len(calls) == 6
