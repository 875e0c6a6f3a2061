"""Confine the calling process, and every process it will start, before it execs untrusted code.

A sandbox's namespaces and read-only mounts say what a command can see; a root command (or one
holding capabilities in its user namespace) could still create setuid-root binaries or device
nodes in a writable directory, which the host would later trust, signal processes outside the
sandbox, or reach host services over TCP or abstract Unix sockets. These layers close that,
all inherited across fork and exec and impossible to undo:

* ``no_new_privs``: no exec ever gains privileges (setuid bits, file capabilities).
* ``drop_capabilities``: empty ambient, bounding, effective, permitted and inheritable sets.
* ``restrict_writes``: a Landlock domain that allows modifying the file system only under the
  given directories (and files), never creates a device node, and optionally denies TCP
  bind/connect and scopes signals and abstract Unix sockets to the domain. Reads and execution
  stay free: the mounts already decide what is visible.
* ``install_seccomp``: a seccomp filter that refuses setuid/setgid modes and device nodes.

Landlock and seccomp apply to the calling *thread*: call them while single-threaded. The module
is imported by the stdlib-only supervisor scripts (``python -I -S``, next to this file), so it
imports only cheap builtin modules (ctypes costs ~4 ms; ``typing`` would cost ~15 ms).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct

TYPE_CHECKING = False  # not from typing: importing typing costs ~15 ms a run
if TYPE_CHECKING:
    from collections.abc import Sequence

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long

# linux/prctl.h, linux/capability.h, linux/seccomp.h
PR_CAPBSET_DROP, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 24, 22, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL, SECCOMP_MODE_FILTER = 4, 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# linux/landlock.h (the syscall numbers are the generic ones, x86_64 and aarch64 alike)
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_WRITE_FILE, FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR = 1 << 1, 1 << 4, 1 << 5, 1 << 6
FS_MAKE_DIR, FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO = 1 << 7, 1 << 8, 1 << 9, 1 << 10
FS_MAKE_BLOCK, FS_MAKE_SYM, FS_REFER, FS_TRUNCATE = 1 << 11, 1 << 12, 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FS_MODIFY = (
    FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_CHAR | FS_MAKE_DIR | FS_MAKE_REG
)
FS_MODIFY |= FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_BLOCK | FS_MAKE_SYM


def _check(result: int) -> int:
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def _arg(value: int | bytes) -> ctypes.c_long | ctypes.Array[ctypes.c_char]:
    return ctypes.c_long(value) if isinstance(value, int) else ctypes.create_string_buffer(value)


def _syscall(number: int, *args: int | bytes) -> int:
    """``syscall(number, args...)``: ints as longs, bytes as pointers to a copy."""
    return _check(_LIBC.syscall(ctypes.c_long(number), *map(_arg, args)))


def _prctl(option: int, *args: int | bytes) -> int:
    padded = [*args, 0, 0, 0, 0][:4]
    return _check(_LIBC.prctl(ctypes.c_int(option), *map(_arg, padded)))


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when there is none (not built in, disabled at
    boot, or refused by an outer seccomp filter)."""
    try:
        return _syscall(SYS_LANDLOCK_CREATE_RULESET, 0, 0, LANDLOCK_CREATE_RULESET_VERSION)
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
            return 0
        raise


def no_new_privs() -> None:
    """``prctl(PR_SET_NO_NEW_PRIVS, 1)``: no exec of this process or its children gains
    privileges (setuid/setgid bits and file capabilities are ignored)."""
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def drop_capabilities() -> None:
    """Empty every capability set of this process: ambient, bounding (so not even an exec by
    uid 0 regains any), then effective, permitted and inheritable. The bounding set is left
    alone when the process lacks CAP_SETPCAP (it cannot drop it; with no permitted capability
    and ``no_new_privs`` nothing is regained from it either). A no-op for a process without
    capabilities."""
    try:
        _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError as exc:  # EINVAL: a kernel without ambient capabilities (< 4.3)
        if exc.errno != errno.EINVAL:
            raise
    try:
        fd = os.open("/proc/sys/kernel/cap_last_cap", os.O_RDONLY | os.O_CLOEXEC)
        try:
            last = int(os.read(fd, 64))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        try:
            _prctl(PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno == errno.EPERM:  # no CAP_SETPCAP: none of them can be dropped
                break
            if exc.errno != errno.EINVAL:  # EINVAL: a capability this kernel does not know
                raise
    header = struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0)
    _check(_LIBC.capset(_arg(header), _arg(bytes(24))))  # 2 x {effective, permitted, inheritable}


