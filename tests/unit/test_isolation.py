"""The local isolation plan (pure parts): layers claimed, bubblewrap argv, masks, tools."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sandboxrun.backends.local.isolation import (
    SANDBOX_HOME,
    HostSupport,
    LocalPlan,
    env_sockets,
    mask_args,
    root_args,
    runtime_dirs,
)
from sandboxrun.models import Limits, Policy, required_guarantees

FULL = HostSupport("/usr/bin/bwrap", None, 7, True)
NO_BWRAP = HostSupport(None, "bubblewrap is not installed (apt-get install bubblewrap)", 7, True)


def plan(tmp_path: Path, support: HostSupport = FULL, **policy: object) -> LocalPlan:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return LocalPlan(Policy(**policy), ws, (tmp_path / "home",), support)


def test_full_support_gives_every_default_guarantee() -> None:
    layers = FULL.layers(Policy())
    assert set(required_guarantees(Policy(), Limits())) <= set(layers)
    assert "read-only-workspace" not in layers
    assert "read-only-workspace" in FULL.layers(Policy(access="read-only"))
    assert "network-none" not in FULL.layers(Policy(network="on"))
    assert FULL.layers(Policy(access="danger-full-access")) == ()


@pytest.mark.parametrize("network", ["none", "on"])
def test_landlock_alone_never_stands_for_a_read_only_root(network: str) -> None:
    layers = NO_BWRAP.layers(Policy(network=network))
    assert "landlock" in layers and "seccomp" in layers
    assert "read-only-root" not in layers and "network-none" not in layers
    assert "apt-get install bubblewrap" in NO_BWRAP.why_not(["network-none"])
    assert NO_BWRAP.why_not(["memory-limit"]) == ""  # not the layer's to give
    no_seccomp = HostSupport(None, "x", 0, False)
    assert "CONFIG_SECCOMP_FILTER" in no_seccomp.why_not(["seccomp"])


def test_confine_plan_per_policy(tmp_path: Path) -> None:
    confine = plan(tmp_path).confine()
    landlock = confine["landlock"]
    assert isinstance(landlock, dict)
    assert str(tmp_path / "ws") in landlock["dirs"] and "/tmp" in landlock["dirs"]
    assert landlock["deny_tcp"] is False  # the network namespace cuts the network
    ro = plan(tmp_path, access="read-only").confine()["landlock"]
    assert isinstance(ro, dict) and str(tmp_path / "ws") not in ro["dirs"]
    alone = plan(tmp_path, NO_BWRAP).confine()["landlock"]
    assert isinstance(alone, dict) and alone["deny_tcp"] is True and "/tmp" not in alone["dirs"]
    assert plan(tmp_path, access="danger-full-access").confine() == {}


def test_bwrap_argv_order_and_workspace(tmp_path: Path) -> None:
    argv = plan(tmp_path).bwrap_argv(["python", "runner"])
    ws = str(tmp_path / "ws")
    assert argv[-3:] == ["--", "python", "runner"]
    assert "--unshare-net" in argv and "--unshare-pid" in argv and "--as-pid-1" in argv
    assert ("--cap-drop" in argv) == (os.geteuid() == 0)
    bind = argv.index("--bind")
    assert argv[bind + 1 : bind + 3] == [ws, ws]
    assert argv.index("--tmpfs") < bind  # the private /tmp comes before the workspace in it
    ro = plan(tmp_path, access="read-only").bwrap_argv(["x"])
    assert ["--ro-bind", ws, ws] == ro[ro.index(ws) - 1 : ro.index(ws) + 2]
    assert "--unshare-net" not in plan(tmp_path, network="on").bwrap_argv(["x"])


def test_secret_in_home_is_masked_after_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    home = ws / "home"  # visible inside (the workspace): its secrets must be masked
    (home / ".ssh").mkdir(parents=True)
    (home / ".netrc").write_text("machine x password y")
    hidden_home = tmp_path / "elsewhere"  # under the private /tmp: hidden already
    (hidden_home / ".ssh").mkdir(parents=True)
    argv = LocalPlan(Policy(), ws, (home, hidden_home), FULL).bwrap_argv(["x"])
    ssh_at = argv.index(str(home / ".ssh"))
    assert argv[ssh_at - 1] == "--tmpfs" and argv.index("--bind") < ssh_at
    netrc = argv.index(str(home / ".netrc"))
    assert argv[netrc - 2 : netrc] == ["--ro-bind", "/dev/null"]
    assert str(hidden_home / ".ssh") not in argv


def test_mask_args(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    secret = ws / "secret.txt"
    secret.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(secret)
    assert mask_args(tmp_path / "missing", ws) == []
    assert mask_args(tmp_path, ws) == []  # it holds the workspace: the caller asked for it
    assert mask_args(ws, ws) == []
    assert mask_args(link, ws) == ["--ro-bind", "/dev/null", str(secret)]  # where it points
    assert mask_args(ws / "sub", ws) == [
        "--tmpfs",
        str(ws / "sub"),
        "--remount-ro",
        str(ws / "sub"),
    ]


def test_tools_under_private_dirs_are_shown_but_never_the_socket_dirs(tmp_path: Path) -> None:
    tool = tmp_path / "tools"  # under /tmp (pytest's tmp_path)
    tool.mkdir()
    base = plan(tmp_path)
    shown = LocalPlan(
        base.policy,
        base.workspace,
        base.homes,
        FULL,
        tools=(tool, Path("/run"), Path("/var/run"), Path("/"), Path("/var"), Path("/usr/bin")),
    ).shown_tools()
    assert Path(os.path.realpath(tool)) in shown
    for refused in ("/run", "/", "/var"):
        assert Path(refused) not in shown
    assert Path("/usr/bin") not in shown  # already visible (read-only root): no bind needed


def test_sandboxrun_itself_stays_runnable_from_a_private_dir() -> None:
    dirs = runtime_dirs()
    assert sys.prefix in dirs
    assert os.path.dirname(os.path.realpath(sys.executable)) in dirs
    assert any(Path(d, "supervisor", "runner.py").exists() for d in dirs)


def test_private_home_and_tmpdir_unless_given(tmp_path: Path) -> None:
    p = plan(tmp_path)
    env = p.command_env({"HOME": "/root", "TMPDIR": "/var/x", "A": "b"}, frozenset())
    assert env == {"HOME": SANDBOX_HOME, "TMPDIR": "/tmp", "A": "b"}
    kept = p.command_env({"HOME": "/mine"}, frozenset({"HOME"}))
    assert kept["HOME"] == "/mine"
    assert plan(tmp_path, NO_BWRAP).command_env({"HOME": "/root"}, frozenset()) == {"HOME": "/root"}


def test_a_mask_that_holds_the_workspace_is_refused(tmp_path: Path) -> None:
    from sandboxrun import ConfigError, Sandbox

    ws = tmp_path / "ws"
    ws.mkdir()
    for bad in (str(ws), str(tmp_path), "/"):
        with pytest.raises(ConfigError, match="holds the workspace"):
            Sandbox(ws, policy=Policy(mask=(bad,)))
    Sandbox(ws, policy=Policy(mask=(str(ws / "inside"), str(tmp_path / "beside"))))


def test_the_workspace_is_bound_at_slash_workspace_too(tmp_path: Path) -> None:
    ws = str(tmp_path / "ws")
    argv = plan(tmp_path).bwrap_argv(["x"])
    assert ["--bind", ws, "/workspace"] == argv[
        argv.index("/workspace") - 2 : argv.index("/workspace") + 1
    ]
    assert argv[argv.index("--") - 2 : argv.index("--")] == ["--remount-ro", "/"]  # made, then ro
    triples = [argv[i : i + 3] for i in range(len(argv))]
    assert ["--ro-bind", "/", "/"] not in triples and ["--ro-bind-try", "/usr", "/usr"] in triples
    ro = plan(tmp_path, access="read-only").bwrap_argv(["x"])
    assert ro[ro.index("/workspace") - 2] == "--ro-bind"
    assert plan(tmp_path).seen(tmp_path / "ws" / "a" / "b") == "/workspace/a/b"
    assert plan(tmp_path).seen(tmp_path / "ws") == "/workspace"
    assert plan(tmp_path).seen(tmp_path / "elsewhere") == str(tmp_path / "elsewhere")
    for other in (
        plan(tmp_path, workspace_at="host"),
        plan(tmp_path, NO_BWRAP),
        plan(tmp_path, access="danger-full-access"),
    ):
        assert other.inside_root is None
        assert other.seen(tmp_path / "ws" / "a") == str(tmp_path / "ws" / "a")
    host = plan(tmp_path, workspace_at="host").bwrap_argv(["x"])
    assert "/workspace" not in host and host[host.index("/") - 1 : host.index("/") + 2] == [
        "--ro-bind",
        "/",
        "/",
    ]


def test_a_secret_in_the_workspace_is_masked_at_both_its_paths(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".ssh").mkdir(parents=True)
    (ws / ".netrc").write_text("machine x password y")
    argv = LocalPlan(Policy(), ws, (ws,), FULL).bwrap_argv(["x"])
    for seen in (str(ws / ".ssh"), "/workspace/.ssh"):
        assert argv[argv.index(seen) - 1] == "--tmpfs", seen
    for seen in (str(ws / ".netrc"), "/workspace/.netrc"):
        assert argv[argv.index(seen) - 2 : argv.index(seen)] == ["--ro-bind", "/dev/null"], seen
    assert argv.index("/workspace/.ssh") > argv.index("/workspace")  # after its bind


def test_root_args_bind_each_top_entry_and_leave_out_the_rest(tmp_path: Path) -> None:
    (tmp_path / "usr").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "bin").symlink_to("usr/bin")
    os.mkfifo(tmp_path / "fifo")
    argv = root_args(str(tmp_path))
    top = str(tmp_path)
    assert ["--symlink", "usr/bin", f"{top}/bin"] == argv[0:3]
    assert ["--ro-bind-try", f"{top}/file", f"{top}/file"] == argv[3:6]
    assert ["--ro-bind-try", f"{top}/usr", f"{top}/usr"] == argv[6:9]
    assert f"{top}/fifo" not in argv and len(argv) == 9
    real = root_args()
    assert "/proc" not in real and "/dev" not in real and "/workspace" not in real


def test_a_host_with_its_own_slash_workspace_keeps_the_host_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What runs the sandbox (its Python, a PATH directory) may live under the host's own
    ``/workspace``: never hidden by the sandbox's (a planted ``.venv/bin/python`` in the
    workspace would have run as the supervisor)."""
    real = os.path.lexists
    monkeypatch.setattr(os.path, "lexists", lambda p: p == "/workspace" or real(p))
    held = plan(tmp_path)
    assert held.inside_root is None
    argv = held.bwrap_argv(["x"])
    assert "/workspace" not in argv and argv[argv.index("/") - 1] == "--ro-bind"


