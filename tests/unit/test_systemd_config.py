"""Pure logic of the systemd-scope backend: names, properties, argv, and parsing."""

from __future__ import annotations

import os

import pytest

from sandboxrun.backends.systemd import config as cfg
from sandboxrun.backends.systemd.scope import cgroup_populated
from sandboxrun.models import Limits
from sandboxrun.supervisor import launchwire
from sandboxrun.supervisor import procfs as proctree

HYBRID = """12:perf_event:/
9:name=systemd:/docker/abc/system.slice/sandboxrun-r1.scope
8:pids:/docker/abc/system.slice/sandboxrun-r1.scope
4:memory:/docker/abc/system.slice/sandboxrun-r1.scope
2:cpuacct:/docker/abc
1:cpu:/docker/abc/system.slice/sandboxrun-r1.scope
0::/docker/abc/system.slice/sandboxrun-r1.scope
"""
PURE_V2 = "0::/system.slice/sandboxrun-r1.scope\n"


@pytest.mark.parametrize("run_id", ["abc", "0123456789abcdef", "probe-1-2", "A_b"])
def test_unit_name_of_plain_ids(run_id: str) -> None:
    name = cfg.unit_name(run_id)
    assert name == f"sandboxrun-{run_id}.scope"
    assert cfg.is_our_unit(name)


@pytest.mark.parametrize("run_id", ["", "a b", "a/b", "x.scope", "$x", "a\n", "é", "a" * 65])
def test_unit_name_refuses_anything_else(run_id: str) -> None:
    with pytest.raises(ValueError, match="unit name"):
        cfg.unit_name(run_id)


@pytest.mark.parametrize(
    ("name", "ours"),
    [("sandboxrun-x.scope", True), ("sandboxrun-x.service", False), ("run-x.scope", False)],
)
def test_is_our_unit(name: str, ours: bool) -> None:
    assert cfg.is_our_unit(name) is ours


def test_owner_round_trips_through_the_description() -> None:
    desc = cfg.description("run r1", 4242, 1700000000)
    assert desc == "sandboxrun run r1 owner=4242:1700000000"
    assert cfg.owner_of(desc) == (4242, 1700000000)
    assert cfg.owner_of("something else") is None


def test_properties_without_limits_only_account() -> None:
    props = cfg.properties(Limits(grace_s=0.5))
    assert props == [
        "CPUAccounting=yes",
        "MemoryAccounting=yes",
        "TasksAccounting=yes",
        "TimeoutStopSec=500ms",
    ]


def test_properties_carry_every_limit() -> None:
    props = cfg.properties(Limits(memory_bytes=64 << 20, pids=40, cpus=1.5, grace_s=0))
    assert "TasksMax=41" in props  # the keeper counts too
    assert f"MemoryMax={64 << 20}" in props
    assert "MemorySwapMax=0" in props
    assert "CPUQuota=150%" in props
    assert "TimeoutStopSec=1ms" in props


@pytest.mark.parametrize(("cpus", "percent"), [(0.001, 1), (0.5, 50), (1, 100), (2.345, 235)])
def test_cpu_quota_rounds_up_to_whole_percent(cpus: float, percent: int) -> None:
    assert cfg.cpu_quota_percent(cpus) == percent


@pytest.mark.parametrize("mode", ["system", "user"])
def test_systemd_run_argv_keeps_the_command_after_the_separator(mode: cfg.Mode) -> None:
    command = ["--help", "$VAR", "%n", "a b"]
    argv = cfg.systemd_run_argv(
        "/bin/systemd-run", mode, "sandboxrun-r.scope", "d", Limits(), command
    )
    assert argv[0] == "/bin/systemd-run"
    assert ("--user" in argv) is (mode == "user")
    for flag in (
        "--scope",
        "--quiet",
        "--collect",
        "--no-ask-password",
        "--unit=sandboxrun-r.scope",
    ):
        assert flag in argv
    assert argv[argv.index("--") + 1 :] == command


def test_kill_argv_signals_the_whole_unit() -> None:
    argv = cfg.kill_argv("systemctl", "user", "u.scope", "SIGTERM")
    assert argv == [
        "systemctl", "--user", "--no-ask-password", "kill", "--kill-whom=all", "--signal=SIGTERM",
        "u.scope",
    ]  # fmt: skip


def test_parse_status_splits_messages_and_frames() -> None:
    data = b'Warning: something\n\0{"op": "launched", "cgroup": "0::/x"}\n'
    report = launchwire.parse_status(data)
    assert report == launchwire.StatusReport("Warning: something", True, "0::/x", None)


