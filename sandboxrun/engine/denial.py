"""Tell a refusal by the sandbox (or a limit it hit) apart from an ordinary failure.

``diagnose`` is pure: it reads the result's status and output, the policy and limits, and the
``HostFacts`` that ``host_facts`` gathered (the only I/O here). A line of output is evidence
only when the sandbox really enforced the guarantee that would refuse it (``isolation``) and,
for a path, when the invoking user could have done it on the host: ``cat /nonexistent``, a
test suite that fails on its own, or a file whose own permissions refuse the host user too are
never denials.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandboxrun.engine.paths import CONTAINER_ROOT, Workspace
from sandboxrun.models import Denial, DenialKind, ExecResult, Limits, Mount, Policy, replaced

MAX_EVIDENCE = 300
MAX_PATHS = 16
DIAGNOSED = ("failed", "oom_killed", "disk_exceeded")
"""Only these statuses can carry a denial: a completed run was refused nothing, and a timeout,
a cancellation or a spawn or sandbox error has its own explanation."""
FS_GUARD_INSIDE = "read-only-workspace"
FS_GUARD_OUTSIDE = "read-only-root"
NET_GUARD = "network-none"
PIDS_GUARD = "pids-limit"
SYSCALL_GUARDS = frozenset({"container", "seccomp", "syscall-filter"})
"""Isolation names under which a system-call filter or dropped capabilities are in force."""


@dataclass(frozen=True)
class Pattern:
    """One row of the evidence table: a line matching ``regex`` (case-insensitive) may show a
    denial of ``kind``; ``rule`` names the check ``diagnose`` applies before saying so."""

    name: str
    kind: DenialKind
    regex: re.Pattern[str]
    rule: str


def _p(name: str, kind: DenialKind, regex: str, rule: str) -> Pattern:
    return Pattern(name, kind, re.compile(regex, re.IGNORECASE), rule)


PATTERNS: tuple[Pattern, ...] = (
    _p("erofs", "filesystem", r"read-only file system|\bEROFS\b", "path"),
    _p("eacces", "filesystem", r"permission denied|\bEACCES\b", "path"),
    _p("eperm", "syscall", r"operation not permitted|\bEPERM\b", "syscall"),
    _p(
        "enospc",
        "disk-full",
        r"no space left on device|\bENOSPC\b|disk quota exceeded|\bEDQUOT\b",
        "always",
    ),
    _p("unreachable", "network", r"network is unreachable|\bENETUNREACH\b", "network"),
    _p(
        "dns",
        "network",
        r"temporary failure in name resolution|temporary failure resolving"
        r"|could not resolve host|unable to resolve host|name or service not known"
        r"|no address associated with hostname|\bgetaddrinfo\b|\bEAI_AGAIN\b",
        "network",
    ),
    _p(
        "fork",
        "pids-limit",
        r"\bfork: retry\b|\bcannot fork\b|\bcan't fork\b|\bfork\b.*resource temporarily unavailable"
        r"|can't start new thread|failed to create new OS thread"
        r"|pthread_create.*(?:resource temporarily unavailable|EAGAIN)",
        "pids",
    ),
    _p("eagain", "pids-limit", r"resource temporarily unavailable", "pids-explicit"),
)
"""The evidence table, first match per line wins. Rules: ``path``: the path named on the line
is judged (host could write it, inside or outside the workspace, guard enforced); ``syscall``:
a filter was in force and the host user could have done it; ``network``: ``network-none`` was
asked and enforced; ``pids``: a pids limit was enforced; ``pids-explicit``: the caller set
``Limits.pids`` (a bare EAGAIN is also what a non-blocking read says); ``always``: a full disk
is a full disk. ``Connection refused`` is deliberately absent: a closed local port says it."""

_QUOTED = re.compile(r"'([^']+)'|‘([^’]+)’|\"([^\"]+)\"|`([^`']+)['`]")
_BEFORE_COLON = re.compile(r"(\S+):\s*$")
_VERB = re.compile(r"\bcannot \w+\s+$")
_CHMOD_LIKE = re.compile(r"\bchmod\b|changing permissions|\bchown\b|changing ownership|mknod")


@dataclass(frozen=True)
class PathFacts:
    """What the host says about a path named in the evidence."""

    host_path: str
    in_workspace: bool
    host_writable: bool
    """The invoking user could write it (or create it: its nearest existing ancestor)."""
    host_owned: bool = False
    """It exists and belongs to the invoking user."""
    in_container: bool = False
    """A path of the container's own file system (not the host's): only the sandbox's
    read-only root can be judged there (``Read-only file system``), not a file's mode."""


