"""``sandboxrun.ray.SandboxPool``: warm sandboxes across the nodes of a Ray cluster.

Each slot is a Ray actor (``Holder``) on one node, holding a warm sandbox there, made with
``max_restarts=0`` and ``max_task_retries=0`` and never as a plain task: a command is sent to
an actor once, and an actor that is lost (killed, its worker crashed, its node gone) is never
restarted or retried, so a command never runs twice. Its result is then ``sandbox_error``
(``via="ray"``, ``error`` naming the actor or node), and the pool opens a slot in its place on
a node with room (``placement.choose``). A node where a sandbox cannot open (no Docker engine,
say) is marked unusable for the pool, with its error, and work goes elsewhere.

The driver's side is synchronous and thread-safe: ``exec``, ``submit`` (a ``RayRun`` to wait
for or cancel), ``map`` (every result, in order, at most ``max_in_flight`` running) and
``session`` (one sandbox for many commands, pinned to its actor: losing it is reported, never
moved). Progress (started slots, finished runs, lost actors) is made by whichever call waits.
A per-node ``Reaper`` removes what a SIGKILLed owner left on its node.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, cast

from sandboxrun.api.pool import Template, check_wait
from sandboxrun.api.request import new_run_id
from sandboxrun.api.sandbox import Sandbox
from sandboxrun.engine import results
from sandboxrun.engine.results import RunFacts
from sandboxrun.errors import ConfigError, InputError, PoolExhaustedError
from sandboxrun.integrations.ray import placement
from sandboxrun.integrations.ray.holder import EXEC_OPTIONS, Holder
from sandboxrun.integrations.ray.reaper import Reaper
from sandboxrun.models import BackendName, ExecResult, Policy, Status, replaced

State = Literal["starting", "ready", "busy", "session", "lost", "closed"]
Command = Sequence[str] | str
"""An argv, or a shell script (run with ``shell=``)."""
STOP_WAIT_S = 30.0
"""How long ``close`` waits for the slots to close their sandboxes before killing them."""
POLL_S = 0.05
SUSPECT_S = 60.0
"""How long a node that lost a slot is placed on only when no other node has room (Ray
may not have seen it die yet)."""
KEEP_S = 0.2
"""The background keeper's longest wait between two looks."""
NODE_CHECK_S = 1.0
"""How often slots still starting are checked for a node that died under them."""


@dataclass
class Slot:
    actor: Any
    node_id: str
    host: str
    state: State = "starting"
    start_ref: Any = None
    pid: int | None = None
    backend: str | None = None
    started: float = field(default_factory=time.monotonic)
    released: float = 0.0
    """When it last became ready (the one ready longest is handed out first: a ``fresh``
    slot just released is still opening its next sandbox)."""
    watch_ref: Any = None
    """``Holder.alive``: ends (with an error) when the slot's actor or node is lost."""
    dead: str | None = None
    """Why the slot's actor is gone, as its watch saw (the slot is then lost)."""
    session: str | None = None
    """The session holding the slot (``SandboxPool.session``), or None."""


@dataclass(frozen=True)
class RayPoolStats:
    """What a Ray pool holds and has done (``SandboxPool.stats``)."""

    size: int
    ready: int
    busy: int
    sessions: int
    starting: int
    nodes: dict[str, int]
    """Live slots per node (by host name)."""
    unusable: dict[str, str]
    """Nodes barred from this pool (by host name), each with the error that barred it."""
    started: int
    lost: int
    """Slots lost with their actor or node (each one's command, if any, ``sandbox_error``)."""
    failed_starts: int
    runs: int
    last_error: str | None


