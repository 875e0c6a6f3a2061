"""Where a Ray pool's next sandbox slot goes (pure: no Ray, no I/O).

A node can take a slot when it is alive, offers ``sandbox_slots``, is not marked unusable for
this pool (a sandbox failed to open there) and holds fewer of the pool's slots than both its
``sandbox_slots`` and the pool's ``per_node``. Of those, the one holding the fewest gets it
(ties: the node seen first), so a pool spreads evenly and refills where there is room.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SLOT = "sandbox_slots"
"""The custom Ray resource a node offers sandboxes with (``ray start --resources``)."""


@dataclass(frozen=True)
class NodeView:
    node_id: str
    host: str
    alive: bool
    slots: float
    """The node's ``sandbox_slots`` (0: none offered)."""


def nodes_of(listing: Iterable[Mapping[str, object]]) -> list[NodeView]:
    """``ray.nodes()``'s rows as ``NodeView``s, in the order given."""
    views = []
    for row in listing:
        resources = row.get("Resources")
        slots = resources.get(SLOT, 0.0) if isinstance(resources, Mapping) else 0.0
        views.append(
            NodeView(
                node_id=str(row.get("NodeID", "")),
                host=str(row.get("NodeManagerHostname", "")),
                alive=bool(row.get("Alive", False)),
                slots=float(slots) if isinstance(slots, (int, float)) else 0.0,
            )
        )
    return views


def room(node: NodeView, held: int, per_node: int | None) -> int:
    """How many more of the pool's slots ``node`` can take."""
    cap = int(node.slots) if per_node is None else min(int(node.slots), per_node)
    return max(0, cap - held) if node.alive else 0


def choose(
    nodes: Iterable[NodeView],
    held: Mapping[str, int],
    per_node: int | None,
    unusable: Iterable[str] = (),
    last: Iterable[str] = (),
) -> str | None:
    """The node the next slot goes to, or None when no node has room. ``last``: nodes
    taken only when no other has room (one that just lost a slot may be dying)."""
    barred, later = set(unusable), set(last)
    best: tuple[bool, int, int, str] | None = None
    for order, node in enumerate(nodes):
        if node.node_id in barred:
            continue
        count = held.get(node.node_id, 0)
        rank = (node.node_id in later, count, order)
        if room(node, count, per_node) > 0 and (best is None or rank < best[:3]):
            best = (*rank, node.node_id)
    return None if best is None else best[3]


def capacity(nodes: Iterable[NodeView], per_node: int | None, unusable: Iterable[str] = ()) -> int:
    """How many slots the pool could hold on ``nodes`` at most."""
    barred = set(unusable)
    return sum(room(n, 0, per_node) for n in nodes if n.node_id not in barred)
