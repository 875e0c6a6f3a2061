"""Issue 9 (item 3): no docker run may leave a setuid/setgid file owned by root, or a device
node, in the host workspace.

A root invoker used to get a uid-0 command: ``cp /bin/sh s; chmod 4755 s`` left a setuid-root
shell in the host's workspace. Now (1) every container gets sandboxrun's seccomp profile
(Docker's default plus argument filters refusing S_ISUID/S_ISGID modes and device nodes, and
ENOSYS for openat2 and io_uring), and (2) a root invoker's command runs as the workspace owner
when that is not root. Each plant is judged on the host, with ``os.lstat``, after the run.

Real engine, nothing mocked (but the one test of an engine without seccomp, which fakes its
refusal); skipped only when the docker probe fails, and when the invoker is not root (the
plants need a uid-0 command to mean anything).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import stat
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from helpers import require_backend

from sandboxrun import Policy, PolicyRefusedError, Sandbox
from sandboxrun.backends.docker.backend import DockerBackend
from sandboxrun.backends.docker.seccomp import ENOSYS, profile

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="the plants need a root invoker"),
]

SETID = stat.S_ISUID | stat.S_ISGID


@pytest.fixture(scope="module", autouse=True)
def docker_backend() -> None:
    require_backend("docker")


def planted(workspace: Path) -> list[str]:
    """Every setuid/setgid entry or device node under ``workspace`` (on the host)."""
    bad = []
    for directory, dirs, files in os.walk(workspace):
        for name in [*dirs, *files]:
            path = Path(directory, name)
            st = os.lstat(path)
            if st.st_mode & SETID or stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                rel = path.relative_to(workspace)
                bad.append(f"{rel} mode={st.st_mode:o} uid={st.st_uid}")
    return bad


def lines(result: Any) -> list[str]:
    return list(result.stdout.splitlines())


def backend_of(sb: Sandbox) -> DockerBackend:
    backend = sb.backend
    assert isinstance(backend, DockerBackend)
    return backend


def security_opt(sb: Sandbox) -> list[str]:
    cid = backend_of(sb).session.container_id
    assert cid is not None
    client = docker.from_env(timeout=30)
    try:
        info: dict[str, Any] = client.api.inspect_container(cid)
    finally:
        client.close()
    return list(info["HostConfig"].get("SecurityOpt") or [])


def py(code: str) -> str:
    return f"python3 -c {shlex.quote('import os, stat; ' + code)}"


PLANTS = {
    "chmod-4755": "cp /bin/sh s && chmod 4755 s",
    "chmod-u+s": "cp /bin/sh s && chmod u+s s",
    "chmod-g+s-file": "touch f && chmod g+s f",
    "chmod-g+s-dir": "mkdir d && chmod g+s d",
    "install-4755": "install -m 4755 /bin/sh s2",
    "cp-a-setuid-binary": "cp -a /usr/bin/su su && cp -p /usr/bin/passwd passwd",
    "tar-xp-setuid-member": (
        "tar chf /tmp/a.tar --mode=6755 -C /bin sh && tar xpf /tmp/a.tar --same-owner"
    ),
    "python-open-creat-4755": py('os.close(os.open("p", os.O_CREAT | os.O_WRONLY, 0o4755))'),
    "python-fchmod": py('os.fchmod(os.open("p", os.O_CREAT | os.O_WRONLY, 0o755), 0o4755)'),
    "perl-sysopen-4755": (
        'perl -MFcntl -e \'sysopen(F, "q", O_CREAT | O_WRONLY, 04755) or die "$!"\''
    ),
    "python-mknod-regular-setuid": py('os.mknod("m", stat.S_IFREG | 0o4755)'),
    "python-mknod-typeless-setgid": py('os.mknod("m0", 0o2755)'),
    "mknod-char-1-3": "mknod c c 1 3",
    "mknod-block-7-0": "mknod b b 7 0",
    "python-mknod-char": py('os.mknod("c2", stat.S_IFCHR | 0o666, os.makedev(1, 3))'),
}

RAW = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
AT_FDCWD = -100
open("t", "w").close()
fd = os.open("t", os.O_RDONLY)
HIGH = 1 << 32  # a 32-bit mode argument: the kernel drops the high bits, a filter must not
S = ctypes.c_char_p
calls = {
    "chmod": (90, S(b"t"), 0o4755),
    "chmod-high-bits": (90, S(b"t"), HIGH | 0o4755),
    "fchmod": (91, fd, 0o2755),
    "fchmodat": (268, AT_FDCWD, S(b"t"), 0o4755),
    "fchmodat2": (452, AT_FDCWD, S(b"t"), 0o4755, 0),
    "creat": (85, S(b"c1"), 0o4755),
    "open": (2, S(b"c2"), os.O_CREAT | os.O_WRONLY, 0o4755),
    "openat": (257, AT_FDCWD, S(b"c3"), os.O_CREAT | os.O_WRONLY, 0o6755),
    "openat-tmpfile": (257, AT_FDCWD, S(b"."), os.O_TMPFILE | os.O_WRONLY, 0o4755),
    "mknod-reg-setuid": (133, S(b"m1"), 0o104755, 0),
    "mknod-chr": (133, S(b"m2"), 0o020666, os.makedev(1, 3)),
    "mknod-chr-high-bits": (133, S(b"m3"), HIGH | 0o020666, os.makedev(1, 3)),
    "mknodat-blk": (259, AT_FDCWD, S(b"m4"), 0o060666, os.makedev(7, 0)),
    "mknodat-reg-setgid": (259, AT_FDCWD, S(b"m5"), 0o102755, 0),
    "openat2": (437, AT_FDCWD, S(b"o2"), ctypes.c_char_p(bytes(24)), 24),
    "io_uring_setup": (425, 4, ctypes.c_char_p(bytes(120))),
    "io_uring_enter": (426, 0, 0, 0, 0, 0, 0),
    "io_uring_register": (427, 0, 0, 0, 0),
}
for name, (nr, *args) in calls.items():
    ctypes.set_errno(0)
    rc = libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in (nr, *args)))
    print(name, rc, ctypes.get_errno())
"""


