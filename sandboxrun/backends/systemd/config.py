"""Pure logic of the systemd-scope backend: unit names, properties, argv, and parsing of what
systemd and the kernel report (no I/O here; exhaustively unit-tested)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from sandboxrun.models import Limits

Mode = Literal["system", "user"]

UNIT_PREFIX = "sandboxrun-"
UNIT_SUFFIX = ".scope"
KEEPER_TASKS = 1
"""The launcher's keeper lives in the scope too: ``TasksMax`` is the pids limit plus it (plus
the launcher itself where it stays to mirror a command it forked into the sandbox's PID
namespace: ``ours=KEEPER_TASKS + 1``)."""
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_OWNER = re.compile(r"owner=(\d+):(\d+)")


def unit_name(run_id: str) -> str:
    """``sandboxrun-<run id>.scope``; run ids are generated, but are still checked to be plain."""
    if not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r} cannot be part of a unit name")
    return f"{UNIT_PREFIX}{run_id}{UNIT_SUFFIX}"


def is_our_unit(name: str) -> bool:
    return name.startswith(UNIT_PREFIX) and name.endswith(UNIT_SUFFIX)


def description(what: str, owner_pid: int, owner_start: int) -> str:
    """A unit's Description: what it is and who started it (pid and start time), so ``clean``
    can tell the leftovers of a dead sandboxrun from a live one's units."""
    return f"sandboxrun {what} owner={owner_pid}:{owner_start}"


def owner_of(description_text: str) -> tuple[int, int] | None:
    """``(pid, start time)`` of the sandboxrun process that started a unit, from its Description."""
    match = _OWNER.search(description_text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def properties(limits: Limits, ours: int = KEEPER_TASKS) -> list[str]:
    """``-p`` assignments from the limits (accounting is always on, for the result)."""
    props = ["CPUAccounting=yes", "MemoryAccounting=yes", "TasksAccounting=yes"]
    # ``systemctl stop`` (``sandboxrun clean``) then also does TERM, the grace, KILL
    props.append(f"TimeoutStopSec={max(1, round(limits.grace_s * 1000))}ms")
    if limits.pids is not None:
        props.append(f"TasksMax={limits.pids + ours}")
    if limits.memory_bytes is not None:
        props += [f"MemoryMax={limits.memory_bytes}", "MemorySwapMax=0"]
    if limits.cpus is not None:
        props.append(f"CPUQuota={cpu_quota_percent(limits.cpus)}%")
    return props


def cpu_quota_percent(cpus: float) -> int:
    """``CPUQuota=`` in whole percent of one CPU (at least 1%)."""
    return max(1, math.ceil(cpus * 100))


def systemd_run_argv(
    systemd_run: str,
    mode: Mode,
    unit: str,
    desc: str,
    limits: Limits,
    command: list[str],
    ours: int = KEEPER_TASKS,
) -> list[str]:
    argv = [systemd_run]
    if mode == "user":
        argv.append("--user")
    argv += ["--scope", "--quiet", "--collect", "--no-ask-password", f"--unit={unit}"]
    argv.append(f"--description={desc}")
    for prop in properties(limits, ours):
        argv += ["-p", prop]
    return [*argv, "--", *command]


def systemctl_argv(systemctl: str, mode: Mode, *args: str) -> list[str]:
    return [systemctl, *(["--user"] if mode == "user" else []), "--no-ask-password", *args]


def kill_argv(systemctl: str, mode: Mode, unit: str, signal_name: str) -> list[str]:
    return systemctl_argv(
        systemctl, mode, "kill", "--kill-whom=all", f"--signal={signal_name}", unit
    )


@dataclass(frozen=True)
class CgroupPaths:
    """Where one scope lives in the cgroup file system (absolute paths under the mount)."""

    procs: str
    """``cgroup.procs`` listing every process of the scope."""
    memory: str | None = None
    pids: str | None = None
    cpu: str | None = None
    cpuacct: str | None = None
    unified: str | None = None
    """The scope's directory in a v2 hierarchy (pure v2: everything is here)."""
    v2: bool = False


def cgroup_paths(
    proc_cgroup: str, unit: str, mount: str = "/sys/fs/cgroup", *, pure_v2: bool
) -> CgroupPaths:
    """The scope's cgroup directories from the launcher's ``/proc/self/cgroup`` text. Only
    hierarchies where the process sits in ``unit``'s own cgroup count (on cgroup v1 a
    controller systemd does not manage for the scope leaves it in an ancestor's cgroup)."""
    by_controller: dict[str, str] = {}
    unified: str | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].endswith(f"/{unit}"):
            continue
        _, controllers, path = parts
        if controllers == "":
            unified = path
        for name in controllers.split(","):
            by_controller[name] = path
    if pure_v2:
        if unified is None:
            raise ValueError(f"no cgroup v2 entry of {unit} in /proc/self/cgroup")
        base = f"{mount}{unified}"
        return CgroupPaths(
            procs=f"{base}/cgroup.procs",
            memory=base,
            pids=base,
            cpu=base,
            cpuacct=base,
            unified=base,
            v2=True,
        )
    if "name=systemd" in by_controller:
        procs = f"{mount}/systemd{by_controller['name=systemd']}/cgroup.procs"
    elif unified is not None:
        procs = f"{mount}/unified{unified}/cgroup.procs"
    else:
        raise ValueError(f"no name=systemd or cgroup v2 entry of {unit} in /proc/self/cgroup")

    def under(controller: str, directory: str | None = None) -> str | None:
        path = by_controller.get(controller)
        return None if path is None else f"{mount}/{directory or controller}{path}"

    return CgroupPaths(
        procs=procs,
        memory=under("memory"),
        pids=under("pids"),
        cpu=under("cpu"),
        cpuacct=under("cpuacct"),
        unified=None if unified is None else f"{mount}/unified{unified}",
    )


