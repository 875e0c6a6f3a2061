"""``sandboxrun.engine.denial``: the evidence table, tested both ways (a denial, and its look-alikes
that are ordinary failures), and the host facts it relies on."""

from __future__ import annotations

import os
from collections import namedtuple
from pathlib import Path

import pytest

from sandboxrun.engine import denial
from sandboxrun.engine.denial import HostFacts, PathFacts, describe_change, diagnose, host_facts
from sandboxrun.models import BackendName, ExecResult, Limits, Policy, Status

CONFINED = [
    "own-session", "read-only-root", "network-none", "seccomp", "landlock", "pids-limit",
]  # fmt: skip
READ_ONLY = [*CONFINED, "read-only-workspace"]
UNCONFINED = ["own-session", "descendant-sweep"]
WS = "/home/u/ws"


def result(
    stderr: str = "",
    stdout: str = "",
    *,
    status: Status = "failed",
    isolation: list[str] | None = None,
    backend: BackendName = "process-group",
) -> ExecResult:
    return ExecResult(
        status=status,
        exit_code=1 if status == "failed" else None,
        duration_s=0.1,
        stdout=stdout,
        stdout_total_bytes=len(stdout.encode()),
        stderr=stderr,
        stderr_total_bytes=len(stderr.encode()),
        backend=backend,
        isolation=CONFINED if isolation is None else isolation,
        argv=["x"],
        run_id="r1",
    )


OUT = {"/etc/x": PathFacts("/etc/x", False, True)}
IN = {f"{WS}/out.txt": PathFacts(f"{WS}/out.txt", True, True)}
IN_REL = {"out.txt": PathFacts(f"{WS}/out.txt", True, True)}
LOCKED = {"/root/secret": PathFacts("/root/secret", False, False)}

Case = namedtuple("Case", "pattern line policy paths kind escalate_to", defaults=[None])
WW = Policy()
RO = Policy(access="read-only")
DANGER = Policy(access="danger-full-access")

POSITIVE = [
    Case("erofs", "touch: cannot touch '/etc/x': Read-only file system", WW, OUT,
         "filesystem", {"access": "danger-full-access"}),
    Case("erofs", "mkdir: cannot create directory ‘/etc/x’: Read-only file system", WW, OUT,
         "filesystem", {"access": "danger-full-access"}),
    Case("erofs", "bash: line 1: /etc/x: Read-only file system", WW, OUT,
         "filesystem", {"access": "danger-full-access"}),
    Case("erofs", "OSError: [Errno 30] Read-only file system: '/etc/x'", WW, OUT,
         "filesystem", {"access": "danger-full-access"}),
    Case("erofs", "sh: 1: cannot create out.txt: Read-only file system", RO, IN_REL,
         "filesystem", {"access": "workspace-write"}),
    Case("erofs", f"open {WS}/out.txt: read-only file system", RO, IN,
         "filesystem", {"access": "workspace-write"}),
    Case("eacces", "touch: cannot touch '/etc/x': Permission denied", WW, OUT,
         "filesystem", {"access": "danger-full-access"}),
    Case("eacces", "bash: /etc/x: Permission denied", WW, OUT,
         "filesystem", {"access": "danger-full-access"}),
    Case("eacces", "PermissionError: [Errno 13] Permission denied: '/etc/x'", WW, OUT,
         "filesystem", {"access": "danger-full-access"}),
    Case("eacces", "open /etc/x: permission denied", WW, OUT,
         "filesystem", {"access": "danger-full-access"}),
    Case("eacces", "Error: EACCES: permission denied, open '/etc/x'", WW, OUT,
         "filesystem", {"access": "danger-full-access"}),
    Case("eperm", "chmod: changing permissions of '/etc/x': Operation not permitted", WW, OUT,
         "syscall"),
    Case("eperm", "mknod: /etc/x: Operation not permitted", WW, OUT, "syscall"),
    Case("enospc", "cp: error writing '/tmp/big': No space left on device", WW, {}, "disk-full"),
    Case("enospc", "OSError: [Errno 28] No space left on device", WW, {}, "disk-full"),
    Case("enospc", "write /workspace/f: disk quota exceeded", WW, {}, "disk-full"),
    Case("unreachable", "OSError: [Errno 101] Network is unreachable", WW, {},
         "network", {"network": "on"}),
    Case("unreachable", "dial tcp 1.1.1.1:443: connect: network is unreachable", WW, {},
         "network", {"network": "on"}),
    Case("dns", "fatal: unable to access 'https://x/y/': Could not resolve host: github.com",
         WW, {}, "network", {"network": "on"}),
    Case("dns", "socket.gaierror: [Errno -3] Temporary failure in name resolution", WW, {},
         "network", {"network": "on"}),
    Case("dns", "socket.gaierror: [Errno -2] Name or service not known", WW, {},
         "network", {"network": "on"}),
    Case("dns", "npm ERR! request failed, reason: getaddrinfo EAI_AGAIN registry.npmjs.org",
         WW, {}, "network", {"network": "on"}),
    Case("dns", "ping: example.com: No address associated with hostname", WW, {},
         "network", {"network": "on"}),
    Case("dns", "W: Temporary failure resolving 'deb.debian.org'", WW, {},
         "network", {"network": "on"}),
    Case("fork", "bash: fork: retry: Resource temporarily unavailable", WW, {}, "pids-limit"),
    Case("fork", "sh: 1: Cannot fork", WW, {}, "pids-limit"),
    Case("fork", "RuntimeError: can't start new thread", WW, {}, "pids-limit"),
    Case("fork", "runtime: failed to create new OS thread (have 8 already; errno=11)", WW, {},
         "pids-limit"),
]  # fmt: skip