@dataclass(frozen=True)
class HostFacts:
    """Everything ``diagnose`` needs from outside the result (see ``host_facts``)."""

    paths: Mapping[str, PathFacts] = field(default_factory=dict)
    """By the path as the evidence line spells it."""
    privileged: bool = False
    """The invoking user is root on the host."""
    workspace_free_bytes: int | None = None
    """Free space on the workspace's filesystem; only looked up when a failed command printed
    nothing (None: not looked up)."""
    workspace_free_inodes: int | None = None
    """Free inodes there (None: not looked up, or the filesystem has no inode limit)."""


def evidence_line(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_EVIDENCE else line[: MAX_EVIDENCE - 1] + "…"


def _path_like(token: str, before: str) -> bool:
    """A bare token before ``: phrase`` is a path if it has a ``/``, follows a ``prog:`` field
    (``bash: out.txt: ...``) or a verb (dash's ``cannot create out.txt: ...``); a first field
    alone is a program name (``touch: Permission denied``)."""
    return "/" in token or before.rstrip().endswith(":") or bool(_VERB.search(before))


def path_in(line: str, match: re.Match[str]) -> str | None:
    """The path an error line is about: the last quoted one before the error phrase
    (``touch: cannot touch '/x': ...``), else the token just before ``: phrase``
    (``bash: /x: ...``, Go's ``open /x: ...``, see ``_path_like``), else the first quoted
    one after it (Python's ``...: '/x'``, node's ``EACCES: permission denied, open '/x'``)."""
    head, tail = line[: match.start()], line[match.end() :]
    quoted = [next(g for g in m.groups() if g is not None) for m in _QUOTED.finditer(head)]
    if quoted:
        return quoted[-1]
    bare = _BEFORE_COLON.search(head)
    if bare and _path_like(bare.group(1), head[: bare.start(1)]):
        return bare.group(1).strip("'\"`‘’")
    after = _QUOTED.search(tail)
    if after:
        return next(g for g in after.groups() if g is not None)
    return None


def _lines(result: ExecResult) -> list[str]:
    return [*result.stderr.splitlines(), *result.stdout.splitlines()]


def evidence_paths(result: ExecResult) -> list[str]:
    """The paths named by path-judged lines (at most ``MAX_PATHS``): what ``host_facts`` must
    look at."""
    if result.status not in DIAGNOSED:
        return []
    found: list[str] = []
    for line in _lines(result):
        for pattern in PATTERNS:
            match = pattern.regex.search(line)
            if match is None:
                continue
            if pattern.rule in ("path", "syscall"):
                path = path_in(line, match)
                if path is not None and path not in found:
                    found.append(path)
            break
        if len(found) >= MAX_PATHS:
            break
    return found


def _silent(result: ExecResult) -> bool:
    return result.stdout_total_bytes == 0 and result.stderr_total_bytes == 0


def _size(n: int) -> str:
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.4g} {unit}"


def describe_change(old: Policy, new: Policy) -> str:
    """The CLI options that turn ``old`` into ``new``: ``--policy danger-full-access (no
    isolation)``, ``--network on``..."""
    parts = []
    if new.access != old.access:
        extra = " (no isolation)" if new.access == "danger-full-access" else ""
        parts.append(f"--policy {new.access}{extra}")
    if new.network != old.network:
        parts.append(f"--network {new.network}")
    return " and ".join(parts) or "the same policy"


def _widen(policy: Policy, **update: str) -> Policy | None:
    wider = replaced(policy, **update)
    return None if wider == policy else wider


def _allowed(policy: Policy, wider: Policy | None) -> str:
    if wider is None:
        return "no wider policy allows it here"
    return f"it would be allowed with {describe_change(policy, wider)}"


def _read_only_mount(path: str | None, policy: Policy) -> Mount | None:
    """The read-only ``--mount`` that ``path`` (as the command named it) lies in, if any."""
    if path is None or not path.startswith("/"):
        return None
    for mount in policy.mounts:
        if mount.read_only and (path == mount.target or path.startswith(mount.target + "/")):
            return mount
    return None