def limit_files(paths: CgroupPaths) -> dict[str, str | None]:
    """Per isolation name, the file whose content shows whether the limit is applied."""
    if paths.v2:
        return {
            "memory-limit": f"{paths.memory}/memory.max",
            "pids-limit": f"{paths.pids}/pids.max",
            "cpu-limit": f"{paths.cpu}/cpu.max",
        }
    return {
        "memory-limit": None if paths.memory is None else f"{paths.memory}/memory.limit_in_bytes",
        "pids-limit": None if paths.pids is None else f"{paths.pids}/pids.max",
        "cpu-limit": None if paths.cpu is None else f"{paths.cpu}/cpu.cfs_quota_us",
    }


def limit_applied(
    name: str,
    content: str | None,
    limits: Limits,
    page_size: int = 4096,
    ours: int = KEEPER_TASKS,
) -> bool:
    """Whether a limit file shows the requested limit (v1 or v2 syntax)."""
    if content is None:
        return False
    text = content.strip()
    if name == "pids-limit":
        return limits.pids is not None and text == str(limits.pids + ours)
    if name == "memory-limit":
        if limits.memory_bytes is None or not text.isdigit():
            return False
        # the kernel rounds the limit down to whole pages
        return limits.memory_bytes - page_size < int(text) <= limits.memory_bytes
    if name == "cpu-limit":
        quota = text.split()[0] if text else ""
        return limits.cpus is not None and quota not in ("", "max", "-1")
    return False


def cpu_usage_s(content: str, *, v2: bool) -> float | None:
    """CPU time in seconds from v1 ``cpuacct.usage`` (ns) or v2 ``cpu.stat`` (usage_usec)."""
    if not v2:
        text = content.strip()
        return int(text) / 1e9 if text.isdigit() else None
    for row in content.splitlines():
        key, _, value = row.partition(" ")
        if key == "usage_usec" and value.strip().isdigit():
            return int(value) / 1e6
    return None


def parse_show(text: str) -> dict[str, str]:
    """``systemctl show -p A -p B`` output (``A=value`` lines)."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            result[key] = value
    return result


def parse_units(text: str) -> list[dict[str, str]]:
    """``systemctl show -p Id -p Description -p ActiveState <pattern>``: blank-line separated."""
    units = []
    for block in text.split("\n\n"):
        fields = parse_show(block)
        if fields.get("Id"):
            units.append(fields)
    return units


def probe_reason(stdout: str, stderr: str, code: int, what: str) -> str:
    """One line saying why a probe command failed, from what it printed."""
    for text in (stderr, stdout):
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return f"{what} failed with exit code {code}"
