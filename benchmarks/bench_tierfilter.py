"""The tier filter's CPU per pod in process: the kept ranking against the node-by-node rule.

    .venv/bin/python benchmarks/bench_tierfilter.py [--nodes 1000,5000] [--pods 600]

Two `ClusterView`s as the shipped extender builds them (`fragaware`, tier of one, directed GPUs,
nodes' CPU and memory known) get the same nodes (random usage and CPU, so few are alike) and the
same pods (the default trace's mix, `bench_scheduler.pod_mix`), one at a time:

* ranked  — `remember` + `filter_nodes`: the GPU shape's kept ranking (`extender.tierranks`);
* by node — as before it: the shape's answers kept (`extender.replies`, the last 4 shapes, built
            over every node for a new shape) and every survivor ranked (`_best_tier`);
* reply   — ranked as /filter asks it (`all_reasons=False`: the reasons are read only when no
            node passes, so the failing nodes are not sorted out when the tier fills).

Each pod is then counted on the chosen node in every view (as /bind does); the answers must be
equal, pod by pod (the reply's survivors, and its reasons where none passes). Printed per size:
ms per pod of each, filter and counting, for the pods' first pass (new GPU shapes build their
ranking) and a second pass of the same shapes, the ratio by node / ranked, and the slowest
single filter (the first pod of a new GPU shape, ranked).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scheduler import RESOURCE, pod_mix  # noqa: E402

from sharepack.common import podrequests, state as published  # noqa: E402
from sharepack.common.policies import MigStrategy, NodePolicy, Policy, Sharing  # noqa: E402
from sharepack.common.podrequests import PodRequest  # noqa: E402
from sharepack.common.state import GpuState, NodeState, ResourceState  # noqa: E402
from sharepack.extender.caches import ClusterView  # noqa: E402
from sharepack.extender.noderesources import NodeResources  # noqa: E402

Answer = tuple[list[int], dict[str, str], dict[str, str]]


def node_obj(name: str, cpu_milli: int) -> dict[str, Any]:
    allocatable = {"cpu": f"{cpu_milli}m", "memory": "262144Mi", "pods": "110", RESOURCE: "80"}
    return {"metadata": {"name": name, "labels": {}}, "status": {"allocatable": allocatable}}


def state_obj(name: str, allocated: list[int]) -> dict[str, Any]:
    gpus = tuple(
        GpuState(f"GPU-{name}-{i}", str(i), "NVIDIA A100-SXM4-40GB", 10, a, 0, tuple(f"p-{name}-{i}-{k}" for k in range(a)))
        for i, a in enumerate(allocated)
    )
    state = NodeState("2026-11-30T03:00:00Z", "0.1.0", Policy.PACKED, MigStrategy.NONE,
                      (ResourceState(RESOURCE, Sharing.TIME_SLICING, False, gpus),))  # fmt: skip
    return {"metadata": {"name": name, "resourceVersion": "1"}, "status": published.to_status(state)}


def make_view(names: list[str], seed: int) -> ClusterView:
    rng = random.Random(seed)
    view = ClusterView(NodePolicy.FRAGAWARE, tier_width=1, resources=NodeResources(), directed=True)
    assert view.resources is not None
    for name in names:
        view.resources.upsert_node(node_obj(name, rng.choice([64000, 96000, 128000])))
        view.upsert_state(state_obj(name, [rng.choice([0, 0, 0, 3, 5, 10]) for _ in range(rng.choice([2, 4, 8]))]))
    return view


def by_node(view: ClusterView, names: list[str], req: PodRequest) -> Answer:
    """The filter as it was before the kept ranking."""
    view.remember(req, prioritizing=True)  # the shape's answers kept, as `remember` did
    return view._filter_by_node(names, req, view.wall_clock())


def ranked(view: ClusterView, names: list[str], req: PodRequest) -> Answer:
    view.remember(req)
    return view.filter_nodes(names, req)


def reply(view: ClusterView, names: list[str], req: PodRequest) -> Answer:
    view.remember(req)
    return view.filter_nodes(names, req, all_reasons=False)


def count(view: ClusterView, req: PodRequest, node: str) -> None:
    assert view.resources is not None
    view.resources.assume(req.uid, node, req.cpu, req.memory)
    if not req.empty:
        view.assume(req.uid, node, req)


def one_pass(views: dict[str, ClusterView], names: list[str], reqs: list[PodRequest]) -> dict[str, list[float]]:
    spent = {k: [0.0, 0.0, 0.0] for k in views}  # filter, counting, the slowest filter
    ways = {"ranked": ranked, "by node": by_node, "reply": reply}
    for req in reqs:
        answers = {}
        for k, view in views.items():
            t0 = time.process_time()
            answers[k] = ways[k](view, names, req)
            took = time.process_time() - t0
            spent[k][0] += took
            spent[k][2] = max(spent[k][2], took * len(reqs))  # per pod below, as the others
        assert answers["ranked"] == answers["by node"], f"the two filters disagree on pod {req.uid}"
        survivors = answers["ranked"][0]
        assert answers["reply"][0] == survivors, f"the reply's survivors differ on pod {req.uid}"
        assert survivors or answers["reply"] == answers["ranked"], f"the reply's reasons differ on pod {req.uid}"
        if survivors:
            for k, view in views.items():
                t0 = time.process_time()
                count(view, req, names[survivors[0]])
                spent[k][1] += time.process_time() - t0
    return {k: [s * 1e3 / len(reqs) for s in v] for k, v in spent.items()}


def requests(pods: list[dict[str, Any]], prefix: str) -> list[PodRequest]:
    out = []
    for i, pod in enumerate(pods):
        r = podrequests.pod_request(podrequests.decode_pod(pod, None), None)
        out.append(PodRequest(f"{prefix}{i}", r.namespace, r.name, r.containers, cpu=r.cpu, memory=r.memory))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1000,5000")
    parser.add_argument("--pods", type=int, default=600)
    args = parser.parse_args()
    for n in (int(x) for x in args.nodes.split(",")):
        names = [f"node-{i:05d}" for i in range(n)]
        views = {"ranked": make_view(names, 1), "by node": make_view(names, 1), "reply": make_view(names, 1)}
        pods = pod_mix(args.pods, 10)
        for label, prefix in (("first pass", "a"), ("second pass", "b")):
            r = one_pass(views, names, requests(pods, prefix))
            print(f"{n} nodes, {args.pods} pods, {label}: filter CPU ms per pod, ranked {r['ranked'][0]:.2f}, by node "
                  f"{r['by node'][0]:.2f} (ratio {r['by node'][0] / r['ranked'][0]:.1f}); slowest filter, ranked "
                  f"{r['ranked'][2]:.1f}, by node {r['by node'][2]:.1f}; counting the pod, ranked "
                  f"{r['ranked'][1]:.2f}, by node {r['by node'][1]:.2f}; as /filter asks (no reasons "
                  f"while a node passes) {r['reply'][0]:.2f}; answers equal")  # fmt: skip


if __name__ == "__main__":
    main()