def restrict_writes(
    writable_dirs: Sequence[str],
    writable_files: Sequence[str] = (),
    *,
    deny_tcp: bool = False,
    scope: bool = True,
) -> int:
    """Enforce a Landlock domain that handles only the rights that modify the file system
    (reads and execution stay free): they are allowed beneath each existing directory of
    ``writable_dirs`` except creating character or block devices, which is allowed nowhere,
    and only writing (and truncating) each existing file of ``writable_files``. Missing paths
    are skipped. ``deny_tcp`` (ABI >= 4) denies every TCP bind and connect; ``scope`` (ABI >=
    6) refuses signals and abstract Unix socket connections to processes outside the domain.
    Sets ``no_new_privs``. Returns the ABI used; 0, changing nothing, without Landlock."""
    abi = landlock_abi()
    if abi == 0:
        return 0
    handled = FS_MODIFY | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    net = NET_BIND_TCP | NET_CONNECT_TCP if deny_tcp and abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if scope and abi >= 6 else 0
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the struct grew with the ABI
    attr = struct.pack("=QQQ", handled, net, scoped)[:size]
    ruleset = _syscall(SYS_LANDLOCK_CREATE_RULESET, attr, size, 0)
    try:
        in_dirs = handled & ~(FS_MAKE_CHAR | FS_MAKE_BLOCK)
        on_files = handled & (FS_WRITE_FILE | FS_TRUNCATE)  # all a rule on a file may hold
        rules = [(path, in_dirs) for path in writable_dirs]
        rules += [(path, on_files) for path in writable_files]
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except (FileNotFoundError, NotADirectoryError):
                continue
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    rights &= on_files
                rule = struct.pack("=Qi", rights, fd)  # packed landlock_path_beneath_attr
                _syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0)
            finally:
                os.close(fd)
        no_new_privs()  # required by landlock_restrict_self without CAP_SYS_ADMIN
        _syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)
    return abi


# classic BPF (linux/filter.h, linux/seccomp.h, linux/audit.h)
LD_ABS, JEQ, JSET, AND, RET = 0x20, 0x15, 0x45, 0x54, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
X32_BIT, SET_ID_BITS, S_IFMT, S_IFCHR, S_IFBLK = 0x40000000, 0o6000, 0o170000, 0o020000, 0o060000
WILL_CREATE = 0o100 | 0o20000000  # O_CREAT | __O_TMPFILE: open's mode is ignored otherwise
UNFILTERABLE = (437, 425, 426, 427)  # openat2, io_uring_setup/enter/register: pointers
# machine -> (AUDIT_ARCH, x32 possible, {syscall: check}); a check names the mode argument
ARCHES = {
    "x86_64": (0xC000003E, True, {90: "mode1", 91: "mode1", 268: "mode2", 452: "mode2",
                                  85: "mode1", 2: "open", 257: "openat", 133: "mknod1",
                                  259: "mknod2", 248: "eperm", 249: "eperm", 250: "eperm"}),
    "aarch64": (0xC00000B7, False, {52: "mode1", 53: "mode2", 452: "mode2", 56: "openat",
                                    33: "mknod2", 217: "eperm", 218: "eperm", 219: "eperm"}),
}  # fmt: skip
"""Per machine; ``eperm``: add_key, request_key, keyctl (the kernel's keyrings are the uid's,
not the sandbox's: a key added by one command would reach every later sandbox and host
process of that uid; docker's default profile refuses them too)."""
ARCHES["amd64"], ARCHES["arm64"] = ARCHES["x86_64"], ARCHES["aarch64"]

if TYPE_CHECKING:
    Insn = tuple[int, int, str | None, str | None]  # code, k, label if true, label if false


def _assemble(items: list[Insn | str]) -> bytes:
    """``struct sock_filter`` array from instructions and labels (str items); a jump to None
    falls through."""
    labels: dict[str, int] = {}
    code: list[Insn] = []
    for item in items:
        if isinstance(item, str):
            labels[item] = len(code)
        else:
            code.append(item)
    out = []
    for index, (op, k, if_true, if_false) in enumerate(code):
        jt, jf = (0 if to is None else labels[to] - index - 1 for to in (if_true, if_false))
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise ValueError(f"BPF jump out of range at {index}")
        out.append(struct.pack("=HBBI", op, jt, jf, k))
    return b"".join(out)


