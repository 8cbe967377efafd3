"""`sharepack status`: every node's published GPUs as bars, and the cluster's totals.

Totals count fresh nodes only: a stale state (its agent has not written for longer than
`--stale-after`, by default the extender's --state-max-age-seconds) may be wrong in either
direction, and the extender treats such a node as unknown too. Whole-GPU and stranded counts
follow `common.capacity`, the definition the extender's gauges and `kubectl get
nodegpustates` use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sharepack.cli.reading import PublishedNode
from sharepack.common import bars, capacity
from sharepack.common.state import NodeState, observed_epoch


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    state: NodeState | None
    error: str  # why the state cannot be read ("" when it can)
    age_s: float | None  # seconds since observedAt; None when unreadable
    stale: bool
    capacity: capacity.Capacity | None


@dataclass(frozen=True, slots=True)
class Totals:
    nodes: int
    fresh_nodes: int
    stale_nodes: int
    unreadable_nodes: int
    gpus: int  # on fresh nodes
    whole_gpus_free: int
    stranded_replicas: int


def node_status(node: PublishedNode, now: float, stale_after_s: float) -> NodeStatus:
    if node.state is None:
        return NodeStatus(node.name, None, node.error, None, False, None)
    observed = observed_epoch(node.state.observed_at)
    age = None if observed is None else max(now - observed, 0.0)
    # No readable time: we cannot tell it is fresh (the extender decides the same way).
    stale = stale_after_s > 0 and (age is None or age > stale_after_s)
    return NodeStatus(node.name, node.state, "", age, stale, capacity.capacity(node.state))


def statuses(nodes: Mapping[str, PublishedNode], now: float, stale_after_s: float) -> list[NodeStatus]:
    return [node_status(nodes[name], now, stale_after_s) for name in sorted(nodes)]


def totals(rows: list[NodeStatus]) -> Totals:
    fresh = [r.capacity for r in rows if r.capacity is not None and not r.stale]
    return Totals(
        nodes=len(rows),
        fresh_nodes=len(fresh),
        stale_nodes=sum(1 for r in rows if r.stale),
        unreadable_nodes=sum(1 for r in rows if r.state is None),
        gpus=sum(c.gpus for c in fresh),
        whole_gpus_free=sum(c.whole_gpus_free for c in fresh),
        stranded_replicas=sum(c.stranded for c in fresh),
    )


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def render_text(rows: list[NodeStatus]) -> str:
    """The bars, one line per node and resource, then the totals line."""
    if not rows:
        return "no NodeGpuStates: no sharepack agent has published a node yet\n"
    name_w = max(len(r.name) for r in rows)
    res_w = max((len(res.name) for r in rows if r.state for res in r.state.resources), default=0)
    lines = []
    for r in rows:
        if r.state is None:
            lines.append(f"{r.name:<{name_w}}  unreadable: {r.error}")
            continue
        note = f"  (stale: observed {_age(r.age_s)} ago)" if r.stale else ""
        if not r.state.resources:
            lines.append(f"{r.name:<{name_w}}  no GPU resources{note}")
        for res in r.state.resources:
            label = f"{r.name:<{name_w}}  {res.name:<{res_w}} "
            lines.append(bars.node_line(label, res, width=len(label)) + note)
    t = totals(rows)
    lines.append("")
    lines.append(
        f"{_plural(t.whole_gpus_free, 'whole GPU')} free of {t.gpus}, "
        f"{_plural(t.stranded_replicas, 'stranded replica')}, "
        f"{_plural(t.stale_nodes, 'stale node')}"
        + (f", {_plural(t.unreadable_nodes, 'unreadable node')}" if t.unreadable_nodes else "")
        + f" ({_plural(t.fresh_nodes, 'fresh node')} counted)"
    )
    return "\n".join(lines) + "\n"


def to_json(rows: list[NodeStatus], stale_after_s: float) -> dict[str, Any]:
    t = totals(rows)
    return {
        "staleAfterSeconds": stale_after_s,
        "totals": {
            "nodes": t.nodes, "freshNodes": t.fresh_nodes, "staleNodes": t.stale_nodes,
            "unreadableNodes": t.unreadable_nodes, "gpus": t.gpus, "wholeGpusFree": t.whole_gpus_free,
            "strandedReplicas": t.stranded_replicas,
        },
        "nodes": [_node_json(r) for r in rows],
    }  # fmt: skip


def _node_json(r: NodeStatus) -> dict[str, Any]:
    if r.state is None or r.capacity is None:
        return {"name": r.name, "error": r.error}
    c = r.capacity
    return {
        "name": r.name,
        "observedAt": r.state.observed_at,
        "ageSeconds": None if r.age_s is None else round(r.age_s, 1),
        "stale": r.stale,
        "allocationPolicy": str(r.state.allocation_policy),
        "gpus": c.gpus, "wholeGpusFree": c.whole_gpus_free, "strandedReplicas": c.stranded,
        "used": c.used, "total": c.total,
        "resources": [
            {
                "name": res.name,
                "gpus": [
                    {"index": g.index, "key": g.key, "product": g.product, "allocated": g.allocated,
                     "unhealthy": g.unhealthy, "total": g.total}
                    for g in res.gpus
                ],
            }
            for res in r.state.resources
        ],
    }  # fmt: skip
