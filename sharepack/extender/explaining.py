"""`POST /explain`: why a pod would go where, for operators (`sharepack explain POD`).

The body is the `ExtenderArgs` kube-scheduler sends to /filter (the pod and the candidate node
names); the reply gives each node's filter verdict and score. Both come from the very loops
/filter and /prioritize run (`ClusterView.filter_nodes`, `ClusterView.host_priorities`, whose
reply leaves out the nodes that score 0), so an
explanation cannot disagree with a decision. Nothing changes: the pod is not remembered for
/bind nor its shape pre-scored, nothing is assumed; the only writes are the scorers' memos,
which hold the same answers they would compute anyway.

A bound pod is already counted on its node (by its agent, or assumed), so that node is judged
with the pod on it: the reply names the node (`boundTo`) for the reader to weigh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import orjson

from sharepack.common.podrequests import PodRequest
from sharepack.extender import protocol
from sharepack.extender.caches import ClusterView


class Knowledge(StrEnum):
    """What the extender knows of a node's GPUs; all but `published` pass the filter with score 0."""

    PUBLISHED = "published"
    STALE = "stale"  # observedAt older than --state-max-age-seconds
    UNREADABLE = "unreadable"  # a NodeGpuState this extender cannot decode
    UNKNOWN = "unknown"  # no NodeGpuState


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"  # cannot host the pod now
    UNRESOLVABLE = "unresolvable"  # never can (preemption would not help)


@dataclass(frozen=True, slots=True)
class NodeExplanation:
    node: str
    knowledge: Knowledge
    verdict: Verdict
    reason: str
    score: int


def _knowledge(view: ClusterView, name: str, now: float) -> Knowledge:
    scorer = view.scorers.get(name)
    if scorer is None:
        return Knowledge.UNREADABLE if name in view.invalid else Knowledge.UNKNOWN
    return Knowledge.STALE if scorer.fresh_until <= now else Knowledge.PUBLISHED


def explain(view: ClusterView, names: Sequence[str], request: PodRequest) -> list[NodeExplanation]:
    """Each of `names` with the verdict /filter gives and the score /prioritize gives."""
    now = view.wall_clock()
    survivors, failed, unresolvable = view.filter_nodes(names, request)
    passed = {names[i] for i in survivors}
    scores = {p["Host"]: p["Score"] for p in orjson.loads(protocol.join_priorities(view.host_priorities(names, request)))}
    out = []
    for name in names:
        if name in passed:
            verdict, reason = Verdict.PASS, ""
        elif name in unresolvable:
            verdict, reason = Verdict.UNRESOLVABLE, unresolvable[name]
        else:
            verdict, reason = Verdict.FAIL, failed.get(name, "")
        knowledge = _knowledge(view, name, now)
        if knowledge is Knowledge.UNREADABLE:
            reason = view.invalid.get(name, "")
        out.append(NodeExplanation(name, knowledge, verdict, reason, int(scores.get(name, 0))))
    return out


def encode(args: protocol.ExtenderArgs, request: PodRequest | None, nodes: Sequence[NodeExplanation]) -> bytes:
    return orjson.dumps({
        "pod": {"namespace": args.pod_namespace, "name": args.pod_name, "uid": args.pod_uid},
        # What this extender judges: resources some node publishes (others belong to another plugin).
        "request": dict(request.totals) if request is not None else {},
        "error": args.pod_error,
        "nodes": [
            {"node": n.node, "knowledge": str(n.knowledge), "filter": str(n.verdict), "reason": n.reason, "score": n.score}
            for n in nodes
        ],
    })  # fmt: skip
