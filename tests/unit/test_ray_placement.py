"""The Ray pool's pure parts: where the next slot goes, and what a command may carry."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxrun.errors import ConfigError
from sandboxrun.integrations.ray import placement
from sandboxrun.integrations.ray.placement import NodeView, capacity, choose, nodes_of, room


def node(name: str, slots: float = 2, *, alive: bool = True) -> NodeView:
    return NodeView(node_id=name, host=f"host-{name}", alive=alive, slots=slots)


def test_the_node_holding_the_fewest_gets_the_next_slot() -> None:
    nodes = [node("a"), node("b"), node("c")]
    assert choose(nodes, {}, None) == "a"  # (ties: the first seen)
    assert choose(nodes, {"a": 1}, None) == "b"
    assert choose(nodes, {"a": 1, "b": 1}, None) == "c"
    assert choose(nodes, {"a": 1, "b": 1, "c": 1}, None) == "a"


def test_no_node_past_its_slots_or_per_node() -> None:
    nodes = [node("a", 3), node("b", 1)]
    assert choose(nodes, {"a": 3, "b": 1}, None) is None
    assert choose(nodes, {"a": 1, "b": 0}, 1) == "b"
    assert choose(nodes, {"a": 1, "b": 1}, 1) is None
    assert room(node("a", 3), 1, None) == 2 and room(node("a", 3), 1, 2) == 1


def test_dead_slotless_and_barred_nodes_take_nothing() -> None:
    nodes = [node("dead", 4, alive=False), node("none", 0), node("barred", 4), node("ok", 1)]
    assert choose(nodes, {}, None, unusable={"barred"}) == "ok"
    assert choose(nodes, {"ok": 1}, None, unusable={"barred"}) is None
    assert capacity(nodes, None, {"barred"}) == 1
    assert capacity(nodes, None) == 5


def test_a_node_that_just_lost_a_slot_is_taken_last() -> None:
    nodes = [node("a"), node("b")]
    assert choose(nodes, {"a": 0, "b": 1}, None, last={"a"}) == "b"
    assert choose(nodes, {"b": 2}, None, last={"a"}) == "a"  # no other room: still used


def test_rows_of_ray_nodes() -> None:
    rows = [
        {
            "NodeID": "x",
            "NodeManagerHostname": "h",
            "Alive": True,
            "Resources": {"sandbox_slots": 3.0},
        },
        {"NodeID": "y", "NodeManagerHostname": "g", "Alive": False, "Resources": {}},
        {"NodeID": "z", "Alive": True, "Resources": None},
    ]
    assert nodes_of(rows) == [
        NodeView("x", "h", True, 3.0),
        NodeView("y", "g", False, 0.0),
        NodeView("z", "", True, 0.0),
    ]
    assert placement.SLOT == "sandbox_slots"


@given(
    st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(1, 4)),
    st.integers(0, 30),
)
def test_filling_never_passes_a_cap_and_spreads_evenly(
    spec: list[tuple[int, bool]], per_node: int | None, size: int
) -> None:
    nodes = [node(str(i), slots, alive=alive) for i, (slots, alive) in enumerate(spec)]
    held: dict[str, int] = {}
    for _ in range(size):
        chosen = choose(nodes, held, per_node)
        if chosen is None:
            break
        held[chosen] = held.get(chosen, 0) + 1
    assert sum(held.values()) == min(size, capacity(nodes, per_node))
    for n in nodes:
        assert held.get(n.node_id, 0) <= room(n, 0, per_node)
    # evenly: a node with room left holds no fewer than one below any other
    open_counts = [
        held.get(n.node_id, 0) for n in nodes if room(n, held.get(n.node_id, 0), per_node)
    ]
    if open_counts and sum(held.values()) < size:
        raise AssertionError("a node had room but was not filled")
    if open_counts:
        assert max(held.values(), default=0) - min(open_counts) <= 1


def test_commands_are_checked_on_the_driver() -> None:
    pytest.importorskip("ray")
    from sandboxrun.integrations.ray.pool import command

    assert command(["echo", "hi"], {}) == (["echo", "hi"], {})
    assert command("echo hi", {"timeout": 2}) == (None, {"shell": "echo hi", "timeout": 2})
    assert command(None, {"shell": "true"}) == (None, {"shell": "true"})
    cases: list[tuple[Any, dict[str, Any], str]] = [
        (["x"], {"sink": print}, "takes no sink"),
        (["x"], {"escalate": None}, "takes no escalate"),
        ("x", {"shell": "y"}, "not both"),
        (None, {}, "give a command"),
        ([], {}, "non-empty list"),
        (["a", 1], {}, "non-empty list"),
        (["a"], {"timeout": float("nan")}, "timeout"),
        ("sleep 1", {"timeout": float("nan")}, "timeout"),
        (None, {"shell": "true", "timeout": -5}, "timeout"),
        ("true", {"idle_timeout": "soon"}, "idle_timeout"),
    ]
    for bad, options, says in cases:
        with pytest.raises(ConfigError, match=says):
            command(bad, options)


def test_a_pool_refuses_bad_sizes_before_touching_ray() -> None:
    pytest.importorskip("ray")
    from sandboxrun.integrations.ray.pool import SandboxPool

    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "a size, a per_node"),
        ({"size": 0}, "size must be"),
        ({"size": True}, "size must be"),
        ({"per_node": -1}, "per_node must be"),
        ({"size": 1, "open_timeout_s": 0}, "open_timeout_s"),
        ({"size": 1, "name": "n"}, "takes no 'name'"),
        ({"size": 1, "reset": "yes"}, "fresh and reset must be True or False"),
        ({"size": 1, "fresh": 1}, "fresh and reset must be True or False"),
    ]
    for kwargs, says in cases:
        with pytest.raises(ConfigError, match=says):
            SandboxPool(**kwargs)


def test_opening_without_ray_init_says_so() -> None:
    ray = pytest.importorskip("ray")
    from sandboxrun.integrations.ray.pool import SandboxPool

    assert not ray.is_initialized()
    with pytest.raises(ConfigError, match=r"call ray.init\(\) first"):
        SandboxPool(size=1, backend="process-group").open()


def test_mount_sources_are_the_nodes_to_check() -> None:
    pytest.importorskip("ray")
    from sandboxrun import Mount, Policy
    from sandboxrun.integrations.ray.pool import driver_checkable

    policy = Policy(mounts=(Mount(source="/only/on/the/nodes", target="/data"),), network="on")
    checked = driver_checkable({"policy": policy, "backend": "docker"})
    assert checked["policy"].mounts == () and checked["policy"].network == "on"
    assert checked["backend"] == "docker"
    assert driver_checkable({"backend": "docker"}) == {"backend": "docker"}
