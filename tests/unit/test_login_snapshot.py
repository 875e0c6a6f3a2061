"""Unit tests of sandboxrun.api.login: parsing a snapshot, the merge order of a command's
environment, the argv forms, the shell-selection script (run for real through /bin/sh with a
fake ``getent``/``id`` first on PATH: the host user's passwd entry cannot be changed), and the
once-per-key / fall-back logic of ``Logins`` with a fake runner.

(Named ``test_login_snapshot``: ``tests/conformance/test_login_env.py`` has the other name and
pytest's default import mode refuses two test modules of one basename.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path, PurePosixPath

import anyio
import pytest

from sandboxrun.api import login
from sandboxrun.engine import argv as wrapping
from sandboxrun.engine.request import ExecRequest, LoginMode, Snapshot
from sandboxrun.errors import ConfigError
from sandboxrun.models import ExecResult, Limits, Policy, Status

MARKER = "sandboxrun-login-0123"
BASH = shutil.which("bash")


def frames(shell: str, *entries: bytes, noise: bytes = b"") -> bytes:
    env = b"".join(e + b"\0" for e in entries)
    return (
        b"\0"
        + MARKER.encode()
        + b"\0"
        + shell.encode()
        + b"\0"
        + noise
        + (b"\0" + MARKER.encode() + b"-env\0" + env)
    )


# --------------------------------------------------------------------------- parse_output
def test_parse_keeps_name_value_entries_and_drops_bookkeeping() -> None:
    out = frames(
        "/bin/bash",
        b"A=1",
        b"B=x=y",
        b"EMPTY=",
        b"MULTI=line1\nline2",
        b"not-an-assignment",
        b"=novalue",
        b"PWD=/snap",
        b"OLDPWD=/",
        b"SHLVL=2",
        b"_=/usr/bin/env",
        b"SANDBOXRUN_RUN_ID=abc",
        b"SANDBOXRUN_EXPLICIT_PATH=/x",
        noise=b"Welcome!\nnoise with = sign\n",
    )
    shell, env = login.parse_output(out, MARKER)
    assert shell == "/bin/bash"
    assert env == {"A": "1", "B": "x=y", "EMPTY": "", "MULTI": "line1\nline2"}


def test_parse_keeps_non_utf8_bytes_exactly() -> None:
    _, env = login.parse_output(frames("/bin/sh", b"V=\xff\xfe"), MARKER)
    assert env is not None and os.fsencode(env["V"]) == b"\xff\xfe"


def test_parse_without_the_env_frame_still_has_the_shell() -> None:
    out = b"\0" + MARKER.encode() + b"\0/bin/zsh\0profile said bye\n"
    assert login.parse_output(out, MARKER) == ("/bin/zsh", None)
    assert login.parse_output(b"", MARKER) == (None, None)
    assert login.parse_output(b"A=1\0", MARKER) == (None, None)


def test_parse_takes_the_last_env_frame() -> None:
    fake = b"\0" + MARKER.encode() + b"-env\0FAKE=1\0"  # printed by the profile: before ours
    _, env = login.parse_output(frames("/bin/sh", b"REAL=1", noise=fake), MARKER)
    assert env == {"REAL": "1"}


# --------------------------------------------------------------------------- exec_env
def request(
    env: dict[str, str],
    *,
    explicit: frozenset[str] = frozenset(),
    prepend: list[str] | None = None,
    snapshot: Snapshot | None = None,
    login_mode: LoginMode = "snapshot",
    argv: list[str] | None = None,
    script: str | None = None,
    shell: str | None = None,
    timeout: float = 10,
    workdir_rel: str = ".",
) -> ExecRequest:
    return ExecRequest(
        run_id="r1",
        argv=argv if script is None else None,
        script=script,
        env=env,
        path_prepend=prepend or [],
        workdir=Path("/ws") / workdir_rel,
        workdir_rel=PurePosixPath(workdir_rel),
        stdin=None,
        timeout_s=timeout,
        limits=Limits(),
        policy=Policy(),
        explicit=explicit,
        login=login_mode,
        login_shell=shell,
        snapshot=snapshot,
    )


BASE = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/home/u", "TERM": "dumb"}
SNAP = Snapshot(
    env={"PATH": "/opt/a:/usr/bin:/bin", "LANG": "en_US.UTF-8", "HOME": "/home/u", "FOO": "p"},
    base=BASE,
)


def test_merge_order_snapshot_then_own_variables_then_owned_then_prepend() -> None:
    env = {**BASE, "FOO": "mine", "NEW": "passed", "TERM": "dumb"}
    req = request(env, explicit=frozenset({"FOO"}), prepend=["/pp"], snapshot=SNAP)
    out = wrapping.exec_env(req, owned={"HOME": "/sandbox-home", "SANDBOXRUN_RUN_ID": "r1"})
    assert out == {
        "PATH": "/pp:/opt/a:/usr/bin:/bin",  # the profile's PATH, the prepend in front
        "LANG": "en_US.UTF-8",  # the profile changed it, the command did not ask otherwise
        "HOME": "/sandbox-home",  # sandboxrun's own
        "FOO": "mine",  # explicit beats the profile
        "NEW": "passed",  # not in the base (a --pass-env of this command): kept
        "SANDBOXRUN_RUN_ID": "r1",  # (no TERM: the profile unset it, the command is as the base)
    }


def test_explicit_value_equal_to_the_base_still_wins() -> None:
    req = request(dict(BASE), explicit=frozenset({"LANG", "PATH"}), snapshot=SNAP)
    out = wrapping.exec_env(req, owned={})
    assert (out["LANG"], out["PATH"]) == ("C.UTF-8", "/usr/bin:/bin")


def test_prepend_dedupes_the_snapshot_path_but_not_an_explicit_one() -> None:
    snap = Snapshot(env={"PATH": "/pp:/usr/bin:/pp:/bin"}, base=BASE)
    req = request(dict(BASE), prepend=["/pp"], snapshot=snap)
    assert wrapping.exec_env(req, owned={})["PATH"] == "/pp:/usr/bin:/bin"
    env = {**BASE, "PATH": "/pp:/x"}
    req = request(env, explicit=frozenset({"PATH"}), prepend=["/pp"], snapshot=snap)
    assert wrapping.exec_env(req, owned={})["PATH"] == "/pp:/pp:/x"


def test_drop_keeps_host_only_names_out_unless_explicit() -> None:
    env = {**BASE, "HOME": "/host/home", "TMPDIR": "/host/tmp"}
    req = request(env, snapshot=SNAP)
    out = wrapping.exec_env(req, owned={}, drop=("HOME", "TMPDIR"))
    assert (out["HOME"], "TMPDIR" in out) == ("/home/u", False)
    req = request(env, explicit=frozenset({"TMPDIR"}), snapshot=SNAP)
    assert wrapping.exec_env(req, owned={}, drop=("HOME", "TMPDIR"))["TMPDIR"] == "/host/tmp"


def test_utf8_only_leaves_out_undecodable_snapshot_entries() -> None:
    bad = os.fsdecode(b"\xff")
    snap = Snapshot(env={"OK": "1", "BAD": bad}, base={})
    assert wrapping.exec_env(request({}, snapshot=snap), owned={}, utf8_only=True) == {"OK": "1"}
    assert "BAD" in wrapping.exec_env(request({}, snapshot=snap), owned={})


# --------------------------------------------------------------------------- command
def test_command_forms() -> None:
    argv = ["ls", "-l"]
    assert wrapping.command(request({}, argv=argv, snapshot=SNAP), "bash") == argv
    assert wrapping.command(request({}, argv=argv, login_mode="raw"), "bash") == argv
    wrapped = wrapping.command(request({}, argv=argv), "/bin/sh")  # snapshot mode, none taken
    assert wrapped[:2] == ["/bin/sh", "-lc"] and wrapped[-2:] == argv
    each = wrapping.command(request({}, argv=argv, login_mode="each", shell="/bin/zsh"), "bash")
    assert each[:2] == ["/bin/zsh", "-lc"]
    script = request({}, script="echo hi", snapshot=SNAP, shell="/bin/dash")
    assert wrapping.command(script, "bash") == ["/bin/dash", "-c", "echo hi"]
    assert wrapping.command(request({}, script="echo hi", login_mode="each"), "sh")[:2] == [
        "sh",
        "-lc",
    ]


def test_login_shell_option_is_checked() -> None:
    for bad in ("", "bin/sh", "/bin/\0sh"):
        with pytest.raises(ConfigError):
            login.Logins("snapshot", bad)
    with pytest.raises(ConfigError):
        login.Logins("raw", None)
    login.Logins("each", "zsh")


# --------------------------------------------------------------------------- the script
def run_script(
    tmp_path: Path, *, getent: str | None, uid: str = "0", shell: str = "", mode: str = "select",
    prepend: str = "", home: Path | None = None,
) -> tuple[str | None, dict[str, str] | None]:  # fmt: skip
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (fake / "getent").write_text(
        "#!/bin/sh\nexit 2\n" if getent is None else f"#!/bin/sh\necho '{getent}'\n"
    )
    for tool in ("id", "getent"):
        (fake / tool).chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(home or tmp_path)}
    argv = login.script_argv(MARKER, shell, prepend, mode)
    proc = subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    return login.parse_output(proc.stdout, MARKER)


needs_bash = pytest.mark.skipif(BASH is None, reason="no bash on this host")


@needs_bash
@pytest.mark.parametrize("passwd_shell", ["/usr/bin/fish", "/usr/sbin/nologin", "/bin/false", ""])
def test_a_non_posix_or_missing_login_shell_gives_bash(tmp_path: Path, passwd_shell: str) -> None:
    shell, env = run_script(tmp_path, getent=f"u:x:0:0::/home/u:{passwd_shell}")
    assert shell is not None and os.path.basename(shell) == "bash"
    assert env is None  # select mode prints no environment


def test_a_posix_login_shell_is_taken(tmp_path: Path) -> None:
    shell, _ = run_script(tmp_path, getent="u:x:0:0::/home/u:/bin/sh")
    assert shell == "/bin/sh"


@needs_bash
def test_a_posix_login_shell_that_is_not_installed_gives_bash(tmp_path: Path) -> None:
    shell, _ = run_script(tmp_path, getent="u:x:0:0::/home/u:/no/such/zsh")
    assert shell is not None and os.path.basename(shell) == "bash"


@needs_bash
@pytest.mark.skipif(
    not Path("/etc/passwd").exists() or "nobody:x:65534:" not in Path("/etc/passwd").read_text(),
    reason="needs the usual nobody entry in /etc/passwd",
)
def test_without_getent_the_passwd_file_is_read(tmp_path: Path) -> None:
    """The fake getent fails: the script reads /etc/passwd (``nobody``'s shell is not one)."""
    shell, _ = run_script(tmp_path, getent=None, uid="65534")
    assert shell is not None and os.path.basename(shell) == "bash"


def test_the_given_shell_overrides_the_selection(tmp_path: Path) -> None:
    shell, _ = run_script(tmp_path, getent="u:x:0:0::/home/u:/bin/bash", shell="/bin/sh")
    assert shell == "/bin/sh"


def test_env_mode_prints_the_profile_environment_after_its_noise(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text(
        'echo "noise"\nSEEN_PATH=$PATH; export SEEN_PATH\nFROM_PROFILE=yes; export FROM_PROFILE\n'
    )
    shell, env = run_script(
        tmp_path, getent=None, shell="/bin/sh", mode="env", prepend="/pp1:/pp2", home=home
    )
    assert shell == "/bin/sh"
    assert env is not None
    assert env["FROM_PROFILE"] == "yes"
    assert "noise" not in env
    assert not {"PWD", "SHLVL", "_", "OLDPWD"} & set(env)


def test_the_login_shell_starts_with_the_prepends_on_path(tmp_path: Path) -> None:
    """(A real login shell's /etc/profile may assign PATH: a fake one without a profile.)"""
    fake_shell = tmp_path / "noprofile-sh"
    fake_shell.write_text('#!/bin/sh\nshift\nexec /bin/sh "$@"\n')  # drops -l
    fake_shell.chmod(0o755)
    shell, env = run_script(
        tmp_path, getent=None, shell=str(fake_shell), mode="env", prepend="/pp1:/pp2"
    )
    assert shell == str(fake_shell)
    assert env is not None and env["PATH"].startswith("/pp1:/pp2:")


# --------------------------------------------------------------------------- Logins
def completed(code: int = 0, stderr: str = "", status: Status | None = None) -> ExecResult:
    return ExecResult(
        status=status or ("completed" if code == 0 else "failed"),
        exit_code=code,
        duration_s=0,
        backend="process-group",
        argv=["sh"],
        run_id="r0",
        stderr=stderr,
    )


Run = Callable[[ExecRequest], Awaitable[ExecResult]]


def logins(
    mode: LoginMode = "snapshot", shell: str | None = None, explicit: frozenset[str] = frozenset()
) -> login.Logins:
    return login.Logins(mode, shell, base=lambda: dict(BASE), explicit=explicit)


def env_frame(req: ExecRequest, *entries: bytes, shell: str = "/bin/sh") -> None:
    """What ``SCRIPT`` prints, to the snapshot request's sink."""
    assert req.argv is not None and req.sink is not None
    marker = req.argv[4].encode()
    req.sink("stdout", b"\0" + marker + b"\0" + shell.encode() + b"\0")
    req.sink("stdout", b"\0" + marker + b"-env\0" + b"".join(e + b"\0" for e in entries))


async def _resolve_many(
    logins: login.Logins, reqs: list[ExecRequest], fake: Run
) -> list[tuple[ExecRequest, str | None]]:
    out: list[tuple[ExecRequest, str | None]] = []

    async def one(req: ExecRequest) -> None:
        out.append(await logins.resolve(req, fake))

    async with anyio.create_task_group() as tg:
        for req in reqs:
            tg.start_soon(one, req)
    return out


def test_concurrent_first_commands_share_one_snapshot_per_prepend_set() -> None:
    calls: list[ExecRequest] = []

    async def fake(req: ExecRequest) -> ExecResult:
        calls.append(req)
        await anyio.sleep(0.01)
        env_frame(req, b"X=1")
        return completed()

    reqs = [request(dict(BASE), argv=["true"], workdir_rel="sub/dir") for _ in range(5)]
    reqs.append(request(dict(BASE), argv=["true"], prepend=["/pp"]))
    results = anyio.run(_resolve_many, logins(explicit=frozenset({"LANG"})), reqs, fake)
    assert len(calls) == 2
    assert {req.argv[6] for req in calls if req.argv} == {"", "/pp"}
    for snap in calls:  # raw, at the workspace root, with the base, unmasked
        assert (snap.login, snap.workdir, snap.workdir_rel) == (
            "raw",
            Path("/ws"),
            PurePosixPath("."),
        )
        assert (snap.env, snap.explicit, snap.policy.mask_output) == (
            BASE,
            frozenset({"LANG"}),
            False,
        )
        assert snap.path_prepend == [] and snap.run_id != "r1"
    for resolved, warning in results:
        assert warning is None
        assert resolved.login == "snapshot" and resolved.login_shell == "/bin/sh"
        assert resolved.snapshot == Snapshot(env={"X": "1"}, base=BASE)


def test_restore_keeps_exactly_the_saved_snapshots() -> None:
    """A pooled sandbox's next holder gets the snapshots it had when it was made: one a
    holder had taken (its profile wrote it) is forgotten, a saved one that was evicted is
    back, and a saved state is not changed by later use (its warning reported)."""
    seen: list[bytes] = [b"X=made"]

    async def fake(req: ExecRequest) -> ExecResult:
        env_frame(req, seen[0])
        return completed()

    async def go() -> None:
        ls = logins()
        plain = request(dict(BASE), argv=["true"])
        assert (await ls.resolve(plain, fake))[0].snapshot == Snapshot({"X": "made"}, BASE)
        saved = ls.saved()
        seen[0] = b"X=holder"
        for i in range(login.MAX_KEYS):  # the default one evicted, then taken again
            await ls.resolve(request(dict(BASE), argv=["true"], prepend=[f"/p{i}"]), fake)
        assert (await ls.resolve(plain, fake))[0].snapshot == Snapshot({"X": "holder"}, BASE)
        ls.restore(saved)
        assert ls.ready(request(dict(BASE), argv=["true"], prepend=["/p1"])) is None
        assert (await ls.resolve(plain, fake))[0].snapshot == Snapshot({"X": "made"}, BASE)
        assert ls.saved() == saved

    anyio.run(go)


def test_a_failed_snapshot_gives_each_and_warns_once() -> None:
    async def fake(req: ExecRequest) -> ExecResult:
        assert req.argv is not None and req.sink is not None
        req.sink("stdout", b"\0" + req.argv[4].encode() + b"\0/bin/bash\0")
        return completed(3, stderr="profile broke")

    sb = logins()

    async def go() -> list[tuple[ExecRequest, str | None]]:
        return [await sb.resolve(request(dict(BASE), argv=["x"]), fake) for _ in "ab"]

    (first, warning), (second, again) = anyio.run(go)
    assert first.login == second.login == "each"
    assert first.login_shell == "/bin/bash" and first.snapshot is None
    assert warning is not None and "status 3: profile broke" in warning
    assert "with these path prepends" in warning  # per key, not the whole sandbox
    assert again is None


SECRET = "s3cr3t-token-value-42"


def test_the_failure_warning_masks_the_sandboxs_secrets_before_cutting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The snapshot run is unmasked (its output is the environment); the stderr line quoted in
    the warning is masked, and masked before it is cut to 200 characters (no secret prefix)."""
    lines = [f"tok={SECRET}", "x" * 195 + SECRET]

    async def fake(req: ExecRequest) -> ExecResult:
        assert req.policy.mask_output is False
        return completed(1, stderr=lines.pop(0))

    base = {**BASE, "API_TOKEN": SECRET}
    sb = login.Logins("snapshot", None, base=lambda: base, explicit={"API_TOKEN"})

    async def go() -> list[str | None]:
        reqs = [request(base, argv=["x"], prepend=[p]) for p in ("/a", "/b")]
        return [(await sb.resolve(req, fake))[1] for req in reqs]

    warnings = anyio.run(go)
    assert warnings[0] is not None and "tok=[masked:API_TOKEN]" in warnings[0]
    assert warnings[1] is not None and SECRET[:4] not in warnings[1]
    assert SECRET[:4] not in caplog.text


def test_each_mode_only_selects_the_shell_and_raw_is_left_alone() -> None:
    modes: list[str] = []

    async def fake(req: ExecRequest) -> ExecResult:
        assert req.argv is not None and req.sink is not None
        modes.append(req.argv[-1])
        req.sink("stdout", b"\0" + req.argv[4].encode() + b"\0/bin/zsh\0")
        return completed()

    sb = logins("each")

    async def go() -> tuple[ExecRequest, ExecRequest]:
        each, _ = await sb.resolve(request({}, argv=["x"], login_mode="each"), fake)
        raw = request({}, argv=["x"], login_mode="raw")
        assert (await sb.resolve(raw, fake))[0] is raw
        return each, (await sb.resolve(request({}, argv=["x"], login_mode="each"), fake))[0]

    each, later = anyio.run(go)
    assert modes == ["select"]
    assert (each.login, each.login_shell, later.login_shell) == ("each", "/bin/zsh", "/bin/zsh")


def test_a_broken_sandbox_is_not_a_failed_snapshot_and_is_tried_again() -> None:
    """A ``sandbox_error`` (its container died, say) is the command's result, not a reason to
    give up the snapshot for good; the next command takes it again."""
    answers = [completed(status="sandbox_error").model_copy(update={"error": "gone"}), completed()]

    async def fake(req: ExecRequest) -> ExecResult:
        env_frame(req, b"X=1")
        return answers.pop(0)

    sb = logins(shell="/bin/sh")

    async def go() -> ExecRequest:
        with pytest.raises(login.NotRun, match="gone") as caught:
            await sb.resolve(request({}, argv=["x"]), fake)
        assert caught.value.status == "sandbox_error"
        return (await sb.resolve(request({}, argv=["x"]), fake))[0]

    resolved = anyio.run(go)
    assert resolved.snapshot is not None and resolved.snapshot.env == {"X": "1"}
    assert answers == []


def test_the_snapshot_is_bounded_by_the_commands_deadline_and_not_kept_when_cut() -> None:
    budgets: list[float] = []

    async def fake(req: ExecRequest) -> ExecResult:
        budgets.append(req.timeout_s)
        await anyio.sleep(0.2)
        if req.timeout_s < login.SNAPSHOT_TIMEOUT_S:
            return completed(status="timed_out")
        env_frame(req, b"X=1")
        return completed()

    sb = logins()

    async def go() -> ExecRequest:
        with pytest.raises(login.NotRun, match="used up the timeout") as caught:
            await sb.resolve(request({}, argv=["x"], timeout=5), fake)
        assert caught.value.status == "timed_out"
        resolved, warning = await sb.resolve(request({}, argv=["x"], timeout=60), fake)
        assert warning is None
        return resolved

    resolved = anyio.run(go)
    assert budgets[0] <= 5 and budgets[1] == login.SNAPSHOT_TIMEOUT_S  # tried again: not kept
    assert resolved.snapshot is not None
    assert 59 < resolved.timeout_s <= 60 - 0.2  # the command has what is left


def test_a_snapshot_that_ends_past_the_deadline_is_kept_but_the_command_is_not_run() -> None:
    calls = []

    async def fake(req: ExecRequest) -> ExecResult:
        calls.append(req)
        await anyio.sleep(0.3)
        env_frame(req, b"X=1")
        return completed()  # finished (within its grace), after the deadline

    sb = logins()

    async def go() -> None:
        with pytest.raises(login.NotRun) as caught:
            await sb.resolve(request({}, argv=["x"], timeout=0.1), fake)
        assert caught.value.status == "timed_out"
        resolved, _ = await sb.resolve(request({}, argv=["x"]), fake)
        assert resolved.snapshot is not None

    anyio.run(go)
    assert len(calls) == 1


def test_a_cached_key_does_not_wait_for_another_keys_snapshot() -> None:
    """One lock per key: a command whose snapshot is cached runs while another key's is taken;
    a waiter for the same key gives up at its own deadline."""
    slow = anyio.Event()

    async def fake(req: ExecRequest) -> ExecResult:
        if req.argv and req.argv[6] == "/slow":
            await slow.wait()
        env_frame(req, b"X=1")
        return completed()

    sb = logins()

    async def go() -> None:
        await sb.resolve(request({}, argv=["x"]), fake)  # cached from now on
        async with anyio.create_task_group() as tg:
            tg.start_soon(sb.resolve, request({}, argv=["x"], prepend=["/slow"]), fake)
            await anyio.sleep(0.05)
            with anyio.fail_after(1):
                resolved, _ = await sb.resolve(request({}, argv=["x"]), fake)
                assert resolved.snapshot is not None
                resolved, _ = await sb.resolve(request({}, argv=["x"], prepend=["/other"]), fake)
                with pytest.raises(login.NotRun, match="used up the timeout"):
                    await sb.resolve(request({}, argv=["x"], prepend=["/slow"], timeout=0.1), fake)
            slow.set()
        assert sb._locks == {}  # no lock left behind

    anyio.run(go)


def test_a_cancelled_snapshot_keeps_nothing() -> None:
    calls = 0

    async def fake(req: ExecRequest) -> ExecResult:
        nonlocal calls
        calls += 1
        if calls == 1:
            await anyio.sleep(10)  # aclose() cancels the command's scope, snapshot included
        env_frame(req, b"X=1")
        return completed()

    sb = logins()

    async def go() -> None:
        with anyio.move_on_after(0.05):
            await sb.resolve(request({}, argv=["x"]), fake)
        resolved, warning = await sb.resolve(request({}, argv=["x"]), fake)
        assert (resolved.snapshot is not None, warning) == (True, None)

    anyio.run(go)
    assert calls == 2


def test_only_the_most_recently_used_snapshots_are_kept() -> None:
    taken: list[str] = []

    async def fake(req: ExecRequest) -> ExecResult:
        assert req.argv is not None
        taken.append(req.argv[6])
        env_frame(req, b"X=1")
        return completed()

    sb = logins()

    async def go() -> None:
        for i in range(login.MAX_KEYS):
            await sb.resolve(request({}, argv=["x"], prepend=[f"/p{i}"]), fake)
        await sb.resolve(request({}, argv=["x"], prepend=["/p0"]), fake)  # used: kept
        await sb.resolve(request({}, argv=["x"], prepend=["/new"]), fake)  # drops /p1
        await sb.resolve(request({}, argv=["x"], prepend=["/p0"]), fake)
        await sb.resolve(request({}, argv=["x"], prepend=["/p1"]), fake)

    anyio.run(go)
    assert taken == [*(f"/p{i}" for i in range(login.MAX_KEYS)), "/new", "/p1"]