def test_parse_status_keeper_pid() -> None:
    report = launchwire.parse_status(b'\0{"op": "launched", "cgroup": "c", "keeper": 77}\n')
    assert report.keeper == 77
    for bad in (b"0", b'"77"', b"-1", b"null"):
        frame = b'\0{"op": "launched", "cgroup": "c", "keeper": ' + bad + b"}\n"
        assert launchwire.parse_status(frame).keeper is None


def test_parse_status_spawn_error_and_garbage() -> None:
    data = b'\0{"op": "launched", "cgroup": "c"}\n\0not json\n\0[1]\n'
    data += b'\0{"op": "spawn_error", "errno": 2}\n'
    report = launchwire.parse_status(data)
    assert report.launched
    assert report.spawn_error == {"op": "spawn_error", "errno": 2}


def test_parse_status_of_a_systemd_run_failure() -> None:
    report = launchwire.parse_status(
        b"Failed to start transient scope unit: Unit x already exists.\n"
    )
    assert not report.launched
    assert report.messages.startswith("Failed to start transient scope unit")


def test_cgroup_paths_hybrid_ignores_controllers_outside_the_scope() -> None:
    paths = cfg.cgroup_paths(HYBRID, "sandboxrun-r1.scope", pure_v2=False)
    base = "/docker/abc/system.slice/sandboxrun-r1.scope"
    assert paths.procs == f"/sys/fs/cgroup/systemd{base}/cgroup.procs"
    assert paths.memory == f"/sys/fs/cgroup/memory{base}"
    assert paths.pids == f"/sys/fs/cgroup/pids{base}"
    assert paths.cpu == f"/sys/fs/cgroup/cpu{base}"
    assert paths.cpuacct is None  # left in the container's cgroup: not the scope's figures
    assert paths.unified == f"/sys/fs/cgroup/unified{base}"
    assert not paths.v2


def test_cgroup_paths_pure_v2() -> None:
    paths = cfg.cgroup_paths(PURE_V2, "sandboxrun-r1.scope", "/cg", pure_v2=True)
    assert paths.procs == "/cg/system.slice/sandboxrun-r1.scope/cgroup.procs"
    assert paths.v2 and paths.memory == paths.unified == "/cg/system.slice/sandboxrun-r1.scope"


@pytest.mark.parametrize(
    ("text", "pure"), [("", True), ("", False), ("0::/other.scope\n", True), ("garbage", False)]
)
def test_cgroup_paths_refuse_text_without_the_scope(text: str, pure: bool) -> None:
    with pytest.raises(ValueError, match=r"sandboxrun-r1\.scope"):
        cfg.cgroup_paths(text, "sandboxrun-r1.scope", pure_v2=pure)


@pytest.mark.parametrize(
    ("name", "content", "applied"),
    [
        ("pids-limit", "41\n", True),
        ("pids-limit", "40\n", False),
        ("pids-limit", "max\n", False),
        ("memory-limit", f"{64 << 20}\n", True),
        ("memory-limit", "9223372036854771712\n", False),
        ("memory-limit", "max\n", False),
        ("cpu-limit", "50000\n", True),
        ("cpu-limit", "50000 100000\n", True),
        ("cpu-limit", "-1\n", False),
        ("cpu-limit", "max 100000\n", False),
        ("pids-limit", None, False),
        ("other", "1", False),
    ],
)
def test_limit_applied(name: str, content: str | None, applied: bool) -> None:
    limits = Limits(pids=40, memory_bytes=64 << 20, cpus=0.5)
    assert cfg.limit_applied(name, content, limits) is applied


def test_limit_applied_accepts_page_rounding() -> None:
    limits = Limits(memory_bytes=(64 << 20) + 100)
    assert cfg.limit_applied("memory-limit", str(64 << 20), limits)
    big_pages = Limits(memory_bytes=100_000_000)
    assert not cfg.limit_applied("memory-limit", "99942400", big_pages)
    assert cfg.limit_applied("memory-limit", "99942400", big_pages, page_size=65536)


def test_limit_files_v1_and_v2() -> None:
    v1 = cfg.limit_files(cfg.cgroup_paths(HYBRID, "sandboxrun-r1.scope", pure_v2=False))
    assert v1["memory-limit"] is not None and v1["memory-limit"].endswith("memory.limit_in_bytes")
    assert v1["cpu-limit"] is not None and v1["cpu-limit"].endswith("cpu.cfs_quota_us")
    v2 = cfg.limit_files(cfg.cgroup_paths(PURE_V2, "sandboxrun-r1.scope", pure_v2=True))
    assert v2["memory-limit"] is not None and v2["memory-limit"].endswith("/memory.max")