@pytest.mark.parametrize("case", POSITIVE, ids=[f"{c.pattern}:{c.line[:40]}" for c in POSITIVE])
def test_each_evidence_shape_is_a_denial(case: Case) -> None:
    found = diagnose(
        result(case.line, isolation=READ_ONLY if case.policy == RO else CONFINED),
        case.policy,
        HostFacts(case.paths, privileged=True),
    )
    assert found is not None, case.line
    assert found.kind == case.kind
    assert found.evidence == case.line
    wanted = case.escalate_to
    if wanted == {"access": "danger-full-access"}:
        wanted = None  # never offered on the word of the command's own output
    expected = None if wanted is None else case.policy.model_copy(update=wanted)
    assert found.escalate_to == expected
    assert found.message and "\n" not in found.message


def test_every_row_of_the_table_is_tested() -> None:
    tested = {c.pattern for c in POSITIVE} | {"eagain"}  # eagain: test_bare_eagain_*
    assert tested == {p.name for p in denial.PATTERNS}


NEGATIVE = [
    # ordinary failures that look like nothing the sandbox did
    ("cat: /nonexistent: No such file or directory", WW, OUT, CONFINED),
    ("E   AssertionError: assert 1 == 2", WW, OUT, CONFINED),
    ("FAILED tests/test_x.py::test_perm - AssertionError: Permission denied != ok", WW, OUT,
     CONFINED),
    ("ValueError: the user lacks permission to edit this page", WW, OUT, CONFINED),
    ("curl: (7) Failed to connect to localhost port 8080: Connection refused", WW, {}, CONFINED),
    ("ConnectionRefusedError: [Errno 111] Connection refused", WW, {}, CONFINED),
    # the host user could not do it either: the file's own permissions
    ("ls: cannot open directory '/root/secret': Permission denied", WW, LOCKED, CONFINED),
    ("touch: cannot touch '/root/secret': Read-only file system", WW, LOCKED, CONFINED),
    # no path to judge
    ("Error: Permission denied (os error 13)", WW, OUT, CONFINED),
    ("touch: Permission denied", WW, OUT, CONFINED),
    # in a read-only workspace the sandbox answers EROFS: EACCES is the file's own mode (for
    # the command's uid, which is not the host user's when a root invoker runs as the owner)
    (f"touch: cannot touch '{WS}/out.txt': Permission denied", RO, IN, CONFINED),
    # a path the host did not report on
    ("touch: cannot touch '/elsewhere': Read-only file system", WW, OUT, CONFINED),
    # the guard that would refuse it was not enforced (degraded run): not the sandbox's doing
    ("touch: cannot touch '/etc/x': Read-only file system", WW, OUT, UNCONFINED),
    ("OSError: [Errno 101] Network is unreachable", WW, {}, UNCONFINED),
    ("bash: fork: retry: Resource temporarily unavailable", WW, {}, UNCONFINED),
    ("mknod: /etc/x: Operation not permitted", WW, OUT, UNCONFINED),
    # the policy already allows it
    ("OSError: [Errno 101] Network is unreachable", Policy(network="on"), {}, CONFINED),
    ("touch: cannot touch '/etc/x': Read-only file system", DANGER, OUT, CONFINED),
    (f"touch: cannot touch '{WS}/out.txt': Read-only file system", WW, IN, CONFINED),
    # a bare EAGAIN without an explicit pids limit (a non-blocking read says it too)
    ("BlockingIOError: [Errno 11] Resource temporarily unavailable", WW, {}, CONFINED),
]  # fmt: skip


