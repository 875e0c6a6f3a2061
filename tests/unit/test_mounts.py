"""``--mount SRC:DST[:ro|rw]``: parsing, and what may be mounted (``engine.mounts``), with real
paths under a temporary directory (the checks resolve and stat them)."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxrun.backends.docker import config as cfg
from sandboxrun.backends.local.isolation import LocalPlan, check_local_target, probe_host
from sandboxrun.backends.secrets import door_sockets
from sandboxrun.engine.mounts import checked, masked_inside
from sandboxrun.errors import ConfigError
from sandboxrun.models import Limits, Mount, Policy

WS = "/workspace"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "f.txt").write_text("x")
    (tmp_path / "ws").mkdir()
    return tmp_path


@pytest.fixture
def door(tree: Path) -> Iterator[Path]:
    """A listening unix socket standing in for an engine's."""
    path = tree / "engine" / "docker.sock"
    path.parent.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    yield path
    sock.close()


def check(tree: Path, *specs: str, sockets: tuple[Path, ...] = ()) -> tuple[Mount, ...]:
    return checked(
        [Mount.parse(s) for s in specs], workspace=tree / "ws", inside=WS, sockets=sockets
    )


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("/a:/b", ("/a", "/b", True)),
        ("/a:/b:ro", ("/a", "/b", True)),
        ("/a:/b:rw", ("/a", "/b", False)),
        ("/a:b:/c", ("/a:b", "/c", True)),  # a source may hold ':'
        ("/a:b:/c:rw", ("/a:b", "/c", False)),
        ("/a:ro", ("/a", "ro", True)),  # no target: 'ro' is one (then refused as relative)
    ],
)
def test_parse(spec: str, want: tuple[str, str, bool]) -> None:
    got = Mount.parse(spec)
    assert (got.source, got.target, got.read_only) == want


@pytest.mark.parametrize("spec", ["", "/a", ":/b", "/a:", "/a:rw:"])
def test_parse_refuses(spec: str) -> None:
    with pytest.raises(ConfigError, match="expected SRC:DST"):
        Mount.parse(spec)


def test_policy_takes_strings_and_models() -> None:
    policy = Policy(mounts=("/a:/b:rw", Mount(source="/c", target="/d")))
    assert policy.mounts == (
        Mount(source="/a", target="/b", read_only=False),
        Mount(source="/c", target="/d"),
    )
    assert Policy().mounts == ()


def test_sources_are_resolved(tree: Path) -> None:
    (tree / "link").symlink_to(tree / "data")
    (got,) = check(tree, f"{tree}/link:/data")
    assert got == Mount(source=str(tree / "data"), target="/data")
    (got,) = check(tree, f"{tree}/data/f.txt:/opt/f.txt:rw")
    assert (got.source, got.read_only) == (str(tree / "data" / "f.txt"), False)
    assert check(tree, f"{tree}/data:/data/") == (Mount(source=str(tree / "data"), target="/data"),)


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("rel/dir", "must be an absolute path"),
        ("/a/../b", "normal path"),
        ("/a/./b", "normal path"),
        ("/a//b", "normal path"),
        ("/", "cannot be /"),
        ("/proc", "/proc is the sandbox's own"),
        ("/proc/self", "/proc is the sandbox's own"),
        ("/sys/x", "/sys is the sandbox's own"),
        ("/dev/shm/x", "/dev is the sandbox's own"),
        ("/run/sandboxrun", "/run is the sandbox's own"),
        ("/workspace", "around the workspace (/workspace)"),
        ("/workspace/x", "around the workspace"),
        ("/workspaces", None),  # only the workspace itself and what is in or around it
        ("//proc", "normal path"),  # POSIX keeps a leading '//': it must not pass for '/proc'
        ("//workspace", "normal path"),
        ("/run", "/run is the sandbox's own"),
        ("/var/run/sandboxrun", "/var/run is the sandbox's own"),  # an image's /var/run -> /run
        ("/var/lock/x", "/var/lock is the sandbox's own"),
        ("/etc", "/etc is the sandbox's own"),
        ("/etc/app.conf", "/etc is the sandbox's own"),
        ("/tmp", "/tmp is the sandbox's own private directory"),
        ("/var/tmp", "/var/tmp is the sandbox's own private directory"),
        ("/var", "/var/tmp is the sandbox's own private directory"),  # it holds one
        ("/home/sandbox", "/home/sandbox is the sandbox's own"),
        ("/home", "/home/sandbox is the sandbox's own"),
        ("/tmp/sandboxrun-home", "/tmp/sandboxrun-home is the sandbox's own"),
        ("/tmp/data", None),  # in them is fine
        ("/home/sandbox/.cache/pip", None),
    ],
)
def test_targets(tree: Path, target: str, words: str | None) -> None:
    if words is None:
        assert check(tree, f"{tree}/data:{target}")[0].target == target
        return
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")) as err:
        check(tree, f"{tree}/data:{target}")
    assert "\n" not in str(err.value) and str(err.value).startswith("invalid --mount '")