def _judge_path(
    pattern: Pattern,
    line: str,
    match: re.Match[str],
    policy: Policy,
    facts: HostFacts,
    isolation: set[str],
) -> Denial | None:
    path = path_in(line, match)
    mounted = _read_only_mount(path, policy) if pattern.name == "erofs" else None
    if path is not None and mounted is not None:  # what the caller mounted read-only
        message = (
            f"the sandbox refused a write to {path}: it is in the read-only mount "
            f"{mounted.shown()} (--mount {mounted.source}:{mounted.target}:rw writes there)"
        )
        return Denial(kind="filesystem", evidence=evidence_line(line), message=message)
    seen = facts.paths.get(path) if path is not None else None
    if path is None or seen is None or not seen.host_writable:
        return None  # no path to judge, or the host user could not either: the file's own doing
    if seen.in_container and pattern.name != "erofs":
        return None  # a file's mode in the image: not the sandbox's doing
    if seen.in_workspace:
        if FS_GUARD_INSIDE not in isolation or policy.access != "read-only":
            return None
        if pattern.name != "erofs":  # a read-only workspace answers EROFS; EACCES there is
            return None  # the file's own mode (for the command's uid, not the host's)
        wider = _widen(policy, access="workspace-write")
        where = "in the workspace"
    else:
        if "container" in isolation and pattern.name == "erofs":
            # a container's root is read-only under every policy: no wider one lifts it
            message = (
                f"the sandbox refused a write to {path} outside the workspace: the "
                "container's root is read-only under every policy (only the workspace and its "
                "temporary directory are writable)"
            )
            return Denial(kind="filesystem", evidence=evidence_line(line), message=message)
        if FS_GUARD_OUTSIDE not in isolation or policy.access == "danger-full-access":
            return None
        wider = _widen(policy, access="danger-full-access")
        where = "outside the workspace"
    what = "a write to" if pattern.name == "erofs" else "access to"
    message = (
        f"the sandbox refused {what} {path} {where} (policy {policy.access}); "
        f"{_allowed(policy, wider)}"
    )
    # The evidence is the command's own output: never offer to drop every layer on its word
    # (an untrusted program could print the line to ask for its own escape).
    offer = None if wider is None or wider.access == "danger-full-access" else wider
    return Denial(
        kind="filesystem", evidence=evidence_line(line), message=message, escalate_to=offer
    )


def _judge_syscall(
    line: str, match: re.Match[str], facts: HostFacts, isolation: set[str]
) -> Denial | None:
    if not isolation & SYSCALL_GUARDS:
        return None  # nothing filtered system calls: the program's own EPERM
    path = path_in(line, match)
    seen = facts.paths.get(path) if path is not None else None
    owner_could = seen is not None and seen.host_owned and bool(_CHMOD_LIKE.search(line))
    if not (facts.privileged or owner_could):
        return None  # the host user could not do it either
    message = (
        "the sandbox refused a privileged operation (its system-call filter and dropped "
        "capabilities refuse setuid bits, device nodes and ownership changes under every "
        "policy); no policy allows it"
    )
    return Denial(kind="syscall", evidence=evidence_line(line), message=message)


def _judge(
    pattern: Pattern,
    line: str,
    match: re.Match[str],
    result: ExecResult,
    policy: Policy,
    facts: HostFacts,
    limits: Limits | None,
) -> Denial | None:
    isolation = set(result.isolation)
    evidence = evidence_line(line)
    if pattern.rule == "path":
        return _judge_path(pattern, line, match, policy, facts, isolation)
    if pattern.rule == "syscall":
        return _judge_syscall(line, match, facts, isolation)
    if pattern.rule == "network":
        if policy.network != "none" or NET_GUARD not in isolation:
            return None
        wider = _widen(policy, network="on")
        message = f"the sandbox refused network access (network none); {_allowed(policy, wider)}"
        return Denial(kind="network", evidence=evidence, message=message, escalate_to=wider)
    if pattern.rule in ("pids", "pids-explicit"):
        explicit = limits is not None and limits.pids is not None
        if PIDS_GUARD not in isolation or (pattern.rule == "pids-explicit" and not explicit):
            return None
        amount = f" of {limits.pids}" if limits is not None and limits.pids else ""
        message = (
            f"the command hit the sandbox's process limit{amount} (pids-limit); "
            "a larger --pids allows more, no policy changes it"
        )
        return Denial(kind="pids-limit", evidence=evidence, message=message)
    # "always": a full disk
    message = (
        "the filesystem the command wrote to is full (no space left on device); "
        "no policy changes that: free space in the workspace or the sandbox's tmpfs"
    )
    return Denial(kind="disk-full", evidence=evidence, message=message)


