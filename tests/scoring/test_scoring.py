"""Node scoring: feasibility, predicted placement, the 0..10 score, and a packing scenario."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharepack.common import podrequests as pr
from sharepack.common import scoring
from sharepack.common.policies import MigStrategy, NodePolicy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState

SHARED = "nvidia.com/gpu.shared"
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.5gb"
PACKED, DISTRIBUTED = Policy.PACKED, Policy.DISTRIBUTED

Gpus = Sequence[tuple[int, int] | tuple[int, int, int]]  # (total, allocated[, unhealthy])


def resource(name: str, gpus: Gpus, *, sharing: Sharing = Sharing.TIME_SLICING,
             fail_gt_one: bool = False) -> ResourceState:  # fmt: skip
    return ResourceState(
        name, sharing, fail_gt_one,
        tuple(GpuState(f"GPU-{i}", str(i), "NVIDIA A100-SXM4-40GB", g[0], g[1],
                       g[2] if len(g) > 2 else 0) for i, g in enumerate(gpus)),  # type: ignore[misc]
    )  # fmt: skip


def node(gpus: Gpus, *, policy: Policy = PACKED, name: str = SHARED, **kw: object) -> NodeState:
    res = resource(name, gpus, **kw)  # type: ignore[arg-type]
    return NodeState("2026-11-30T03:00:00Z", "0.1.0", policy, MigStrategy.NONE, (res,))


def request(*containers: int, init: Sequence[int] = (), name: str = SHARED, uid: str = "u") -> pr.PodRequest:
    return pr.pod_request(pr.Pod(
        uid, "ns", "p",
        containers=tuple(pr.Container(f"c{i}", {name: n}) for i, n in enumerate(containers)),
        init_containers=tuple(pr.Container(f"i{i}", {name: n}, kind=pr.ContainerKind.INIT)
                              for i, n in enumerate(init)),
    ))  # fmt: skip


# --- feasibility ------------------------------------------------------------------------------

INFEASIBLE = [
    pytest.param(node([(4, 4), (4, 3)]), request(2), "not enough free devices: pod needs 2, node has 1", False,
                 id="fewer free replicas than asked"),
    pytest.param(node([(4, 2, 2), (4, 3)]), request(2), "node has 1", False,
                 id="unhealthy replicas are not free"),
    pytest.param(node([(7, 7), (7, 7)], name=MIG, sharing=Sharing.NONE), request(1, name=MIG), "node has 0", False,
                 id="no free MIG instance of the profile"),
    pytest.param(node([(4, 0)]), request(1, name=GPU), "publishes no such resource", True,
                 id="a resource the node does not publish"),
    pytest.param(node([(4, 0)], fail_gt_one=True), request(2), "failRequestsGreaterThanOne", True,
                 id="multi-replica container where the node fails requests greater than one"),
]  # fmt: skip


@pytest.mark.parametrize(("state", "req", "reason", "unresolvable"), INFEASIBLE)
def test_nodes_that_cannot_host_the_pod_fail_with_a_reason(
    state: NodeState, req: pr.PodRequest, reason: str, unresolvable: bool
) -> None:
    s = scoring.score_node(state, req, PACKED)
    assert not s.feasible
    assert reason in s.reason
    assert s.unresolvable == unresolvable
    assert s.score == 0


def test_fail_requests_greater_than_one_allows_single_replicas_in_many_containers() -> None:
    s = scoring.score_node(node([(4, 0)], fail_gt_one=True), request(1, 1), PACKED)
    assert s.feasible
    assert s.placement[SHARED] == ("GPU-0", "GPU-0")


def test_a_pod_without_managed_resources_is_feasible_everywhere() -> None:
    empty = pr.pod_request(pr.Pod("u", "ns", "p", (pr.Container("c", {}),)))
    assert scoring.score_node(node([(4, 4)]), empty, PACKED) is scoring.NO_REQUEST


# --- predicted placement: the node's own policy -----------------------------------------------

PLACEMENT = [
    pytest.param(node([(4, 1), (4, 2), (4, 0)], policy=PACKED), request(1), ("GPU-1",),
                 id="a packed node gives the most used GPU"),
    pytest.param(node([(4, 1), (4, 2), (4, 0)], policy=DISTRIBUTED), request(1), ("GPU-2",),
                 id="a distributed node gives the least used GPU"),
    pytest.param(node([(4, 3), (4, 0)], policy=PACKED), request(2), ("GPU-0", "GPU-1"),
                 id="packed overflows to the next GPU when the fullest runs out"),
    pytest.param(node([(4, 0), (4, 0)], policy=DISTRIBUTED), request(2), ("GPU-0", "GPU-1"),
                 id="distributed rotates over equally loaded GPUs"),
    pytest.param(node([(4, 0), (4, 0)], policy=PACKED), request(1, 1), ("GPU-0", "GPU-0"),
                 id="containers are placed one after another on a packed node"),
    pytest.param(node([(4, 0), (4, 0)], policy=PACKED), request(2, init=[2]), ("GPU-0", "GPU-0"),
                 id="an app container reuses its init container's devices"),
    pytest.param(node([(4, 0), (4, 0)], policy=PACKED), request(1, init=[3]), ("GPU-0", "GPU-0", "GPU-0"),
                 id="init devices stay held for the pod"),
]  # fmt: skip


@pytest.mark.parametrize(("state", "req", "expected"), PLACEMENT)
def test_the_prediction_replays_the_nodes_allocation_policy(
    state: NodeState, req: pr.PodRequest, expected: tuple[str, ...]
) -> None:
    s = scoring.score_node(state, req, PACKED)
    assert s.feasible, s.reason
    assert s.placement[SHARED] == expected


# --- scores ---------------------------------------------------------------------------------

RANKS = [
    pytest.param(node([(4, 2), (4, 0)]), node([(4, 0), (4, 0)]), request(1),
                 id="landing on a used GPU beats opening a fresh one"),
    pytest.param(node([(4, 3), (4, 0)]), node([(4, 1), (4, 0)]), request(1),
                 id="the tighter fit wins among used GPUs"),
    pytest.param(node([(4, 4), (4, 0)]), node([(4, 0), (4, 0)]), request(1),
                 id="a fuller node wins when both open a fresh GPU"),
    pytest.param(node([(4, 0), (4, 0)]), node([(4, 2), (4, 0)]), request(4),
                 id="a whole-GPU request prefers a free GPU it fills over splitting across a used one"),
    pytest.param(node([(1, 1), (1, 0)], sharing=Sharing.NONE, name=SHARED),
                 node([(1, 0), (1, 0)], sharing=Sharing.NONE, name=SHARED), request(1),
                 id="full GPUs go to the fuller node"),
]  # fmt: skip


@pytest.mark.parametrize(("better", "worse", "req"), RANKS)
def test_packed_ranks_and_distributed_reverses(better: NodeState, worse: NodeState, req: pr.PodRequest) -> None:
    # By the fine rank: 0..10 is coarse and can tie where the rank tells the nodes apart.
    assert scoring.score_node(better, req, PACKED).rank > scoring.score_node(worse, req, PACKED).rank
    assert scoring.score_node(better, req, PACKED).score >= scoring.score_node(worse, req, PACKED).score
    assert scoring.score_node(better, req, DISTRIBUTED).rank < scoring.score_node(worse, req, DISTRIBUTED).rank


def test_scores_use_the_documented_formula() -> None:
    # One replica on the used GPU of a half-used 2-GPU node: reuse 1, gpu_use 1 GPU of 8, fit 3/4.
    s = scoring.score_node(node([(4, 2), (4, 0)]), request(1), PACKED)
    assert s.score == int(10 * (0.6 * 1 + 0.3 * 1 / 8 + 0.1 * 0.75) + 0.5) == 7
    assert scoring.score_node(node([(4, 2), (4, 0)]), request(1), DISTRIBUTED).score == 3


def test_a_mig_profile_packs_by_parent_gpu() -> None:
    state = node([(7, 3), (7, 0)], name=MIG, sharing=Sharing.NONE, policy=PACKED)
    s = scoring.score_node(state, request(2, name=MIG), PACKED)
    assert s.placement[MIG] == ("GPU-0", "GPU-0")


def test_the_scorer_memoises_by_request_shape() -> None:
    scorer = scoring.NodeScorer(node([(4, 1)]), PACKED)
    first = scorer.score(request(1, uid="a"))
    assert scorer.score(request(1, uid="b")) is first
    assert scorer.score(request(2, uid="c")) is not first
    assert len(scorer) == 2


def test_applying_a_placement_counts_the_pod_on_its_gpus() -> None:
    state = node([(4, 1), (4, 0)])
    s = scoring.score_node(state, request(2), PACKED)
    after = scoring.apply_placement(state, "pod-x", s.placement)
    assert [g.allocated for g in after.resources[0].gpus] == [3, 0]
    assert scoring.placed_gpus(after, "pod-x") == {SHARED: frozenset({"GPU-0"})}


# --- properties -------------------------------------------------------------------------------

gpu = st.integers(1, 8).flatmap(
    lambda total: st.tuples(st.just(total), st.integers(0, total)).flatmap(
        lambda ta: st.tuples(st.just(ta[0]), st.just(ta[1]), st.integers(0, ta[0] - ta[1]))
    )
)
policies = st.sampled_from(list(Policy))


@settings(max_examples=300, deadline=None)
@given(st.lists(gpu, min_size=1, max_size=8), st.lists(st.integers(1, 6), min_size=1, max_size=3),
       policies, policies)  # fmt: skip
def test_properties_of_every_score(gpus: Gpus, sizes: list[int], node_policy: Policy, policy: Policy) -> None:
    state = node(gpus, policy=node_policy)
    req = request(*sizes)
    s = scoring.score_node(state, req, policy)
    free = sum(t - a - u for t, a, u in gpus)  # type: ignore[misc]
    assert 0 <= s.score <= 10
    assert s.feasible == (free >= sum(sizes))
    if s.feasible:
        taken = Counter(s.placement[SHARED])
        assert sum(taken.values()) == sum(sizes)
        for i, (t, a, u) in enumerate(gpus):  # type: ignore[misc]
            assert taken.get(f"GPU-{i}", 0) <= t - a - u
        other = scoring.score_node(state, req, PACKED if policy is not PACKED else DISTRIBUTED).score
        assert abs((s.score + other) - 10) <= 1  # the reverse, up to rounding


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(2, 8), min_size=1, max_size=8), st.data())
def test_packed_prefers_landing_on_used_gpus(totals: list[int], data: st.DataObject) -> None:
    used = data.draw(st.integers(0, len(totals) - 1))
    allocated = data.draw(st.integers(1, totals[used] - 1))
    gpus = [(t, allocated if i == used else 0) for i, t in enumerate(totals)]
    busy = node(gpus, policy=PACKED)
    empty = node([(t, 0) for t in totals], policy=PACKED)
    s = scoring.score_node(busy, request(1), PACKED)
    assert s.placement[SHARED] == (f"GPU-{used}",)
    assert s.score > scoring.score_node(empty, request(1), PACKED).score
    assert scoring.score_node(busy, request(1), DISTRIBUTED).score < scoring.score_node(empty, request(1), DISTRIBUTED).score


# --- scenario: shared pods, then whole-GPU pods ---------------------------------------------


def best_node(
    scorers: list[tuple[str, scoring.NodeScorer]], req: pr.PodRequest
) -> tuple[str, scoring.NodeScore] | None:
    """A scheduler stand-in: the feasible node with the highest score, ties by name."""
    feasible = [(name, s) for name, scorer in scorers if (s := scorer.score(req)).feasible]
    return min(feasible, key=lambda ns: (-ns[1].score, ns[0]), default=None)


def run_stream(policy: Policy, nodes: int, shared: int, whole: int) -> tuple[int, int]:
    """Schedule `shared` 1-replica pods then `whole` 4-replica pods (one GPU's worth) with
    `policy` on nodes and extender; returns (whole pods landing on one free GPU, stranded)."""
    states = {f"node-{i}": node([(4, 0), (4, 0)], policy=policy) for i in range(nodes)}
    uid = 0

    def place(req: pr.PodRequest) -> scoring.NodeScore | None:
        nonlocal uid
        scorers = [(n, scoring.NodeScorer(s, policy)) for n, s in states.items()]
        best = best_node(scorers, req)
        if best is None:
            return None
        name, s = best
        uid += 1
        states[name] = scoring.apply_placement(states[name], f"pod-{uid}", s.placement)
        return s

    for _ in range(shared):
        assert place(request(1)) is not None
    landed = stranded = 0
    for _ in range(whole):
        s = place(request(4))
        if s is not None and len(set(s.placement[SHARED])) == 1:
            landed += 1
        else:
            stranded += 1
    return landed, stranded


@pytest.mark.parametrize("shared", [6, 8, 10, 12])
def test_packed_keeps_whole_gpus_for_whole_gpu_pods_where_distributed_strands_them(shared: int) -> None:
    # 4 nodes x 2 GPUs x 4 replicas; packed fills at most two nodes with <= 12 shared pods, so
    # the other two keep 4 whole GPUs. Distributed touches every GPU once there are 8 shared
    # pods; with 6, the two untouched GPUs sit on nodes whose other GPU is used, and a
    # distributed node splits a 4-replica request across both.
    nodes, whole = 4, 4
    assert run_stream(PACKED, nodes, shared, whole) == (whole, 0)
    landed, stranded = run_stream(DISTRIBUTED, nodes, shared, whole)
    assert landed == 0 and stranded == whole


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["GPU-0", "GPU-1", "GPU-2"]), st.integers(-2, 6), st.integers(-2, 8),
                       st.integers(-2, 8)), max_size=6),
    st.lists(st.integers(1, 5), min_size=1, max_size=3), policies, policies,
)  # fmt: skip
def test_inconsistent_published_states_never_raise(
    gpus: list[tuple[str, int, int, int]], sizes: list[int], node_policy: Policy, policy: Policy
) -> None:
    # Duplicate keys, negative or over-full counts: a buggy or hostile publisher must not crash
    # the scorer (the extender would answer 500).
    res = ResourceState(SHARED, Sharing.TIME_SLICING, False,
                        tuple(GpuState(k, "0", "x", t, a, u) for k, t, a, u in gpus))  # fmt: skip
    state = NodeState("", "", node_policy, MigStrategy.NONE, (res,))
    s = scoring.score_node(state, request(*sizes), policy)
    assert 0 <= s.score <= 10


@settings(max_examples=200, deadline=None)
@given(st.lists(gpu, min_size=1, max_size=6), st.lists(st.integers(1, 4), min_size=1, max_size=2),
       policies, policies, st.randoms(use_true_random=False))  # fmt: skip
def test_nodes_alike_but_for_gpu_names_share_scores_exactly(
    gpus: Gpus, sizes: list[int], node_policy: Policy, policy: Policy, rnd: Any
) -> None:
    first = node(gpus, policy=node_policy)
    names = [f"GPU-{i}" for i in range(len(gpus))]
    renamed = [f"GPU-{c}" for c in rnd.sample("abcdefgh", len(gpus))]
    res = first.resources[0]
    second = NodeState(first.observed_at, first.agent_version, node_policy, first.mig_strategy, (
        ResourceState(res.name, res.sharing, False, tuple(
            GpuState(renamed[names.index(g.key)], g.index, g.product, g.total, g.allocated, g.unhealthy)
            for g in res.gpus)),))  # fmt: skip
    templates = scoring.ScoreTemplates(policy)
    req = request(*sizes)
    for state in (first, second):  # the second may reuse the first's template
        shared = scoring.NodeScorer(state, policy, templates=templates).score(req)
        assert shared == scoring.score_node(state, req, policy)


@settings(max_examples=300, deadline=None)
@given(st.lists(gpu, min_size=1, max_size=8), st.lists(st.integers(1, 6), min_size=1, max_size=3),
       st.lists(st.integers(1, 4), max_size=1), st.booleans(), policies, policies,
       st.randoms(use_true_random=False))  # fmt: skip
def test_nodes_with_the_same_counts_in_another_order_share_scores_exactly(
    gpus: Gpus, sizes: list[int], init: list[int], two_resources: bool, node_policy: Policy, policy: Policy,
    rnd: Any,
) -> None:
    # Counts-first signatures (`signature(any_order=True)`) share one simulation between nodes
    # whose GPUs carry the same counts in another order: every node must still get exactly
    # the score and placement its own simulation gives, for one container or several.
    order = list(range(len(gpus)))
    rnd.shuffle(order)
    other = "nvidia.com/gpu"

    def state(loads: Gpus) -> NodeState:
        resources = [resource(SHARED, loads)]
        if two_resources:  # the same GPUs under a second resource, with counts of their own
            resources.append(resource(other, [(1, (t + a) % 2) for t, a, *_ in loads]))
        return NodeState("2026-11-30T03:00:00Z", "0.1.0", node_policy, MigStrategy.NONE, tuple(resources))

    first, second = state(gpus), state([gpus[i] for i in order])
    templates = scoring.ScoreTemplates(policy)
    req = request(*sizes, init=init)
    for s in (first, second):
        scorer = scoring.NodeScorer(s, policy, templates=templates)
        own = scoring.score_node(s, req, policy)
        verdict = scorer.verdict(req)
        assert (verdict.feasible, verdict.score, verdict.reason, verdict.rank) == (own.feasible, own.score, own.reason, own.rank)
        assert scorer.score(req) == own


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1)), min_size=1, max_size=6),
    st.lists(st.tuples(st.sampled_from([1, 1, 2, 2, 3, 3, 4, 4, 0, 9, 12]), st.sampled_from([0, 3000, 12000, 40000])),
             min_size=1, max_size=3),
    st.lists(st.tuples(st.sampled_from([0, 2000, 8000, 16000, 30000, 64000]), st.booleans()), min_size=2, max_size=5),
    st.sampled_from([10, 8, 1000, 1024]), st.booleans(), st.booleans(), st.randoms(use_true_random=False),
)  # fmt: skip
def test_fragaware_verdicts_shared_between_nodes_alike_in_any_order_are_each_nodes_own(
    counts: list[tuple[int, int]], shapes: list[tuple[int, int]], nodes: list[tuple[int, bool]], replicas: int,
    mixed_totals: bool, refuse_many: bool, rnd: Any,
) -> None:  # fmt: skip
    # `fragaware` with directed shares shares verdicts between nodes whose GPUs carry the same
    # counts in any order, each under its own GPU names and published order and with its own
    # CPU room, and the directed share's candidates per such group and GPU shape
    # (`ScoreTemplates._choices`): every node must still get exactly its own verdict, request
    # after request, and its own placement from `score`: shares on one GPU, shares no GPU has
    # room for (the agent's own placement, over several GPUs) and pods without GPUs. Some
    # nodes have one GPU freer than the others (another group). Mixed totals, or more devices
    # than milli-GPUs, are where ties can fall between GPUs with different counts: there
    # nothing may be shared in any order.
    policy = NodePolicy.FRAGAWARE
    templates = scoring.ScoreTemplates(policy, directed=True)
    requests = [
        pr.PodRequest(f"u{i}", "ns", "p", (pr.ContainerRequest("c", pr.ContainerKind.APP, ((SHARED, n),)),) if n else (),
                      cpu=cpu)
        for i, (n, cpu) in enumerate(shapes)
    ]  # fmt: skip
    for k, (room, freer) in enumerate(nodes):
        order = list(range(len(counts)))
        rnd.shuffle(order)
        gpus = []
        for pos, i in enumerate(order):
            total = replicas + (i % 2 if mixed_totals else 0)
            free, unhealthy = counts[i][0] + (freer and i == 0), counts[i][1]
            gpus.append(GpuState(f"GPU-n{k}-{rnd.randrange(1000)}-{pos}", str(pos), "x", total,
                                 total - free - unhealthy, unhealthy))  # fmt: skip
        res = ResourceState(SHARED, Sharing.TIME_SLICING, refuse_many, tuple(gpus))
        state = NodeState("2026-11-30T03:00:00Z", "0.1.0", PACKED, MigStrategy.NONE, (res,))
        scorer = scoring.NodeScorer(state, policy, templates=templates, room=(room, 1 << 20))
        for req in requests:
            own = scoring.score_node(state, req, policy, admitted=scorer.admitted(req), directed=True)
            verdict = scorer.verdict(req)
            assert (verdict.feasible, verdict.score, verdict.reason, verdict.rank, verdict.unresolvable) == (
                own.feasible, own.score, own.reason, own.rank, own.unresolvable,
            )  # fmt: skip
            assert scorer.score(req) == own
    if not mixed_totals and replicas <= 1000:
        # At most two groups of alike nodes: candidates kept once per group and GPU shape.
        assert len(templates._choices) <= 2 * len({r.gpu_shape for r in requests})


def test_nodes_with_the_same_counts_in_another_order_are_simulated_once() -> None:
    templates = scoring.ScoreTemplates(PACKED)
    loads = [(4, 1), (4, 0), (4, 3)]
    scorers = [scoring.NodeScorer(node(order), PACKED, templates=templates) for order in (loads, loads[::-1])]
    scores = [s.score(request(1)) for s in scorers]
    assert len(templates._memo) == 1
    assert [s.placement[SHARED] for s in scores] == [("GPU-2",), ("GPU-0",)]  # the fullest GPU on each


def test_identical_machines_are_simulated_once_per_shape() -> None:
    templates = scoring.ScoreTemplates(PACKED)
    scorers = [
        scoring.NodeScorer(NodeState("", "", PACKED, MigStrategy.NONE, (ResourceState(
            SHARED, Sharing.TIME_SLICING, False,
            tuple(GpuState(f"GPU-n{n}-{i}", str(i), "x", 4, 1, 0) for i in range(2))),)), PACKED,
            templates=templates)
        for n in range(3)
    ]  # fmt: skip
    verdicts = [s.verdict(request(1)) for s in scorers]
    assert len(templates._memo) == 1
    assert all(v is verdicts[0] for v in verdicts)  # shared as is: same score, no renaming
    scores = [s.score(request(1)) for s in scorers]
    assert [s.placement[SHARED] for s in scores] == [("GPU-n0-0",), ("GPU-n1-0",), ("GPU-n2-0",)]


def test_placements_applied_keep_every_field_of_the_state() -> None:
    """`apply_placement` and `release_placement` copy the state's dataclasses field by field
    (faster than `dataclasses.replace` on the rebuild path), and `statebuilding.same_use`
    compares them so: a field added to one of them must be added to both, or it would be lost
    on every assumed pod and ignored by every comparison of published states."""
    from dataclasses import fields

    from sharepack.common.policies import MigStrategy, Policy, Sharing
    from sharepack.common.state import GpuState, NodeState, ResourceState

    assert [f.name for f in fields(GpuState)] == ["key", "index", "product", "total", "allocated", "unhealthy", "pods"]
    assert [f.name for f in fields(ResourceState)] == ["name", "sharing", "fail_requests_greater_than_one", "gpus"]
    assert [f.name for f in fields(NodeState)] == [
        "observed_at", "agent_version", "allocation_policy", "mig_strategy", "resources", "schema_version"]  # fmt: skip
    gpu = GpuState("GPU-a", "3", "H100", 10, 2, 1, ("p1",))
    state = NodeState("2026-12-06T00:00:00Z", "9.9", Policy.DISTRIBUTED, MigStrategy.MIXED,
                      (ResourceState("nvidia.com/gpu.shared", Sharing.MPS, True, (gpu,)),), schema_version=7)  # fmt: skip
    after = scoring.apply_placement(state, "p2", {"nvidia.com/gpu.shared": ("GPU-a", "GPU-a")})
    expected_gpu = GpuState("GPU-a", "3", "H100", 10, 4, 1, ("p1", "p2"))
    assert after == NodeState(state.observed_at, "9.9", Policy.DISTRIBUTED, MigStrategy.MIXED,
                              (ResourceState("nvidia.com/gpu.shared", Sharing.MPS, True, (expected_gpu,)),), 7)  # fmt: skip
    assert scoring.release_placement(after, "p2", {"nvidia.com/gpu.shared": ("GPU-a", "GPU-a")}) == state
