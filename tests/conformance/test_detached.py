"""Detached sandboxes on every backend (issue 20): ``create`` once, ``exec`` many times from
separate CLI processes, ``rm``; and what an attacker or a crash does to them: a client killed
mid-exec, another uid, a TTL with a command still running, a keeper killed outright. Every test
ends with no keeper, no process of the sandbox and no container of its workspace left."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import CLI, cli, processes_mentioning, require_backend

from sandboxrun import (
    NoSuchSandbox,
    Sandbox,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    WorkspaceError,
)
from sandboxrun.detached import client

pytestmark = pytest.mark.anyio


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private runtime directory of the test's own (short: a socket path has 107 bytes);
    afterwards no keeper may hold a lock in it."""
    base = Path(tempfile.mkdtemp(prefix="srt-", dir="/tmp"))
    monkeypatch.setenv("SANDBOXRUN_RUNTIME_DIR", str(base))
    yield base
    alive = [lock.stem for lock in base.glob("*.lock") if client.held(lock)]
    for name in alive:
        client.remove(name, base, force=True)
    shutil.rmtree(base, ignore_errors=True)
    assert alive == [], f"keepers left running: {alive}"


def containers_of(workspace: Path) -> list[str]:
    if shutil.which("docker") is None:
        return []
    digest = hashlib.sha256(str(workspace.resolve()).encode()).hexdigest()[:16]
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=sandboxrun.managed=true",
         "--filter", f"label=sandboxrun.workspace={digest}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.split()