def test_targets_at_the_workspace_host_path_and_duplicates(tree: Path) -> None:
    for target in (f"{tree}/ws", f"{tree}/ws/in", str(tree)):
        with pytest.raises(ConfigError, match="around the workspace"):
            check(tree, f"{tree}/data:{target}")
    for second in ("/d/", "/d/in"):
        with pytest.raises(ConfigError, match="another mount is at /d; mounts may not be at, in"):
            check(tree, f"{tree}/data:/d", f"{tree}/data/sub:{second}")
    assert len(check(tree, f"{tree}/data:/d", f"{tree}/data/sub:/x")) == 2  # beside: fine
    with pytest.raises(ConfigError, match="another mount is at /d/in"):  # around it, too
        check(tree, f"{tree}/data:/d/in", f"{tree}/data/sub:/d")


def test_sources_refused(tree: Path, door: Path) -> None:
    (tree / "to-door").symlink_to(door)
    os.mkfifo(tree / "fifo")
    cases = {
        f"{tree}/missing": "No such file or directory",
        str(door): "is a socket (a daemon's door)",
        f"{tree}/to-door": f"{door} is a socket",  # a symlink is where it leads
        str(door.parent): f"holds {door}, which no sandbox may reach",
        str(tree): f"holds {door}",
        str(tree / "fifo"): "not a directory or a regular file",
        "/proc": "exposes /proc",
        "/proc/1": "exposes /proc",
        "/sys/kernel": "exposes /sys",
        "/dev": "exposes /dev",
        "/run": "exposes /run",
        "/": "exposes /proc",  # / holds them all
    }
    for source, words in cases.items():
        with pytest.raises(ConfigError, match=re.escape(words)) as err:
            check(tree, f"{source}:/x", sockets=(door,))
        assert "\n" not in str(err.value), source


def test_door_sockets_name_the_engines_and_agents() -> None:
    env = {
        "DOCKER_HOST": "unix:///srv/d.sock",
        "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
        "XDG_RUNTIME_DIR": "/run/user/7",
    }
    found = set(map(str, door_sockets(env)))
    assert {"/var/run/docker.sock", "/srv/d.sock", "/tmp/ssh-x/agent.1"} <= found
    assert "/run/user/7/docker.sock" in found and "/run/user/7/podman/podman.sock" in found
    assert "/var/run/docker.sock" in set(map(str, door_sockets({})))


def test_masked_inside_maps_secrets_under_a_source(tree: Path) -> None:
    home = tree / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".netrc").write_text("x")
    mount = Mount(source=str(home), target="/h")
    secrets = [home / ".ssh", home / ".netrc", home / ".aws", tree / "elsewhere", home]
    assert masked_inside(mount, secrets) == [
        (home / ".ssh", "/h/.ssh"),
        (home / ".netrc", "/h/.netrc"),
    ]