@pytest.mark.parametrize(
    ("content", "count"),
    [
        ("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", 3),
        ("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n", 1),
        ("oom_kill x\n", None),
        ("", None),
    ],
)
def test_oom_count(content: str, count: int | None) -> None:
    assert proctree.oom_count(content) == count


def test_cpu_usage_v1_and_v2() -> None:
    assert cfg.cpu_usage_s("1500000000\n", v2=False) == 1.5
    assert cfg.cpu_usage_s("usage_usec 250000\nuser_usec 1\n", v2=True) == 0.25
    assert cfg.cpu_usage_s("junk", v2=False) is None
    assert cfg.cpu_usage_s("user_usec 1\n", v2=True) is None


def test_parse_units_and_show() -> None:
    text = "Id=a.scope\nDescription=x=y\nActiveState=active\n\nId=b.scope\nActiveState=inactive\n"
    units = cfg.parse_units(text)
    assert units == [
        {"Id": "a.scope", "Description": "x=y", "ActiveState": "active"},
        {"Id": "b.scope", "ActiveState": "inactive"},
    ]
    assert cfg.parse_units("") == []


@pytest.mark.parametrize(
    ("stdout", "stderr", "reason"),
    [
        (
            "",
            "\nFailed to connect to bus: No medium found\n",
            "Failed to connect to bus: No medium found",
        ),
        ("offline\n", "", "offline"),
        ("", "", "systemctl failed with exit code 1"),
    ],
)
def test_probe_reason_is_the_first_line_said(stdout: str, stderr: str, reason: str) -> None:
    assert cfg.probe_reason(stdout, stderr, 1, "systemctl") == reason


@pytest.mark.parametrize(
    ("events", "populated"),
    [("populated 1\nfrozen 0\n", True), ("populated 0\n", False), (None, None), ("", None)],
)
def test_cgroup_populated(events: str | None, populated: bool | None) -> None:
    assert cgroup_populated(events) is populated


@pytest.mark.parametrize(
    ("argv", "env", "cwd"),
    [
        (["true"], {}, "/"),
        (
            ["sh", "-c", "echo $X", "", "a b", "line\nbreak", "é", "%n"],
            {"X": "=y=", "E": ""},
            "/w d",
        ),
        (["\udcff-raw"], {"K\udcfe": "v\udcfd"}, "/tmp"),
    ],
)
def test_spec_round_trips_through_the_launcher(
    argv: list[str], env: dict[str, str], cwd: str
) -> None:
    from sandboxrun.supervisor.launchwire import decode_spec

    got_cwd, got_argv, got_env = decode_spec(launchwire.encode_spec(argv, env, cwd))
    assert os.fsdecode(got_cwd) == cwd
    assert [os.fsdecode(a) for a in got_argv] == argv
    assert {os.fsdecode(k): os.fsdecode(v) for k, v in got_env.items()} == env


def test_spec_refuses_a_nul() -> None:
    with pytest.raises(ValueError, match="NUL"):
        launchwire.encode_spec(["a\0b"], {}, "/")


@pytest.mark.parametrize(
    "text", ["plain", 'quote " and \\ back', "nl\n\ttab", "é ü", "𝄞 astral", "\udcff lone", ""]
)
def test_launcher_frames_are_json(text: str) -> None:
    import json

    from sandboxrun.supervisor.launchwire import json_text

    assert json.loads(json_text(text)) == text
    assert json_text(text).isascii()


@pytest.mark.parametrize(
    ("ns_pid", "extra", "confine"),
    [
        (
            4242,
            ["user", "net"],
            {
                "drop_caps": True,
                "seccomp": True,
                "landlock": {
                    "dirs": ["/work space", "/tmp", "/dév/ünï"],
                    "files": ["/dev/null", "/dev/tty"],
                    "deny_tcp": False,
                },
            },
        ),
        (None, [], {"drop_caps": True, "seccomp": False, "landlock": None}),
        (
            7,
            ["net"],
            {
                "drop_caps": False,
                "seccomp": True,
                "landlock": {"dirs": [], "files": [], "deny_tcp": True},
            },
        ),
    ],
)
def test_launcher_plan_round_trip(
    ns_pid: int | None, extra: list[str], confine: dict[str, object]
) -> None:
    from sandboxrun.supervisor.launchwire import decode_plan

    plan = decode_plan(launchwire.encode_plan(ns_pid, extra, confine))
    assert plan == {"ns_fd": ns_pid or 0, "ns_extra": extra, "confine": confine}


def test_launcher_plan_refuses_nul() -> None:
    landlock = {"dirs": ["/a\0b"], "files": [], "deny_tcp": False}
    with pytest.raises(ValueError, match="NUL"):
        launchwire.encode_plan(1, [], {"landlock": landlock})
