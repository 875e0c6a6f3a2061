"""The pure parts of handing a pooled sandbox on in place (``sandboxrun.api.pool_reset``):
which mounts are listed, what taints a sandbox, and the workspace's restore on the host."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxrun.api import pool_reset
from sandboxrun.models import Denial, ExecResult

MOUNTS = """overlay / overlay ro,relatime,lowerdir=/a:/b 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /dev tmpfs rw,nosuid,size=65536k,mode=755 0 0
devpts /dev/pts devpts rw,nosuid,noexec,relatime,gid=5,mode=620,ptmxmode=666 0 0
sysfs /sys sysfs ro,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs rw,nosuid,nodev,noexec,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/pids cgroup ro,nosuid,nodev,noexec,relatime,pids 0 0
mqueue /dev/mqueue mqueue rw,nosuid,nodev,noexec,relatime 0 0
shm /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k 0 0
/dev/vda /workspace ext4 rw,relatime 0 0
tmpfs /workspace/secret tmpfs ro,relatime 0 0
tmpfs /workspace/deep/rw tmpfs rw,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid,nodev,noexec,relatime,size=262144k 0 0
/dev/vda /run/sandboxrun ext4 ro,relatime 0 0
tmpfs /var/tmp tmpfs rw,nosuid,nodev,relatime,size=262144k 0 0
tmpfs /home/sandbox tmpfs rw,nosuid,nodev,noexec,relatime,size=262144k 0 0
/dev/vdb /data ext4 rw,relatime 0 0
/dev/vdb /with\\040space ext4 rw,relatime 0 0
proc /proc/sys proc ro,nosuid,nodev,noexec,relatime 0 0
tmpfs /proc/keys tmpfs rw,nosuid,size=65536k,mode=755 0 0
tmpfs /dev tmpfs rw,nosuid 0 0
short line
"""

SCRATCH = ("/tmp", "/var/tmp", "/home/sandbox", "/dev/shm", "/dev/mqueue")


def test_listed_mounts_are_the_writable_ones_a_command_could_leave_something_in() -> None:
    listed = pool_reset.listed_mounts(MOUNTS, skip=["/workspace", *SCRATCH, "/data"])
    # not: the read-only root, proc/sysfs/devpts/cgroup (the kernel's), the workspace and
    # what is under it, the scratch directories (emptied, listed apart), a host rw mount
    assert listed == ["/dev", "/sys/fs/cgroup", "/with space", "/proc/keys"]


def test_a_skipped_path_is_a_whole_component() -> None:
    table = "tmpfs /tmpx tmpfs rw 0 0\ntmpfs /tmp/y tmpfs rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n"
    assert pool_reset.listed_mounts(table, skip=["/tmp"]) == ["/tmpx"]
    assert pool_reset.listed_mounts(table, skip=["/tmp/"]) == ["/tmpx"]


@pytest.mark.parametrize(
    ("field", "path"),
    [
        ("/a\\040b", "/a b"),
        ("/tab\\011x", "/tab\tx"),
        ("/nl\\012", "/nl\n"),
        ("/back\\134slash", "/back\\slash"),
        ("/not\\08", "/not\\08"),  # (not three octal digits: as it is)
        ("/end\\", "/end\\"),
        ("/plain", "/plain"),
    ],
)
def test_unescape_mount(field: str, path: str) -> None:
    assert pool_reset.unescape_mount(field) == path


@given(st.text(alphabet=st.sampled_from("ab /\\\t\n0123"), max_size=20))
def test_unescape_inverts_the_kernels_escape(path: str) -> None:
    escaped = "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)
    assert pool_reset.unescape_mount(escaped) == path


def result(**fields: object) -> ExecResult:
    base: dict[str, object] = {
        "status": "completed",
        "exit_code": 0,
        "stdout": "",
        "stderr": "",
        "duration_s": 0.1,
        "backend": "docker",
        "argv": ["true"],
        "run_id": "r",
    }
    return ExecResult.model_validate({**base, **fields})


@pytest.mark.parametrize(
    ("fields", "taint"),
    [
        ({}, None),
        ({"status": "failed", "exit_code": 1}, None),
        ({"status": "timed_out", "exit_code": None}, "a command of it ended timed_out"),
        ({"status": "cancelled", "exit_code": None}, "a command of it ended cancelled"),
        ({"status": "oom_killed", "exit_code": None}, "a command of it ended oom_killed"),
        ({"status": "sandbox_error", "exit_code": None}, "a command of it ended sandbox_error"),
        ({"status": "spawn_error", "exit_code": 127}, "a command of it ended spawn_error"),
        ({"survivors": 2}, "a command of it left 2 survivors"),
        (
            {
                "status": "failed",
                "exit_code": 1,
                "denial": Denial(kind="network", evidence="x", message="m"),
            },
            "a command of it was denied (network)",
        ),
    ],
)
def test_what_taints_a_sandbox(fields: dict[str, object], taint: str | None) -> None:
    assert pool_reset.taint_of(result(**fields)) == taint


def test_a_listing_counts_only_when_whole_and_complete() -> None:
    good = "scratch /tmp d 1777 0 0\nmounts\nproc /proc proc rw 0 0\n"
    listing = pool_reset._listing_of
    assert listing(result(stdout=good)) == good
    assert listing(result(stdout=good, stdout_truncated=True)) is None
    assert listing(result(stdout=good, stdout_dropped_bytes=5)) is None
    assert listing(result(stdout=good, survivors=1)) is None
    assert listing(result(stdout=good, status="failed", exit_code=1)) is None
    assert listing(result(stdout="scratch /tmp d 1777 0 0\n")) is None  # cut before the table


def test_the_listing_command_carries_its_paths_as_arguments() -> None:
    argv = pool_reset.listing_argv(["/tmp", "/home/sandbox"], ["/dev", "/x y", "/*"])
    assert argv[:2] == ["/bin/sh", "-c"] and argv[2] == pool_reset.LISTING
    assert argv[3:] == ["sandboxrun-reset", "/tmp /home/sandbox", "/dev", "/x y", "/*"]


@pytest.mark.parametrize("bad", ["/x y", "/*", "tmp", "/a\nb", "/$(id)", ""])
def test_a_scratch_path_the_listing_would_split_or_expand_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="plain absolute path"):
        pool_reset.listing_argv(["/tmp", bad], [])


def copy_of(template: Path) -> Callable[[Path], None]:
    def fill(root: Path) -> None:
        shutil.copytree(template, root, symlinks=True, dirs_exist_ok=True)

    return fill


def test_restore_empties_the_workspace_without_following_what_a_command_planted(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template"
    (template / "src").mkdir(parents=True)
    (template / "src" / "task.txt").write_text("task\n")
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("mine\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "src").mkdir()
    (ws / "src" / "task.txt").write_text("changed\n")
    (ws / "planted").write_text("x\n")
    (ws / "link").symlink_to(outside)  # a symlink to a directory: removed, never followed
    (ws / "src" / "deep").symlink_to(outside / "keep")
    locked = ws / "locked" / "inner"
    locked.mkdir(parents=True)
    (locked / "f").write_text("x\n")
    os.chmod(locked, 0o000)
    os.chmod(ws / "locked", 0o000)
    os.chmod(ws, 0o500)
    pool_reset.restore_workspace(ws, copy_of(template))
    assert sorted(p.name for p in ws.iterdir()) == ["src"]
    assert [p.name for p in (ws / "src").iterdir()] == ["task.txt"]
    assert (ws / "src" / "task.txt").read_text() == "task\n"
    assert (outside / "keep" / "file").read_text() == "mine\n"
    assert ws.stat().st_mode & 0o777 == template.stat().st_mode & 0o777


def test_restore_removes_the_roots_own_xattrs_and_dates(tmp_path: Path) -> None:
    """A holder's ``user.*`` attribute or default ACL on the workspace root (every later file
    would inherit the ACL) and its dates are not handed on."""
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        os.setxattr(ws, "user.leak", b"from-A")
    except OSError as exc:
        pytest.skip(f"no user xattrs on this file system: {exc}")
    os.utime(ws, (981173106, 981173106))

    def refill(root: Path) -> None:
        (root / "f").write_text("x\n")

    pool_reset.restore_workspace(ws, refill)
    assert "user.leak" not in os.listxattr(ws)
    assert ws.stat().st_mtime > 981173106 + 10**8
    assert (ws / "f").read_text() == "x\n"


def test_a_local_pool_refuses_a_reset_that_is_not_a_bool() -> None:
    from sandboxrun import ConfigError, SandboxPool

    with pytest.raises(ConfigError, match="reset must be True or False"):
        SandboxPool(1, reset="yes")  # type: ignore[arg-type]


LOCKED_TREE = """
import os, sys
from pathlib import Path
from sandboxrun.api import pool_reset
root = Path(sys.argv[1])
ws = root / "ws"
(ws / "a" / "b" / "c").mkdir(parents=True)
(ws / "a" / "b" / "c" / "f").write_text("x")
(ws / "a" / "g").write_text("x")
(ws / "top").mkdir()
(ws / "top" / "h").write_text("x")
for d in (ws / "a" / "b" / "c", ws / "a" / "b", ws / "a", ws / "top"):
    os.chmod(d, 0o000)  # unreadable and unsearchable, innermost first
