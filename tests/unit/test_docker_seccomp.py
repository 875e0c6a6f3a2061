"""The docker sandbox's seccomp profile (``docker_seccomp``), judged by a small model of how
the engine and libseccomp apply a profile: a call is allowed when some rule naming it applies
(arch and capability conditions) and all of that rule's argument conditions hold; otherwise the
default action. Plus the root invoker's default user and the ``isolation`` names."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxrun.backends.docker import config as cfg
from sandboxrun.backends.docker import seccomp as sc
from sandboxrun.models import Limits, Policy

VENDORED_SHA256 = "536529b665dd0972c37bfb569f5d4ac8a53592e7b00752bc39ff063ca9864c74"
"""moby/profiles v0.2.3 seccomp/default.json, byte for byte (see
sandboxrun/backends/docker/profiles/README.md)."""
U64 = st.integers(min_value=0, max_value=2**64 - 1)
EPERM = 1

Rule = dict[str, Any]


def applies(rule: Rule, arch: str, caps: frozenset[str]) -> bool:
    includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
    if includes.get("arches") and arch not in includes["arches"]:
        return False
    if includes.get("caps") and not set(includes["caps"]) <= caps:
        return False
    if arch in (excludes.get("arches") or []):
        return False
    return not set(excludes.get("caps") or []) & caps


def holds(cond: dict[str, Any], args: list[int]) -> bool:
    arg, value, two = args[cond["index"]], int(cond["value"]), int(cond.get("valueTwo", 0))
    ops: dict[str, bool] = {
        "SCMP_CMP_EQ": arg == value,
        "SCMP_CMP_NE": arg != value,
        "SCMP_CMP_LT": arg < value,
        "SCMP_CMP_LE": arg <= value,
        "SCMP_CMP_GT": arg > value,
        "SCMP_CMP_GE": arg >= value,
        "SCMP_CMP_MASKED_EQ": arg & value == two,
    }
    return ops[cond["op"]]


def decide(
    profile: dict[str, Any],
    name: str,
    args: list[int],
    *,
    arch: str = "amd64",
    caps: frozenset[str] = frozenset(),
) -> tuple[str, int]:
    """(action, errno) of one call under ``profile`` (minKernel conditions taken as met)."""
    args = [*args, *[0] * (6 - len(args))]
    matched = {
        (rule["action"], rule.get("errnoRet", EPERM))
        for rule in profile["syscalls"]
        if name in (rule.get("names") or [rule.get("name")])
        and applies(rule, arch, caps)
        and all(holds(cond, args) for cond in rule.get("args") or [])
    }
    assert len(matched) <= 1, (name, matched)  # never two verdicts for one call
    return matched.pop() if matched else (profile["defaultAction"], EPERM)


ALLOW = ("SCMP_ACT_ALLOW", EPERM)
REFUSED = ("SCMP_ACT_ERRNO", EPERM)
NOT_HERE = ("SCMP_ACT_ERRNO", sc.ENOSYS)
PROFILE = sc.profile()
BASE = sc.load_default()


# -- the base: Docker's default, unmodified --------------------------------------------------
def test_the_vendored_base_is_dockers_default_byte_for_byte() -> None:
    path = Path(sc.__file__).parent / sc.DEFAULT_PROFILE
    assert hashlib.sha256(path.read_bytes()).hexdigest() == VENDORED_SHA256
    assert "Apache License" in (path.parent / "LICENSE").read_text()[:200]


def test_under_the_base_a_uid0_command_could_plant() -> None:
    """What the transformation is for: the base allows any mode and any mknod."""
    assert decide(BASE, "chmod", [0, 0o4755]) == ALLOW
    assert decide(BASE, "mknod", [0, stat.S_IFCHR | 0o666, 0x103]) == ALLOW


# -- the transformation ------------------------------------------------------------------------
def test_only_the_guarded_calls_change() -> None:
    assert {k: v for k, v in PROFILE.items() if k != "syscalls"} == {
        k: v for k, v in BASE.items() if k != "syscalls"
    }
    guards = sc.guard_rules()
    assert PROFILE["syscalls"][-len(guards) :] == guards
    kept = PROFILE["syscalls"][: -len(guards)]
    expected = []
    for rule in BASE["syscalls"]:
        names = [n for n in rule["names"] if n not in sc.GUARDED]
        if names:
            expected.append({**rule, "names": names})
    assert kept == expected
    assert len(kept) == len(BASE["syscalls"])  # no base rule named only guarded calls


def test_the_guarded_calls_appear_only_in_the_guard_rules() -> None:
    guards = sc.guard_rules()
    for rule in PROFILE["syscalls"]:
        if sc.GUARDED & set(rule["names"]):
            assert rule in guards, rule
    in_guards = {name for rule in guards for name in rule["names"]}
    assert in_guards == sc.GUARDED


def test_guard_rules_use_dockers_json_spelling() -> None:
    [chmod] = [r for r in sc.guard_rules() if "chmod" in r["names"]]
    assert chmod["args"] == [
        {"index": 1, "value": 0o6000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    ]
    assert chmod["action"] == "SCMP_ACT_ALLOW"
    [enosys] = [r for r in sc.guard_rules() if "openat2" in r["names"]]
    assert enosys["action"] == "SCMP_ACT_ERRNO"
    assert enosys["errnoRet"] == 38


def test_transform_handles_the_one_name_spelling_and_leaves_its_input_alone() -> None:
    base = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": [
            {"name": "chmod", "action": "SCMP_ACT_ALLOW", "args": []},
            {"names": ["mknod", "openat2"], "action": "SCMP_ACT_ALLOW", "args": []},
            {"names": ["read", "open"], "action": "SCMP_ACT_ALLOW", "args": []},
            {"name": "write", "action": "SCMP_ACT_ALLOW", "args": []},
        ],
    }
    before = json.dumps(base)
    out = sc.transform(base)
    assert json.dumps(base) == before
    guards = sc.guard_rules()
    assert out["syscalls"] == [
        {"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": []},
        {"name": "write", "action": "SCMP_ACT_ALLOW", "args": []},
        *guards,
    ]


def test_profile_json_is_compact_cached_and_what_security_opt_carries() -> None:
    text = sc.profile_json()
    assert sc.profile_json() is text
    assert ": " not in text.split('"comment"')[0]
    assert json.loads(text) == PROFILE
    assert sc.security_opt() == "seccomp=" + text
    assert sc.profile() is not sc.profile()  # callers get copies


# -- what a command may do -------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(sc.MODE_ARG))
@given(mode=U64, other=U64)
def test_a_mode_may_not_carry_setuid_or_setgid(name: str, mode: int, other: int) -> None:
    args = [other] * 6
    args[sc.MODE_ARG[name]] = mode
    expected = ALLOW if mode & 0o6000 == 0 else REFUSED
    assert decide(PROFILE, name, args) == expected
    assert decide(PROFILE, name, args, arch="x86") == expected


@pytest.mark.parametrize("name", sorted(sc.NODE_ARG))
@given(mode=U64, other=U64)
def test_mknod_makes_no_device_and_no_setid_file(name: str, mode: int, other: int) -> None:
    args = [other] * 6
    args[sc.NODE_ARG[name]] = mode
    safe = mode & 0o6000 == 0 and stat.S_IFMT(mode & 0o177777) in (
        0,
        stat.S_IFREG,
        stat.S_IFIFO,
        stat.S_IFSOCK,
    )
    assert decide(PROFILE, name, args) == (ALLOW if safe else REFUSED)


@pytest.mark.parametrize(
    ("mode", "allowed"),
    [
        (0o644, True),
        (stat.S_IFREG | 0o755, True),
        (stat.S_IFIFO | 0o600, True),
        (stat.S_IFSOCK | 0o777, True),
        (stat.S_IFREG | 0o1755, True),  # sticky is harmless
        (stat.S_IFCHR | 0o666, False),
        (stat.S_IFBLK | 0o660, False),
        (stat.S_IFDIR | 0o755, False),
        (stat.S_IFLNK | 0o777, False),
        (stat.S_IFREG | 0o4755, False),
        (0o2755, False),
        ((1 << 32) | stat.S_IFCHR | 0o666, False),  # high bits the kernel drops
        ((1 << 32) | 0o644, True),
    ],
)
def test_mknod_examples(mode: int, allowed: bool) -> None:
    assert decide(PROFILE, "mknod", [0, mode, 0x103]) == (ALLOW if allowed else REFUSED)
    assert decide(PROFILE, "mknodat", [0, 0, mode, 0x103]) == (ALLOW if allowed else REFUSED)


@pytest.mark.parametrize("mode", [0o4755, 0o2755, 0o6755, (1 << 32) | 0o4000, 0o4000 | 0o170000])
def test_setid_modes_are_refused_everywhere(mode: int) -> None:
    assert decide(PROFILE, "chmod", [0, mode]) == REFUSED
    assert decide(PROFILE, "fchmodat", [0, 0, mode]) == REFUSED
    assert decide(PROFILE, "fchmodat2", [0, 0, mode, 0]) == REFUSED
    assert decide(PROFILE, "openat", [0, 0, 0o101, mode]) == REFUSED
    assert decide(PROFILE, "open", [0, 0o101, mode]) == REFUSED
    assert decide(PROFILE, "creat", [0, mode]) == REFUSED


@pytest.mark.parametrize("mode", [0, 0o644, 0o755, 0o1777, 0o777, 0o600])
def test_ordinary_modes_are_allowed(mode: int) -> None:
    for name, index in sc.MODE_ARG.items():
        args = [0] * 6
        args[index] = mode
        assert decide(PROFILE, name, args) == ALLOW, name


@pytest.mark.parametrize("name", sc.ENOSYS_CALLS)
def test_openat2_and_io_uring_are_not_here(name: str) -> None:
    assert decide(PROFILE, name, [0, 0, 0, 0]) == NOT_HERE
    assert decide(BASE, name, [0, 0, 0, 0]) != NOT_HERE


def test_everything_else_is_dockers_verdict() -> None:
    names = {n for rule in BASE["syscalls"] for n in rule["names"]} - sc.GUARDED
    for name in [*sorted(names), "reboot", "kexec_load"]:
        for args in ([0] * 6, [1] * 6, [0xFFFFFFFF] * 6, [39] * 6):
            assert decide(PROFILE, name, args) == decide(BASE, name, args), name
            admin = frozenset({"CAP_SYS_ADMIN"})
            assert decide(PROFILE, name, args, caps=admin) == decide(BASE, name, args, caps=admin)


# -- the user and the isolation names ----------------------------------------------------------
@pytest.mark.parametrize(
    ("euid", "owner", "expected"),
    [
        (0, (1000, 1001), "1000:1001"),  # a root invoker runs as the workspace's owner
        (0, (0, 0), None),  # a root-owned workspace: nobody else to be
        (0, (0, 1000), None),
        (0, None, None),  # unknown (the workspace could not be read)
        (0, (2**31, 5), None),  # beyond what the engine takes
        (1000, (1234, 1234), None),  # not root: always the invoker
    ],
)
def test_default_user(
    monkeypatch: pytest.MonkeyPatch,
    euid: int,
    owner: tuple[int, int] | None,
    expected: str | None,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    monkeypatch.setattr(os, "getuid", lambda: euid)
    monkeypatch.setattr(os, "getgid", lambda: euid)
    assert cfg.parse_user(None, owner=owner) == (expected or f"{euid}:{euid}")


def test_an_explicit_user_wins_over_the_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert cfg.parse_user("0:0", owner=(1000, 1000)) == "0:0"
    assert cfg.parse_user("00", owner=(1000, 1000)) == "0:0"


def test_isolation_names_seccomp_and_non_root() -> None:
    both = cfg.isolation(Policy(), Limits(), "1000:1000", seccomp=True)
    assert {"non-root", "seccomp"} <= set(both)
    root = cfg.isolation(Policy(), Limits(), "0:0", seccomp=True)
    assert "seccomp" in root
    assert "non-root" not in root
    assert "seccomp" not in cfg.isolation(Policy(), Limits(), "1000:1000")


def test_host_config_carries_the_profile_text() -> None:
    def opts(seccomp: str | None) -> list[str]:
        config = cfg.host_config(
            workspace=Path("/ws"),
            policy=Policy(),
            limits=Limits(),
            image="img",
            user="1:1",
            lbls={},
            seccomp=seccomp,
        )
        security: list[str] = config["host_config"]["security_opt"]
        return security

    assert opts(None) == ["no-new-privileges"]
    assert opts(sc.profile_json()) == ["no-new-privileges", sc.security_opt()]


def test_only_an_engine_without_seccomp_is_told_apart() -> None:
    assert cfg.seccomp_unsupported(
        "500 Server Error: seccomp is not enabled in your kernel, cannot run a custom "
        "seccomp profile"
    )
    assert cfg.seccomp_unsupported(
        "seccomp profiles are not supported on this daemon, you cannot specify a custom "
        "seccomp profile"
    )
    assert not cfg.seccomp_unsupported("Decoding seccomp profile failed: invalid character")
