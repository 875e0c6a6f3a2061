"""The seccomp profile of docker sandboxes: Docker's default profile with argument filters, so
that no command, whatever its uid, can give a file a setuid/setgid mode or create a device node.

The base is Docker's own default profile, vendored unmodified (``profiles/docker-default.json``,
Apache-2.0, see ``profiles/README.md``). ``transform`` derives sandboxrun's from it:

* ``chmod``, ``fchmod``, ``fchmodat``, ``fchmodat2``, ``creat``, ``open``, ``openat``: allowed
  only when the mode argument has neither S_ISUID nor S_ISGID (``mode & 0o6000 == 0``);
* ``mknod``, ``mknodat``: allowed only for a regular file (type 0 or S_IFREG), a FIFO or a
  socket, without S_ISUID/S_ISGID (``mode & 0o176000`` is one of those four values: one rule
  each, as libseccomp ANDs the conditions of a rule and they need distinct argument indexes);
* ``openat2`` (its mode is in a struct no filter can read) and ``io_uring_setup``/``_enter``/
  ``_register`` (io_uring opens files outside seccomp): ENOSYS, "not implemented here", which
  makes callers fall back (glibc and Python use ``openat``).

Those names are removed from every rule of the base (today only its unconditional allow list
names them); every other rule, the architectures, the default action and the capability and
kernel conditions stay exactly Docker's. Masked comparisons look at the masked bits only, so
high bits a caller sets in a 32-bit mode argument (the kernel drops them) cannot slip past.

The Engine API takes the profile's JSON *text* in ``HostConfig.SecurityOpt`` as
``seccomp=<json>`` (the docker CLI reads a file for ``--security-opt seccomp=PATH``; the engine
never reads a path). Pure but for reading the vendored file, once.
"""

from __future__ import annotations

import copy
import functools
import json
import stat
from importlib import resources
from typing import Any

Profile = dict[str, Any]

DEFAULT_PROFILE = "profiles/docker-default.json"
"""Docker's default profile, in the ``sandboxrun`` package."""
ENOSYS = 38
SETID = stat.S_ISUID | stat.S_ISGID
"""0o6000: the mode bits no file in a sandbox may be given."""
TYPE_AND_SETID = 0o170000 | SETID  # S_IFMT (a function in the stat module)
"""0o176000: the file type and the setid bits of a mknod mode."""
SAFE_NODES = (0, stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK)
"""The mknod types a command may create (0 means a regular file); never a device."""
MODE_ARG = {
    "chmod": 1,
    "fchmod": 1,
    "creat": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "open": 2,
    "openat": 3,
}
"""The index of the mode argument of each call that gives a file its mode."""
NODE_ARG = {"mknod": 1, "mknodat": 2}
"""The index of the mode (type and permissions) argument of the mknod calls."""
ENOSYS_CALLS = ("openat2", "io_uring_setup", "io_uring_enter", "io_uring_register")
GUARDED = frozenset((*MODE_ARG, *NODE_ARG, *ENOSYS_CALLS))
"""The calls whose base rules are replaced."""


def masked_eq(index: int, mask: int, value: int) -> dict[str, Any]:
    """An argument condition: ``args[index] & mask == value`` (Docker's JSON spelling)."""
    return {"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


def _by_index(calls: dict[str, int]) -> list[tuple[int, list[str]]]:
    groups: dict[int, list[str]] = {}
    for name, index in calls.items():
        groups.setdefault(index, []).append(name)
    return sorted(groups.items())


def guard_rules() -> list[dict[str, Any]]:
    """The rules sandboxrun adds in place of the base's rules for ``GUARDED``."""
    rules: list[dict[str, Any]] = [
        {
            "names": names,
            "action": "SCMP_ACT_ALLOW",
            "args": [masked_eq(index, SETID, 0)],
            "comment": "sandboxrun: no S_ISUID/S_ISGID mode",
        }
        for index, names in _by_index(MODE_ARG)
    ]
    rules += [
        {
            "names": names,
            "action": "SCMP_ACT_ALLOW",
            "args": [masked_eq(index, TYPE_AND_SETID, node)],
            "comment": f"sandboxrun: mknod of type {node:#o} only, no S_ISUID/S_ISGID",
        }
        for node in SAFE_NODES
        for index, names in _by_index(NODE_ARG)
    ]
    rules.append(
        {
            "names": list(ENOSYS_CALLS),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": ENOSYS,
            "args": [],
            "comment": "sandboxrun: openat2's mode and io_uring's opens escape the filters",
        }
    )
    return rules


def transform(base: Profile) -> Profile:
    """``base`` (a Docker seccomp profile) with ``GUARDED`` removed from each of its rules (a
    rule left with no name is dropped) and ``guard_rules`` appended; nothing else changes."""
    out = copy.deepcopy(base)
    kept: list[dict[str, Any]] = []
    for rule in out["syscalls"]:
        if rule.get("name") in GUARDED:  # the old one-name spelling
            continue
        names = rule.get("names")
        if names is not None and GUARDED.intersection(names):
            rule["names"] = [name for name in names if name not in GUARDED]
            if not rule["names"]:
                continue
        kept.append(rule)
    out["syscalls"] = kept + guard_rules()
    return out


def load_default() -> Profile:
    """Docker's default profile as vendored (a fresh copy)."""
    profiles = resources.files("sandboxrun.backends.docker")
    text = profiles.joinpath(DEFAULT_PROFILE).read_text(encoding="utf-8")
    profile: Profile = json.loads(text)
    return profile


@functools.cache
def profile_json() -> str:
    """sandboxrun's profile as compact JSON text: what ``seccomp=`` carries to the engine."""
    return json.dumps(transform(load_default()), separators=(",", ":"))


def profile() -> Profile:
    """sandboxrun's profile (a fresh copy)."""
    parsed: Profile = json.loads(profile_json())
    return parsed


def security_opt() -> str:
    """The ``HostConfig.SecurityOpt`` entry that applies the profile."""
    return "seccomp=" + profile_json()
