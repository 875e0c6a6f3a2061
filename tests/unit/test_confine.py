"""sandboxrun.supervisor.confine: the seccomp program, pure (run by a small BPF interpreter), and
every
layer on real processes. Each hostile check runs twice in forked children: without the layer
(the attack must work, so the test proves something) and with it (it must fail)."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import stat
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxrun.supervisor import confine as _confine

ABI = _confine.landlock_abi()
needs_landlock = pytest.mark.skipif(ABI == 0, reason="this kernel has no Landlock")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (capabilities, mknod)")
CONFINE_DIR = str(Path(_confine.__file__).parent)

# ---------------------------------------------------------------- seccomp_program, pure

AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
NR = {
    "x86_64": {"read": 0, "open": 2, "chmod": 90, "fchmod": 91, "creat": 85, "mknod": 133,
               "openat": 257, "mknodat": 259, "fchmodat": 268, "add_key": 248,
               "request_key": 249, "keyctl": 250},
    "aarch64": {"read": 63, "openat": 56, "fchmod": 52, "fchmodat": 53, "mknodat": 33,
                "add_key": 217, "request_key": 218, "keyctl": 219},
}  # fmt: skip
for _table in NR.values():
    _table.update(fchmodat2=452, openat2=437, io_uring_setup=425, io_uring_enter=426)
    _table.update(io_uring_register=427)
ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
O_CREAT, O_WRONLY, O_TMPFILE = 0o100, 0o1, 0o20000000 | 0o200000


def run_bpf(prog: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel would answer: a classic-BPF interpreter for the opcodes the filter may
    use, over a ``struct seccomp_data`` (nr, arch, ip, args[6])."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    insns = [struct.unpack_from("=HBBI", prog, i) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # LD|W|ABS
            (acc,) = struct.unpack_from("<I", data, k)
            pc += 1
        elif code == 0x15:  # JMP|JEQ|K
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x45:  # JMP|JSET|K
            pc += 1 + (jt if acc & k else jf)
        elif code == 0x54:  # ALU|AND|K
            acc &= k
            pc += 1
        elif code == 0x06:  # RET|K
            return int(k)
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


CASES: list[tuple[str, tuple[int, ...], int]] = [
    ("read", (0, 0, 0), ALLOW),
    ("chmod", (0, 0o755), ALLOW),
    ("chmod", (0, 0o4755), EPERM),
    ("chmod", (0, 0o2755), EPERM),
    ("chmod", (0, 0xFFFF_FFFF_0000_0000 | 0o755), ALLOW),  # only the low 32 bits are the mode
    ("fchmod", (3, 0o644), ALLOW),
    ("fchmod", (3, 0o6755), EPERM),
    ("fchmodat", (-100 & 0xFFFFFFFF, 0, 0o4755), EPERM),
    ("fchmodat", (-100 & 0xFFFFFFFF, 0, 0o1777), ALLOW),
    ("fchmodat2", (-100 & 0xFFFFFFFF, 0, 0o2755, 0x1000), EPERM),
    ("fchmodat2", (-100 & 0xFFFFFFFF, 0, 0o755, 0x1000), ALLOW),
    ("creat", (0, 0o4755), EPERM),
    ("creat", (0, 0o755), ALLOW),
    ("open", (0, O_CREAT | O_WRONLY, 0o4755), EPERM),
    ("open", (0, O_CREAT | O_WRONLY, 0o644), ALLOW),
    ("open", (0, 0, 0o4755), ALLOW),  # no O_CREAT: the kernel ignores the mode
    ("openat", (0, 0, O_CREAT, 0o2755), EPERM),
    ("openat", (0, 0, O_TMPFILE | O_WRONLY, 0o4700), EPERM),
    ("openat", (0, 0, O_CREAT, 0o644), ALLOW),
    ("openat", (0, 0, 0, 0o4755), ALLOW),
    ("mknod", (0, stat.S_IFCHR | 0o600, 0x103), EPERM),
    ("mknod", (0, stat.S_IFREG | 0o4755, 0), EPERM),
    ("mknod", (0, stat.S_IFIFO | 0o600, 0), ALLOW),
    ("mknodat", (0, 0, stat.S_IFCHR | 0o600, 0x103), EPERM),
    ("mknodat", (0, 0, stat.S_IFBLK | 0o600, 0x800), EPERM),
    ("mknodat", (0, 0, stat.S_IFREG | 0o644, 0), ALLOW),
    ("mknodat", (0, 0, 0o644, 0), ALLOW),  # type 0: a regular file
    ("mknodat", (0, 0, stat.S_IFIFO | 0o600, 0), ALLOW),
    ("mknodat", (0, 0, stat.S_IFSOCK | 0o600, 0), ALLOW),
    ("mknodat", (0, 0, stat.S_IFIFO | 0o2600, 0), EPERM),
    ("openat2", (0, 0, 0, 24), ENOSYS),
    ("io_uring_setup", (8, 0), ENOSYS),
    ("io_uring_enter", (3, 1), ENOSYS),
    ("io_uring_register", (3, 0), ENOSYS),
    ("add_key", (0, 0, 0, 0, 0xFFFFFFFC), EPERM),  # the keyrings are the uid's, not the sandbox's
    ("request_key", (0, 0, 0, 0xFFFFFFFC), EPERM),
    ("keyctl", (0, 0xFFFFFFFC), EPERM),
]


@pytest.mark.parametrize(
    ("arch", "call", "args", "expected"),
    [(arch, *case) for arch in ("x86_64", "aarch64") for case in CASES if case[0] in NR[arch]],
)
def test_seccomp_program_rules(arch: str, call: str, args: tuple[int, ...], expected: int) -> None:
    prog = _confine.seccomp_program(arch)
    assert run_bpf(prog, NR[arch][call], AUDIT[arch], args) == expected


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_seccomp_program_shape_and_foreign_abis(arch: str) -> None:
    prog = _confine.seccomp_program(arch)
    assert len(prog) % 8 == 0 and 8 * 20 < len(prog) < 8 * 64  # small: no far jumps
    assert struct.unpack_from("=HBBI", prog, 0) == (0x20, 0, 0, 4)  # first: load the arch
    for nr in range(0, 600, 7):  # another ABI (i386 on x86_64, arm32...): refused whatever nr
        assert run_bpf(prog, nr, 0x40000003, (0, 0o4755, 0o4755, 0o4755)) == EPERM
    x32 = run_bpf(prog, 0x40000000 | 90, AUDIT[arch], (0, 0o755))
    assert x32 == (ENOSYS if arch == "x86_64" else ALLOW)  # aarch64 has no x32 bit
    assert _confine.seccomp_program("amd64" if arch == "x86_64" else "arm64") == prog


def test_seccomp_program_default_arch_and_unknown() -> None:
    assert _confine.seccomp_program() == _confine.seccomp_program(os.uname().machine)
    with pytest.raises(ValueError, match="riscv64"):
        _confine.seccomp_program("riscv64")


# ---------------------------------------------------------------- real processes


def in_child(setup: Callable[[], object], probe: Callable[[], dict[str, object]]) -> object:
    """Fork; the child runs ``setup`` (a layer or nothing) then ``probe``, and sends back its
    result as JSON (an exception as {"error": ...})."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            setup()
            data = json.dumps(probe())
        except BaseException as exc:
            data = json.dumps({"error": repr(exc)})
        os.write(write_end, data.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        data_read = reader.read()
    os.waitpid(pid, 0)
    result = json.loads(data_read)
    assert "error" not in result, result
    return result


def nothing() -> None:
    pass


def err(action: Callable[[], object]) -> int | str:
    """0 if ``action`` works, else its errno (or the name of another exception)."""
    try:
        action()
    except OSError as exc:
        return exc.errno or -1
    except Exception as exc:
        return type(exc).__name__
    return 0


def test_seccomp_refuses_setuid_and_devices(tmp_path: Path) -> None:
    def probe() -> dict[str, object]:
        target = tmp_path / "f"
        target.write_text("x")
        result: dict[str, object] = {"chmod_suid": err(lambda: os.chmod(target, 0o4755))}  # noqa: S103
        result["suid_bit"] = bool(os.stat(target).st_mode & stat.S_ISUID)
        result["chmod_plain"] = err(lambda: os.chmod(target, 0o755))  # noqa: S103
        fd = os.open(target, os.O_RDONLY)
        result["fchmod_sgid"] = err(lambda: os.fchmod(fd, 0o2755))
        os.close(fd)
        created = tmp_path / "created"
        result["open_suid"] = err(
            lambda: os.close(os.open(created, os.O_CREAT | os.O_WRONLY, 0o4755))
        )
        char = tmp_path / "null"
        result["mknod_chr"] = err(lambda: os.mknod(char, 0o600 | stat.S_IFCHR, os.makedev(1, 3)))
        result["mkfifo"] = err(lambda: os.mknod(tmp_path / "fifo", 0o600 | stat.S_IFIFO))
        for path in tmp_path.iterdir():
            path.unlink()
        return result

    before = in_child(nothing, probe)
    assert before == {"chmod_suid": 0, "suid_bit": True, "chmod_plain": 0, "fchmod_sgid": 0,
                      "open_suid": 0, "mknod_chr": 0 if os.geteuid() == 0 else errno.EPERM,
                      "mkfifo": 0}  # fmt: skip
    after = in_child(_confine.install_seccomp, probe)
    assert after == {"chmod_suid": errno.EPERM, "suid_bit": False, "chmod_plain": 0,
                     "fchmod_sgid": errno.EPERM, "open_suid": errno.EPERM,
                     "mknod_chr": errno.EPERM, "mkfifo": 0}  # fmt: skip


def test_seccomp_refuses_the_keyrings() -> None:
    """A key added by one sandboxed command would sit in the uid's user keyring: seen by every
    later sandbox and host process of that uid (review: a pool's next holder read it)."""
    nr = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
    if nr is None:
        pytest.skip("no keyctl number known for this machine")

    def probe() -> dict[str, object]:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        got = libc.syscall(nr, 0, ctypes.c_int(-4), 0)  # KEYCTL_GET_KEYRING_ID, user keyring
        return {"ok": got >= 0, "errno": 0 if got >= 0 else ctypes.get_errno()}

    before = in_child(nothing, probe)
    if before != {"ok": True, "errno": 0}:
        pytest.skip(f"keyctl is refused here already: {before}")
    assert in_child(_confine.install_seccomp, probe) == {"ok": False, "errno": errno.EPERM}


def test_seccomp_shell_cannot_make_a_setuid_copy(tmp_path: Path) -> None:
    def probe() -> dict[str, object]:
        copy = tmp_path / "s"
        done = subprocess.run(["sh", "-c", 'cp /bin/sh "$1" && chmod 4755 "$1"', "sh", str(copy)],
                              capture_output=True, check=False)  # fmt: skip
        setuid = bool(os.stat(copy).st_mode & stat.S_ISUID)
        copy.unlink()
        return {"rc": done.returncode, "setuid": setuid}

    assert in_child(nothing, probe) == {"rc": 0, "setuid": True}
    after = in_child(_confine.install_seccomp, probe)
    assert after == {"rc": 1, "setuid": False}


@needs_landlock
def test_landlock_writes_only_in_the_writable_dirs(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (b / "kept").write_text("read me")
    (b / "file").write_text("")

    def probe() -> dict[str, object]:
        (a / "sub").mkdir()
        (a / "sub" / "new").write_text("ok")
        (a / "sub" / "new").rename(a / "moved")
        (a / "moved").unlink()
        (a / "sub").rmdir()
        result: dict[str, object] = {"read_b": (b / "kept").read_text()}
        result["create_b"] = err(lambda: (b / "new").write_text("no"))
        result["mkdir_b"] = err(lambda: (b / "dir").mkdir())
        result["write_b_file"] = err(lambda: (b / "file").write_text("yes"))
        result["delete_b"] = err(lambda: (b / "kept").unlink())
        result["write_devnull"] = err(lambda: Path("/dev/null").write_text("x"))
        result["mkfifo_a"] = err(lambda: os.mkfifo(a / "fifo"))
        result["mknod_chr_a"] = err(
            lambda: os.mknod(a / "c", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        )
        for path in [a / "fifo", a / "c", b / "new", b / "dir"]:
            if path.is_dir():
                path.rmdir()
            elif os.path.lexists(path):
                path.unlink()
        return result

    before = in_child(nothing, probe)
    assert before == {"read_b": "read me", "create_b": 0, "mkdir_b": 0, "write_b_file": 0,
                      "delete_b": 0, "write_devnull": 0, "mkfifo_a": 0,
                      "mknod_chr_a": 0 if os.geteuid() == 0 else errno.EPERM}  # fmt: skip
    (b / "kept").write_text("read me")

    def confine() -> None:
        files = ["/dev/null", str(b / "file"), str(tmp_path / "missing")]
        assert _confine.restrict_writes([str(a), str(tmp_path / "gone")], files) == ABI

    after = in_child(confine, probe)
    assert after == {"read_b": "read me", "create_b": errno.EACCES, "mkdir_b": errno.EACCES,
                     "write_b_file": 0, "delete_b": errno.EACCES, "write_devnull": 0,
                     "mkfifo_a": 0, "mknod_chr_a": errno.EACCES}  # fmt: skip


@needs_landlock
def test_landlock_scope_signals_and_abstract_sockets(tmp_path: Path) -> None:
    if ABI < 6:
        pytest.skip(f"Landlock ABI {ABI} has no scopes (needs 6)")
    outside = subprocess.Popen(["sleep", "30"])
    name = f"\0sandboxrun-test-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(name)
    server.listen()

    def probe() -> dict[str, object]:
        inside = subprocess.Popen(["sleep", "30"])
        own = err(lambda: os.kill(inside.pid, 9))
        inside.wait()
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connect = err(lambda: client.connect(name))
        client.close()
        return {"kill_outside": err(lambda: os.kill(outside.pid, 0)), "kill_own": own,
                "abstract_connect": connect}  # fmt: skip

    try:
        assert in_child(nothing, probe) == {"kill_outside": 0, "kill_own": 0, "abstract_connect": 0}
        after = in_child(lambda: _confine.restrict_writes([str(tmp_path)]), probe)
        assert after == {"kill_outside": errno.EPERM, "kill_own": 0,
                         "abstract_connect": errno.EPERM}  # fmt: skip
        unscoped = in_child(lambda: _confine.restrict_writes([], scope=False), probe)
        assert unscoped == {"kill_outside": 0, "kill_own": 0, "abstract_connect": 0}
    finally:
        outside.kill()
        outside.wait()
        server.close()


@needs_landlock
def test_landlock_deny_tcp() -> None:
    if ABI < 4:
        pytest.skip(f"Landlock ABI {ABI} cannot restrict TCP (needs 4)")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def probe() -> dict[str, object]:
            def connect() -> None:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()

            def bind() -> None:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", 0))

            return {"connect": err(connect), "bind": err(bind)}

        assert in_child(nothing, probe) == {"connect": 0, "bind": 0}
        after = in_child(lambda: _confine.restrict_writes([], deny_tcp=True), probe)
        assert after == {"connect": errno.EACCES, "bind": errno.EACCES}
        assert in_child(lambda: _confine.restrict_writes([]), probe) == {"connect": 0, "bind": 0}


def capabilities() -> dict[str, object]:
    """The capability sets of this process, and of a process it execs (as it is: uid 0)."""
    lines = Path("/proc/self/status").read_text().splitlines()
    own = {k: int(v, 16) for k, v in (ln.split(":\t") for ln in lines if ln.startswith("Cap"))}
    execd = subprocess.run(["grep", "^Cap", "/proc/self/status"], capture_output=True,
                           text=True, check=True).stdout  # fmt: skip
    return {"own": own, "exec": {ln.split(":\t")[0]: int(ln.split(":\t")[1], 16)
                                 for ln in execd.splitlines()}}  # fmt: skip


@needs_root
def test_drop_capabilities_empties_every_set() -> None:
    before = in_child(nothing, capabilities)
    assert isinstance(before, dict)
    assert before["own"]["CapEff"] and before["own"]["CapBnd"] and before["exec"]["CapEff"]
    after = in_child(_confine.drop_capabilities, capabilities)
    zero = {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0}
    assert after == {"own": zero, "exec": zero}  # uid 0 regains nothing on exec


@needs_root
def test_drop_capabilities_is_a_no_op_without_capabilities() -> None:
    def unprivileged() -> None:
        os.setgid(65534)
        os.setuid(65534)  # loses every permitted capability; the bounding set stays full
        _confine.drop_capabilities()

    after = in_child(unprivileged, capabilities)
    assert isinstance(after, dict)
    assert after["own"]["CapEff"] == after["own"]["CapPrm"] == 0


def test_no_new_privs() -> None:
    def flag() -> dict[str, object]:
        lines = Path("/proc/self/status").read_text().splitlines()
        return {"nnp": next(ln for ln in lines if ln.startswith("NoNewPrivs")).split()[1]}

    assert in_child(nothing, flag) == {"nnp": "0"}
    assert in_child(_confine.no_new_privs, flag) == {"nnp": "1"}


SCRIPT = """
import sys
before = set(sys.modules)
sys.path.insert(0, sys.argv[1])
import confine as _confine
plan = {"drop_caps": True, "landlock": {"dirs": [sys.argv[2]], "files": ["/dev/null"],
        "deny_tcp": True}, "seccomp": True}
layers = _confine.apply(plan)
print(sorted(set(sys.modules) - before), file=sys.stderr)
open(sys.argv[2] + "/ok", "w").close()
try:
    open(sys.argv[3], "w").close()
except PermissionError:
    print(*layers)
"""


def test_apply_in_a_stdlib_only_script(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    argv = [sys.executable, "-I", "-S", "-c", SCRIPT, CONFINE_DIR, str(tmp_path / "w")]
    done = subprocess.run([*argv, str(tmp_path / "denied")], capture_output=True, text=True,
                          check=True)  # fmt: skip
    if ABI == 0:
        pytest.skip("this kernel has no Landlock: nothing is denied")
    assert done.stdout.split() == ["caps-dropped", "landlock", "seccomp", "no-new-privileges"]
    assert "'typing'" not in done.stderr and "'confine'" in done.stderr, done.stderr


def test_apply_minimal_plan_and_bad_plans() -> None:
    def probe() -> dict[str, object]:
        bad = err(lambda: _confine.apply({"landlock": {"dirs": "/tmp"}}))
        return {"layers": _confine.apply({"landlock": None, "seccomp": False}), "bad": bad}

    assert in_child(nothing, probe) == {"layers": ["no-new-privileges"], "bad": "TypeError"}
