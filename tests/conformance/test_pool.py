"""``SandboxPool`` on every backend: warm sandboxes handed out once, each on a private copy of
the template; a released one is closed with everything it ran (a process that left its
session too) and replaced; a bounded wait names what the pool holds; a failing open is
reported to the waiting acquirer; closing the pool leaves no sandbox, process or workspace."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import processes_mentioning, wait_until

from sandboxrun import (
    ConfigError,
    Limits,
    Policy,
    PolicyRefusedError,
    PoolExhaustedError,
    Sandbox,
    SandboxPool,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def template(tmp_path: Path) -> Path:
    root = tmp_path / "template"
    (root / "src").mkdir(parents=True)
    (root / "src" / "task.txt").write_text("task\n")
    return root


async def test_warm_private_and_handed_out_once(
    backend: str, template: Path, tmp_path: Path
) -> None:
    marker = f"9{uuid.uuid4().int % 10**6:06d}.5"  # a sleep of its own: `sleep 9123456.5`
    root = tmp_path / "pool"
    async with SandboxPool(2, workspace=template, root=root, backend=backend) as pool:
        assert await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: pool.stats().ready == 2, 60)
        ), pool.stats()
        assert pool.stats().opened == 2
        seen: list[str] = []
        async with pool.acquire() as sb:
            assert sb.backend.name == backend  # already open: nothing to wait for
            assert pool.stats().opened == 2 and pool.stats().in_use == 1
            first = await sb.exec(shell="cat src/task.txt; echo changed > src/task.txt; touch mine")
            assert first.ok and first.stdout == "task\n", first
            seen.append(str(sb.workspace.root))
            # a job that outlives the block, and a process of it that left its session
            await sb.start(["sh", "-c", f"setsid sleep {marker} & wait"])
            assert await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: bool(processes_mentioning(marker)), 10)
            )
        # released: closed with what it ran, its workspace gone, a fresh one opening
        assert await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: not processes_mentioning(marker), 30)
        ), "a process of a released sandbox lives"
        assert await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: not Path(seen[0]).exists(), 30)
        ), "a released sandbox's workspace is still there"
        async with pool.acquire() as sb, pool.acquire() as other:
            assert sb is not other
            for each in (sb, other):
                again = await each.exec(shell="cat src/task.txt; ls mine 2>&1 || true")
                assert again.stdout.startswith("task\n") and "No such file" in again.stdout
                seen.append(str(each.workspace.root))
        assert len(set(seen)) == 3
        assert (template / "src" / "task.txt").read_text() == "task\n"  # the template untouched
        stats = pool.stats()
        assert stats.acquired == 3 and stats.failed_opens == 0 and stats.discarded >= 1
    assert not root.exists() or not any(root.iterdir()), "workspaces outlived the pool"
    assert not processes_mentioning(marker)


async def test_a_bounded_wait_names_what_the_pool_holds(backend: str, tmp_path: Path) -> None:
    async with SandboxPool(1, backend=backend, root=tmp_path / "pool") as pool:
        async with pool.acquire(timeout_s=60) as sb:
            with pytest.raises(PoolExhaustedError, match=r"within 0.5s \(size 1: 1 in use"):
                async with pool.acquire(timeout_s=0.5):
                    pass
            assert (await sb.exec(["true"])).ok
        assert pool.stats().waiting == 0
        async with pool.acquire(timeout_s=60) as sb:
            assert (await sb.exec(["true"])).ok


async def test_closing_the_pool_ends_held_and_ready_sandboxes(backend: str, tmp_path: Path) -> None:
    marker = f"9{uuid.uuid4().int % 10**6:06d}.5"
    pool = await SandboxPool(2, backend=backend, root=tmp_path / "pool").open()
    try:
        async with pool.acquire(timeout_s=60) as sb:
            job = await sb.start(["sleep", marker])
            assert await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: bool(processes_mentioning(marker)), 10)
            )
            await pool.aclose()  # while it is held
            assert (await job.wait()).status == "cancelled"
    finally:
        await pool.aclose()
    assert not processes_mentioning(marker)
    assert pool.stats().in_use == 0 and pool.stats().ready == 0


async def test_a_failing_open_is_reported_to_the_acquirer(backend: str, tmp_path: Path) -> None:
    """Every open fails (docker: no such image; a local backend: a writable root, which it
    refuses): the acquirer waits its bound and is told why; nothing is left."""
    failing: dict[str, Any] = (
        {"image": "sandboxrun/no-such-image:never"}
        if backend == "docker"
        else {"policy": Policy(root="writable")}
    )
    async with SandboxPool(1, backend=backend, root=tmp_path / "pool", **failing) as pool:
        with pytest.raises(PoolExhaustedError, match=r"the last open failed: \w+Error"):
            async with pool.acquire(timeout_s=3):
                pass
        stats = pool.stats()
        assert stats.failed_opens >= 1 and stats.opened == 0 and stats.in_use == 0


async def test_many_acquirers_each_get_a_sandbox_of_their_own_within_the_size(
    backend: str, tmp_path: Path
) -> None:
    """Twelve acquirers at once on a pool of two: every one is served, each by a sandbox no
    one had before, and the pool never holds more than two at a time."""
    seen: list[str] = []
    most = 0
    async with SandboxPool(2, backend=backend, root=tmp_path / "pool") as pool:

        async def one() -> None:
            nonlocal most
            async with pool.acquire(timeout_s=120) as sb:
                s = pool.stats()
                most = max(most, s.ready + s.in_use + s.opening + s.closing)
                result = await sb.exec(shell="test ! -e used && touch used && pwd")
                assert result.ok, result
                seen.append(str(sb.workspace.root))

        async with anyio.create_task_group() as group:
            for _ in range(12):
                group.start_soon(one)
        assert pool.stats().acquired == 12
    assert len(set(seen)) == 12 and most <= 2


async def test_reset_neighbours_at_once_never_see_each_other(
    backend: str, template: Path, tmp_path: Path
) -> None:
    """``reset=True``, a pool of two, twelve acquirers at once: each finds no file of another
    in ``/tmp`` or the workspace and leaves its own in both. Their sandboxes are reset while
    the other one runs; the pool never holds more than two; on docker they are reset in
    place, elsewhere replaced."""
    if backend == "systemd-scope":  # (twelve slow opens there, the discard path of process-group)
        pytest.skip("only docker resets in place; process-group covers the discard")
    most = 0
    async with SandboxPool(
        2, workspace=template, root=tmp_path / "pool", backend=backend, reset=True
    ) as pool:

        async def one(i: int) -> None:
            nonlocal most
            async with pool.acquire(timeout_s=120) as sb:
                s = pool.stats()
                most = max(most, s.ready + s.in_use + s.opening + s.closing + s.resetting)
                result = await sb.exec(
                    shell="! ls -A /tmp | grep -q '^used-' && test ! -e used && "
                    f"cat src/task.txt && touch used /tmp/used-{i} && echo x > src/task.txt"
                )
                assert result.ok and result.stdout == "task\n", (i, result)

        async with anyio.create_task_group() as group:
            for i in range(12):
                group.start_soon(one, i)
        stats = pool.stats()
    assert stats.acquired == 12 and most <= 2, (stats, most)
    if backend == "docker":
        assert stats.reset >= 8, stats  # (the last ones may be closed with the pool)
    else:
        assert stats.reset == 0, stats
    assert (template / "src" / "task.txt").read_text() == "task\n"


def alive(pool: SandboxPool) -> int:
    s = pool.stats()
    return s.ready + s.in_use + s.opening + s.closing


async def test_a_pool_larger_than_its_open_concurrency_fills(backend: str, tmp_path: Path) -> None:
    async with SandboxPool(3, backend=backend, open_concurrency=1, root=tmp_path / "p") as pool:
        assert await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: pool.stats().ready == 3, 90)
        ), pool.stats()
        async with pool.acquire(timeout_s=0) as sb:  # 0: one that is ready now
            assert (await sb.exec(["true"])).ok
        with pytest.raises(ConfigError, match="timeout_s must be a number of seconds"):
            async with pool.acquire(timeout_s=-1):
                pass


async def test_a_cancelled_waiter_loses_nothing_and_a_close_elsewhere_is_refused(
    backend: str, tmp_path: Path
) -> None:
    async with SandboxPool(1, backend=backend, root=tmp_path / "pool") as pool:
        async with pool.acquire(timeout_s=60) as sb:
            async with anyio.create_task_group() as group:

                async def waiter() -> None:
                    async with pool.acquire(timeout_s=60):
                        raise AssertionError("a waiter got the held sandbox")

                group.start_soon(waiter)
                assert await anyio.to_thread.run_sync(
                    lambda: wait_until(lambda: pool.stats().waiting == 1, 10)
                )
                group.cancel_scope.cancel()  # while it waits
            assert pool.stats().waiting == 0 and pool.stats().in_use == 1
            refused: list[str] = []

            async def close_elsewhere() -> None:
                try:
                    await pool.aclose()
                except RuntimeError as exc:
                    refused.append(str(exc))

            async with anyio.create_task_group() as other:
                other.start_soon(close_elsewhere)
            assert refused and "closed by the task that opened it" in refused[0]
            assert (await sb.exec(["true"])).ok  # the refused close touched nothing
        assert await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: pool.stats().ready == 1, 60)
        ), pool.stats()
        assert alive(pool) == 1


async def test_a_factory_fills_each_workspace_and_a_failing_one_leaves_nothing(
    backend: str, tmp_path: Path
) -> None:
    made: list[Path] = []

    def factory(path: Path) -> None:
        made.append(path)
        (path / "task.txt").write_text(f"{len(made)}\n")

    root = tmp_path / "pool"
    pool = SandboxPool(1, backend=backend, workspace=factory, root=root)
    async with pool, pool.acquire(timeout_s=60) as sb:
        assert (await sb.exec(["cat", "task.txt"])).stdout == "1\n"

    def broken(path: Path) -> None:
        (path / "half").write_text("x")
        raise OSError(28, "No space left on device")

    async with SandboxPool(1, backend=backend, workspace=broken, root=root) as pool:
        with pytest.raises(PoolExhaustedError, match="No space left on device"):
            async with pool.acquire(timeout_s=1):
                pass
        assert pool.stats().failed_opens >= 1
    assert not list(root.iterdir()), "a failed open left its workspace"


async def test_a_close_while_another_task_holds_one_counts_it_once(
    backend: str, tmp_path: Path
) -> None:
    held = anyio.Event()
    async with anyio.create_task_group() as group:
        pool = await SandboxPool(2, backend=backend, root=tmp_path / "pool").open()

        async def holder() -> None:
            async with pool.acquire(timeout_s=60) as sb:
                held.set()
                await sb.exec(["sleep", "30"])  # cancelled by the close

        group.start_soon(holder)
        await held.wait()
        await pool.aclose()
    stats = pool.stats()
    assert stats.discarded == stats.opened and alive(pool) == 0, stats
    assert pool._slots == 0


@pytest.mark.parametrize("after_s", [0.0, 0.02, 0.05, 0.1, 0.2, 0.4])
async def test_an_open_cancelled_anywhere_leaves_nothing(
    backend: str, workspace: Path, after_s: float
) -> None:
    """What a pool does at every close while a sandbox opens: the open cancelled at any point
    releases what it took (a holder process, its socket: pytest's unraisable-warning check
    fails the test on a leak), and the sandbox can be closed after."""
    sb = Sandbox(workspace, backend=backend)
    with anyio.move_on_after(after_s):
        await sb.open()
    await sb.aclose()
    import gc

    gc.collect()  # a leaked Popen or socket warns now, in this test


async def pids_limit_enforced(backend: str, tmp_path: Path) -> bool:
    """Whether ``backend`` enforces a pids limit here (it refuses one it cannot)."""
    try:
        async with Sandbox(tmp_path, backend=backend, limits=Limits(pids=256)) as sb:
            return "pids-limit" in (await sb.exec(["true"])).isolation
    except PolicyRefusedError:
        return False


@pytest.mark.timeout(420)  # docker: 200 opens at ~0.4 s each on 2 cores, two at a time
@pytest.mark.parametrize("reset", [False, True], ids=["discard", "reset"])
async def test_two_hundred_cycles_with_hostile_users_hand_out_only_clean_sandboxes(
    backend: str, template: Path, tmp_path: Path, reset: bool
) -> None:
    """200 acquire/release cycles, every fourth user hostile in its own way: a ``setsid``
    daemon left running, a file planted in ``/tmp`` and in the workspace, and every
    twentieth a fork bomb (only where the pids limit is enforced). Every sandbox handed out
    is clean: no file of an earlier user in ``/tmp`` or the workspace, the template as it
    was; afterwards no daemon lives and no workspace is left. With ``reset`` (docker only:
    elsewhere it discards, as above) the daemon's and the planter's sandboxes are reset in
    place, a bomb's (timed out) discarded."""
    if reset and backend != "docker":
        pytest.skip("only docker resets in place: elsewhere this is the discard case again")
    marker = f"9{uuid.uuid4().int % 10**6:06d}.5"
    root = tmp_path / "pool"
    bombs = 0
    # the pids limit asked for where the backend can enforce it (docker has one anyway;
    # systemd-scope only when asked, and not under every manager; process-group never)
    enforced = await pids_limit_enforced(backend, tmp_path)
    limited: dict[str, Any] = {"limits": Limits(pids=256)} if enforced else {}
    async with SandboxPool(
        3,
        workspace=template,
        root=root,
        backend=backend,
        open_concurrency=2,
        reset=reset,
        **limited,
    ) as pool:
        for i in range(200):
            async with pool.acquire(timeout_s=120) as sb:
                look = await sb.exec(
                    shell="ls -A /tmp | grep -c '^planted' || true; ls -A; cat src/task.txt"
                )
                assert look.ok and look.stdout == "0\nsrc\ntask\n", (i, look.stdout, look.stderr)
                kind = i % 4
                if kind == 0:
                    started = await sb.exec(shell=f"setsid sleep {marker} > /dev/null 2>&1 &")
                    assert started.ok, started
                elif kind == 1:
                    planted = await sb.exec(
                        shell="echo x > /tmp/planted-$$; echo x > planted; "
                        "echo changed > src/task.txt"
                    )
                    assert planted.ok, planted
                elif kind == 2 and i % 20 == 2 and "pids-limit" in look.isolation:
                    bomb = await sb.exec(shell="b() { b | b & }; b; sleep 30", timeout=1)
                    assert bomb.status in ("timed_out", "failed", "completed"), bomb
                    bombs += 1
        stats = pool.stats()
        assert stats.acquired == 200 and stats.failed_opens == 0, stats
        if reset:  # the 150 harmless and the 50 daemons/planters, less the bombs' 10
            assert stats.reset >= 190 - 3, stats  # (the last three are closed with the pool)
    assert await anyio.to_thread.run_sync(
        lambda: wait_until(lambda: not processes_mentioning(marker), 30)
    ), "a hostile user's daemon outlived its sandbox"
    assert not root.exists() or not any(root.iterdir()), "workspaces outlived the pool"
    assert (template / "src" / "task.txt").read_text() == "task\n"
    assert bombs == (10 if enforced else 0), "where the pids limit holds, every bomb must run"


