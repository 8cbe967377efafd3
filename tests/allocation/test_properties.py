"""Allocation invariants over generated nodes (hypothesis)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharepack.common import allocation
from sharepack.common.allocation import GpuLoad
from sharepack.common.devices import replica_id
from sharepack.common.errors import AllocationError
from sharepack.common.policies import Policy

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Node:
    devices: list[str]
    parent: dict[str, str]  # device id -> physical key (MIG-like when several bases share one)
    available: list[str]
    must_include: list[str]
    size: int


@st.composite
def nodes(draw: st.DrawFn) -> Node:
    n_gpus = draw(st.integers(1, 6))
    devices: list[str] = []
    parent: dict[str, str] = {}
    for g in range(n_gpus):
        # One or more "instances" per GPU (MIG-like), each with 1..5 replicas.
        for m in range(draw(st.integers(1, 2))):
            base = f"dev-{g}-{m}"
            for n in range(draw(st.integers(1, 5))):
                device_id = replica_id(base, n)
                devices.append(device_id)
                parent[device_id] = f"gpu-{g}"
    available = draw(st.lists(st.sampled_from(devices), unique=True, max_size=len(devices)))
    must_include = draw(st.lists(st.sampled_from(available), unique=True)) if available else []
    size = draw(st.integers(0, len(devices) + 1))
    shuffle_seed = draw(st.integers(0, 2**16))
    random.Random(shuffle_seed).shuffle(available)
    return Node(devices, parent, available, must_include, size)


@st.composite
def feasible_nodes(draw: st.DrawFn) -> Node:
    """A request the node can meet, that needs at least one pick beyond must-include, with
    candidates on at least two GPUs: the policies have a real choice to make. Devices left out
    of `available` are held by other pods, so the GPUs start unevenly loaded."""
    n_gpus = draw(st.integers(2, 6))
    devices: list[str] = []
    parent: dict[str, str] = {}
    offered: list[list[str]] = []
    for g in range(n_gpus):
        pool = []
        for m in range(draw(st.integers(1, 2))):
            for n in range(draw(st.integers(1, 5))):
                device_id = replica_id(f"dev-{g}-{m}", n)
                pool.append(device_id)
                parent[device_id] = f"gpu-{g}"
        devices += pool
        offered.append(draw(st.permutations(pool))[: draw(st.integers(0, len(pool)))])
    # Two GPUs keep a candidate that must-include may not take.
    keep_from = draw(st.lists(st.sampled_from(range(n_gpus)), min_size=2, max_size=2, unique=True))
    for g in keep_from:
        if not offered[g]:
            offered[g] = [next(d for d in devices if parent[d] == f"gpu-{g}")]
    kept = {offered[g][0] for g in keep_from}
    available = [d for pool in offered for d in pool]
    free = [d for d in available if d not in kept]
    must_include = draw(st.lists(st.sampled_from(free), unique=True)) if free else []
    candidates = len(available) - len(must_include)
    size = len(must_include) + draw(st.integers(1, candidates))
    random.Random(draw(st.integers(0, 2**16))).shuffle(available)
    return Node(devices, parent, available, must_include, size)


def _allocate(policy: Policy, node: Node) -> list[str] | None:
    try:
        return allocation.shared_allocation(
            policy, node.devices, node.available, node.must_include, node.size, group_of=node.parent
        )
    except AllocationError:
        return None


# Generated nodes: `nodes()` reaches the edges (shortage, size 0, must-include filling the
# request); `feasible_nodes()` the cases where a policy has a real choice to make.
ANY_NODE = st.one_of(nodes(), feasible_nodes())


@SETTINGS
@given(node=ANY_NODE, policy=st.sampled_from(list(Policy)))
def test_result_is_must_include_then_distinct_available_devices_of_the_right_size(
    node: Node, policy: Policy
) -> None:
    result = _allocate(policy, node)
    must = node.must_include
    if result is None:
        assert len(node.available) < node.size  # only a real shortage fails
        return
    assert len(result) == len(set(result))
    assert set(result) <= set(node.available)
    assert result[: len(must)] == must
    assert len(result) == (len(must) if len(must) >= node.size else node.size)


@SETTINGS
@given(node=feasible_nodes(), policy=st.sampled_from(list(Policy)), seed=st.integers(0, 2**16))
def test_result_does_not_depend_on_the_order_devices_are_offered_in(
    node: Node, policy: Policy, seed: int
) -> None:
    shuffled = list(node.available)
    random.Random(seed).shuffle(shuffled)
    other = Node(node.devices, node.parent, shuffled, node.must_include, node.size)
    result = _allocate(policy, node)
    assert result is not None and len(result) > len(node.must_include)  # feasible by construction
    assert result == _allocate(policy, other)


def _held_after(node: Node, result: list[str]) -> Counter[str]:
    taken = set(node.devices) - set(node.available) | set(result)
    return Counter(node.parent[d] for d in taken)


def _untouched_gpus(node: Node, result: list[str]) -> int:
    held = _held_after(node, result)
    return sum(1 for gpu in set(node.parent.values()) if held[gpu] == 0)


def _distinct_gpus(node: Node, result: list[str]) -> int:
    return len({node.parent[d] for d in result})


def _all_policies(node: Node) -> dict[Policy, list[str]]:
    results = {policy: _allocate(policy, node) for policy in Policy}
    answered = {policy: r for policy, r in results.items() if r is not None}
    assert len(answered) == len(results), f"a feasible request failed: {node}"
    return answered


# Each comparison counts the cases where the policies really differ on it, and requires enough of
# them (about half and a quarter of the examples in measured runs): a generator drifting back
# to vacuous cases would otherwise pass unnoticed.
MEANINGFUL_FLOOR = 30


def test_packed_never_leaves_fewer_untouched_gpus_than_distributed() -> None:
    strictly_more = 0

    @SETTINGS
    @given(node=feasible_nodes())
    def check(node: Node) -> None:
        nonlocal strictly_more
        results = _all_policies(node)
        packed = _untouched_gpus(node, results[Policy.PACKED])
        distributed = _untouched_gpus(node, results[Policy.DISTRIBUTED])
        assert packed >= distributed
        strictly_more += packed > distributed

    check()
    assert strictly_more >= MEANINGFUL_FLOOR


def test_spread_never_touches_fewer_distinct_gpus_than_the_other_policies() -> None:
    strictly_more = 0

    @SETTINGS
    @given(node=feasible_nodes())
    def check(node: Node) -> None:
        nonlocal strictly_more
        results = _all_policies(node)
        spread = _distinct_gpus(node, results[Policy.SPREAD])
        others = [_distinct_gpus(node, results[p]) for p in (Policy.PACKED, Policy.DISTRIBUTED)]
        assert spread >= max(others)
        strictly_more += spread > min(others)

    check()
    assert strictly_more >= MEANINGFUL_FLOOR


@SETTINGS
@given(node=ANY_NODE, policy=st.sampled_from(list(Policy)))
def test_pick_gpus_predicts_the_per_gpu_counts_of_shared_allocation(
    node: Node, policy: Policy
) -> None:
    """The extender and the simulator score with pick_gpus; the agent allocates with
    shared_allocation. Without must-include (the scheduler never has one) they must agree."""
    plain = Node(node.devices, node.parent, node.available, [], node.size)
    result = _allocate(policy, plain)
    offered = Counter(node.parent[d] for d in node.available)
    totals = Counter(node.parent.values())
    loads = [GpuLoad(gpu, totals[gpu], offered[gpu]) for gpu in sorted(totals, reverse=True)]
    if result is None:
        try:
            allocation.pick_gpus(policy, loads, node.size)
        except AllocationError:
            return
        raise AssertionError("pick_gpus satisfied a request shared_allocation could not")
    predicted = allocation.pick_gpus(policy, loads, node.size)
    assert predicted == dict(Counter(node.parent[d] for d in result))