class SandboxPool:
    """``size`` warm sandboxes on the cluster ``ray.init`` connected to, at most ``per_node``
    on a node (and never more than its ``sandbox_slots``); ``size`` None: ``per_node`` on
    every node offering slots. ``fresh``: each command runs in a sandbox no earlier command
    touched (False: the commands sent to a slot share its sandbox, files and all; processes
    never outlive a command either way). ``workspace``: the template of each sandbox's
    workspace (a directory that exists on every node, a callable run on the node, or None);
    ``root``: where workspaces are made on each node. ``reset``: a ``fresh`` slot resets its
    sandbox in place after a command where that can be checked (``SandboxPool(reset=True)``
    on one host: milliseconds, not a new sandbox's open), else replaces it.
    ``sandbox_options``: ``Sandbox(...)``'s (``backend``, ``image``, ``policy``, ``limits``,
    ...)."""

    def __init__(
        self,
        size: int | None = None,
        *,
        per_node: int | None = None,
        workspace: Template = None,
        root: str | None = None,
        fresh: bool = True,
        reset: bool = False,
        open_timeout_s: float = 120.0,
        acquire_timeout_s: float = 300.0,
        reaper: bool = True,
        reap_interval_s: float = 60.0,
        **sandbox_options: Any,
    ) -> None:
        for name, value in (("size", size), ("per_node", per_node)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(f"{name} must be a whole number of at least 1, got {value!r}")
        if size is None and per_node is None:
            raise ConfigError("a Ray SandboxPool needs a size, a per_node count, or both")
        check_wait(open_timeout_s, "open_timeout_s", zero=False)
        check_wait(acquire_timeout_s, "acquire_timeout_s", zero=True)
        check_wait(reap_interval_s, "reap_interval_s", zero=False)
        for taken in ("workspace", "detach", "name"):
            if taken in sandbox_options:
                raise ConfigError(f"SandboxPool takes no {taken!r} for its sandboxes")
        if not isinstance(reset, bool) or not isinstance(fresh, bool):
            raise ConfigError(f"fresh and reset must be True or False, got {fresh!r}, {reset!r}")
        if isinstance(workspace, Path):
            workspace = str(workspace)
        self.size = size
        self.per_node = per_node
        self.template = workspace
        self.root = root
        self.fresh = fresh
        self.reset = reset
        self.open_timeout_s = open_timeout_s
        self.acquire_timeout_s = acquire_timeout_s
        self.reaper = reaper
        self.reap_interval_s = reap_interval_s
        self.sandbox_options = sandbox_options
        self.close_errors: list[str] = []
        self._lock = threading.RLock()
        self._slots: list[Slot] = []
        self._runs: dict[Any, RayRun] = {}
        """Refs of commands under way, to the run each belongs to."""
        self._reapers: dict[str, tuple[str, Any]] = {}
        """node id -> (host, its ``Reaper`` actor): one on every live node offering slots."""
        self._unusable: dict[str, tuple[str, str]] = {}
        """node id -> (host, why)."""
        self._counts = {"started": 0, "lost": 0, "failed_starts": 0, "runs": 0}
        self._last_error: str | None = None
        self._failed_in_a_row = 0
        self._not_before = 0.0
        self._suspect: dict[str, float] = {}
        """node id -> when it last lost a slot."""
        self._node_check = 0.0
        self._open = False
        self._closed = False
        self._holder_class: Any = None
        self._keeper: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> Self:
        """Place the slots and wait (at most ``open_timeout_s``) until each has its first
        sandbox or failed; at least one must be ready (``PoolExhaustedError`` otherwise, with
        every node's error)."""
        import ray

        if self._open or self._closed:
            raise RuntimeError("a Ray SandboxPool is opened once")
        if not ray.is_initialized():
            raise ConfigError("a Ray SandboxPool needs a Ray connection: call ray.init() first")
        import tempfile

        with tempfile.TemporaryDirectory(prefix="sandboxrun-pool-check-") as probe:
            Sandbox(probe, **driver_checkable(self.sandbox_options))  # a bad option: here
        self._holder_class = ray.remote(Holder)
        self._open = True
        try:
            return self._open_slots()
        except BaseException:
            self.close()  # (what was started: slots, reapers, the keeper)
            raise

    def _open_slots(self) -> Self:
        nodes = self._nodes()
        if self.size is None:
            assert self.per_node is not None
            self.size = placement.capacity(nodes, self.per_node)
            if self.size < 1:
                raise PoolExhaustedError(
                    f"no node of the Ray cluster offers {placement.SLOT} "
                    "(start nodes with ray start --resources "
                    f"'{{\"{placement.SLOT}\": N}}')"
                )
        deadline = time.monotonic() + self.open_timeout_s
        with self._lock:
            self._fill(nodes)
        self._keeper = threading.Thread(target=self._keep, name="sandboxrun-ray-pool", daemon=True)
        self._keeper.start()
        while time.monotonic() < deadline:
            with self._lock:
                if not any(s.state == "starting" for s in self._slots) and self._settled():
                    break
            self._pump(POLL_S)
        with self._lock:
            if not any(s.state == "ready" for s in self._slots):
                raise PoolExhaustedError(self._exhausted("opening the pool"))
        return self

    def _keep(self) -> None:
        """In the background while the pool is open: take in started slots and ended runs,
        and replace lost slots, also while no caller waits."""
        while not self._closed:
            try:
                self._pump(KEEP_S)
            except Exception as exc:  # (Ray shut down under the pool: the callers see it)
                self._last_error = f"the pool's keeper: {first_line(exc)}"
                time.sleep(KEEP_S)

    def _settled(self) -> bool:
        """Every slot the cluster has room for was tried (started, or its node barred)."""
        assert self.size is not None
        live = [s for s in self._slots if s.state not in ("lost", "closed")]
        return (
            len(live) >= self.size
            or placement.choose(self._nodes(), self._held(), self.per_node, self._unusable) is None
        )

    def close(self) -> None:
        """Close every slot (their sandboxes closed, every process of them killed) and stop
        the reapers after a last sweep; idempotent."""
        import ray

        with self._lock:
            if self._closed:
                return
            self._closed = True
            slots = [s for s in self._slots if s.state not in ("lost", "closed")]
            for run in list(self._runs.values()):
                run.cancel()
        stops = {s.actor.stop.remote(): s for s in slots}
        with contextlib.suppress(Exception):
            ready, late = ray.wait(list(stops), num_returns=len(stops), timeout=STOP_WAIT_S)
            for ref in late:
                self.close_errors.append(
                    f"a slot on {stops[ref].host} did not stop within {STOP_WAIT_S:g}s: "
                    "killed (its sandbox ends with it)"
                )
            for ref in ready:
                try:
                    self.close_errors += ray.get(ref)
                except Exception as exc:
                    self.close_errors.append(f"a slot on {stops[ref].host} did not stop: {exc}")
        if self._keeper is not None:
            self._keeper.join(KEEP_S * 5)
        for slot in slots:
            slot.state = "closed"
            with contextlib.suppress(Exception):
                ray.kill(slot.actor, no_restart=True)
        sweeps: dict[Any, str] = {}
        for host, reaper in list(self._reapers.values()):  # (all at once: one wait in all)
            with contextlib.suppress(Exception):
                sweeps[reaper.sweep.remote()] = host
        with contextlib.suppress(Exception):
            swept, late = ray.wait(list(sweeps), num_returns=len(sweeps), timeout=STOP_WAIT_S)
            for ref in late:
                self.close_errors.append(
                    f"{sweeps[ref]}: the reaper's last sweep did not end within {STOP_WAIT_S:g}s"
                )
            for ref in swept:
                with contextlib.suppress(Exception):  # (a reaper lost with its node)
                    problems = ray.get(ref)["problems"]
                    self.close_errors += [f"{sweeps[ref]}: {p}" for p in problems]
        for _, reaper in list(self._reapers.values()):
            with contextlib.suppress(Exception):
                ray.kill(reaper, no_restart=True)
        self._reapers.clear()

    # -- placing ---------------------------------------------------------------------------------
    def _nodes(self) -> list[placement.NodeView]:
        import ray

        listing: Any = ray.nodes()  # type: ignore[no-untyped-call]
        return placement.nodes_of(listing)

    def _held(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for s in self._slots:
            if s.state not in ("lost", "closed"):
                held[s.node_id] = held.get(s.node_id, 0) + 1
        return held

    def _fill(self, nodes: list[placement.NodeView] | None = None) -> None:
        """Start slots until the pool holds ``size`` (under the lock)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self._closed or time.monotonic() < self._not_before:
            return
        assert self.size is not None
        nodes = self._nodes() if nodes is None else nodes
        if self.reaper:
            self._start_reapers(nodes)
        hosts = {n.node_id: n.host for n in nodes}
        while len([s for s in self._slots if s.state not in ("lost", "closed")]) < self.size:
            now = time.monotonic()
            last = [n for n, when in self._suspect.items() if now - when < SUSPECT_S]
            node = placement.choose(nodes, self._held(), self.per_node, self._unusable, last)
            if node is None:
                return
            actor = self._holder_class.options(
                max_restarts=0,
                max_task_retries=0,
                num_cpus=0,
                resources={placement.SLOT: 1},
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(
                self.sandbox_options,
                self.template,
                self.root,
                self.fresh,
                self.open_timeout_s,
                self.reset,
            )
            slot = Slot(actor=actor, node_id=node, host=hosts.get(node, node[:12]))
            slot.start_ref = actor.start.remote()
            self._slots.append(slot)

    def _start_reapers(self, nodes: list[placement.NodeView]) -> None:
        """A reaper on every live node offering slots that has none (a node that joined
        since the last look included); those of nodes gone are dropped (under the lock)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = {n.node_id for n in nodes if n.alive}
        for node_id in [n for n in self._reapers if n not in alive]:
            _, gone = self._reapers.pop(node_id)
            with contextlib.suppress(Exception):
                ray.kill(gone, no_restart=True)
        kind: Any = None
        for node in nodes:
            if not node.alive or node.slots <= 0 or node.node_id in self._reapers:
                continue
            kind = kind or ray.remote(Reaper)
            reaper = kind.options(
                max_restarts=0,
                max_task_retries=0,
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            ).remote(self.reap_interval_s)
            self._reapers[node.node_id] = (node.host, reaper)
            reaper.start.remote()
            reaper.sweep.remote()

    def _sweep(self, node_id: str) -> None:
        """Ask the node's reaper to look now (a lost slot's leftovers)."""
        if node_id not in self._reapers:
            return
        for node in self._nodes():
            if node.node_id == node_id and node.alive:
                self._reapers[node_id][1].sweep.remote()

    # -- progress --------------------------------------------------------------------------------
    def _pump(self, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` for a slot's start or a run's end, and take them in."""
        import ray

        with self._lock:
            starting = {s.start_ref: s for s in self._slots if s.state == "starting"}
            watched = {
                s.watch_ref: s
                for s in self._slots
                if s.watch_ref is not None and s.state not in ("lost", "closed")
            }
            runs = [ref for ref, run in self._runs.items() if not run.waited]
            refs = [*starting, *watched, *runs]
            if not refs:
                self._fill()
        if not refs:
            time.sleep(timeout_s)
            return
        done, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if done:  # everything finished by now, in one go
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        with self._lock:
            for ref in done:
                if ref in starting:
                    self._started(starting[ref], ref)
                elif ref in watched:
                    self._watch_ended(watched[ref], ref)
                elif ref in self._runs:
                    self._runs.pop(ref)._collect()
            self._check_starting(list(starting.values()))
            self._fill()

    def _check_starting(self, starting: list[Slot]) -> None:
        """Give up slots still starting on a node that died (Ray may leave an actor bound to
        a dead node pending) or past ``open_timeout_s``; at most every ``NODE_CHECK_S``."""
        now = time.monotonic()
        starting = [s for s in starting if s.state == "starting"]
        if not starting or now - self._node_check < NODE_CHECK_S:
            return
        self._node_check = now
        alive = {n.node_id for n in self._nodes() if n.alive}
        for slot in starting:
            if slot.node_id not in alive:
                self._lose(slot, f"its node {slot.host} was lost while it started", count=False)
            elif now - slot.started > self.open_timeout_s + 10:
                why = f"its slot did not start within {self.open_timeout_s:g}s"
                self._lose(slot, why, count=False)

    def _watch_ended(self, slot: Slot, ref: Any) -> None:
        """The slot's ``alive`` call ended: it stopped or was lost. The slot is given up at
        once, whatever holds it, and replaced: an idle one before a command is sent to it,
        a busy one even if its command completed just before (the run reports what became
        of its command, ``_collect``; a session's next command sends nothing)."""
        import ray

        slot.watch_ref = None
        if self._closed or slot.state not in ("ready", "busy", "session"):
            return
        try:
            ray.get(ref, timeout=10)
            why = f"its actor on {slot.host} stopped"
        except Exception as exc:
            why = self._lost_why(slot, exc)
        slot.dead = why
        self._lose(slot, why)

    def _started(self, slot: Slot, ref: Any) -> None:
        import ray

        if slot.state != "starting":
            return
        try:
            identity = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            self._counts["failed_starts"] += 1
            self._lose(slot, f"its actor died while starting: {first_line(exc)}", count=False)
            self._back_off()
            return
        except Exception as exc:  # the sandbox cannot open on that node: bar it
            self._counts["failed_starts"] += 1
            why = first_line(exc)
            self._unusable[slot.node_id] = (slot.host, why)
            self._last_error = f"{slot.host}: {why}"
            slot.state = "lost"
            with contextlib.suppress(Exception):
                ray.kill(slot.actor, no_restart=True)
            return
        self._failed_in_a_row = 0
        slot.pid, slot.backend = identity["pid"], identity["backend"]
        slot.state = "ready"
        slot.released = time.monotonic()
        slot.watch_ref = slot.actor.alive.remote()
        self._counts["started"] += 1

    def _back_off(self) -> None:
        self._failed_in_a_row += 1
        self._not_before = time.monotonic() + min(5.0, 0.1 * 2 ** min(self._failed_in_a_row, 6))

    def _lose(self, slot: Slot, why: str, *, count: bool = True) -> None:
        """``slot`` is gone (its actor killed for sure); its capacity is replaced."""
        import ray

        if slot.state in ("lost", "closed"):
            return
        slot.state = "lost"
        self._counts["lost"] += 1 if count else 0
        self._last_error = f"{slot.host}: {why}"
        self._suspect[slot.node_id] = time.monotonic()
        with contextlib.suppress(Exception):
            ray.kill(slot.actor, no_restart=True)
        with contextlib.suppress(Exception):
            self._sweep(slot.node_id)

    def _lost_why(self, slot: Slot, exc: BaseException) -> str:
        """Why ``slot`` is gone, naming its node or actor (never raises: it is called where
        a result or a release must follow)."""
        try:
            node_alive = any(n.node_id == slot.node_id and n.alive for n in self._nodes())
        except Exception:  # (the control plane failing too: say the actor's loss)
            node_alive = True
        pid = f" (pid {slot.pid})" if slot.pid else ""
        if not node_alive:
            return f"its sandbox's node {slot.host} ({slot.node_id[:12]}) was lost"
        return f"its sandbox's actor{pid} on {slot.host} died: {first_line(exc)}"

    def _take(self, timeout_s: float | None, *, state: State) -> Slot:
        """A ready slot, marked ``state``; waits (pumping) at most ``timeout_s``."""
        wait = self.acquire_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                slot = self._take_free(state)
                if slot is not None:
                    return slot
                if not self._possible():
                    raise PoolExhaustedError(self._exhausted("no node can take a slot"))
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolExhaustedError(self._exhausted(f"no slot was free within {wait:g}s"))
            self._pump(min(POLL_S * 4, left))

    def _take_free(self, state: State) -> Slot | None:
        """The slot ready longest, marked ``state``, or None when none is ready (no wait)."""
        with self._lock:
            if not self._open or self._closed:
                raise RuntimeError("the Ray SandboxPool is not open")
            ready = [s for s in self._slots if s.state == "ready"]
            if not ready:
                return None
            slot = min(ready, key=lambda s: s.released)
            slot.state = state
            return slot

    def _possible(self) -> bool:
        """A slot exists or could still be started."""
        if any(s.state not in ("lost", "closed") for s in self._slots):
            return True
        return placement.choose(self._nodes(), {}, self.per_node, self._unusable) is not None

    def _exhausted(self, what: str) -> str:
        s = self.stats()
        barred = "".join(f"; {host} is unusable: {why}" for host, why in s.unusable.items())
        last = f"; the last error: {s.last_error}" if s.last_error else ""
        return (
            f"{what} (size {s.size}: {s.ready} ready, {s.busy} busy, {s.sessions} in "
            f"sessions, {s.starting} starting){barred}{last}"
        )

    def _release(self, slot: Slot) -> None:
        """A command or session gives ``slot`` back: ready again (a lost one stays lost)."""
        if slot.state in ("busy", "session"):
            slot.state = "ready"
            slot.released = time.monotonic()

    # -- running ---------------------------------------------------------------------------------
    def submit(
        self, argv: Command | None = None, *, acquire_timeout_s: float | None = None, **options: Any
    ) -> RayRun:
        """Send one command to a free slot (waiting for one at most ``acquire_timeout_s``):
        its ``RayRun``. ``options``: ``Sandbox.exec``'s (``shell``, ``timeout``, ``env``,
        ``stdin``, ``workdir``, ...)."""
        args, options = command(argv, options)
        if acquire_timeout_s is not None:
            check_wait(acquire_timeout_s, "acquire_timeout_s", zero=True)
        while True:
            run = self._send(self._take(acquire_timeout_s, state="busy"), args, options)
            if run is not None:
                return run

    def _send(self, slot: Slot, args: list[str] | None, options: dict[str, Any]) -> RayRun | None:
        """Send a checked command to ``slot`` (taken ``busy``): its ``RayRun``; None, and
        nothing sent, if the slot was lost since it was taken (take another)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the Ray SandboxPool was closed")
            if slot.state != "busy":
                return None
            try:
                ref = slot.actor.exec.remote(args, options)
            except Exception as exc:  # (nothing was sent: an argument Ray cannot carry)
                self._release(slot)
                raise ConfigError(f"the command cannot be sent to a node: {exc}") from exc
            self._counts["runs"] += 1
            run = RayRun(self, slot, ref, args, options)
            self._runs[ref] = run
        return run

    def exec(self, argv: Command | None = None, **options: Any) -> ExecResult:
        """``submit(...).result()``: one command's result (never raises for its outcome)."""
        return self.submit(argv, **options).result()

    def map(
        self, commands: Sequence[Command], *, max_in_flight: int | None = None, **options: Any
    ) -> list[ExecResult]:
        """Every command's result, in the order given; at most ``max_in_flight`` under way
        at once (default: the pool's size). Each command is an argv or a shell script."""
        return list(self.imap(commands, max_in_flight=max_in_flight, **options))

    def imap(
        self, commands: Sequence[Command], *, max_in_flight: int | None = None, **options: Any
    ) -> Iterator[ExecResult]:
        """``map``, yielding each result as soon as it and those before it are in."""
        if not self._open:
            raise RuntimeError("the Ray SandboxPool is not open")
        limit = self.size if max_in_flight is None else max_in_flight
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"max_in_flight must be a whole number of at least 1, got {limit!r}")
        checked = [command(c, options) for c in commands]  # every one checked first
        runs: list[RayRun] = []
        given = 0
        try:
            while given < len(checked) or runs:
                while given < len(checked) and len(runs) < limit:
                    # With runs of its own under way it never waits for a slot (they give
                    # theirs back as they end): a limit above the live slots is no error.
                    args, opts = checked[given]
                    slot = self._take_free("busy") if runs else self._take(None, state="busy")
                    if slot is None:
                        break
                    run = self._send(slot, args, opts)
                    if run is not None:
                        runs.append(run)
                        given += 1
                if not runs[0].done():
                    self._pump(POLL_S)
                    continue
                yield runs.pop(0).result()
        finally:
            for run in runs:  # a consumer that stopped early: nothing is left running
                run.cancel()

    @contextmanager
    def session(self, acquire_timeout_s: float | None = None) -> Iterator[RaySession]:
        """One sandbox for many commands, on one slot for the whole block (agents). If its
        actor or node is lost the session's results say so (``sandbox_error``) from then
        on: it is never moved, its state would be gone."""
        import ray

        if acquire_timeout_s is not None:
            check_wait(acquire_timeout_s, "acquire_timeout_s", zero=True)
        name = uuid.uuid4().hex
        while True:  # (a slot lost between its take and the begin: take another)
            slot = self._take(acquire_timeout_s, state="session")
            with self._lock:
                if slot.state == "session":
                    slot.session = name
                    begun = slot.actor.session_begin.remote(name)
                    break
        session = RaySession(self, slot, name)
        try:
            try:
                ray.get(begun, timeout=self.open_timeout_s)
            except ray.exceptions.RayActorError as exc:
                session._lost(exc)
            except BaseException as exc:  # not begun (or begun late): the slot is not trusted
                with self._lock:
                    why = f"its slot on {slot.host} could not begin a session: {first_line(exc)}"
                    self._lose(slot, why)
                    session.lost = why
                if isinstance(exc, Exception):
                    raise PoolExhaustedError(f"no session: {why}") from exc
                raise
            yield session
        finally:
            with self._lock:  # (from here on its exec sends nothing, nor gives up the slot)
                session.ended = True
                if session.lost is None and slot.dead is not None:
                    session.lost = slot.dead  # (lost with no command after: still said)
                lost = session.lost
            if lost is None and slot.state == "session":
                try:
                    ray.get(slot.actor.session_end.remote(name), timeout=STOP_WAIT_S)
                except Exception as exc:
                    with self._lock:
                        self._lose(slot, self._lost_why(slot, exc))
            with self._lock:
                if slot.session == name:
                    slot.session = None
                    self._release(slot)
                self._fill()

    def stats(self) -> RayPoolStats:
        with self._lock:
            states = [s.state for s in self._slots]
            nodes: dict[str, int] = {}
            for s in self._slots:
                if s.state not in ("lost", "closed", "starting"):
                    nodes[s.host] = nodes.get(s.host, 0) + 1
            return RayPoolStats(
                size=self.size or 0,
                ready=states.count("ready"),
                busy=states.count("busy"),
                sessions=states.count("session"),
                starting=states.count("starting"),
                nodes=nodes,
                unusable=dict(self._unusable.values()),
                started=self._counts["started"],
                lost=self._counts["lost"],
                failed_starts=self._counts["failed_starts"],
                runs=self._counts["runs"],
                last_error=self._last_error,
            )

    def slots(self) -> list[dict[str, Any]]:
        """The live slots: node id, host, actor pid, backend and state of each."""
        with self._lock:
            return [
                {
                    "node_id": s.node_id,
                    "host": s.host,
                    "pid": s.pid,
                    "backend": s.backend,
                    "state": s.state,
                }
                for s in self._slots
                if s.state not in ("lost", "closed")
            ]

    def _backend_of(self, slot: Slot) -> BackendName:
        name = slot.backend or self.sandbox_options.get("backend")
        known: tuple[BackendName, ...] = ("docker", "systemd-scope", "process-group", "fake")
        return cast(BackendName, name) if name in known else "docker"


class RayRun:
    """One command sent to a slot: ``result()`` waits for it, ``cancel()`` ends it (its
    result is then ``cancelled``, the slot's processes killed)."""

    def __init__(
        self,
        pool: SandboxPool,
        slot: Slot,
        ref: Any,
        argv: list[str] | None,
        options: dict[str, Any],
    ) -> None:
        self.pool = pool
        self.slot = slot
        self.ref = ref
        self.argv = argv
        self.options = options
        self.began = time.monotonic()
        self._result: ExecResult | None = None
        self.waited = False
        """A caller waits in ``result``, which takes the result in (the pool's waits leave
        it out: one waiter per ref)."""
        self._cancelled = False
        self._done = threading.Event()

    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Cancel the command (nothing when it has ended)."""
        import ray

        if self._done.is_set() or self._cancelled:
            return  # (once: a second cancel would break into the first one's cleanup)
        self._cancelled = True
        with contextlib.suppress(Exception):
            ray.cancel(self.ref)

    def result(self, timeout_s: float | None = None) -> ExecResult:
        """The command's result (``TimeoutError`` past ``timeout_s``: it still runs)."""
        import ray

        if timeout_s is not None:
            check_wait(timeout_s, "timeout_s", zero=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.waited = True
        try:
            while not self._done.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"the command was still running after {timeout_s:g}s")
                wait = KEEP_S if left is None else min(KEEP_S, left)
                ended, _ = ray.wait([self.ref], timeout=wait)
                if ended:
                    with self.pool._lock:
                        self.pool._runs.pop(self.ref, None)
                        self._collect()
        finally:
            self.waited = False  # (a caller that gave up: the pool's waits take it in)
        assert self._result is not None
        return self._result

    def _collect(self) -> None:
        """Take the ended command's result in (under the pool's lock)."""
        import ray

        if self._done.is_set():
            return
        pool, slot = self.pool, self.slot
        try:
            self._take_in(ray)
        except Exception as exc:  # (the control plane failing while we look): said, never hung
            if self._result is None:
                self._result = self._made(
                    "sandbox_error", f"its result was lost: {first_line(exc)}"
                )
            with contextlib.suppress(Exception):
                pool._lose(slot, f"its result was lost: {first_line(exc)}")
        finally:
            if self._result is None:
                self._result = self._made("sandbox_error", "its result was lost")
            self._done.set()

    def _take_in(self, ray: Any) -> None:
        pool, slot = self.pool, self.slot
        try:
            got = ray.get(self.ref, timeout=30)
            if not isinstance(got, ExecResult):
                raise TypeError(f"a slot returned {type(got).__name__}, not an ExecResult")
            self._result = got
            pool._release(slot)
        except ray.exceptions.TaskCancelledError:
            self._result = self._made("cancelled", "cancelled on the driver (ray.cancel)")
            pool._release(slot)
        except ray.exceptions.ActorUnavailableError as exc:
            why = (
                f"its sandbox's actor on {slot.host} became unreachable "
                f"({first_line(exc)}); it was killed (its sandbox ends with it), and the "
                "command, which may have started, was not run again"
            )
            self._result = self._made("sandbox_error", why)
            pool._lose(slot, why)
        except ray.exceptions.RayActorError as exc:
            why = slot.dead or pool._lost_why(slot, exc)  # (the watch saw it first: its why)
            self._result = self._made("sandbox_error", f"{why}; the command was not run again")
            pool._lose(slot, why)
        except ray.exceptions.RayTaskError as exc:  # the slot refused the command
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            if refused(cause):
                self._result = self._made("spawn_error", first_line(cause))
                pool._release(slot)
            else:
                why = f"its slot on {slot.host} failed: {first_line(cause)}"
                self._result = self._made("sandbox_error", why)
                pool._lose(slot, why)
        except Exception as exc:  # the object or its owner lost: the slot is not trusted
            why = f"its result was lost on {slot.host}: {first_line(exc)}"
            self._result = self._made("sandbox_error", why)
            pool._lose(slot, why)

    def _made(self, status: Status, error: str) -> ExecResult:
        """The result the driver gives a command whose slot could not say (its actor lost,
        a cancel): nothing of its output reached the driver."""
        facts = RunFacts(
            backend=self.pool._backend_of(self.slot),
            argv=list(self.argv or []) or ["sh", "-c", str(self.options.get("shell", ""))],
            run_id=new_run_id(),
            isolation=[],
            missing=[],
            fallback_reason=None,
            via="ray",
        )
        return results.unstarted(facts, status, error, self.began)


class RaySession:
    """Commands in one sandbox on one slot (``SandboxPool.session``)."""

    def __init__(self, pool: SandboxPool, slot: Slot, name: str) -> None:
        self.pool = pool
        self.slot = slot
        self.name = name
        self.lost: str | None = None
        """Why the session's sandbox is gone (its actor or node lost), or None."""
        self.ended = False
        """Its block has ended: the slot may serve another caller, nothing is sent to it."""

    @property
    def host(self) -> str:
        return self.slot.host

    @property
    def node_id(self) -> str:
        return self.slot.node_id

    def _lost(self, exc: BaseException) -> str:
        return self._give_up(self.pool._lost_why(self.slot, exc))

    def _give_up(self, why: str) -> str:
        """The session's sandbox is gone: its slot too, while the session holds it (after
        its block the block's end decided). ``why``, to say."""
        with self.pool._lock:
            if self.ended:
                return why
            self.lost = why
            if self.slot.session == self.name:
                self.pool._lose(self.slot, why)
        return why

    def exec(self, argv: Command | None = None, **options: Any) -> ExecResult:
        """One command in the session's sandbox; once the session is lost, ``sandbox_error``
        (nothing runs anywhere else). After the session's block: ``InputError``, nothing
        sent (its slot may serve another caller by then)."""
        import ray

        if self.ended:
            raise InputError(
                "this Ray session has ended (its block is over and its slot may serve another "
                "caller): use a session only inside `with pool.session() as s:`"
            )
        args, options = command(argv, options)
        run = RayRun(self.pool, self.slot, None, args, options)
        lost = self.lost
        if lost is None and self.slot.dead is not None:
            lost = self._give_up(self.slot.dead)
        if lost is None:
            try:
                got = ray.get(self.slot.actor.session_exec.remote(self.name, args, options))
            except ray.exceptions.RayActorError as exc:
                lost = self._lost(exc)
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if isinstance(exc.cause, BaseException) else exc
                if refused(cause):
                    return run._made("spawn_error", first_line(cause))
                lost = self._give_up(f"its slot on {self.host} failed: {first_line(cause)}")
            except Exception as exc:  # the result or its owner lost: the slot is not trusted
                lost = self._give_up(f"its result was lost on {self.host}: {first_line(exc)}")
            else:
                if isinstance(got, ExecResult):
                    return got
                lost = self._give_up(
                    f"its slot on {self.host} returned {type(got).__name__}, not an ExecResult"
                )
        return run._made("sandbox_error", f"the session's sandbox is lost: {lost}; it is not moved")


def command(
    argv: Command | None, options: dict[str, Any]
) -> tuple[list[str] | None, dict[str, Any]]:
    """``(argv, options)`` to send: a string is a shell script; options checked here."""
    unknown = set(options) - EXEC_OPTIONS
    if unknown:
        raise ConfigError(
            f"a Ray pool's exec takes no {', '.join(sorted(unknown))} (a callable cannot "
            "cross to the node; these are taken: " + ", ".join(sorted(EXEC_OPTIONS)) + ")"
        )
    options = checked_options(options)
    if isinstance(argv, str):
        if options.get("shell") is not None:
            raise ConfigError("give a command as a string or as shell=, not both")
        options["shell"] = argv
        return None, options
    if argv is None:
        if options.get("shell") is None:
            raise ConfigError("give a command: an argv, a shell script, or shell=")
        return None, options
    args = list(argv)
    if not args or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"an argv is a non-empty list of strings, got {argv!r}")
    return args, options


def checked_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with each one's type checked on the driver (``ConfigError`` naming it):
    a malformed one would otherwise fail on the node and cost the slot, or a session. A
    ``str`` stdin is sent as its UTF-8 bytes."""
    out = dict(options)
    for name in ("timeout", "idle_timeout"):
        if out.get(name) is not None:
            check_wait(out[name], name, zero=False)
    for name in ("shell", "workdir"):
        if name in out and out[name] is not None and not isinstance(out[name], str):
            raise ConfigError(f"{name} must be a string, got {type(out[name]).__name__}")
    env = out.get("env")
    if env is not None:
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ConfigError(f"env must be a mapping of strings to strings, got {env!r:.200}")
        out["env"] = dict(env)
    for name in ("pass_env", "path_prepend"):
        value = out.get(name)
        if value is None:  # (as not given: the node's default, none)
            out.pop(name, None)
            continue
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name} must be a list of strings, got {value!r:.200}")
        out[name] = list(value)
    stdin = out.get("stdin")
    if isinstance(stdin, str):
        try:
            out["stdin"] = stdin.encode()
        except UnicodeEncodeError as exc:
            raise ConfigError(f"stdin is a string that is not valid Unicode: {exc}") from exc
    elif isinstance(stdin, (bytearray, memoryview)):
        out["stdin"] = bytes(stdin)
    elif stdin is not None and not isinstance(stdin, bytes):
        raise ConfigError(f"stdin must be bytes or a string, got {type(stdin).__name__}")
    return out


def driver_checkable(options: dict[str, Any]) -> dict[str, Any]:
    """The sandbox options the driver can check for the nodes: all but the mounts' sources,
    which are the nodes' paths (each node checks them when its slot opens, and a node where
    one is missing is barred with that error)."""
    policy = options.get("policy")
    if isinstance(policy, Policy) and policy.mounts:
        return {**options, "policy": replaced(policy, mounts=())}
    return options


def refused(exc: BaseException) -> bool:
    """The slot refused the command for what it is (bad input: nothing of the slot broke)."""
    return isinstance(exc, (TypeError, ValueError, InputError))


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (of its cause, for a Ray task's error)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and type(exc).__name__.startswith("RayTaskError"):
        exc = cause
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


__all__ = ["RayPoolStats", "RayRun", "RaySession", "SandboxPool"]