def diagnose(
    result: ExecResult, policy: Policy, facts: HostFacts, limits: Limits | None = None
) -> Denial | None:
    """The denial ``result`` shows, or None for an ordinary result (pure: no I/O).

    An OOM kill is a memory-limit denial. Otherwise, for a failed run, the first line (stderr
    first, then stdout) that matches ``PATTERNS`` *and* passes its rule is the evidence. A
    failed command that printed nothing on a workspace filesystem with no space (or inodes)
    left is a disk-full denial."""
    if result.status == "oom_killed":
        limit = limits.memory_bytes if limits is not None else None
        amount = f" (memory limit {_size(limit)})" if limit else ""
        return Denial(
            kind="memory-limit",
            evidence=f"status oom_killed: the kernel's OOM killer ended the command{amount}",
            message=f"the command exceeded the sandbox's memory limit and was killed{amount}; "
            "a larger --memory allows more, no policy changes it",
        )
    if result.status == "disk_exceeded":
        return Denial(
            kind="disk-full",
            evidence=f"status disk_exceeded: {result.error or 'the writable root passed --disk'}",
            message="the command filled the sandbox's writable root past its --disk bound and "
            "was killed; a larger --disk allows more, no policy changes it",
        )
    if result.status != "failed":
        return None
    for line in _lines(result):
        for pattern in PATTERNS:
            match = pattern.regex.search(line)
            if match is None:
                continue
            found = _judge(pattern, line, match, result, policy, facts, limits)
            if found is not None:
                return found
            break  # one pattern per line: an ordinary EACCES is not then read as EAGAIN
    full = facts.workspace_free_bytes == 0 or facts.workspace_free_inodes == 0
    if _silent(result) and full:
        what = "no space" if facts.workspace_free_bytes == 0 else "no inodes"
        return Denial(
            kind="disk-full",
            evidence=f"the command printed nothing; the workspace's filesystem has {what} left",
            message="the workspace's filesystem is full; no policy changes that: free space there",
        )
    return None


def _host_path(text: str, root: Path, workdir: Path, container: bool) -> Path | None:
    """``container``: ``/workspace/...`` is the workspace's (a container's, or a local
    sandbox's second view of it)."""
    if container and (text == str(CONTAINER_ROOT) or text.startswith(f"{CONTAINER_ROOT}/")):
        try:
            return Workspace(root).to_host(text)
        except Exception:  # climbs out of /workspace: judge nothing
            return None
    return Path(text) if text.startswith("/") else workdir / text


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path("/")


def path_facts(
    text: str, root: Path, workdir: Path, container: bool, *, mapped: bool = False
) -> PathFacts | None:
    """The host's view of one evidence path (``/workspace/...`` mapped for a container, and
    for a local sandbox that shows the workspace there: ``mapped``)."""
    host = _host_path(text, root, workdir, container or mapped)
    if host is None or "\0" in str(host):
        return None
    try:
        real = Path(os.path.realpath(host))
        nearest = _nearest_existing(real)
        writable = os.access(nearest, os.W_OK)
        owned = nearest == real and nearest.lstat().st_uid == os.geteuid()
    except (OSError, ValueError):
        return None
    inside = real == root or root in real.parents
    if container and not inside:  # the container's own file system, not the host's
        return PathFacts(text, False, True, False, in_container=True)
    return PathFacts(str(real), inside, writable, owned)


def host_facts(
    result: ExecResult,
    workspace_root: Path,
    *,
    workdir: Path | None = None,
    mapped: bool = False,
) -> HostFacts:
    """Gather what ``diagnose`` needs about ``result`` from the host (a few ``stat``s; the
    workspace's ``statvfs`` only when a failed command printed nothing). Never raises for a
    path it cannot look at: that path is simply not judged. ``mapped``: a local sandbox that
    shows the workspace at ``/workspace`` too (its paths there are the workspace's)."""
    if result.status not in DIAGNOSED:
        return HostFacts()
    root = Path(os.path.realpath(workspace_root))
    container = result.backend == "docker"
    paths: dict[str, PathFacts] = {}
    for text in evidence_paths(result):
        seen = path_facts(text, root, workdir or root, container, mapped=mapped)
        if seen is not None:
            paths[text] = seen
    free_bytes = free_inodes = None
    if result.status == "failed" and _silent(result):
        try:
            st = os.statvfs(root)
            free_bytes = st.f_bavail * st.f_frsize
            free_inodes = st.f_favail if st.f_files > 0 else None
        except OSError:
            pass
    return HostFacts(paths, os.geteuid() == 0, free_bytes, free_inodes)