def _ld_arg(index: int) -> Insn:
    return (LD_ABS, 16 + 8 * index, None, None)  # low 32 bits of args[index] (little endian)


def seccomp_program(arch: str | None = None) -> bytes:
    """The seccomp filter (``sock_filter`` array) for ``arch`` (default: this machine's):
    EPERM for chmod-like and create calls whose mode has setuid/setgid bits, for mknod of
    character or block devices and for the keyring calls (add_key, request_key, keyctl),
    ENOSYS for openat2 and io_uring (their arguments are out of a filter's reach; callers
    fall back to openat) and for x32 calls, EPERM for any other ABI (i386 on x86_64);
    everything else is allowed. Pure."""
    machine = arch or os.uname().machine
    if machine not in ARCHES:
        raise ValueError(f"no seccomp filter for {machine}")
    audit_arch, has_x32, checks = ARCHES[machine]
    prog: list[Insn | str] = [(LD_ABS, 4, None, None), (JEQ, audit_arch, None, "eperm")]
    prog.append((LD_ABS, 0, None, None))
    if has_x32:
        prog.append((JSET, X32_BIT, "enosys", None))
    prog += [(JEQ, nr, "enosys", None) for nr in UNFILTERABLE]
    prog += [(JEQ, nr, check, None) for nr, check in sorted(checks.items())]
    prog += [(RET, RET_ALLOW, None, None)]
    prog += ["open", _ld_arg(1), (JSET, WILL_CREATE, "mode2", "allow")]
    prog += ["openat", _ld_arg(2), (JSET, WILL_CREATE, "mode3", "allow")]
    for index in (1, 2, 3):
        prog += [f"mode{index}", _ld_arg(index), (JSET, SET_ID_BITS, "eperm", "allow")]
    for index in (1, 2):
        prog += [f"mknod{index}", _ld_arg(index), (JSET, SET_ID_BITS, "eperm", None)]
        prog += [(AND, S_IFMT, None, None), (JEQ, S_IFCHR, "eperm", None)]
        prog += [(JEQ, S_IFBLK, "eperm", "allow")]
    prog += ["allow", (RET, RET_ALLOW, None, None)]
    prog += ["eperm", (RET, RET_ERRNO | errno.EPERM, None, None)]
    prog += ["enosys", (RET, RET_ERRNO | errno.ENOSYS, None, None)]
    return _assemble(prog)


def install_seccomp(program: bytes | None = None) -> None:
    """Set ``no_new_privs`` and install ``program`` (default: ``seccomp_program()``) as a
    seccomp filter of this thread and its future children."""
    prog = seccomp_program() if program is None else program
    if not prog or len(prog) % 8:
        raise ValueError("a seccomp program is a non-empty array of 8-byte instructions")
    no_new_privs()
    filters = ctypes.create_string_buffer(prog, len(prog))
    fprog = struct.pack("@HP", len(prog) // 8, ctypes.addressof(filters))  # struct sock_fprog
    _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fprog)


def _strings(value: object) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"expected a list of paths, not {value!r}")
    return list(value)


def apply(plan: dict[str, object]) -> list[str]:
    """Carry out a JSON-able plan, in order: ``drop_caps`` (bool), ``landlock`` (``{"dirs":
    [...], "files": [...], "deny_tcp": bool}`` or None), ``seccomp`` (bool), then always
    ``no_new_privs``. Returns the layers applied: "caps-dropped", "landlock" (only where the
    kernel has it), "seccomp", "no-new-privileges"."""
    layers = []
    if plan.get("drop_caps"):
        drop_capabilities()
        layers.append("caps-dropped")
    landlock = plan.get("landlock")
    if isinstance(landlock, dict):
        dirs, files = _strings(landlock.get("dirs", [])), _strings(landlock.get("files", []))
        if restrict_writes(dirs, files, deny_tcp=bool(landlock.get("deny_tcp"))) > 0:
            layers.append("landlock")
    if plan.get("seccomp"):
        install_seccomp()
        layers.append("seccomp")
    no_new_privs()
    layers.append("no-new-privileges")
    return layers