@pytest.mark.parametrize("layout", ["root", "runtime-dir", "cache"])
def test_the_docker_supervisors_parent_is_a_secret_path_in_every_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """Where docker sandboxes' runners are copied before their containers import them: every
    sandbox masks it (a local one with ``$HOME`` as its workspace, or a docker one with
    ``-w ~``, could otherwise swap another sandbox's runner), and the rendezvous uses it."""
    from sandboxrun.backends import secrets
    from sandboxrun.backends.docker.rendezvous import parent_dir

    runtime = tmp_path / "runtime"
    runtime.mkdir()
    env = {"HOME": str(tmp_path / "home")}
    monkeypatch.setattr(os, "geteuid", lambda: 0 if layout == "root" else 1000)
    monkeypatch.delenv("SANDBOXRUN_SPILL_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if layout == "runtime-dir":
        env["XDG_RUNTIME_DIR"] = str(runtime)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    else:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    expected = {
        "root": Path("/run/sandboxrun-supervisor"),
        "runtime-dir": runtime / "sandboxrun-supervisor",
        "cache": tmp_path / "cache" / "sandboxrun" / "supervisor",
    }[layout]
    assert secrets.supervisor_parent(env) == expected
    assert expected in secrets.secret_paths(env)  # (docker's masks, mounts, the files API)
    assert expected in env_sockets(env)  # (the local backends' masks)
    assert expected.is_dir()  # made before a sandbox starts: a mask covers what exists
    assert parent_dir(tmp_path / "elsewhere") == expected
    assert parent_dir(tmp_path if layout != "root" else Path("/run")) is None  # (holds it)