@pytest.fixture
def root_workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, 0, 0)
    return ws


@pytest.fixture
def user_workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "userws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    return ws


# -- a root invoker, a root-owned workspace: the command is uid 0, seccomp holds the line -------
@pytest.mark.parametrize("script", PLANTS.values(), ids=PLANTS.keys())
async def test_uid0_cannot_plant_a_setid_file_or_a_device(
    root_workspace: Path, script: str
) -> None:
    async with Sandbox(root_workspace, backend="docker") as sb:
        who = await sb.exec(["id", "-u"])
        result = await sb.exec(shell=script)
    assert who.stdout == "0\n"  # the workspace owner is root: nobody else to be
    assert planted(root_workspace) == [], (result.stdout, result.stderr)
    assert result.status == "failed", result  # refused, not silently ignored
    assert "seccomp" in result.isolation
    assert "non-root" not in result.isolation


@pytest.mark.skipif(platform.machine() != "x86_64", reason="raw x86_64 syscall numbers")
async def test_raw_syscalls_are_refused(root_workspace: Path) -> None:
    async with Sandbox(root_workspace, backend="docker") as sb:
        result = await sb.exec(["python3", "-c", RAW])
    assert result.status == "completed", result.stderr
    outcome = {name: (int(rc), int(err)) for name, rc, err in map(str.split, lines(result))}
    assert len(outcome) == RAW.count('    "') == 18, outcome
    for name, (rc, err) in outcome.items():
        assert rc == -1, (name, outcome)
        if name.startswith(("openat2", "io_uring")):
            assert err == ENOSYS, (name, err)  # "not here": callers fall back to openat
        else:
            assert err == 1, (name, err)  # EPERM
    assert planted(root_workspace) == []


async def test_the_profile_reaches_the_engine(root_workspace: Path) -> None:
    async with Sandbox(root_workspace, backend="docker") as sb:
        opts = security_opt(sb)
        status = await sb.exec(["grep", "^Seccomp:", "/proc/self/status"])
    assert "no-new-privileges" in opts
    [sent] = [o for o in opts if o.startswith("seccomp=")]
    assert json.loads(sent.removeprefix("seccomp=")) == profile()
    assert status.stdout.split() == ["Seccomp:", "2"]  # a filter, on every exec


# -- ordinary work still runs -------------------------------------------------------------------
ORDINARY = r"""
set -eu
bash -lc 'echo login-shell'
python3 -c 'import sqlite3; sqlite3.connect("db.sqlite").execute("create table t(x)")'
perl -e 'print "perl\n"'
mkdir -p src/sub && echo data > src/sub/f && chmod 755 src/sub/f && chmod u=rw,go=r src/sub
chmod 755 src/sub && chmod 1777 src && chmod -R go-w src
cp -a src copy && test -x copy/sub/f && cp -r src copy2 && cp -p src/sub/f kept
tar cf /tmp/a.tar src && mkdir out && tar xf /tmp/a.tar -C out && tar xpf /tmp/a.tar -C out
test -x out/src/sub/f
mkfifo fifo && test -p fifo && mknod pipe2 p && test -p pipe2
python3 -c 'import os, stat; os.mknod("reg", 0o644); os.mknod("reg2", stat.S_IFREG | 0o600)'
python3 -c 'import os, socket; os.mkfifo("fifo2"); socket.socket(socket.AF_UNIX).bind("sock")'
echo line > ed.txt && sed -i s/line/edited/ ed.txt && grep -q edited ed.txt
ln -s ed.txt link && ln ed.txt hard && touch -d 2001-01-01 ed.txt && install -m 755 ed.txt inst
git --version >/dev/null 2>&1 || true
echo all-ok
"""


