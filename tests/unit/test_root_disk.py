"""A writable root and its bound, the pure parts: the guarantees asked for, the container
config (a writable layer, a package manager's capabilities for uid 0 only, the engine's size),
the layer's size as ``du`` counts it, the watch (once, then over), and how the result reads
(status, denial, CLI exit status and line). The engine side: tests/integration/
test_writable_root.py."""

from __future__ import annotations

import os
import threading
import time
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
    with pytest.raises(OSError):
        disk.layer_bytes(str(tmp_path / "missing"))


def test_the_watch_fires_once_past_the_bound_and_ends(tmp_path: Path) -> None:
    calls: list[int] = []
    fired = threading.Event()

    def exceeded(held: int) -> None:
        calls.append(held)
        fired.set()

    watch = disk.LayerWatch(str(tmp_path), 2 * MiB, exceeded)
    (tmp_path / "small").write_bytes(b"x" * MiB)
    time.sleep(0.3)
    assert not calls
    (tmp_path / "big").write_bytes(b"x" * (2 * MiB))
    assert fired.wait(5)
    time.sleep(0.2)
    watch.stop()
    assert len(calls) == 1 and calls[0] > 2 * MiB


def test_a_stopped_watch_never_fires(tmp_path: Path) -> None:
    calls: list[int] = []
    watch = disk.LayerWatch(str(tmp_path), MiB, calls.append)
    watch.stop()
    (tmp_path / "big").write_bytes(b"x" * (2 * MiB))
    time.sleep(0.2)
    assert not calls


def test_a_watch_of_a_layer_that_went_ends_quietly(tmp_path: Path) -> None:
    layer = tmp_path / "diff"
    layer.mkdir()
    calls: list[int] = []
    watch = disk.LayerWatch(str(layer), MiB, calls.append)
    layer.rmdir()
    time.sleep(0.2)
    assert not watch._thread.is_alive() and not calls
    with pytest.raises(OSError):
        disk.LayerWatch(str(layer), MiB, calls.append)  # unreadable at the start: refused


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