def test_docker_host_config_binds_and_masks(tree: Path) -> None:
    home = tree / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "id").write_text("x")
    policy = Policy(
        mounts=(
            Mount(source=str(home), target="/h"),
            Mount(source=str(tree / "data"), target="/d", read_only=False),
        )
    )
    config = cfg.host_config(
        workspace=tree / "ws", policy=policy, limits=Limits(), image="i", user="1:1",
        lbls={}, secrets=(home / ".ssh", home / "id"),
    )  # fmt: skip
    mounts = config["host_config"]["mounts"]
    assert cfg.mount("/h", str(home), "bind", True) in mounts
    assert cfg.mount("/d", str(tree / "data"), "bind", False) in mounts
    assert cfg.mount("/h/.ssh", None, "tmpfs", True) in mounts
    assert cfg.mount("/h/id", "/dev/null", "bind", True) in mounts
    assert mounts.index(cfg.mount("/h", str(home), "bind", True)) < mounts.index(
        cfg.mount("/h/.ssh", None, "tmpfs", True)
    )  # the mask over the mount, not under it


def test_local_plan_binds_masks_and_lets_rw_targets_be_written(tree: Path) -> None:
    home = tree / "home"
    (home / ".ssh").mkdir(parents=True)
    policy = Policy(
        mounts=(
            Mount(source=str(home), target="/tmp/h"),
            Mount(source=str(tree / "data"), target="/tmp/d", read_only=False),
        )
    )
    support = probe_host()
    if support.bwrap is None:
        pytest.skip(f"no bubblewrap: {support.bwrap_reason}")
    plan = LocalPlan(policy=policy, workspace=tree / "ws", homes=(home,), support=support)
    argv = plan.bwrap_argv(["true"])
    joined = " ".join(argv)
    assert f"--ro-bind {home} /tmp/h" in joined and f"--bind {tree}/data /tmp/d" in joined
    assert "--tmpfs /tmp/h/.ssh --remount-ro /tmp/h/.ssh" in joined
    assert joined.index(f"--ro-bind {home} /tmp/h") < joined.index("--tmpfs /tmp/h/.ssh")
    assert "/tmp/d" in plan.writable_dirs() and "/tmp/h" not in plan.writable_dirs()


def test_local_targets(tree: Path) -> None:
    check_local_target("/tmp/anything/new", True)  # made in the private /tmp
    check_local_target("/var/tmp/x", False)
    check_local_target(str(tree / "data"), True)  # in /tmp too (pytest's)
    check_local_target("/usr", True)  # exists here as a directory
    check_local_target("/etc/passwd", False)  # and as a file
    for target, directory in (("/no-such-dir", True), ("/usr", False), ("/etc/passwd", True)):
        with pytest.raises(ConfigError, match="target must be an existing"):
            check_local_target(target, directory)


def test_a_socket_anywhere_in_a_mounted_directory_is_refused(tree: Path) -> None:
    deep = tree / "data" / "sub" / "deeper"
    deep.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(deep / "tmux-default"))  # a read-only mount would not stop connect()
    try:
        with pytest.raises(ConfigError, match=re.escape(f"{deep}/tmux-default is a socket")):
            check(tree, f"{tree}/data:/d")
        assert check(tree, f"{tree}/data/f.txt:/f")  # a file beside it is fine
    finally:
        sock.close()


