"""``sandboxrun.ray.SandboxPool`` on a real Ray cluster (a head and two worker nodes started
with ``ray start``, ``tests/ray_cluster.py``) and the real Docker engine: placement per node,
``map`` in order, at most ``max_in_flight`` running, a command never run twice when its actor,
its raylet or its whole node is killed mid-command, nothing left after a driver SIGKILL, a
remote timeout and ``ray.cancel``, a node without an engine, sticky sessions, the reaper, and a
cluster that never talks to anything but loopback."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import textwrap
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import docker
import pytest
import ray_cluster
from helpers import processes_mentioning, require_backend, wait_until

pytestmark = pytest.mark.timeout(600)

PREAMBLE = textwrap.dedent(
    """
    import json, os, sys, time
    import ray
    ray.init(address="127.0.0.1:6379", logging_level="ERROR")
    from sandboxrun import Mount, Policy
    from sandboxrun.ray import SandboxPool

    def say(event, **kw):
        print(json.dumps({"event": event, **kw}), flush=True)

    def res(r):
        return {"status": r.status, "stdout": r.stdout, "stderr": r.stderr[-500:],
                "error": r.error, "via": r.via, "exit_code": r.exit_code,
                "duration_s": r.duration_s, "backend": r.backend}

    ARGS = json.loads(sys.argv[1])
    MARKS = Policy(mounts=(Mount(source=ARGS["marks"], target="/marks", read_only=False),))

    def pool(**kw):
        kw.setdefault("backend", "docker")
        kw.setdefault("root", ARGS["root"])
        return SandboxPool(**kw)
    """
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ray_cluster.Cluster]:
    why = ray_cluster.why_not()
    if why is not None:
        if os.environ.get("SANDBOXRUN_REQUIRE_RAY") == "1":
            pytest.fail(f"the Ray tests are required (SANDBOXRUN_REQUIRE_RAY) but: {why}")
        pytest.skip(why)
    require_backend("docker")
    made = ray_cluster.start({"sbr-w1": 3, "sbr-w2": 3})
    try:
        yield made
    finally:
        hosts = {"sbr-head", *made.nodes, "sbr-w3", "sbr-w4", "sbr-driver"}
        made.stop()
        left = containers_of(hosts)
        for cid in left:  # (then failed below: a test must leave none)
            with suppress(Exception):
                docker.from_env().api.remove_container(cid, force=True)
        assert not left, f"containers of the cluster left: {left}"


@pytest.fixture
def marks(cluster: ray_cluster.Cluster, tmp_path: Path) -> Path:
    path = cluster.root / f"marks-{time.monotonic_ns()}"
    path.mkdir()
    path.chmod(0o777)
    return path


def args(cluster: ray_cluster.Cluster, marks: Path, **extra: Any) -> str:
    root = cluster.root / f"ws-{time.monotonic_ns()}"
    return json.dumps({"marks": str(marks), "root": str(root), **extra})


def containers_of(hosts: set[str]) -> list[str]:
    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": "sandboxrun.managed=true"})
    finally:
        client.close()
    return [str(c["Id"]) for c in found if c["Labels"].get("sandboxrun.owner_host") in hosts]


def run_driver(cluster: ray_cluster.Cluster, body: str, argv: str) -> dict[str, Any]:
    """A driver that prints one ``done`` line, run to its end."""
    done = cluster.python(PREAMBLE + textwrap.dedent(body), argv, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    for line in reversed(done.stdout.splitlines()):
        got = json.loads(line) if line.startswith("{") else None
        if got and got.get("event") == "done":
            return dict(got)
    raise AssertionError(f"no done line: {done.stdout[-2000:]} {done.stderr[-2000:]}")


def test_placement_per_node_and_never_past_the_slots(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """``per_node=2``: two warm sandboxes on each worker node (their actors' node ids), none
    on the head (no ``sandbox_slots``); ``size=9`` on 3 + 3 slots: six, never more."""
    got = run_driver(
        cluster,
        """
        with pool(per_node=2) as p:
            two = [(s["host"], s["backend"], s["state"]) for s in p.slots()]
            ran = res(p.exec(["sh", "-c", "cat /proc/1/cgroup >/dev/null; echo in"]))
            st = p.stats()
        with pool(size=9, acquire_timeout_s=0) as p:
            nine = [s["host"] for s in p.slots()]
            size = p.stats().size
        say("done", two=two, ran=ran, nine=nine, size=size, nodes=st.nodes)
        """,
        args(cluster, marks),
    )
    assert sorted(got["two"]) == [
        ["sbr-w1", "docker", "ready"],
        ["sbr-w1", "docker", "ready"],
        ["sbr-w2", "docker", "ready"],
        ["sbr-w2", "docker", "ready"],
    ]
    assert got["nodes"] == {"sbr-w1": 2, "sbr-w2": 2}
    assert got["ran"]["status"] == "completed" and got["ran"]["stdout"] == "in\n", got["ran"]
    assert got["ran"]["via"] == "supervisor", got["ran"]
    assert sorted(got["nine"]) == ["sbr-w1"] * 3 + ["sbr-w2"] * 3 and got["size"] == 9


def test_map_returns_every_result_in_order_with_at_most_max_in_flight(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """1,000 commands through ``map`` on four slots: every result, in order. Forty that
    each take 0.3 s with ``max_in_flight=2``: never more than two at once (from the
    commands' own clocks). With ``fresh`` (the default), no command sees another's file; with
    ``reset`` too, and the slots' sandboxes are reset in place (two containers for twelve)."""
    got = run_driver(
        cluster,
        """
        with pool(size=4, fresh=False) as p:
            t = time.monotonic()
            out = [r.stdout for r in p.map([["echo", str(i)] for i in range(1000)])]
            took = time.monotonic() - t
            spans = [r.stdout.split() for r in p.map(
                ["date +%s.%N; sleep 0.3; date +%s.%N"] * 40, max_in_flight=2)]
        with pool(size=2) as p:
            fresh = [r.status for r in p.map(
                ["test ! -e /tmp/seen && touch /tmp/seen && test ! -e seen && touch seen"] * 12)]
        with pool(size=2, reset=True) as p:
            reset = [r.stdout for r in p.map(
                ["test ! -e /tmp/seen && touch /tmp/seen && test ! -e seen && touch seen && "
                 "cat /etc/hostname"] * 12)]
        say("done", out=out, took=took, spans=spans, fresh=fresh, reset=reset)
        """,
        args(cluster, marks),
    )
    assert got["out"] == [f"{i}\n" for i in range(1000)]
    events = sorted(
        [(float(a), 1) for a, _ in got["spans"]] + [(float(b), -1) for _, b in got["spans"]]
    )
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most == 2, got["spans"]  # 2 at once (and not 1: the limit is used)
    assert got["fresh"] == ["completed"] * 12
    # with reset: as fresh (each saw no earlier file), on the slots' two containers, reset
    assert all(out.strip() for out in got["reset"]), got["reset"]
    assert len(set(got["reset"])) <= 2, got["reset"]


def test_a_killed_actor_never_runs_its_command_twice(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """SIGKILL the actor holding a running command: its marker ran exactly once, the result
    is ``sandbox_error`` naming the actor, the pool replaces the slot, and within 5 s none of
    the command's processes (a ``setsid`` child among them) and no container of it is left."""
    driver = cluster.driver(
        PREAMBLE
        + textwrap.dedent(
            """
            with pool(size=2, policy=MARKS) as p:
                run = p.submit(
                    "echo ran >> /marks/count; setsid sleep 9410001.5 & sleep 9410001.5")
                say("submitted", pid=run.slot.pid, host=run.slot.host)
                r = run.result()
                deadline = time.monotonic() + 60
                while p.stats().ready < 2 and time.monotonic() < deadline:
                    time.sleep(0.1)
                after = res(p.exec("echo again"))
                say("done", result=res(r), stats=p.stats().__dict__, after=after,
                    pids=[s["pid"] for s in p.slots()])
            """
        ),
        args(cluster, marks),
    )
    try:
        sub = driver.expect("submitted")
        assert wait_until(lambda: len(processes_mentioning("9410001.5")) >= 2, 30)
        assert containers_owned_by(sub["pid"]), "the actor's sandbox has no container"
        os.kill(sub["pid"], signal.SIGKILL)
        killed = time.monotonic()
        assert wait_until(lambda: not processes_mentioning("9410001.5"), 5)
        assert wait_until(
            lambda: not containers_owned_by(sub["pid"]), 5 - (time.monotonic() - killed)
        )
        done = driver.expect("done")
    finally:
        driver.kill()
    result = done["result"]
    assert result["status"] == "sandbox_error" and result["via"] == "ray", result
    assert f"actor (pid {sub['pid']}) on {sub['host']} died" in result["error"], result
    assert "not run again" in result["error"]
    assert (marks / "count").read_text() == "ran\n"
    assert done["stats"]["lost"] == 1 and done["stats"]["ready"] == 2, done["stats"]
    assert sub["pid"] not in done["pids"]
    assert done["after"]["status"] == "completed"


def containers_owned_by(pid: int) -> list[str]:
    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": f"sandboxrun.owner_pid={pid}"})
    finally:
        client.close()
    return [str(c["Id"]) for c in found]


@pytest.mark.parametrize("fault", ["raylet", "node"])
def test_a_lost_node_never_runs_a_command_twice(
    cluster: ray_cluster.Cluster, marks: Path, fault: str
) -> None:
    """A third node whose raylet is SIGKILLed (or every process of it, the whole node)
    while each slot runs a command: the commands on it end ``sandbox_error`` naming the lost
    node, each marker ran once, its processes and containers are gone within 5 s, the
    capacity comes back on the nodes left, and the other nodes' commands were untouched."""
    cluster.add_node("sbr-w3", 1)
    driver = cluster.driver(
        PREAMBLE
        + textwrap.dedent(
            """
            with pool(size=3, per_node=None, policy=MARKS) as p:
                hosts = sorted(s["host"] for s in p.slots())
                runs = [p.submit(f"echo {i} >> /marks/$MARK; sleep 9410002.5",
                                 env={"MARK": f"m{i}"}, timeout=60) for i in range(3)]
                say("submitted", hosts=hosts, runs=[r.slot.host for r in runs])
                lost = [i for i, r in enumerate(runs) if r.slot.host == "sbr-w3"][0]
                r = runs[lost].result()
                for i, other in enumerate(runs):
                    if i != lost:
                        other.cancel()
                others = [res(o.result()) for i, o in enumerate(runs) if i != lost]
                deadline = time.monotonic() + 60
                while p.stats().ready < 3 and time.monotonic() < deadline:
                    time.sleep(0.1)
                say("done", result=res(r), others=others, stats=p.stats().__dict__,
                    hosts=sorted(s["host"] for s in p.slots()))
            """
        ),
        args(cluster, marks),
    )
    try:
        sub = driver.expect("submitted")
        assert sub["hosts"] == ["sbr-w1", "sbr-w2", "sbr-w3"], sub
        assert wait_until(lambda: len(list(marks.iterdir())) == 3, 30)
        assert wait_until(lambda: len(processes_mentioning("9410002.5")) >= 3, 30)
        if fault == "raylet":
            cluster.kill_raylet("sbr-w3")
        else:
            cluster.kill_node("sbr-w3")
        killed = time.monotonic()

        def left_on_w3() -> bool:
            return bool(containers_of({"sbr-w3"})) or len(processes_mentioning("9410002.5")) > 2

        assert wait_until(lambda: not left_on_w3(), 5), (
            containers_of({"sbr-w3"}),
            processes_mentioning("9410002.5"),
        )
        gone_s = time.monotonic() - killed
        done = driver.expect("done", 120)
    finally:
        driver.kill()
        cluster.forget("sbr-w3")
    result = done["result"]
    assert result["status"] == "sandbox_error", result
    said = result["error"]  # (Ray reports a lost node as the node's, or its actor's, loss)
    assert any(w in said for w in ("node sbr-w3", "sbr-w3 died", "sbr-w3 became unreachable")), (
        result
    )
    assert "not run again" in said, result
    assert [o["status"] for o in done["others"]] == ["cancelled", "cancelled"], done["others"]
    assert sorted(p.read_text() for p in marks.iterdir()) == ["0\n", "1\n", "2\n"]
    assert done["stats"]["lost"] == 1 and done["stats"]["ready"] == 3, done["stats"]
    assert "sbr-w3" not in done["hosts"] and len(done["hosts"]) == 3, done["hosts"]
    assert gone_s < 5


def test_a_killed_driver_leaves_nothing(cluster: ray_cluster.Cluster, marks: Path) -> None:
    """SIGKILL the driver while each of its slots runs a command: Ray's fate sharing ends its
    actors, their sandboxes end with them: no process and no container within 10 s."""
    driver = cluster.driver(
        PREAMBLE
        + textwrap.dedent(
            """
            p = pool(size=2).open()
            runs = [p.submit("setsid sleep 9410003.5 & sleep 9410003.5") for _ in range(2)]
            say("submitted", pids=[r.slot.pid for r in runs])
            time.sleep(600)
            """
        ),
        args(cluster, marks),
    )
    try:
        sub = driver.expect("submitted")
        assert wait_until(lambda: len(processes_mentioning("9410003.5")) >= 4, 30)
        assert all(containers_owned_by(p) for p in sub["pids"]), "a slot without a container"
    finally:
        driver.kill()
    assert wait_until(lambda: not processes_mentioning("9410003.5"), 10)
    assert wait_until(lambda: not any(containers_owned_by(p) for p in sub["pids"]), 10)


def test_remote_timeout_and_cancel_leave_no_survivor(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """A command past its timeout on a node ends ``timed_out``, one cancelled from the
    driver (``RayRun.cancel``: ``ray.cancel``) ends ``cancelled``; neither leaves a process
    (TERM-ignoring, ``setsid`` children) and the slot runs the next command."""
    hostile = "trap '' TERM; setsid sh -c \"trap '' TERM; sleep 9410004.5\" & sleep 9410004.5"
    got = run_driver(
        cluster,
        f"""
        def count():
            return int(os.popen("pgrep -f 'sleep 941000[4].5' | wc -l").read().strip())

        def until_none():
            deadline = time.monotonic() + 10
            while count() and time.monotonic() < deadline:
                time.sleep(0.05)
            return count()

        with pool(size=1, fresh=False) as p:  # (the slot's one sandbox: nothing replaces it)
            timed = res(p.exec({hostile!r}, timeout=1))
            after_timeout = until_none()
            run = p.submit({hostile!r})
            deadline = time.monotonic() + 30
            while count() < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            running = count()
            run.cancel()
            cancelled = res(run.result())
            after_cancel = until_none()
            after = res(p.exec("echo next"))
        say("done", timed=timed, cancelled=cancelled, after=after, running=running,
            after_timeout=after_timeout, after_cancel=after_cancel)
        """,
        args(cluster, marks),
    )
    assert got["timed"]["status"] == "timed_out", got["timed"]
    assert got["cancelled"]["status"] == "cancelled", got["cancelled"]
    assert got["after"]["stdout"] == "next\n"
    assert got["running"] >= 2, got  # the command and its setsid child, both seen running
    assert got["after_timeout"] == 0 and got["after_cancel"] == 0, got  # before any close
    assert not processes_mentioning("9410004.5")


def test_a_node_without_docker_is_barred_and_work_goes_elsewhere(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """A node whose Docker engine is unreachable: its slots fail to open, the pool bars the
    node with the engine's error and puts its sandboxes on the others."""
    cluster.add_node("sbr-w4", 2, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    try:
        got = run_driver(
            cluster,
            """
            with pool(per_node=1) as p:
                hosts = sorted(s["host"] for s in p.slots())
                st = p.stats()
                out = [r.status for r in p.map(["true"] * 6)]
            say("done", hosts=hosts, unusable=st.unusable, out=out)
            """,
            args(cluster, marks),
        )
    finally:
        cluster.kill_node("sbr-w4")
    assert got["hosts"] == ["sbr-w1", "sbr-w2"], got
    assert list(got["unusable"]) == ["sbr-w4"], got
    assert "docker" in got["unusable"]["sbr-w4"].lower(), got["unusable"]
    assert got["out"] == ["completed"] * 6


def test_a_session_is_sticky_and_its_loss_is_reported_never_moved(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """A session keeps one sandbox (a file in /tmp, a job started in it) on one slot; when
    that slot's actor is killed the session's next commands are ``sandbox_error`` and run
    nowhere (the marker file gets nothing more)."""
    driver = cluster.driver(
        PREAMBLE
        + textwrap.dedent(
            """
            with pool(size=2, policy=MARKS) as p:
                with p.session() as s:
                    a = res(s.exec("echo kept > /tmp/state; echo 1 >> /marks/log"))
                    b = res(s.exec("cat /tmp/state; echo 2 >> /marks/log"))
                    say("kill", pid=s.slot.pid, host=s.host)
                    sys.stdin.readline()
                    deadline = time.monotonic() + 30
                    while p.stats().lost < 1 and time.monotonic() < deadline:
                        time.sleep(0.1)  # (the pool sees the loss, no command needed)
                    seen = p.stats().__dict__
                    c = res(s.exec("echo 3 >> /marks/log"))
                    d = res(s.exec("echo 4 >> /marks/log"))
                    lost = s.lost
                say("done", a=a, b=b, c=c, d=d, lost=lost, seen=seen)
            """
        ),
        args(cluster, marks),
    )
    try:
        kill = driver.expect("kill")
        os.kill(kill["pid"], signal.SIGKILL)
        time.sleep(1)
        driver.send("go")
        done = driver.expect("done")
    finally:
        driver.kill()
    assert done["b"]["stdout"] == "kept\n", done["b"]
    assert done["c"]["status"] == "sandbox_error" and done["d"]["status"] == "sandbox_error"
    assert "not moved" in done["d"]["error"] and f"pid {kill['pid']}" in done["lost"], done
    assert (marks / "log").read_text() == "1\n2\n"
    seen = done["seen"]  # (replaced while the session still ran, not at its end)
    assert seen["lost"] == 1 and seen["ready"] + seen["starting"] == 2, seen


def test_the_reaper_removes_only_this_nodes_dead_owners(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """Containers labelled as sandboxes of node sbr-w1 with a dead owner are removed when a
    pool opens (each node's reaper sweeps); one of sbr-w1 whose owner lives, and one of
    another host with a dead owner, are left alone."""
    client = docker.from_env()
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) - 7  # (no such process)
    assert not os.path.exists(f"/proc/{dead}")
    image = "sandboxrun/base:0.1.0"
    made: dict[str, str] = {}
    now = str(int(time.time()))
    try:
        for name, host, pid in (
            ("dead", "sbr-w1", dead),
            ("live", "sbr-w1", 1),
            ("other", "not-a-node-of-the-cluster", dead),
        ):
            created = client.api.create_container(
                image,
                command=["sleep", "infinity"],
                labels={
                    "sandboxrun.managed": "true",
                    "sandboxrun.owner_host": host,
                    "sandboxrun.owner_pid": str(pid),
                    "sandboxrun.created": now,
                },
                host_config=client.api.create_host_config(network_mode="none"),
            )
            made[name] = created["Id"]
        got = run_driver(
            cluster,
            """
            with pool(size=1) as p:
                p.exec("true")
            say("done")
            """,
            args(cluster, marks),
        )
        assert got["event"] == "done"
        ids = {c["Id"] for c in client.api.containers(all=True)}
        assert made["dead"] not in ids
        assert made["live"] in ids and made["other"] in ids
    finally:
        for cid in made.values():
            with suppress(Exception):
                client.api.remove_container(cid, force=True)
        client.close()


def test_a_session_after_its_block_and_malformed_options_cost_no_one_a_slot(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """A session used after its block sends nothing (``InputError``), and if a racing
    thread sends anyway, the slot refuses the ended session (``spawn_error``) without
    touching the other caller's command now running there. Malformed options are a
    ``ConfigError`` on the driver, a session survives them, and a ``str`` stdin is sent as
    UTF-8."""
    got = run_driver(
        cluster,
        """
        from sandboxrun import ConfigError, InputError
        with pool(size=1, policy=MARKS) as p:
            with p.session() as s:
                first = res(s.exec("echo in >> /marks/log; echo in"))
                try:
                    s.exec(["true"], env=["A"])
                    in_session = "sent"
                except ConfigError as exc:
                    in_session = str(exc)
                still = res(s.exec("echo still"))
            other = p.submit("sleep 3; echo other >> /marks/log; echo other")
            time.sleep(1)
            try:
                s.exec("echo late >> /marks/log")
                late = "sent"
            except InputError as exc:
                late = str(exc)
            s.ended = False  # (what a thread racing the block's end may have seen)
            stale = res(s.exec("echo stale >> /marks/log"))
            other = res(other.result())
            bad = []
            for kw in ({"env": ["A"]}, {"env": {"A": 1}}, {"stdin": 5},
                       {"pass_env": "HOME"}, {"path_prepend": [1]}, {"workdir": 3},
                       {"shell": ["echo"]}):
                try:
                    p.submit(["true"], **kw)
                    bad.append("sent")
                except ConfigError as exc:
                    bad.append(str(exc))
            text = res(p.exec(["cat"], stdin="h\u00e9llo"))
            st = p.stats()
        say("done", first=first, in_session=in_session, still=still, late=late, stale=stale,
            other=other, bad=bad, text=text, lost=st.lost, runs=st.runs)
        """,
        args(cluster, marks),
    )
    assert got["first"]["stdout"] == "in\n" and got["still"]["stdout"] == "still\n", got
    assert "env must be a mapping" in got["in_session"], got["in_session"]
    assert "ended" in got["late"], got["late"]
    assert got["stale"]["status"] == "spawn_error" and "ended" in got["stale"]["error"], got
    assert got["other"]["status"] == "completed" and got["other"]["stdout"] == "other\n", got
    names = ["env", "env", "stdin", "pass_env", "path_prepend", "workdir", "shell"]
    assert [b.split(" ")[0] for b in got["bad"]] == names, got["bad"]
    assert got["text"]["stdout"] == "h\u00e9llo", got["text"]
    assert got["lost"] == 0 and got["runs"] == 2, got
    assert (marks / "log").read_text() == "in\nother\n"


def test_a_session_failing_as_its_block_ends_still_gives_back_a_clean_slot(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """A thread's command in the session fails just as the block ends (here: at the moment
    ``ended`` is set): the block's end still ends the session on the slot, so the next
    command there runs at once instead of waiting for the session's sandbox to come back
    (``open_timeout_s``) and failing."""
    got = run_driver(
        cluster,
        """
        import sandboxrun.integrations.ray.pool as P

        class Racing(P.RaySession):
            def __setattr__(self, name, value):
                super().__setattr__(name, value)
                if name == "ended" and value:
                    self._give_up("a racing thread's command failed")

        P.RaySession = Racing
        with pool(size=1, open_timeout_s=10) as p:
            with p.session() as s:
                s.exec("true")
            t = time.monotonic()
            after = res(p.exec("echo next"))
            took = time.monotonic() - t
            st = p.stats()
        say("done", after=after, took=took, lost=st.lost, session_lost=s.lost)
        """,
        args(cluster, marks),
    )
    assert got["after"]["stdout"] == "next\n" and got["took"] < 5, got
    assert got["lost"] == 0 and got["session_lost"] is None, got


def test_a_refused_command_keeps_a_shared_sandbox(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """In a pool whose commands share their slot's sandbox (``fresh=False``), a command the
    slot refuses for what it is (a bad variable name) leaves that sandbox and its files."""
    got = run_driver(
        cluster,
        """
        with pool(size=1, fresh=False) as p:
            first = res(p.exec("echo kept > /tmp/f"))
            bad = res(p.exec(["true"], env={"A=B": "x"}))
            after = res(p.exec("cat /tmp/f"))
        say("done", first=first, bad=bad, after=after)
        """,
        args(cluster, marks),
    )
    assert got["bad"]["status"] == "spawn_error", got["bad"]
    assert got["after"]["stdout"] == "kept\n", got


def test_an_actor_lost_just_after_its_command_is_never_handed_out_again(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """The actor dies after its command completed, and the pool sees its loss (the watch)
    while the command's caller waits for the result: the slot is given up at once and the
    result kept, so the next command goes to a live slot."""
    got = run_driver(
        cluster,
        """
        with pool(size=1) as p:
            with p._lock:  # (the keeper waits: the events below come in this order)
                run = p.submit("echo one")
                ray.wait([run.ref], timeout=60)
                slot = run.slot
                ray.kill(slot.actor, no_restart=True)
                ended, _ = ray.wait([slot.watch_ref], timeout=60)
                assert ended, "the watch did not end"
                run.waited = True  # (its caller is in result(): the pool's look leaves it)
                while slot.watch_ref is not None:
                    p._pump(0.2)  # the pool sees the watch end
                seen = slot.state
                one = res(run.result())  # the caller takes the result in
                state = slot.state
            two = res(p.exec("echo two"))
            st = p.stats()
        say("done", seen=seen, state=state, one=one, two=two, lost=st.lost)
        """,
        args(cluster, marks),
    )
    assert got["one"]["status"] == "completed" and got["one"]["stdout"] == "one\n", got
    assert got["seen"] == "lost" and got["state"] == "lost", got
    assert got["two"]["status"] == "completed" and got["two"]["stdout"] == "two\n", got
    assert got["lost"] == 1, got


def test_map_past_the_live_slots_waits_for_its_own_commands(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """``max_in_flight`` above the pool's slots: the commands past them wait for the map's
    own commands to give a slot back, however long those take, instead of failing with
    ``PoolExhaustedError`` after ``acquire_timeout_s``."""
    got = run_driver(
        cluster,
        """
        with pool(size=2, acquire_timeout_s=0.5) as p:
            out = [r.stdout for r in p.map([f"sleep 1.5; echo {i}" for i in range(6)],
                                           max_in_flight=5)]
        say("done", out=out)
        """,
        args(cluster, marks),
    )
    assert got["out"] == [f"{i}\n" for i in range(6)], got


def test_a_node_that_joins_after_the_pool_opened_gets_a_reaper(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """A node that joins an open pool's cluster gets a reaper: a container of it whose
    owner is dead is removed while the pool is open."""
    client = docker.from_env()
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) - 9  # (no such process)
    assert not os.path.exists(f"/proc/{dead}")
    driver = cluster.driver(
        PREAMBLE
        + textwrap.dedent(
            """
            with pool(per_node=1) as p:
                say("open")
                sys.stdin.readline()
                reapers = sorted(host for host, _ in p._reapers.values())
            say("done", reapers=reapers)
            """
        ),
        args(cluster, marks),
    )
    made = None
    try:
        driver.expect("open")
        created = client.api.create_container(
            "sandboxrun/base:0.1.0",
            command=["sleep", "infinity"],
            labels={
                "sandboxrun.managed": "true",
                "sandboxrun.owner_host": "sbr-w3",
                "sandboxrun.owner_pid": str(dead),
                "sandboxrun.created": str(int(time.time())),
            },
            host_config=client.api.create_host_config(network_mode="none"),
        )
        made = created["Id"]
        cluster.add_node("sbr-w3", 1)

        def gone() -> bool:
            return made not in {c["Id"] for c in client.api.containers(all=True)}

        assert wait_until(gone, 60), "the joined node's dead owner's container was left"
        driver.send("go")
        done = driver.expect("done")
    finally:
        driver.kill()
        cluster.forget("sbr-w3")
        cluster.wait_gone("sbr-w3")  # (the tests after this one place slots on nodes alive)
        if made is not None:
            with suppress(Exception):
                client.api.remove_container(made, force=True)
        client.close()
    assert done["reapers"] == ["sbr-w1", "sbr-w2", "sbr-w3"], done


def test_the_cluster_talks_to_loopback_only(cluster: ray_cluster.Cluster) -> None:
    """The namespace has only ``lo``; every node's address is 127.0.0.1; every TCP peer the
    sampler saw over the whole module is a loopback address (runs last in the module)."""
    assert cluster.interfaces() == ["lo"]
    assert cluster.addresses() <= {"127.0.0.1/8", "::1/128"}, cluster.addresses()
    nodes = cluster.alive_nodes()
    assert {n["address"] for n in nodes} == {"127.0.0.1"}, nodes
    peers = cluster.peers()
    assert peers, "the sampler saw no connection at all"
    assert all(loopback(p) for p in peers), peers


def loopback(peer: str) -> bool:
    address = ipaddress.ip_address(peer.strip("[]").split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@pytest.mark.parametrize(
    ("peer", "ok"),
    [
        ("127.0.0.1", True),
        ("[::ffff:127.0.0.1]", True),
        ("[::1]", True),
        ("127.3.2.1", True),
        ("192.0.2.2", False),
        ("[::ffff:192.0.2.2]", False),
        ("[2001:db8::1]", False),
    ],
)
def test_what_counts_as_loopback(peer: str, ok: bool) -> None:
    assert loopback(peer) is ok


def test_a_cancel_while_waiting_for_a_sandbox_and_bad_input_cost_no_slot(
    cluster: ray_cluster.Cluster, marks: Path
) -> None:
    """A command cancelled while its ``fresh`` slot still opens its next sandbox gives that
    sandbox back (the next command runs at once, not after the open timeout); a command the
    slot refuses for what it is (a bad variable name) is ``spawn_error`` and costs no slot;
    an option of the wrong type (a generator) is a ``ConfigError`` on the driver and frees the
    slot."""
    got = run_driver(
        cluster,
        """
        from sandboxrun import ConfigError
        with pool(size=1, open_timeout_s=60) as p:
            p.exec("true")  # the slot now opens its next sandbox
            run = p.submit("echo never")
            run.cancel()
            first = res(run.result())
            t = time.monotonic()
            after = res(p.exec("echo next"))
            took = time.monotonic() - t
            bad = res(p.exec(["true"], env={"A=B": "x"}))
            try:
                p.submit(["true"], pass_env=(x for x in ["HOME"]))
                unsent = "sent"
            except ConfigError as exc:
                unsent = str(exc)
            last = res(p.exec("echo fine"))
            st = p.stats()
        say("done", first=first, after=after, took=took, bad=bad, unsent=unsent, last=last,
            lost=st.lost, ready=st.ready)
        """,
        args(cluster, marks),
    )
    assert got["first"]["status"] == "cancelled", got["first"]
    assert got["after"]["stdout"] == "next\n" and got["took"] < 20, got
    assert got["bad"]["status"] == "spawn_error" and "A=B" in got["bad"]["error"], got["bad"]
    assert "pass_env must be a list" in got["unsent"], got["unsent"]
    assert got["last"]["stdout"] == "fine\n" and got["lost"] == 0, got