@pytest.mark.parametrize(("line", "policy", "paths", "isolation"), NEGATIVE)
def test_look_alikes_are_not_denials(
    line: str, policy: Policy, paths: dict[str, PathFacts], isolation: list[str]
) -> None:
    assert diagnose(result(line, isolation=isolation), policy, HostFacts(paths)) is None


def test_a_pytest_run_that_fails_on_its_own_is_not_a_denial() -> None:
    stdout = (
        "============================= test session starts ==============================\n"
        "collected 2 items\n\ntests/test_a.py .F\n\n"
        "=================================== FAILURES ===================================\n"
        "    def test_write():\n>       assert open('out').read() == 'ok'\n"
        "E       AssertionError: assert 'ko' == 'ok'\n"
        "========================= 1 failed, 1 passed in 0.02s ==========================\n"
    )
    assert diagnose(result(stdout=stdout), WW, HostFacts(OUT, privileged=True)) is None


def test_a_python_traceback_about_permission_in_a_message_is_not_a_denial() -> None:
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "app.py", line 3, in <module>\n'
        "    raise PermissionError('permission to deploy was not granted by the admin')\n"
        "PermissionError: permission to deploy was not granted by the admin\n"
    )
    assert diagnose(result(stderr), WW, HostFacts(OUT, privileged=True)) is None


def test_bare_eagain_is_a_pids_denial_only_under_an_explicit_limit() -> None:
    line = "BlockingIOError: [Errno 11] Resource temporarily unavailable"
    found = diagnose(result(line), WW, HostFacts(), Limits(pids=16))
    assert found is not None and found.kind == "pids-limit" and found.escalate_to is None
    assert "16" in found.message
    assert diagnose(result(line), WW, HostFacts(), Limits()) is None


def test_syscall_needs_a_host_user_who_could() -> None:
    line = "chown: changing ownership of '/etc/x': Operation not permitted"
    assert diagnose(result(line), WW, HostFacts(OUT, privileged=False)) is None
    assert diagnose(result(line), WW, HostFacts(OUT, privileged=True)) is not None
    own = "chmod: changing permissions of '/w/f': Operation not permitted"
    owned = {"/w/f": PathFacts("/w/f", True, True, True)}
    found = diagnose(result(own), WW, HostFacts(owned))
    assert found is not None and found.kind == "syscall" and found.escalate_to is None
    assert "every policy" in found.message


def test_only_failed_and_oom_killed_results_are_diagnosed() -> None:
    line = "touch: cannot touch '/etc/x': Read-only file system"
    for status in ("completed", "timed_out", "cancelled", "spawn_error", "sandbox_error"):
        assert diagnose(result(line, status=status), WW, HostFacts(OUT)) is None


def test_oom_kill_is_a_memory_limit_denial() -> None:
    found = diagnose(result(status="oom_killed"), WW, HostFacts(), Limits(memory_bytes=64 << 20))
    assert found is not None and found.kind == "memory-limit" and found.escalate_to is None
    assert "64 MiB" in found.evidence


def test_stderr_is_read_before_stdout_and_the_first_denying_line_wins() -> None:
    net = "OSError: [Errno 101] Network is unreachable"
    fs = "touch: cannot touch '/etc/x': Read-only file system"
    found = diagnose(result(stderr=f"noise\n{fs}\n{net}\n", stdout=net), WW, HostFacts(OUT))
    assert found is not None and found.kind == "filesystem"
    found = diagnose(result(stderr="cat: /nope: No such file or directory", stdout=net), WW,
                     HostFacts())  # fmt: skip
    assert found is not None and found.kind == "network"


def test_evidence_is_one_stripped_line_of_at_most_300_chars() -> None:
    line = "  OSError: [Errno 101] Network is unreachable " + "x" * 400
    found = diagnose(result(line), WW, HostFacts())
    assert found is not None
    assert len(found.evidence) <= 300 and found.evidence.startswith("OSError")


def test_silent_failure_on_a_full_workspace_is_disk_full() -> None:
    silent = result()
    assert diagnose(silent, WW, HostFacts(workspace_free_bytes=0)) is not None
    assert diagnose(silent, WW, HostFacts(workspace_free_bytes=4096, workspace_free_inodes=0))
    assert diagnose(silent, WW, HostFacts(workspace_free_bytes=4096)) is None
    assert diagnose(silent, WW, HostFacts()) is None  # not looked up
    noisy = result("Error: something else")
    assert diagnose(noisy, WW, HostFacts(workspace_free_bytes=0)) is None