PROBE = (
    'find /tmp /var/tmp "$HOME" /dev/shm /dev/mqueue -mindepth 1 2>/dev/null | wc -l; '
    "ipcs -m -q 2>/dev/null | grep -c '^0x' || true; "
    "stat -c %a /tmp; test -e /dev/planted && echo planted-dev; ls -A; cat src/task.txt"
)
"""What a sandbox shows of its scratch directories (how many entries), its IPC objects, its
``/tmp``'s mode, ``/dev`` and its workspace: the first holder's view is every holder's."""


@pytest.mark.timeout(300)
async def test_reset_in_place_hands_on_only_what_is_clean(
    backend: str, template: Path, tmp_path: Path
) -> None:
    """``reset=True``, one sandbox: each holder does something hostile, and the next one
    must find a fresh sandbox. What plain commands leave (files in every scratch directory
    and the workspace, a login profile in ``HOME``, modes taken away, a symlink out, System
    V IPC objects, a ``setsid`` daemon that cleared its environment) is undone in place on
    docker; what cannot be checked (a file in ``/dev``, ``/tmp``'s mode changed, a job, a
    timeout) discards it. Elsewhere every release discards (the backend cannot reset). A
    holder's reference is dead after its block, and nothing of any holder outlives the
    pool."""
    if backend == "systemd-scope":  # (eight slow opens there, the discard path of process-group)
        pytest.skip("only docker resets in place; process-group covers the discard with its reason")
    marker = f"9{uuid.uuid4().int % 10**6:06d}.5"
    litter = (
        "echo x > /tmp/a; mkdir -p /tmp/d/e; echo x > /tmp/d/e/f; chmod 000 /tmp/d/e /tmp/d; "
        "echo x > /var/tmp/b; echo 'echo owned' > ~/.profile; mkdir -p ~/.cache; "
        "echo x > /dev/shm/c; echo changed > src/task.txt; echo x > planted; "
        "ln -s /etc outside; mkdir -p locked/in; chmod 000 locked/in locked; "
        "(ipcmk -M 4096 && ipcmk -Q) >/dev/null 2>&1; "
        f"env -i setsid sleep {marker} > /dev/null 2>&1 & true"
    )
    as_root = '[ "$(id -u)" = 0 ]'  # (root owns /dev and /tmp there: it can change them)
    hostile: list[tuple[str, str]] = [
        ("litter", litter),
        ("litter", litter),
        ("dev", f"{as_root} && touch /dev/planted || true"),
        ("mode", f"{as_root} && chmod 700 /tmp || true"),
        ("job", ""),
        ("timeout", "sleep 30"),
        ("litter", litter),
    ]
    kept: list[Sandbox] = []
    fresh: list[str] = []
    async with SandboxPool(
        1, workspace=template, root=tmp_path / "pool", backend=backend, reset=True
    ) as pool:
        for kind, script in hostile:
            async with pool.acquire(timeout_s=120) as sb:
                look = await sb.exec(shell=PROBE)
                fresh = fresh or [look.stdout]
                assert look.ok and look.stdout == fresh[0], (kind, look.stdout, look.stderr)
                assert look.stdout.endswith("src\ntask\n") and "planted" not in look.stdout
                root = (await sb.exec(shell="id -u")).stdout.strip() == "0"
                if kind == "job":
                    await sb.start(["sleep", marker])
                elif kind == "timeout":
                    assert (await sb.exec(shell=script, timeout=0.5)).status == "timed_out"
                else:
                    assert (await sb.exec(shell=script)).ok
                kept.append(sb)
            assert await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: not processes_mentioning(marker), 30)
            ), f"a process of the holder that did {kind!r} outlived its release"
            with pytest.raises(RuntimeError, match="handed back to its pool"):
                await kept[-1].exec(["true"])  # the old holder's reference is dead
            with pytest.raises(RuntimeError, match="handed back to its pool"):
                await kept[-1].write_file("src/task.txt", b"forged\n")
        async with pool.acquire(timeout_s=120) as sb:
            look = await sb.exec(shell=PROBE)
            assert look.ok and look.stdout == fresh[0], look.stdout
        stats = pool.stats()
    # which ones were reset: the litter (3) where the backend can; the others never
    discards = {"dev", "mode", "job", "timeout"} if root else {"job", "timeout"}
    expected_reset = sum(kind not in discards for kind, _ in hostile) if backend == "docker" else 0
    assert stats.reset == expected_reset, stats
    assert stats.acquired == len(hostile) + 1 and stats.failed_opens == 0
    if backend != "docker":
        assert stats.last_discard_reason is not None
        assert f"the {backend} backend cannot reset" in stats.last_discard_reason
    assert not processes_mentioning(marker)
    assert not (tmp_path / "pool").exists() or not any((tmp_path / "pool").iterdir())
    assert (template / "src" / "task.txt").read_text() == "task\n"


