"""The tier filter's kept ranking (extender.tierranks) gives exactly the answer of the
node-by-node ranking (every survivor's verdict, `scoring.best_tier`) through random clusters,
request shapes (GPUs, CPU and memory) and changes: writes, bound pods, CPU room, staleness,
unknown and GPU-free nodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharepack.common import podrequests, scoring
from sharepack.common.policies import NodePolicy, Policy
from sharepack.common.podrequests import ContainerKind, ContainerRequest, PodRequest
from sharepack.extender.caches import ClusterView
from sharepack.extender.noderesources import NodeResources
from sharepack.extender.tierranks import BoundRanks
from tests.extender.test_freshness import MAX_AGE, WallClock, state_obj

SHARED = "nvidia.com/gpu.shared"
NAMES = [f"node-{i}" for i in range(10)]
Answer = tuple[list[int], dict[str, str], dict[str, str]]


def node_obj(name: str, cpu: int, memory: int, gpus: bool) -> dict[str, Any]:
    allocatable = {"cpu": f"{cpu}m", "memory": f"{memory}Mi", "pods": "110"}
    if gpus:
        allocatable[SHARED] = "40"
    return {"metadata": {"name": name, "labels": {}}, "status": {"allocatable": allocatable}}


def cpu_pod(uid: str, node: str, cpu: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"p-{uid}", "namespace": "default", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": f"{cpu}m"}}}]},
        "status": {"phase": "Running"},
    }


def gpu_pod(uid: str, node: str, n: int, cpu: int) -> dict[str, Any]:
    pod = cpu_pod(uid, node, cpu)
    pod["spec"]["containers"][0]["resources"]["limits"] = {SHARED: str(n)}
    return pod


def request(uid: str, replicas: Sequence[int], cpu: int, memory: int) -> PodRequest:
    containers = tuple(
        ContainerRequest(f"c{i}", ContainerKind.APP, ((SHARED, n),)) for i, n in enumerate(replicas) if n
    )
    return PodRequest(uid, "default", f"p-{uid}", containers, cpu=cpu, memory=memory)


def node_by_node(view: ClusterView, names: Sequence[str], req: PodRequest) -> Answer:
    """The straightforward rule: every node's verdict, then `best_tier` over all survivors."""
    now = view.wall_clock()
    survivors, failed, unresolvable = view._filter_each(names, req, now)
    if 0 < view.tier_width < len(survivors):
        survivors = view._best_tier(names, survivors, req, now, failed)
    return survivors, failed, unresolvable


def make_view(policy: NodePolicy | Policy, width: int, directed: bool, clock: WallClock) -> ClusterView:
    return ClusterView(
        policy, tier_width=width, resources=NodeResources(), directed=directed, max_age_s=MAX_AGE, wall_clock=clock
    )


GPUS = st.lists(st.tuples(st.sampled_from([4, 10]), st.integers(0, 10)), min_size=1, max_size=4).map(
    lambda gs: [(t, min(a, t)) for t, a in gs]
)
REQUESTS = st.builds(
    lambda reps, cpu, mem, uid: request(f"u{uid}", reps, cpu, mem),
    st.lists(st.integers(0, 10), min_size=1, max_size=2),
    st.sampled_from([0, 100, 3152, 8000, 11400, 16000, 40000]),
    st.sampled_from([0, 1024, 65536]),
    st.integers(0, 5),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from([NodePolicy.FRAGAWARE, Policy.PACKED]),
    width=st.sampled_from([1, 1, 2, 3]),
    directed=st.booleans(),
    data=st.data(),
)
def test_the_kept_ranking_answers_as_the_node_by_node_ranking(
    policy: NodePolicy | Policy, width: int, directed: bool, data: st.DataObject
) -> None:
    clock = WallClock()
    view = make_view(policy, width, directed, clock)
    resources = view.resources
    assert resources is not None
    rv = iter(range(2, 100_000))
    pods = iter(range(100_000))

    def write(name: str) -> None:
        view.upsert_state(state_obj(name, clock.now, data.draw(GPUS), rv=str(next(rv))))

    def place(name: str) -> None:
        cpu = data.draw(st.sampled_from([0, 1000, 8000, 30000]))
        n = data.draw(st.integers(0, 4))
        pod = gpu_pod(f"b{next(pods)}", name, n, cpu) if n else cpu_pod(f"b{next(pods)}", name, cpu)
        resources.upsert_pod(pod)
        view.upsert_pod(pod)

    for name in NAMES:
        if data.draw(st.booleans()):  # some nodes have no Node object: no room, ranked by GPUs
            cpu = data.draw(st.sampled_from([4000, 16000, 32000, 64000, 96000]))
            resources.upsert_node(node_obj(name, cpu, data.draw(st.sampled_from([8192, 262144])), data.draw(st.booleans())))
        if data.draw(st.integers(0, 4)):  # some publish no state: unknown
            write(name)
    fast = 0
    for _ in range(data.draw(st.integers(1, 25))):
        req = view.relevant(data.draw(REQUESTS))
        view.remember(req)
        names = data.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=len(NAMES), unique=True))
        want = node_by_node(view, names, req)
        assert view.filter_nodes(names, req) == want
        if req.empty and not view.ranks_every_pod:
            continue
        ranks = view._kept_ranks(req, clock.now)
        assert ranks is not None  # remembered: the filter answered from the ranking
        answer = view._filter_ranked(names, req, ranks, clock.now)
        assert answer is not None and answer == want
        # As the filter's reply asks: the same nodes pass; the reasons only where none does.
        survivors, failed, unresolvable = view.filter_nodes(names, req, all_reasons=False)
        assert survivors == want[0]
        if not survivors:
            assert (failed, unresolvable) == want[1:]
        fast += 1
        op = data.draw(st.integers(0, 6))
        name = data.draw(st.sampled_from(NAMES))
        if op == 0:
            write(name)
        elif op == 1:
            place(name)
        elif op == 2:
            clock.now += data.draw(st.sampled_from([10.0, MAX_AGE]))  # some states go stale
        elif op == 3:
            view.delete_state({"metadata": {"name": name}})
        elif op == 4:  # its CPU room changes
            resources.upsert_node(node_obj(name, data.draw(st.sampled_from([8000, 48000])), 262144, True))
        elif op == 5 and name in view.assumed:
            view.expire()
    assert fast or not view.ranks_every_pod