def nothing_left(workspace: Path, marker: str, deadline_s: float = 15.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not processes_mentioning(marker) and not containers_of(workspace):
            return
        time.sleep(0.1)
    assert processes_mentioning(marker) == [], "processes of the sandbox outlived it"
    assert containers_of(workspace) == [], "its container outlived it"


def test_create_fifty_execs_rm_from_separate_processes(
    workspace: Path, backend: str, runtime: Path
) -> None:
    made = cli("create", "--name", "fifty", "-w", str(workspace), "-b", backend)
    assert made.returncode == 0, made.stderr
    assert made.stdout == "fifty\n"
    listed = cli("ls", "--json")
    (item,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (item["name"], item["backend"], item["running"]) == ("fifty", backend, 0)
    assert item["workspace"] == str(workspace.resolve())
    for i in range(50):
        got = cli("exec", "fifty", "--", "sh", "-c", f"echo {i} >> count.txt; echo out-{i}")
        assert (got.returncode, got.stdout, got.stderr) == (0, f"out-{i}\n", ""), got
    lines = (workspace / "count.txt").read_text().split()
    assert lines == [str(i) for i in range(50)]  # the workspace, written from inside
    failed = cli("exec", "fifty", "--", "sh", "-c", "echo err >&2; exit 7")
    assert (failed.returncode, failed.stderr) == (7, "err\n")
    gone = cli("rm", "fifty")
    assert gone.returncode == 0, gone.stderr
    assert cli("ls", "--json").stdout == ""
    after = cli("exec", "fifty", "--", "true")
    assert after.returncode == 125 and "no sandbox named fifty" in after.stderr
    nothing_left(workspace, "fifty")


def test_exec_streams_stdin_output_and_status_like_run(
    workspace: Path, backend: str, runtime: Path
) -> None:
    data = workspace.parent / "data"
    data.mkdir()
    (data / "in.txt").write_text("mounted\n")
    made = cli("create", "--name", "io", "-w", str(workspace), "-b", backend,
               "--mount", f"{data}:/var/tmp/data")  # fmt: skip
    assert made.returncode == 0, made.stderr
    try:
        mounted = cli(
            "exec", "io", "--", "sh", "-c", "cat /var/tmp/data/in.txt; touch /var/tmp/data/x"
        )
        assert mounted.stdout == "mounted\n" and mounted.returncode == 1, mounted  # read-only
        fed = cli("exec", "-i", "io", "--", "tr", "a-z", "A-Z", input="shout\n" * 10000)
        assert (fed.returncode, fed.stdout) == (0, "SHOUT\n" * 10000), fed.stderr
        many = cli("exec", "io", "--", "seq", "1", "300000")  # ~2 MB, past the keeper's queue
        assert many.stdout == "".join(f"{i}\n" for i in range(1, 300001))
        slow = cli("exec", "-t", "1", "io", "--", "sh", "-c", "echo before; sleep 30")
        assert slow.returncode == 124 and slow.stdout == "before\n", slow
        assert "timed out" in slow.stderr
        missing = cli("exec", "io", "--", "no-such-program-x")
        assert missing.returncode == 127
        as_json = cli("exec", "--json", "io", "--", "sh", "-c", "echo j; exit 3")
        result = json.loads(as_json.stdout)
        assert (as_json.returncode, result["exit_code"], result["stdout"]) == (3, 3, "j\n")
        wrong = cli("exec", "io", "--json", "true")
        assert wrong.returncode == 125 and "options go before NAME" in wrong.stderr
    finally:
        assert cli("rm", "--force", "io").returncode == 0


def test_secrets_given_with_e_are_masked_through_exec(
    workspace: Path, backend: str, runtime: Path
) -> None:
    env = {**os.environ, "MY_API_TOKEN": "tok-4b1d-secret-value"}
    made = cli("create", "--name", "sec", "-w", str(workspace), "-b", backend, "-e",
               "MY_API_TOKEN", env=env)  # fmt: skip
    assert made.returncode == 0, made.stderr
    try:
        shown = cli("exec", "sec", "--", "sh", "-c", 'echo "t=$MY_API_TOKEN"')
        assert shown.returncode == 0
        assert "tok-4b1d-secret-value" not in shown.stdout and shown.stdout.startswith("t=")
        pid = json.loads((runtime / "sec.json").read_text())["pid"]
        seen = [
            (runtime / "sec.json").read_text(),
            cli("ls", "--json").stdout,
            Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"),
            cli("exec", "-C", "no/such/dir", "sec", "--", "true").stderr,
        ]
        for text in seen:  # the state, ls, the keeper's argv, an error
            assert "tok-4b1d-secret-value" not in text

    finally:
        assert cli("rm", "sec").returncode == 0
    assert list(runtime.iterdir()) == []  # rm leaves nothing, not even its log


def test_a_client_killed_mid_exec_kills_that_run_only(
    workspace: Path, backend: str, runtime: Path
) -> None:
    assert cli("create", "--name", "kc", "-w", str(workspace), "-b", backend).returncode == 0
    try:
        victim = subprocess.Popen(
            [*CLI, "exec", "kc", "--", "sh", "-c",
             "(trap '' TERM; exec sleep 4321.5) & echo started; wait"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        neighbour = subprocess.Popen(
            [*CLI, "exec", "kc", "--", "sh", "-c", "sleep 3; echo neighbour-done"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert victim.stdout is not None
        assert victim.stdout.readline() == b"started\n"
        assert processes_mentioning("4321.5")
        victim.send_signal(signal.SIGKILL)
        victim.communicate()
        deadline = time.monotonic() + 15
        while processes_mentioning("4321.5") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_mentioning("4321.5") == [], (
            "the killed client's run (TERM-ignoring) lives on"
        )
        out, err = neighbour.communicate(timeout=30)
        assert (neighbour.returncode, out) == (0, "neighbour-done\n"), err
        again = cli("exec", "kc", "--", "echo", "still")
        assert again.stdout == "still\n"  # the sandbox goes on
    finally:
        assert cli("rm", "--force", "kc").returncode == 0
    nothing_left(workspace, "4321.5")


def test_rm_refuses_while_commands_run_and_force_ends_them(
    workspace: Path, backend: str, runtime: Path
) -> None:
    assert cli("create", "--name", "busy", "-w", str(workspace), "-b", backend).returncode == 0
    running = subprocess.Popen(
        [*CLI, "exec", "busy", "--", "sh", "-c", "echo up; exec sleep 4322.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert running.stdout is not None and running.stdout.readline() == b"up\n"
    refused = cli("rm", "busy")
    assert refused.returncode == 125 and "1 command(s) running" in refused.stderr
    assert cli("exec", "busy", "--", "true").returncode == 0  # still there
    forced = cli("rm", "--force", "busy")
    assert forced.returncode == 0, forced.stderr
    _, err = running.communicate(timeout=30)
    assert running.returncode == 130, err  # its run was ended, not completed, and it says why
    assert b"the sandbox was removed: removed by rm --force" in err
    nothing_left(workspace, "4322.5")


def test_ttl_and_idle_ttl_remove_it_with_every_process(
    workspace: Path, backend: str, runtime: Path
) -> None:
    made = cli("create", "--name", "ttl", "-w", str(workspace), "-b", backend, "--ttl", "8s")
    assert made.returncode == 0, made.stderr
    # A command running past the TTL, trying to outlive it (double fork, setsid, TERM ignored).
    started = time.monotonic()
    outlive = cli(
        "exec", "ttl", "--", "sh", "-c",
        "setsid sh -c \"trap '' TERM; exec sleep 4323.5\" >/dev/null 2>&1 & sleep 60",
    )  # fmt: skip
    assert outlive.returncode == 130, outlive  # cancelled, and said so: not a lost keeper
    assert "the sandbox was removed: its TTL ran out" in outlive.stderr
    assert time.monotonic() - started < 20
    idle = cli("create", "--name", "idle", "-w", str(workspace), "-b", backend,
               "--idle-ttl", "6s")  # fmt: skip
    assert idle.returncode == 0, idle.stderr
    # A command running well past the idle TTL keeps it alive (running is not idle). One long
    # command, not a loop of short ones, and an idle TTL of seconds: a loaded CI machine took
    # over 2 s to start the next CLI process (between create and exec too), and that is idle.
    kept = cli("exec", "idle", "--", "sh", "-c", "sleep 9; echo still")
    assert kept.returncode == 0 and kept.stdout == "still\n", kept
    ended = time.monotonic()
    deadline = time.monotonic() + 20
    while client.held(runtime / "idle.lock") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not client.held(runtime / "idle.lock") and not client.held(runtime / "ttl.lock")
    assert time.monotonic() - ended >= 4.0  # counted from the command's end, not from create
    assert "TTL ran out" in (runtime / "ttl.log").read_text()
    assert "idle TTL ran out" in (runtime / "idle.log").read_text()
    assert cli("ls", "--json").stdout == ""
    nothing_left(workspace, "4323.5")


def test_a_keeper_killed_outright_leaves_nothing(
    workspace: Path, backend: str, runtime: Path
) -> None:
    made = cli("create", "--json", "--name", "k9", "-w", str(workspace), "-b", backend)
    assert made.returncode == 0, made.stderr
    pid = json.loads(made.stdout)["pid"]
    running = subprocess.Popen(
        [*CLI, "exec", "k9", "--", "sh", "-c", "echo up; exec sleep 4324.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert running.stdout is not None and running.stdout.readline() == b"up\n"
    os.kill(pid, signal.SIGKILL)
    running.communicate(timeout=30)
    assert running.returncode == 125  # the client learns its keeper is gone
    nothing_left(workspace, "4324.5", deadline_s=30)
    assert cli("ls", "--json").stdout == ""  # what it left is cleared
    again = cli("create", "--name", "k9", "-w", str(workspace), "-b", backend)
    assert again.returncode == 0, again.stderr  # the name is free again
    assert cli("rm", "k9").returncode == 0


def test_two_clients_at_once_do_not_mix(workspace: Path, backend: str, runtime: Path) -> None:
    assert cli("create", "--name", "two", "-w", str(workspace), "-b", backend).returncode == 0
    try:
        outs: dict[int, subprocess.CompletedProcess[str]] = {}

        def one(i: int) -> None:
            outs[i] = cli(
                "exec", "two", "--", "sh", "-c", f"for n in $(seq 500); do echo {i}-$n; done"
            )

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, got in outs.items():
            assert got.stdout == "".join(f"{i}-{n}\n" for n in range(1, 501)), got.stderr
    finally:
        assert cli("rm", "two").returncode == 0


async def test_python_create_attach_exec_remove(
    workspace: Path, backend: str, runtime: Path
) -> None:
    made = await Sandbox.create(workspace, detach=True, backend=backend, idle_ttl=60)
    attached = await Sandbox.attach(made.name)
    chunks: list[tuple[str, bytes]] = []
    result = await attached.exec(
        ["sh", "-c", "cat; echo err >&2; exit 4"],
        stdin=b"fed\n",
        sink=lambda n, c: chunks.append((n, c)),
    )
    assert (result.status, result.exit_code, result.stdout, result.stderr) == (
        "failed", 4, "fed\n", "err\n",
    )  # fmt: skip
    assert b"".join(c for n, c in chunks if n == "stdout") == b"fed\n"
    info = await attached.info()
    assert info["execs"] == 1 and info["backend"] == backend
    # the files API through the keeper: the same answers and the same typed errors
    big = os.urandom(300_000)  # past one frame's chunk
    await attached.write_file("made/deep/big.bin", big, parents=True)
    assert (workspace / "made" / "deep" / "big.bin").read_bytes() == big
    assert await attached.read_file("made/deep/big.bin") == big
    assert [(e.name, e.kind) for e in await attached.list_dir("made")] == [("deep", "dir")]
    with pytest.raises(SandboxFileNotFoundError) as missing:
        await attached.read_file("no/such.txt")
    assert missing.value.path == "no/such.txt"
    with pytest.raises(SandboxFileTooLargeError):
        await attached.read_file("made/deep/big.bin", max_bytes=1000)
    with pytest.raises(WorkspaceError):
        await attached.read_file("../outside.txt")
    assert await made.remove() == []
    with pytest.raises(NoSuchSandbox):
        await Sandbox.attach(made.name)


def test_a_name_in_use_and_a_bad_name_are_refused(
    workspace: Path, backend: str, runtime: Path
) -> None:
    assert cli("create", "--name", "dup", "-w", str(workspace), "-b", backend).returncode == 0
    try:
        twice = cli("create", "--name", "dup", "-w", str(workspace), "-b", backend)
        assert twice.returncode == 125 and "a sandbox named dup exists" in twice.stderr
        bad = cli("create", "--name", "../x", "-w", str(workspace), "-b", backend)
        assert bad.returncode == 125 and "bad sandbox name" in bad.stderr
        assert sorted(p.name for p in runtime.iterdir()) == [
            "dup.json", "dup.lock", "dup.log", "dup.sock",
        ]  # fmt: skip
    finally:
        assert cli("rm", "dup").returncode == 0


def test_creates_racing_for_one_name_make_one_sandbox(
    workspace: Path, backend: str, runtime: Path
) -> None:
    outs: list[subprocess.CompletedProcess[str]] = []

    def one() -> None:
        outs.append(cli("create", "--name", "race", "-w", str(workspace), "-b", backend))

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        won = [o for o in outs if o.returncode == 0]
        assert len(won) == 1, [o.stderr for o in outs]
        assert all("a sandbox named race exists" in o.stderr for o in outs if o.returncode)
        (only,) = [json.loads(line) for line in cli("ls", "--json").stdout.splitlines()]
        assert only["name"] == "race" and only["running"] == 0
    finally:
        assert cli("rm", "race").returncode == 0
    assert len(containers_of(workspace)) == 0


def test_another_uid_cannot_attach(workspace: Path, backend: str, runtime: Path) -> None:
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another uid")
    assert cli("create", "--name", "mine", "-w", str(workspace), "-b", backend).returncode == 0
    try:
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *CLI]
        env = {**os.environ, "SANDBOXRUN_RUNTIME_DIR": str(runtime)}
        denied = subprocess.run(
            [*as_nobody, "exec", "mine", "--", "id"], capture_output=True, text=True, env=env,
            timeout=60, check=False,
        )  # fmt: skip
        assert denied.returncode == 125 and "uid=" not in denied.stdout, denied
        assert "another user" in denied.stderr or "not private" in denied.stderr
        # Even with the directory and the socket opened up, the keeper serves no other uid.
        runtime.chmod(0o711)
        (runtime / "mine.sock").chmod(0o666)
        probe = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
    s.sendall(b'{"op":"exec","argv":["id"]}\\n')
    s.settimeout(10)
    print("closed" if s.recv(100) == b"" else "answered")
except (BrokenPipeError, ConnectionResetError):
    print("closed")
"""
        raw = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
             "-c", probe, str(runtime / "mine.sock")],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert raw.stdout.strip() == "closed", raw  # served nothing, not a word
        runtime.chmod(0o700)
        assert cli("exec", "mine", "--", "echo", "ok").stdout == "ok\n"
    finally:
        runtime.chmod(0o700)
        assert cli("rm", "mine").returncode == 0


def test_a_runtime_dir_others_can_enter_is_refused(tmp_path: Path) -> None:
    open_dir = Path(tempfile.mkdtemp(prefix="srt-", dir="/tmp"))
    try:
        open_dir.chmod(0o755)
        env = {**os.environ, "SANDBOXRUN_RUNTIME_DIR": str(open_dir)}
        got = cli("create", "--name", "x", "-w", str(tmp_path), "-b", "process-group", env=env)
        assert got.returncode == 125 and "not private" in got.stderr, got.stderr
        assert list(open_dir.iterdir()) == []
    finally:
        shutil.rmtree(open_dir)


def test_a_keeper_that_cannot_open_says_why_and_leaves_nothing(
    workspace: Path, runtime: Path
) -> None:
    require_backend("docker")
    got = cli("create", "--name", "noimg", "-w", str(workspace), "-b", "docker",
              "--image", "sandboxrun/no-such-image:0")  # fmt: skip
    assert got.returncode == 125
    assert "no-such-image" in got.stderr, got.stderr
    assert sorted(p.name for p in runtime.iterdir()) in ([], ["noimg.log"])
    assert not list(runtime.glob("*.lock"))


def test_clean_knows_a_detached_sandbox_is_not_an_orphan(workspace: Path, runtime: Path) -> None:
    require_backend("docker")
    made = cli("create", "--name", "kept", "-w", str(workspace), "-b", "docker")
    assert made.returncode == 0, made.stderr
    try:
        assert len(containers_of(workspace)) == 1
        dry = cli("clean", "--dry-run")
        assert dry.returncode == 0 and containers_of(workspace)[0][:12] not in dry.stdout
        cleaned = cli("clean")
        assert cleaned.returncode == 0, cleaned.stderr
        assert len(containers_of(workspace)) == 1  # its keeper, its owner, lives
        assert cli("exec", "kept", "--", "echo", "on").stdout == "on\n"
    finally:
        assert cli("rm", "kept").returncode == 0
    assert containers_of(workspace) == []


@pytest.mark.parametrize("inside", ["home", "workspace"])
def test_a_sandboxed_command_cannot_drive_another_sandbox(
    workspace: Path, backend: str, inside: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command of sandbox A runs as the same uid as B's keeper: B's socket must be out of
    its sight (masked on every backend), and the keeper serves no sandboxed peer anyway."""
    if inside == "home":  # not under /tmp, /run (hidden anyway): a place only the mask hides
        base = Path(tempfile.mkdtemp(prefix=".srt-", dir=Path.home()))
    else:  # a container sees only the workspace: there
        base = Path(tempfile.mkdtemp(prefix=".srt-", dir=workspace))
    base.chmod(0o700)
    monkeypatch.setenv("SANDBOXRUN_RUNTIME_DIR", str(base))
    try:
        assert cli("create", "--name", "b", "-w", str(workspace), "-b", backend).returncode == 0
        assert cli("create", "--name", "a", "-w", str(workspace), "-b", backend).returncode == 0
        probe = f"""
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect({str(base / "b.sock")!r})
    s.sendall(b'{{"op":"exec","argv":["touch","escaped.txt"]}}\\n')
    s.settimeout(10)
    print("answered" if s.recv(100) else "closed")
except OSError as exc:
    print("unreachable", type(exc).__name__)
"""
        got = cli("exec", "a", "--", "python3", "-c", probe)
        assert got.stdout.startswith(("unreachable", "closed")), got
        time.sleep(0.5)
        assert not (workspace / "escaped.txt").exists()
        info = json.loads(
            next(line for line in cli("ls", "--json").stdout.splitlines() if '"b"' in line)
        )
        assert info["execs"] == 0  # b ran nothing for a
    finally:
        for name in ("a", "b"):
            cli("rm", "--force", name)
        shutil.rmtree(base, ignore_errors=True)


def test_the_keeper_refuses_sandboxed_peers(tmp_path: Path) -> None:
    """``refusal`` on real processes: a run's marker, another mount namespace, a descendant
    of the keeper; a plain process of this uid is served."""
    from sandboxrun.cli.keeper import refusal

    with subprocess.Popen(["sleep", "60"]) as other_keeper:  # a keeper not above anything
        try:
            keeper = other_keeper.pid
            assert refusal(os.getpid(), os.getuid(), keeper=keeper) is None
            assert refusal(os.getpid(), os.getuid() + 1, keeper=keeper) == (
                f"uid {os.getuid() + 1}"
            )
            assert refusal(0, os.getuid(), keeper=keeper) is not None
            env = {**os.environ, "SANDBOXRUN_RUN_ID": "0123456789abcdef"}
            with subprocess.Popen(["sleep", "30"], env=env) as marked_child:
                try:
                    time.sleep(0.1)
                    why = refusal(marked_child.pid, os.getuid(), keeper=keeper)
                    assert why is not None and "marker" in why
                finally:
                    marked_child.kill()
            with subprocess.Popen(["sleep", "30"]) as child:
                try:
                    time.sleep(0.1)
                    assert refusal(child.pid, os.getuid(), keeper=keeper) is None
                    assert refusal(child.pid, os.getuid(), keeper=os.getpid()) == (
                        "a command of this sandbox"
                    )
                finally:
                    child.kill()
            if os.getuid() == 0 and shutil.which("unshare"):
                with subprocess.Popen(["unshare", "-m", "sleep", "30"]) as other:
                    try:
                        time.sleep(0.3)
                        why = refusal(other.pid, 0, keeper=keeper)
                        assert why is not None and "mnt namespace" in why
                    finally:
                        other.kill()
        finally:
            other_keeper.kill()


def test_a_killed_client_feeding_stdin_ends_its_run(
    workspace: Path, backend: str, runtime: Path
) -> None:
    """The command never reads its stdin: the client's stdin fills the keeper's window, yet
    the client's death (and, before it, a ^C) is seen at once."""
    assert cli("create", "--name", "fed", "-w", str(workspace), "-b", backend).returncode == 0
    try:
        for how in (signal.SIGINT, signal.SIGKILL):
            with subprocess.Popen(["yes"], stdout=subprocess.PIPE) as feeder:
                client_proc = subprocess.Popen(
                    [*CLI, "exec", "-i", "fed", "--", "sh", "-c", "echo up; exec sleep 4326.5"],
                    stdin=feeder.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                )  # fmt: skip
                assert client_proc.stdout is not None
                assert client_proc.stdout.readline() == b"up\n"
                time.sleep(0.5)  # the window is full by now
                client_proc.send_signal(how)
                deadline = time.monotonic() + 15
                while processes_mentioning("4326.5") and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert processes_mentioning("4326.5") == [], (
                    f"the run outlived its client ({how.name})"
                )
                client_proc.kill()
                client_proc.communicate()
                feeder.kill()
        (item,) = [json.loads(line) for line in cli("ls", "--json").stdout.splitlines()]
        assert item["running"] == 0
    finally:
        assert cli("rm", "--force", "fed").returncode == 0


def test_rm_force_waits_out_a_long_grace_and_a_stalled_client(
    workspace: Path, backend: str, runtime: Path
) -> None:
    """rm --force ends a TERM-ignoring command after its grace (here longer than the keeper's
    answer bound), while another client is stopped and reads nothing: the keeper removes
    everything itself (its log says so), it is not killed, and the running client learns why."""
    made = cli("create", "--name", "slow", "-w", str(workspace), "-b", backend, "--grace", "12s")
    assert made.returncode == 0, made.stderr
    stubborn = subprocess.Popen(
        [*CLI, "exec", "slow", "--", "sh", "-c", "trap '' TERM; echo up; sleep 4327.5; sleep 60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    stalled = subprocess.Popen(
        [*CLI, "exec", "slow", "--", "sh", "-c", "echo up; yes"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"up\n"
    assert stalled.stdout is not None and stalled.stdout.readline() == b"up\n"
    stalled.send_signal(signal.SIGSTOP)
    log_before = (runtime / "slow.log").read_text()
    started = time.monotonic()
    forced = cli("rm", "--force", "slow")
    took = time.monotonic() - started
    assert forced.returncode == 0, forced.stderr
    assert 10 < took < 40, took  # the grace was waited out, not cut short by a kill
    _, err = stubborn.communicate(timeout=30)
    assert stubborn.returncode == 130, err
    assert b"removed by rm --force" in err
    stalled.send_signal(signal.SIGKILL)
    stalled.communicate()
    assert "removed: removed by rm --force" not in log_before
    nothing_left(workspace, "4327.5")