FAKE_FIND = r"""#!/bin/sh
# a holder's `find`: spares its own directory when the reset empties /var/tmp, hides it
case " $* " in
  *" -delete "*)
    /usr/bin/find /tmp "$HOME" /dev/shm /dev/mqueue -xdev -mindepth 1 -delete 2>/dev/null
    /usr/bin/find /var/tmp -xdev -mindepth 1 -maxdepth 1 ! -name .b -exec rm -rf {} + 2>/dev/null
    exit 0 ;;
  *) /usr/bin/find "$@" | /bin/grep -v '/var/tmp/\.b' ;;
esac
"""
TROJAN_LS = r"""#!/bin/sh
cat /workspace/next-holder-secret.txt >> /var/tmp/.b/loot 2>/dev/null
exec /bin/ls "$@"
"""
ROOT_XATTRS = r"""
import os, struct
os.setxattr("/workspace", "user.leak", b"from-A")
acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in (
    (0x01, 7, 0xFFFFFFFF), (0x02, 7, 4242), (0x04, 5, 0xFFFFFFFF), (0x10, 7, 0xFFFFFFFF),
    (0x20, 5, 0xFFFFFFFF)))
os.setxattr("/workspace", "system.posix_acl_default", acl)
os.utime("/workspace", (981173106, 981173106))
"""
SEEN_BY_NEXT = (
    "echo LEAK=$LEAK; echo PATH=$PATH; ls -A /var/tmp; "
    "python3 -c 'import os; print(sorted(os.listxattr(\"/workspace\")))'; "
    "stat -c '%n %Y' /workspace /tmp /var/tmp /dev/shm | grep ' 981173106' || true"
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("via", ["profile", "prepend"])
async def test_a_holder_cannot_steer_the_reset_or_leave_its_login_environment(
    backend: str, tmp_path: Path, via: str
) -> None:
    """Review findings: the reset's listing ran through the login snapshot and the sandbox's
    path prepends, so a holder's `find` (in /var/tmp, named by a profile it wrote in $HOME
    and a snapshot it had taken again; or in a prepended workspace directory) hid a directory
    from the reset, and its trojan `ls` stole the next holder's file. The snapshot a holder
    had taken was also handed on; the workspace root's xattrs (a default ACL every later
    file inherits) and the scratch directories' dates survived."""
    if backend != "docker":
        pytest.skip("only docker resets in place")
    prepend = ["/workspace/.venv/bin"] if via == "prepend" else []
    async with SandboxPool(
        1, root=tmp_path / "pool", backend=backend, reset=True, path_prepend=prepend
    ) as pool:
        async with pool.acquire(timeout_s=120) as a:
            fresh = (await a.exec(shell=SEEN_BY_NEXT)).stdout
            assert "LEAK=\n" in fresh and "user.leak" not in fresh, fresh
            bin_dir = "/var/tmp/.b" if via == "profile" else ".venv/bin"
            assert (await a.exec(["mkdir", "-p", "/var/tmp/.b", bin_dir])).ok
            await a.write_file(f"{bin_dir}/find", FAKE_FIND.encode(), mode=0o755)
            await a.write_file(f"{bin_dir}/ls", TROJAN_LS.encode(), mode=0o755)
            await a.write_file("/var/tmp/.b/left-by-A", b"state of holder A\n")
            if via == "profile":
                profile = "export LEAK=from-A PATH=/var/tmp/.b:$PATH"
                assert (await a.exec(shell=f"echo '{profile}' > ~/.profile")).ok
                for i in range(9):  # the default snapshot evicted (8 kept), then taken again
                    assert (await a.exec(["true"], path_prepend=[f"/opt/p{i}"])).ok
                again = await a.exec(shell="echo $LEAK; command -v find")
                assert again.stdout == "from-A\n/var/tmp/.b/find\n", again
            assert (await a.exec(["python3", "-c", ROOT_XATTRS])).ok
            assert (await a.exec(["touch", "-d", "@981173106", "/tmp", "/var/tmp"])).ok
        async with pool.acquire(timeout_s=120) as b:
            seen = await b.exec(shell=SEEN_BY_NEXT)
            assert seen.ok and seen.stdout == fresh, (pool.stats(), seen.stdout)
            await b.write_file("next-holder-secret.txt", b"B's secret\n")
            assert (await b.exec(["ls"])).ok
            await b.write_file("x", b"")
            acl = await b.exec(["python3", "-c", "import os; print(os.listxattr('x'))"])
            assert acl.stdout == "[]\n", acl  # no default ACL inherited from A
        async with pool.acquire(timeout_s=120) as a2:
            loot = await a2.exec(shell="cat /var/tmp/.b/loot /var/tmp/.b/left-by-A; true")
            assert "secret" not in loot.stdout and "holder A" not in loot.stdout, loot
        stats = pool.stats()
    assert stats.reset == 2 and stats.discarded == 0, stats  # cleaned in place, both times


async def test_the_kernel_keyrings_are_refused(backend: str, tmp_path: Path) -> None:
    """The user keyring is the uid's, not the sandbox's: a key one command adds would reach
    every later sandbox (a pool's next holder) and host process of that uid. Every backend
    refuses the keyring calls (docker's profile, the local backends' seccomp filter)."""
    add_key = (
        "import ctypes, os, platform\n"
        "nr = {'x86_64': 248, 'aarch64': 217}[platform.machine()]\n"
        "libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long\n"
        "got = libc.syscall(nr, b'user', b'sandboxrun-test-key', b'v', 1, ctypes.c_int(-4))\n"
        "print(got, ctypes.get_errno())\n"
        "if got >= 0: libc.syscall(nr + 2, 3, ctypes.c_long(got))  # keyctl(KEYCTL_REVOKE)\n"
    )
    async with Sandbox(tmp_path, backend=backend) as sb:
        result = await sb.exec(["python3", "-c", add_key])
    assert result.ok and result.stdout == "-1 1\n", result  # EPERM