os.chmod(ws, 0o500)
template = root / "template"
(template / "src").mkdir(parents=True)
(template / "src" / "task.txt").write_text("task")
pool_reset.restore_workspace(ws, lambda d: (d / "src").mkdir() or (d / "src" / "t").write_text("t"))
print(sorted(p.name for p in ws.iterdir()))
gone = root / "gone"
(gone / "x" / "y").mkdir(parents=True)
os.chmod(gone / "x" / "y", 0o000)
os.chmod(gone / "x", 0o000)
os.chmod(gone, 0o000)
pool_reset.remove_tree(gone)
print(gone.exists())
"""


def test_directories_a_command_made_unreadable_are_removed_by_a_non_root_owner() -> None:
    """``chmod 000`` on nested directories (what any pooled command may do to its workspace):
    rmtree cannot open them, and its error hook was handed ``os.open`` (a TypeError that
    crashed the pool). Run as a uid without root's override of modes (65534 when the tests
    run as root), ``restore_workspace`` and ``remove_tree`` remove every one."""
    import sys
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="sbr-locked-"))
    try:
        base.chmod(0o755)
        argv = [sys.executable, "-c", LOCKED_TREE, str(base / "t")]
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("setpriv is needed to run as another uid")
            (base / "t").mkdir()
            os.chown(base / "t", 65534, 65534)
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split("\n")[:2] == ["['src']", "False"], proc.stdout
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)