def test_escalation_keeps_the_other_policy_fields() -> None:
    policy = Policy(access="read-only", allow_degraded=True, mask=("/srv",), mask_output=False)
    line = f"touch: cannot touch '{WS}/out.txt': Read-only file system"
    found = diagnose(result(line, isolation=READ_ONLY), policy, HostFacts(IN))
    assert found is not None
    assert found.escalate_to == policy.model_copy(update={"access": "workspace-write"})


def test_describe_change() -> None:
    assert describe_change(WW, DANGER) == "--policy danger-full-access (no isolation)"
    assert describe_change(WW, Policy(network="on")) == "--network on"
    assert describe_change(RO, WW) == "--policy workspace-write"


# -- host_facts: the I/O half ---------------------------------------------------------------


def test_host_facts_judges_paths_inside_and_outside_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    stderr = (
        f"touch: cannot touch '{outside}/new': Read-only file system\n"
        "touch: cannot touch 'rel.txt': Read-only file system\n"
        f"touch: cannot touch '{ws}/../ws/sub/a': Read-only file system\n"
    )
    got = host_facts(result(stderr), ws, workdir=ws / "sub")
    assert got.paths[f"{outside}/new"] == PathFacts(f"{outside}/new", False, True, False)
    assert got.paths["rel.txt"].host_path == str(ws / "sub" / "rel.txt")
    assert got.paths["rel.txt"].in_workspace
    assert got.paths[f"{ws}/../ws/sub/a"].in_workspace
    assert got.privileged == (os.geteuid() == 0)
    assert got.workspace_free_bytes is None  # the command printed something


def test_host_facts_maps_container_paths(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    stderr = (
        "touch: cannot touch '/workspace/f': Read-only file system\n"
        "touch: cannot touch '/workspace/../etc/x': Read-only file system\n"
    )
    got = host_facts(result(stderr, backend="docker"), tmp_path)
    seen = got.paths["/workspace/f"]
    assert seen.host_path == str(tmp_path / "f") and seen.in_workspace and seen.host_owned
    assert "/workspace/../etc/x" not in got.paths  # climbs out: judged as nothing


def test_host_facts_asks_the_host_whether_it_could_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode)
    )
    stderr = f"ls: cannot open directory '{locked}/inner': Permission denied\n"
    got = host_facts(result(stderr), tmp_path)
    assert got.paths[f"{locked}/inner"].host_writable is False  # nearest existing: locked


def test_host_facts_looks_at_free_space_only_for_a_silent_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stat = os.statvfs_result((4096, 4096, 100, 0, 0, 10, 0, 0, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda _: stat)
    got = host_facts(result(), tmp_path)
    assert (got.workspace_free_bytes, got.workspace_free_inodes) == (0, 0)
    assert diagnose(result(), WW, got) is not None
    assert host_facts(result("oops"), tmp_path).workspace_free_bytes is None
    assert host_facts(result(status="completed"), tmp_path) == HostFacts()


def test_container_paths_outside_the_workspace_are_judged_only_by_erofs(tmp_path: Path) -> None:
    """The container's own file system is not the host's: its read-only root is the sandbox's
    doing, a file's mode in the image (``ls /root/x`` as a non-root uid) is not."""
    confined = ["read-only-root", "container", "seccomp"]
    for line, denied in (
        ("touch: cannot touch '/etc/x': Read-only file system", True),
        ("ls: cannot open directory '/root/x': Permission denied", False),
        ("bash: /etc/shadow: Permission denied", False),
    ):
        res = result(line, backend="docker", isolation=confined)
        facts = host_facts(res, tmp_path)
        found = diagnose(res, WW, facts)
        assert (found is not None) == denied, line
        if found is not None:
            assert found.kind == "filesystem" and found.escalate_to is None


def test_a_containers_root_is_never_offered_a_wider_policy() -> None:
    # issue 20: docker proposed --policy danger-full-access, under which its root stays
    # read-only; the denial now says no policy lifts it
    line = "touch: cannot touch '/etc/x': Read-only file system"
    in_image = {"/etc/x": PathFacts("/etc/x", False, True, in_container=True)}
    docker = ["container", "read-only-root", "network-none", "pids-limit"]
    for policy in (WW, DANGER):
        found = diagnose(
            result(line, isolation=docker, backend="docker"), policy, HostFacts(in_image)
        )
        assert found is not None and found.kind == "filesystem" and found.escalate_to is None
        assert "read-only under every policy" in found.message
        assert "danger-full-access" not in found.message
