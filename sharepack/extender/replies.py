"""Filter and prioritize answers kept per request shape, patched on node changes.

kube-scheduler sends every node's name to both verbs for every pod (`percentageOfNodesToScore:
100`), and most pods of a cluster come in a few shapes. For each recently seen shape a
`ShapeReplies` holds only what differs from "passes, scores 0": the nodes that fail the pod
(with their verdicts) and the encoded `HostPriority` of the nodes that score above 0. A node
change patches its entries in every kept shape (on the watch path); a request then runs no
Python per node: `map(dict.get, names)` and a bytes join, in C.

Nodes that are unknown (no usable published state) or stale are in neither table: they pass
and score 0, as the per-node loops in `extender.caches` judge them. The caller keeps that
true: it drops a node from every shape when it goes stale, and uses the tables only while no
indexed node can have gone stale since (`ClusterView.soonest_stale`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, repeat
from operator import attrgetter, is_, is_not

from sharepack.common.scoring import NodeScore


class ShapeReplies:
    """One request shape's failing nodes and non-zero encoded scores."""

    __slots__ = ("failing", "wire")

    def __init__(self) -> None:
        self.failing: dict[str, NodeScore] = {}  # node -> its infeasible verdict
        self.wire: dict[str, bytes] = {}  # node -> its encoded HostPriority, score > 0 only

    def put(self, name: str, verdict: NodeScore, wire: bytes) -> None:
        """The node's verdict and encoded score (empty for 0) for this shape."""
        if verdict.feasible:
            self.failing.pop(name, None)
        else:
            self.failing[name] = verdict
        if wire:
            self.wire[name] = wire
        else:
            self.wire.pop(name, None)

    def drop(self, name: str) -> None:
        """The node is unknown or stale from now on: it passes and scores 0."""
        self.failing.pop(name, None)
        self.wire.pop(name, None)

    def filter(self, names: Sequence[str]) -> tuple[list[int], dict[str, str], dict[str, str]]:
        """(indexes of survivors, node -> why it cannot, node -> why it never can), as
        `ClusterView.filter_nodes`."""
        return filter_failing(self.failing, names)

    def priorities(self, names: Iterable[str]) -> list[bytes]:
        """The encoded `HostPriority` of each of `names` that scores above 0, in order."""
        return list(filter(None, map(self.wire.get, names)))


def filter_failing(
    failing: Mapping[str, NodeScore], names: Sequence[str]
) -> tuple[list[int], dict[str, str], dict[str, str]]:
    """(indexes of survivors, node -> why it cannot, node -> why it never can) of `names`, all
    passing but the nodes in `failing` (their infeasible verdicts), in C but for those."""
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if not failing:
        return list(range(len(names))), failed, unresolvable
    verdicts = list(map(failing.get, names))
    survivors = list(compress(range(len(names)), map(is_, verdicts, repeat(None))))
    if len(survivors) < len(names):
        selected = list(map(is_not, verdicts, repeat(None)))
        judged: list[NodeScore] = list(filter(None, verdicts))  # a NodeScore is always true
        reasons = map(_REASON, judged)
        if any(map(_UNRESOLVABLE, judged)):
            for name, v, why in zip(compress(names, selected), judged, reasons):
                (unresolvable if v.unresolvable else failed)[name] = why
        else:  # the common case, in C: a full cluster fails thousands of nodes per request
            failed = dict(zip(compress(names, selected), reasons))
    return survivors, failed, unresolvable


_REASON = attrgetter("reason")
_UNRESOLVABLE = attrgetter("unresolvable")