def test_a_tree_too_large_to_search_is_refused(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxrun.engine import mounts

    for i in range(30):
        (tree / "data" / f"n{i}").write_text("")
    monkeypatch.setattr(mounts, "MAX_SCANNED", 10)
    with pytest.raises(ConfigError, match="more than 10 entries, too many to search"):
        check(tree, f"{tree}/data:/d")


def test_a_secret_or_masked_path_is_never_a_source(tree: Path) -> None:
    home = tree / "home"
    (home / ".ssh").mkdir(parents=True)
    (tree / "keys-link").symlink_to(home / ".ssh")
    for source in (home / ".ssh", tree / "keys-link", home / ".ssh"):
        with pytest.raises(ConfigError, match=re.escape(f"is a secret path ({home}/.ssh)")):
            checked([Mount.parse(f"{source}:/k")], workspace=tree / "ws", inside=WS,
                    secrets=[home / ".ssh"])  # fmt: skip
    assert checked([Mount.parse(f"{home}:/h")], workspace=tree / "ws", inside=WS,
                   secrets=[home / ".ssh"])  # holding one is fine: it is masked  # fmt: skip


def test_a_directory_that_cannot_be_searched_is_refused(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 0311 directory (enterable, not listable) could hide a socket reachable by name. Root
    lists every directory, so the refusal to list is made here the way the kernel says it."""
    shut = tree / "data" / "shut"
    shut.mkdir()
    real_scandir = os.scandir

    def scandir(path: str) -> object:
        if os.fspath(path) == str(shut):
            raise PermissionError(13, "Permission denied", str(shut))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(ConfigError, match=re.escape(f"{shut} cannot be searched for sockets")):
        check(tree, f"{tree}/data:/d")


def test_runtime_dir_is_a_door(tmp_path: Path) -> None:
    env = {"SANDBOXRUN_RUNTIME_DIR": str(tmp_path / "rt")}
    assert tmp_path / "rt" in door_sockets(env)  # refused as a source's content, made or not


def test_mount_points_and_mounts_under() -> None:
    info = (
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
        "30 22 0:25 / /srv/data/sub rw - tmpfs tmpfs rw\n"
        "31 22 0:26 / /srv/data\\040x rw - tmpfs tmpfs rw\n"
        "32 22 0:27 / /srv/database rw - tmpfs tmpfs rw\n"
    )
    points = cfg.mount_points(info)
    assert points == ["/", "/srv/data/sub", "/srv/data x", "/srv/database"]
    assert cfg.mounts_under("/srv/data", points) == ["/srv/data/sub"]
    assert cfg.mounts_under("/srv/data/", points) == ["/srv/data/sub"]
    assert cfg.mounts_under("/srv/data/sub", points) == []


def test_local_targets_never_replace_what_runs_the_sandbox() -> None:
    import sys

    from sandboxrun import supervisor

    for target in (supervisor.PACKAGE_ROOT, os.path.realpath(sys.prefix)):
        with pytest.raises(ConfigError, match="runs the sandbox"):
            check_local_target(os.path.realpath(target), True)


def test_one_source_at_two_targets_gets_an_fd_each(tree: Path) -> None:
    """bwrap closes each fd it binds: a source mounted twice needs two (the second bind saw
    a closed fd, and the first fd leaked)."""
    support = probe_host()
    if support.bwrap is None:
        pytest.skip(f"no bubblewrap: {support.bwrap_reason}")
    data = str(tree / "data")
    policy = Policy(
        mounts=(Mount(source=data, target="/tmp/a"), Mount(source=data, target="/tmp/b"))
    )
    plan = LocalPlan(policy=policy, workspace=tree / "ws", homes=(), support=support)
    before = len(os.listdir("/proc/self/fd"))
    pinned = plan.pin_mounts()
    try:
        assert sorted(pinned) == ["/tmp/a", "/tmp/b"] and len(set(pinned.values())) == 2
        argv = plan.bwrap_argv(["true"], pinned)
        assert f"--ro-bind-fd {pinned['/tmp/a']} /tmp/a" in " ".join(argv)
        assert f"--ro-bind-fd {pinned['/tmp/b']} /tmp/b" in " ".join(argv)
    finally:
        for fd in pinned.values():
            os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_swapped_source_is_refused_by_pin_mounts_and_leaks_no_fd(tree: Path, door: Path) -> None:
    support = probe_host()
    if support.bwrap is None:
        pytest.skip(f"no bubblewrap: {support.bwrap_reason}")
    src = tree / "src"
    src.mkdir()
    (got,) = check(tree, f"{src}:/tmp/m")
    plan = LocalPlan(policy=Policy(mounts=(got,)), workspace=tree / "ws", homes=(), support=support)
    src.rmdir()
    src.symlink_to(door.parent)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ConfigError, match="its source changed since it was checked"):
        plan.pin_mounts()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_local_target_through_a_symlink_is_refused(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An existing host target reached through a symlink (``/var/run/lock`` -> ``/run/lock``)
    would be mounted where the link leads: named for what it is, refused. (pytest's tmp_path
    is in /tmp, private inside a local sandbox and so never checked: the rule is checked with
    that exception turned off.)"""
    from sandboxrun.backends.local import isolation

    (tree / "real").mkdir()
    (tree / "link").symlink_to(tree / "real")
    monkeypatch.setattr(isolation, "MOUNTABLE_TMP", ())
    with pytest.raises(ConfigError, match="leads through a symlink here"):
        check_local_target(str(tree / "link"), True)
    check_local_target(str(tree / "real"), True)