def test_a_request_of_a_new_cpu_shape_scores_only_the_nodes_above_the_best() -> None:
    """The point of the bound: a GPU shape seen once ranks its next CPU shapes with a few
    verdicts, not one per node."""
    clock = WallClock()
    view = make_view(NodePolicy.FRAGAWARE, 1, True, clock)
    assert view.resources is not None
    for i, name in enumerate(NAMES):
        view.resources.upsert_node(node_obj(name, 64000, 262144, True))
        view.upsert_state(state_obj(name, clock.now, [(10, i % 4), (10, 0)]))
    view.remember(request("u1", [5], 1000, 0))
    second = request("u2", [5], 8000, 1024)
    view.remember(second)
    view.filter_nodes(NAMES, second)
    scored = [n for n in NAMES if second.shape in view.scorers[n].verdicts]
    assert 0 < len(scored) < len(NAMES) // 2


def test_a_name_given_twice_is_ranked_node_by_node() -> None:
    clock = WallClock()
    view = make_view(NodePolicy.FRAGAWARE, 1, False, clock)
    for name in NAMES[:3]:
        view.upsert_state(state_obj(name, clock.now, [(10, 3)]))
    req = request("u1", [2], 0, 0)
    view.remember(req)
    names = [NAMES[0], NAMES[1], NAMES[0], NAMES[2]]
    ranks = view._kept_ranks(req, clock.now)
    assert ranks is not None and view._filter_ranked(names, req, ranks, clock.now) is None
    assert view.filter_nodes(names, req) == node_by_node(view, names, req)


@pytest.mark.parametrize("rank", [float("nan"), float("-inf"), float("inf")])
def test_a_rank_that_is_not_a_finite_number_leaves_the_heap(rank: float) -> None:
    ranks = BoundRanks(request("u", [1], 0, 0))
    ranks.put("node-a", scoring.NodeScore(True, 5, "", {}, rank=rank))
    assert ranks.odd == {"node-a"} and ranks.bounds == {}
    ranks.put("node-a", scoring.NodeScore(True, 5, "", {}, rank=1.0))
    assert ranks.odd == set() and ranks.bounds == {"node-a": -1.0}


def test_an_exact_rank_above_its_bound_is_refused_not_believed() -> None:
    ranks = BoundRanks(request("u", [1], 0, 0))
    ranks.put("node-a", scoring.NodeScore(True, 5, "", {}, rank=1.0))
    ranks.put("node-b", scoring.NodeScore(True, 5, "", {}, rank=0.5))
    assert ranks.best({"node-a", "node-b"}, 1, {"node-a": 0.2, "node-b": 0.4}.__getitem__) == [
        (-0.4, scoring.tie_key("node-b"), "node-b")
    ]
    assert ranks.best({"node-a"}, 1, lambda _: 2.0) is None  # a bound that does not hold


def test_stale_heap_entries_are_dropped_and_compacted() -> None:
    ranks = BoundRanks(request("u", [1], 0, 0))
    for i in range(500):
        ranks.put("node-a", scoring.NodeScore(True, 5, "", {}, rank=float(i % 7)))
    assert len(ranks._heap) <= 2 * len(ranks.bounds) + 64 + 1
    assert ranks.best({"node-a"}, 1, lambda _: 6.0 if ranks.bounds["node-a"] == -6.0 else 1.0)[0][2] == "node-a"


def test_decoded_requests_of_one_gpu_shape_share_one_ranking() -> None:
    clock = WallClock()
    view = make_view(NodePolicy.FRAGAWARE, 1, False, clock)
    view.upsert_state(state_obj(NAMES[0], clock.now, [(10, 3)]))
    for uid, cpu in (("a", "1"), ("b", "2500m")):
        pod = cpu_pod(uid, "", 0)
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}, "limits": {SHARED: "3"}}
        view.remember(podrequests.pod_request(podrequests.decode_pod(pod, None), None))
    assert len(view._ranks) == 1