@pytest.mark.parametrize("user", [None, "1000:1000"])
async def test_ordinary_work_still_runs(root_workspace: Path, user: str | None) -> None:
    root_workspace.chmod(0o777)
    async with Sandbox(root_workspace, backend="docker", user=user) as sb:
        result = await sb.exec(shell=ORDINARY)
    assert result.status == "completed", result.stderr
    assert lines(result)[-1] == "all-ok"
    assert planted(root_workspace) == []
    assert stat.S_IMODE((root_workspace / "src").stat().st_mode) == 0o1755  # sticky is fine


async def test_setgid_directories_are_refused_too(root_workspace: Path) -> None:
    """The known cost: ``chmod g+s`` on a directory (group-shared trees) is refused."""
    root_workspace.chmod(0o777)
    async with Sandbox(root_workspace, backend="docker", user="1000:1000") as sb:
        result = await sb.exec(shell="mkdir d && chmod g+s d")
    assert result.status == "failed"
    assert "Operation not permitted" in result.stderr
    assert planted(root_workspace) == []


# -- a root invoker, a user's workspace: the command runs as that user --------------------------
async def test_root_invoker_runs_as_the_workspace_owner(user_workspace: Path) -> None:
    async with Sandbox(user_workspace, backend="docker") as sb:
        who = await sb.exec(shell="id -u; id -g; echo data > made && mkdir dir")
        plant = await sb.exec(shell=PLANTS["chmod-4755"])
        assert backend_of(sb).user == "1000:1000"
    assert lines(who) == ["1000", "1000"], who.stderr
    for name in ("made", "dir"):
        st = (user_workspace / name).stat()
        assert (st.st_uid, st.st_gid) == (1000, 1000), name
    assert {"non-root", "seccomp"} <= set(who.isolation)
    assert plant.status == "failed"
    assert planted(user_workspace) == []


async def test_an_explicit_root_user_is_root_but_still_cannot_plant(user_workspace: Path) -> None:
    async with Sandbox(user_workspace, backend="docker", user="0:0") as sb:
        who = await sb.exec(["id", "-u"])
        plants = [await sb.exec(shell=script) for script in PLANTS.values()]
    assert who.stdout == "0\n"  # the caller asked for it
    assert "non-root" not in who.isolation
    assert "seccomp" in who.isolation
    assert all(p.status == "failed" for p in plants), [p.stderr for p in plants]
    assert planted(user_workspace) == []


async def test_the_workspace_roots_owner_decides(root_workspace: Path) -> None:
    """The owner of the workspace root (the mount point) decides; what is inside does not."""
    sub = root_workspace / "sub"
    sub.mkdir()
    os.chown(sub, 1000, 1000)
    async with Sandbox(sub, backend="docker") as sb:
        assert backend_of(sb).user == "1000:1000"
        result = await sb.exec(["id", "-u"])
    assert result.stdout == "1000\n"
    async with Sandbox(root_workspace, backend="docker") as sb:
        assert backend_of(sb).user == "0:0"


# -- an engine without seccomp ------------------------------------------------------------------
async def test_an_engine_without_seccomp_runs_without_claiming_it(
    root_workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a daemon built or running without seccomp answers to a custom profile: the sandbox
    starts without one, ``isolation`` does not list ``seccomp``, and a run is refused (fail
    closed) unless the caller allows less."""
    from docker.api.client import APIClient

    real_start = APIClient.start
    refused: list[str] = []

    def start(self: APIClient, container: str, *args: Any, **kwargs: Any) -> Any:
        opts = self.inspect_container(container)["HostConfig"].get("SecurityOpt") or []
        if any(o.startswith("seccomp=") for o in opts):
            refused.append(container)
            raise docker.errors.APIError(
                "500 Server Error",
                explanation="seccomp is not enabled in your kernel, cannot run a custom "
                "seccomp profile",
            )
        return real_start(self, container, *args, **kwargs)

    monkeypatch.setattr(APIClient, "start", start)
    async with Sandbox(root_workspace, backend="docker") as sb:
        with pytest.raises(PolicyRefusedError, match="seccomp"):
            await sb.exec(["true"])
    refused.clear()
    async with Sandbox(root_workspace, backend="docker", policy=Policy(allow_degraded=True)) as sb:
        opts = security_opt(sb)
        result = await sb.exec(["true"])
    assert "seccomp" in result.missing_guarantees
    assert refused
    client = docker.from_env(timeout=30)
    try:
        with pytest.raises(docker.errors.NotFound):  # the refused container was removed
            client.api.inspect_container(refused[0])
    finally:
        client.close()
    assert result.status == "completed"
    assert "seccomp" not in result.isolation
    assert not any(o.startswith("seccomp=") for o in opts)
