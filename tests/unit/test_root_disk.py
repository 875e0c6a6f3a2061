"""A writable root and its bound, the pure parts: the guarantees asked for, the container
config (a writable layer, a package manager's capabilities for uid 0 only, the engine's size),
the layer's size as ``du`` counts it, the watch (once, then over), and how the result reads
(status, denial, CLI exit status and line). The engine side: tests/integration/
test_writable_root.py."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxrun.backends.docker import config as cfg
from sandboxrun.backends.docker import disk
from sandboxrun.cli import report
from sandboxrun.cli.options import check_run_limits
from sandboxrun.engine import denial
from sandboxrun.errors import ConfigError
from sandboxrun.models import ExecResult, Limits, Policy, required_guarantees

MiB = 1 << 20


def config(policy: Policy, user: str, quota: int | None = None) -> dict[str, object]:
    made = cfg.host_config(
        workspace=Path("/w"),
        policy=policy,
        limits=Limits(),
        image="i",
        user=user,
        lbls={},
        disk_quota=quota,
    )
    host = made["host_config"]
    assert isinstance(host, dict)
    return host


@pytest.mark.parametrize(
    ("policy", "limits", "wanted", "not_wanted"),
    [
        (Policy(), Limits(), {"read-only-root"}, {"ephemeral-root", "disk-limit"}),
        (Policy(root="writable"), Limits(), {"ephemeral-root", "seccomp"}, {"read-only-root"}),
        (
            Policy(root="writable", access="read-only"),
            Limits(disk_bytes=MiB),
            {"ephemeral-root", "read-only-workspace", "disk-limit"},
            {"read-only-root"},
        ),
        (
            Policy(root="writable", access="danger-full-access"),
            Limits(disk_bytes=MiB),
            {"ephemeral-root", "disk-limit"},
            {"read-only-root", "seccomp"},
        ),
        (
            Policy(access="danger-full-access"),
            Limits(),
            set(),
            {"ephemeral-root", "read-only-root"},
        ),
    ],
)
def test_guarantees_asked_for(
    policy: Policy, limits: Limits, wanted: set[str], not_wanted: set[str]
) -> None:
    asked = set(required_guarantees(policy, limits))
    assert wanted <= asked and not (not_wanted & asked), asked


def test_disk_has_a_floor() -> None:
    with pytest.raises(ValueError, match="greater than or equal"):
        Limits(disk_bytes=MiB - 1)
    with pytest.raises(ConfigError, match="--disk must be at least 1m"):
        check_run_limits(
            timeout=None, max_timeout=None, idle_timeout=None, grace="3s", max_output="64k",
            spill_max="1m", memory=None, cpus=None, pids=None, host_cpus=2, disk="512k",
        )  # fmt: skip


def test_a_bound_without_a_writable_root_is_refused(tmp_path: Path) -> None:
    from sandboxrun import Sandbox

    with pytest.raises(ConfigError, match="--root writable"):
        Sandbox(tmp_path, backend="docker", limits=Limits(disk_bytes=64 * MiB))


@pytest.mark.parametrize(
    ("root", "user", "read_only", "caps"),
    [
        ("read-only", "0:0", True, None),
        ("read-only", "1000:1000", True, None),
        ("writable", "1000:1000", False, None),
        ("writable", "0:0", False, list(cfg.PACKAGE_CAPS)),
    ],
)
def test_container_root_and_capabilities(
    root: str, user: str, read_only: bool, caps: list[str] | None
) -> None:
    host = config(Policy.model_validate({"root": root}), user)
    assert host["read_only"] is read_only
    assert host.get("cap_add") == caps
    assert host["cap_drop"] == ["ALL"]
    assert "no-new-privileges" in host["security_opt"]  # type: ignore[operator]
    assert "storage_opt" not in host


def test_package_caps_are_a_part_of_the_engines_default_set() -> None:
    default = {
        "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
        "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE",
    }  # fmt: skip
    assert set(cfg.PACKAGE_CAPS) < default
    assert not {"SYS_ADMIN", "MKNOD", "NET_RAW", "SYS_PTRACE"} & set(cfg.PACKAGE_CAPS)


def test_engine_size_when_asked() -> None:
    host = config(Policy(root="writable"), "0:0", quota=64 * MiB)
    assert host["storage_opt"] == {"size": str(64 * MiB)}


def test_isolation_names_the_root_and_the_bound() -> None:
    ro = cfg.isolation(Policy(), Limits(), "1000:1000")
    assert "read-only-root" in ro and "ephemeral-root" not in ro and "disk-limit" not in ro
    rw = cfg.isolation(Policy(root="writable"), Limits(), "0:0", disk=True)
    assert "ephemeral-root" in rw and "disk-limit" in rw and "read-only-root" not in rw
    assert "non-root" not in rw


@pytest.mark.parametrize(
    ("said", "refused"),
    [
        ("500 Server Error: --storage-opt is not supported", True),
        ("--storage-opt is supported only for overlay over xfs with 'pquota' mount option", True),
        ("No such image: x", False),
        ("bind source path does not exist: /w", False),
    ],
)
def test_storage_opt_refusal(said: str, refused: bool) -> None:
    assert disk.storage_opt_refused(said) is refused


def test_upper_dir() -> None:
    data = {"GraphDriver": {"Data": {"UpperDir": "/var/lib/docker/x/diff"}, "Name": "overlay2"}}
    assert disk.upper_dir(data) == "/var/lib/docker/x/diff"
    assert disk.upper_dir({"GraphDriver": {"Data": None, "Name": "vfs"}}) is None
    assert disk.upper_dir({"GraphDriver": {"Data": {"UpperDir": "relative"}}}) is None
    assert disk.upper_dir({}) is None


def test_layer_bytes_counts_what_du_counts(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "full").write_bytes(b"x" * (3 * MiB))
    with open(tmp_path / "sparse", "wb") as f:  # 1 GiB that holds nothing
        f.truncate(1 << 30)
    os.symlink("/usr", tmp_path / "link")  # never followed
    os.mkfifo(tmp_path / "fifo")
    held = disk.layer_bytes(str(tmp_path))
    assert 3 * MiB <= held < 3 * MiB + 256 * 1024, held
    with pytest.raises(FileNotFoundError):
        disk.layer_bytes(str(tmp_path / "missing"))


def test_every_entry_counts_at_least_a_block(tmp_path: Path) -> None:
    for i in range(100):  # empty files cost the host inodes: a flood of them is counted
        (tmp_path / str(i)).touch()
    assert disk.layer_bytes(str(tmp_path)) >= 100 * disk.ENTRY_BYTES


def test_a_tree_too_deep_for_a_path_is_still_counted(tmp_path: Path) -> None:
    """Walked by directory fds: a path of 8 KiB (past PATH_MAX) hides nothing."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(40):
            os.mkdir("d" * 200, dir_fd=fd)
            inner = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with os.fdopen(os.open("big", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "wb") as f:
            f.write(b"x" * (2 * MiB))
    finally:
        os.close(fd)
    assert disk.layer_bytes(str(tmp_path)) >= 2 * MiB
    import subprocess

    subprocess.run(["rm", "-rf", str(tmp_path / ("d" * 200))], check=True)


def test_deleted_but_open_files_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "gone"
    with open(path, "wb") as f:
        f.write(b"x" * (2 * MiB))
        f.flush()
        os.fsync(f.fileno())
        path.unlink()
        assert disk.layer_bytes(str(tmp_path)) < MiB  # no name leads to it
        device = tmp_path.stat().st_dev
        assert disk.deleted_open_bytes([os.getpid()], frozenset({device})) >= 2 * MiB
        other = frozenset({device + 1})  # another file system
        assert disk.deleted_open_bytes([os.getpid()], other) == 0
    assert disk.deleted_open_bytes([os.getpid()], frozenset({device})) == 0


def test_engine_files_and_their_size(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_bytes(b"x" * MiB)
    inspected = {"HostsPath": str(hosts), "ResolvConfPath": "", "HostnamePath": None}
    assert disk.engine_files(inspected) == [str(hosts)]
    assert disk.files_bytes([str(hosts), str(tmp_path / "none")]) >= MiB


def watch_of(tmp_path: Path, limit: int, calls: list[tuple[int, str | None]]) -> disk.LayerWatch:
    return disk.LayerWatch(
        lambda: disk.layer_bytes(str(tmp_path)), limit, lambda h, w: calls.append((h, w))
    )


def test_the_watch_fires_once_past_the_bound_and_ends(tmp_path: Path) -> None:
    calls: list[tuple[int, str | None]] = []
    watch = watch_of(tmp_path, 2 * MiB, calls)
    (tmp_path / "small").write_bytes(b"x" * MiB)
    time.sleep(0.3)
    assert not calls
    (tmp_path / "big").write_bytes(b"x" * (2 * MiB))
    assert wait_for(lambda: bool(calls), 5)
    time.sleep(0.2)
    watch.stop()
    assert len(calls) == 1 and calls[0][0] > 2 * MiB and calls[0][1] is None


def test_what_cannot_be_measured_counts_as_past_the_bound() -> None:
    calls: list[tuple[int, str | None]] = []
    state = {"n": 0}

    def measure() -> int:
        state["n"] += 1
        if state["n"] > 1:
            raise disk.Unmeasurable(13, "x: Permission denied")
        return 0

    watch = disk.LayerWatch(measure, MiB, lambda h, w: calls.append((h, w)))
    assert wait_for(lambda: bool(calls), 5)
    watch.stop()
    assert calls == [(MiB + 1, "[Errno 13] x: Permission denied")]


def test_a_stopped_watch_never_fires(tmp_path: Path) -> None:
    calls: list[tuple[int, str | None]] = []
    watch = watch_of(tmp_path, MiB, calls)
    watch.stop()
    (tmp_path / "big").write_bytes(b"x" * (2 * MiB))
    time.sleep(0.2)
    assert not calls


def test_a_watch_of_a_layer_that_went_ends_quietly(tmp_path: Path) -> None:
    layer = tmp_path / "diff"
    layer.mkdir()
    calls: list[tuple[int, str | None]] = []
    watch = watch_of(layer, MiB, calls)
    layer.rmdir()
    assert wait_for(lambda: not watch._thread.is_alive(), 5)
    assert not calls and watch.gone
    with pytest.raises(OSError):
        watch_of(layer, MiB, calls)  # unreadable at the start: refused


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


ERROR = (
    "the sandbox's writable root held 70.2 MiB, past --disk 64m: every process in it was "
    "killed and its files outside the workspace are gone (the next command gets a fresh root)"
)


def over_full() -> ExecResult:
    return ExecResult(
        status="disk_exceeded", duration_s=1.0, backend="docker", argv=["dd"], run_id="r",
        error=ERROR, stdout="partial\n", stdout_total_bytes=8,
    )  # fmt: skip


def test_the_result_reads_as_a_disk_denial() -> None:
    found = denial.diagnose(over_full(), Policy(root="writable"), denial.HostFacts())
    assert found is not None and found.kind == "disk-full"
    assert "--disk" in found.message and found.escalate_to is None
    assert "past --disk 64m" in found.evidence


def test_the_cli_exits_137_and_says_why_once() -> None:
    result = over_full()
    assert report.exit_status(result) == 137
    line = report.summary(result)
    assert line is not None
    assert line.count("past --disk 64m") == 1 and "a larger --disk allows more" in line
