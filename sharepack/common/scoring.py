"""Node scoring for GPU pods: predict where the node's agent puts the pod, then rank the node.

Shared by the scheduler extender and the trace simulator, so both measure one implementation.

Prediction
----------
The node's agent chooses devices with its own policy (`NodeState.allocation_policy`) through
one greedy loop; `common.allocation.pick_gpus` is that loop over counts. We replay the kubelet's
order (see `common.podrequests`): containers one by one, init containers first, each taking
from the pod's reusable pool (devices of finished init containers) before asking for more. For
each resource the loop sees, per physical GPU, `total` and `available = total - allocated -
unhealthy - already taken by this pod`, exactly the counts the agent's loop would see, so on a
serial stream of pods the predicted physical GPUs are those the agent then reports. (Full,
unreplicated GPUs take the topology-aware path on the node, which the published counts cannot
replay: for them the prediction is only which GPUs are free, and may differ.)

Feasibility (filter)
--------------------
A node fails when it publishes none of a requested resource, has fewer free devices of it than
the pod needs (free replicas, free MIG instances of that profile), or enforces
`failRequestsGreaterThanOne` on a replicated resource while a container asks for more than one.

Score (prioritize), 0..10
-------------------------
With `landed` the devices the pod would take, three terms in 0..1:

* `reuse`   — share of the pod's devices that create no new fragment: they land on GPUs
              already in use (any resource), or on a free GPU the pod fills completely. A
              partly used GPU is the fragment that strands later whole-GPU requests; a pod
              that takes exactly a whole GPU's worth of replicas fragments nothing by landing
              on a free one.
* `gpu_use` — the node's physical GPUs in use after the pod lands, counted up to
              `GPU_USE_SCALE` (not a share of the node's: that draws pods to the
              smallest nodes). Higher means fuller nodes, so whole nodes stay free.
* `fit`     — how full the GPUs the pod lands on are afterwards (device-weighted mean of
              (allocated + unhealthy + landed) / total). A tie-breaker: best fit.

`packed = 0.6 reuse + 0.3 gpu_use + 0.1 fit`, scaled to 0..10 and rounded half up.
`distributed` (and `spread`, which has no different cluster-level meaning) score
`10 - packed`: the exact reverse, preferring empty GPUs and emptier nodes.

`fragaware` (`NodePolicy.FRAGAWARE`) scores the same predicted placement by the FGD study's
fragmentation gradient instead: the node's fragmentation (`common.fragmentation`, over a typical
workload, per-GPU free share = free / total) before minus after, as
`round_half_up(10 x sigmoid(gradient / 100))`, so 5 is "no change" and nodes where the pod
closes a fragment rank above nodes where it opens one.

Fine rank and tier
------------------
`NodeScore.rank` is the policy's value before the rounding to 0..10 (`packed` and its reverse
as above; `fragaware`'s `placement_rank`). kube-scheduler adds its own scores to ours and picks
at random among the best totals, so 11 levels cannot choose a node on a large cluster; the
extender's tier filter can: `best_tier` keeps the N best by rank, ties by a stable node order
(`tie_key`: a hash of the node's name, the same in the extender and the simulator). `fragaware` with `directed` scores the
single-GPU placement it would direct the agent to (`_directed_share`), as FGD chooses a GPU.

The weights make the terms nearly lexicographic: not breaking a whole GPU matters most, then
filling nodes over opening new ones, then tight fit. Nodes without a published state are
unknown: they pass the filter and score 0 (the lowest), so they are chosen only when nothing
better is known. Kube-scheduler multiplies the score by weight x 10 and does not clamp, hence
the hard 0..10 bound.

Cost: one simulation is O(containers x n log m) (~20 us for one container on 8 GPUs); the
extender memoises per node state version and request shape (`NodeScorer`), so a prioritize
over many nodes costs two dict lookups per node once warm, and shares results between nodes
whose states differ only by GPU names (`ScoreTemplates`), so identical machines are simulated
once per request shape. Under `fragaware`, nodes with the same counts in any order share their
verdicts where its directed share cannot tell them apart (`directed_ties_are_identical`), and
what a verdict needs apart from the node's CPU and memory (`FragawareChoices`: the placements
to rank) is prepared once per such group and GPU shape; each node's CPU then costs one ranking
of those placements. A new request shape on 5,000 nodes with random use and CPU thus prepares
a few hundred groups and ranks about a thousand (`benchmarks/bench_extender.py`, cold).
"""

from __future__ import annotations

import functools
import hashlib
import heapq
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TypeVar

from sharepack.common import allocation, fragmentation, shipped, stranding
from sharepack.common.podrequests import ContainerKind, PodRequest
from sharepack.common.policies import NodePolicy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState

MAX_EXTENDER_PRIORITY = 10
MIN_EXTENDER_PRIORITY = 0
# The extender's filter passes this many of the best feasible nodes (`best_tier`); 0: all.
DEFAULT_TIER_WIDTH = shipped.FILTER_TIER_WIDTH

GPU_USE_SCALE = 8  # `gpu_use` saturates at this many GPUs in use (a large node's GPU count)
W_REUSE = 0.6
W_GPU_USE = 0.3
W_FIT = 0.1

Placement = Mapping[str, tuple[str, ...]]  # resource -> physical GPU keys, one per device
AnyNodePolicy = Policy | NodePolicy  # a Policy ranks as the NodePolicy of the same name
_EMPTY: Placement = MappingProxyType({})
_ALL_ADMITTED = (fragmentation.ALL_ADMITTED, fragmentation.ALL_ADMITTED)
# (whole resource, shared resource) listing the same GPUs, each GPU taken whole or shared, not
# both (the DRA mode's whole-GPU and replica devices: `whole_as_shares`).
WholeOf = tuple[str, str]
T = TypeVar("T", int, str, bytes)  # a stable node order: its position, its name, or `tie_key`


@dataclass(frozen=True, slots=True)
class NodeScore:
    feasible: bool
    score: int  # 0..10
    reason: str  # why infeasible, or a short note on how the score came about
    placement: Placement  # predicted: resource -> physical GPU keys (one entry per device)
    # Infeasible whatever runs on the node (no such resource, failRequestsGreaterThanOne):
    # preemption cannot help, which the filter reply tells the scheduler.
    unresolvable: bool = False
    # The node policy's fine-grained rank (higher is better), before the rounding to 0..10:
    # what the tier filter (`best_tier`) orders nodes by. 0 for unknown and infeasible nodes.
    rank: float = 0.0


def cpu_aware(node_policy: AnyNodePolicy) -> bool:
    """Whether the policy ranks with the node's CPU and memory left (`admitted`): `fragaware`
    (FGD's measure counts GPUs stranded by CPU) and `packed` (`common.stranding`)."""
    return node_policy in (NodePolicy.FRAGAWARE, NodePolicy.PACKED)


def _room_for(node_policy: AnyNodePolicy, room: tuple[int, int] | None) -> tuple[int, int] | None:
    """The room a node's scorer keeps: the CPU-aware ranks use it, the others ignore it."""
    return room if cpu_aware(node_policy) else None


def _infeasible(reason: str, *, unresolvable: bool = False) -> NodeScore:
    return NodeScore(False, MIN_EXTENDER_PRIORITY, reason, _EMPTY, unresolvable)


NO_REQUEST = NodeScore(True, MIN_EXTENDER_PRIORITY, "pod requests no managed resources", _EMPTY)
UNKNOWN_NODE = NodeScore(True, MIN_EXTENDER_PRIORITY, "no published NodeGpuState", _EMPTY)


def _take(policy: Policy, pool: dict[str, int], size: int) -> dict[str, int]:
    """Choose `size` devices out of the pod's reusable pool (counts per GPU)."""
    if size >= sum(pool.values()):
        return dict(pool)
    # The kubelet takes any subset of the pool; which GPUs it holds does not change the node's
    # counts, so any deterministic choice predicts as well as another.
    loads = [allocation.GpuLoad(key, n, n) for key, n in sorted(pool.items())]
    return allocation.pick_gpus(policy, loads, size)


def _free(g: GpuState) -> int:
    # Clamped so that a published state with inconsistent counts (negative, over-full) still
    # gives the loop a valid load instead of an exception on the request path.
    return min(g.free, max(g.total, 0))


def _refused(res: ResourceState, container: str, n: int) -> NodeScore | None:
    """The verdict on a node that refuses `n` devices of `res` to one container, else None."""
    if res.fail_requests_greater_than_one and res.sharing is not Sharing.NONE and n > 1:
        return _infeasible(
            f"{res.name}: container {container!r} requests {n} replicas and the node sets failRequestsGreaterThanOne",
            unresolvable=True,
        )
    return None


def _simulate(
    res: ResourceState,
    request: PodRequest,
    policy: Policy,
    new_per_container: dict[str, dict[str, int]] | None = None,
) -> dict[str, int] | NodeScore:
    """Counts per GPU the pod ends up holding of `res`, or the infeasible score saying why.

    `new_per_container`, when given, receives per container the counts per GPU it takes beyond
    what it reuses from the pod's pool: what the kubelet asks the device plugin to choose."""
    name = res.name
    free = {g.key: _free(g) for g in res.gpus}
    totals = {g.key: max(g.total, 0) for g in res.gpus}
    held: dict[str, int] = {}
    reusable: dict[str, int] = {}
    for c in request.containers:
        n = c.amount(name)
        if n == 0:
            continue
        refused = _refused(res, c.name, n)
        if refused is not None:
            return refused
        reused = _take(policy, reusable, n) if reusable else {}
        missing = n - sum(reused.values())
        extra: dict[str, int] = {}
        if missing:
            loads = [allocation.GpuLoad(k, totals[k], free[k]) for k in totals]
            try:
                extra = allocation.pick_gpus(policy, loads, missing)
            except allocation.AllocationError:
                return _infeasible(
                    f"{name}: not enough free devices: container {c.name!r} needs {n}, "
                    f"node has {sum(free.values())} free"
                )
            for k, cnt in extra.items():
                free[k] -= cnt
                held[k] = held.get(k, 0) + cnt
            if new_per_container is not None:
                new_per_container[c.name] = {k: cnt for k, cnt in extra.items() if cnt}
        if c.kind is ContainerKind.INIT:
            # An init container's devices return to the pool when it ends; the reused ones
            # are in it already.
            for k, cnt in extra.items():
                if cnt:
                    reusable[k] = reusable.get(k, 0) + cnt
        else:
            # App containers and sidecars keep what they reuse: it leaves the pool.
            for k, cnt in reused.items():
                left = reusable.get(k, 0) - cnt
                if left > 0:
                    reusable[k] = left
                else:
                    reusable.pop(k, None)
    return held


def _round_half_up(x: float) -> int:
    return int(x * MAX_EXTENDER_PRIORITY + 0.5)


def score_node(
    state: NodeState,
    request: PodRequest,
    node_policy: AnyNodePolicy,
    *,
    workload: fragmentation.TypicalWorkload | None = None,
    admitted: tuple[int, int] | None = None,
    directed: bool = False,
    whole_of: WholeOf | None = None,
    choices: FragawareChoices | NodeScore | None = None,
) -> NodeScore:
    """Predict the pod's placement on this node and score the node under `node_policy`.

    `fragaware` only: `workload` is its typical workload (default: the built-in one);
    `admitted` the shapes the node's CPU and memory admit before and after the pod lands
    (`Fragmentation.admitted`; None: unknown, every shape counts as admitted and a pod without
    GPUs is not ranked; `packed` subtracts the GPUs the pod strands, `common.stranding`); `directed`
    scores the placement the extender would choose and direct the agent to (for a share on
    one replicated GPU, the GPU with the best `placement_rank`), not the agent's own.
    `whole_of`: the node lists its GPUs whole and shared (the DRA mode): feasibility and
    placement come from both resources, the rank from the replicas (`whole_as_shares`).
    `choices`: `fragaware_choices(state, request, directed=directed)`, where the caller keeps
    it (`fragaware` only)."""
    if whole_of is not None and all(state.resource(name) is not None for name in whole_of):
        merged, _ = whole_as_shares(state, _EMPTY, whole_of)
        if request.empty:
            return score_node(merged, request, node_policy, workload=workload, admitted=admitted)
        predicted = score_node(state, request, node_policy, workload=workload, admitted=admitted, directed=directed)
        if not predicted.feasible:
            return predicted
        merged, in_replicas = whole_as_shares(state, predicted.placement, whole_of)
        ranked = score_placement(merged, in_replicas, node_policy, workload=workload, admitted=admitted)
        return replace(ranked, placement=predicted.placement)  # the devices the pod gets, per resource
    if node_policy == NodePolicy.FRAGAWARE and (admitted is not None or not request.empty):
        # A pod without GPUs still strands GPUs when it takes the CPU a shape needs.
        prepared = choices if choices is not None else fragaware_choices(state, request, directed=directed)
        if isinstance(prepared, NodeScore):
            return prepared
        measure = fragmentation.measure_for(workload or fragmentation.DEFAULT_TYPICAL_WORKLOAD)
        return _choose(prepared, measure, admitted or _ALL_ADMITTED)
    if request.empty:
        if node_policy == Policy.PACKED and admitted is not None:
            return _packed_without_gpus(state, admitted, workload)
        return NO_REQUEST
    agent = _agent_placement(state, request)
    if isinstance(agent, NodeScore):
        return agent
    placement, landed = agent
    return _packed(state, placement, landed, node_policy, admitted=admitted, workload=workload)


def _agent_placement(
    state: NodeState, request: PodRequest
) -> tuple[dict[str, tuple[str, ...]], list[tuple[GpuState, int]]] | NodeScore:
    """The placement the node's own loop gives the pod, and the devices it lands per GPU; the
    infeasible verdict where the node cannot take it."""
    for name, total in request.totals:
        res = state.resource(name)
        if res is None:
            return _infeasible(f"{name}: node publishes no such resource", unresolvable=True)
        free = sum(_free(g) for g in {g.key: g for g in res.gpus}.values())
        if free < total:
            return _infeasible(f"{name}: not enough free devices: pod needs {total}, node has {free}")

    placement: dict[str, tuple[str, ...]] = {}
    landed: list[tuple[GpuState, int]] = []
    for name, _ in request.totals:
        res = state.resource(name)
        assert res is not None  # checked above
        held = _simulate(res, request, state.allocation_policy)
        if isinstance(held, NodeScore):
            return held
        placement[name] = tuple(sorted(k for k, cnt in held.items() for _ in range(cnt)))
        by_key = {g.key: g for g in res.gpus}
        landed.extend((by_key[k], cnt) for k, cnt in held.items() if cnt)
    return placement, landed


def score_placement(
    state: NodeState,
    placement: Placement,
    node_policy: AnyNodePolicy,
    *,
    workload: fragmentation.TypicalWorkload | None = None,
    admitted: tuple[int, int] | None = None,
) -> NodeScore:
    """Score the node under `node_policy` for a pod that lands on `placement` (resource ->
    physical GPU keys, one per device), however the placement was predicted: `score_node`
    replays the agent's loop, the DRA mode the scheduler's first-fit allocator
    (`common.draallocation`). Keys the state does not list for a resource are ignored."""
    if node_policy == NodePolicy.FRAGAWARE:
        measure = fragmentation.measure_for(workload or fragmentation.DEFAULT_TYPICAL_WORKLOAD)
        return _fragaware(state, placement, measure, admitted or _ALL_ADMITTED)
    landed: list[tuple[GpuState, int]] = []
    for name, keys in placement.items():
        res = state.resource(name)
        if res is not None:
            by_key = {g.key: g for g in res.gpus}
            landed.extend((by_key[k], cnt) for k, cnt in Counter(keys).items() if k in by_key)
    return _packed(state, placement, landed, node_policy, admitted=admitted, workload=workload)


def _packed(
    state: NodeState,
    placement: Placement,
    landed: Sequence[tuple[GpuState, int]],
    node_policy: AnyNodePolicy,
    *,
    admitted: tuple[int, int] | None,
    workload: fragmentation.TypicalWorkload | None,
) -> NodeScore:
    """`packed` (or its reverse) for a pod whose devices land as `landed` (GPU, devices); with
    `admitted` known, `packed` subtracts the GPUs the pod's CPU and memory strand."""
    used_before = {g.key for r in state.resources for g in r.gpus if g.allocated > 0}
    all_gpus = {g.key for r in state.resources for g in r.gpus}
    devices = 0
    unfragmenting = 0
    filled = 0.0
    for g, cnt in landed:
        devices += cnt
        after = g.allocated + g.unhealthy + cnt
        if g.key in used_before or after >= g.total:
            unfragmenting += cnt
        filled += cnt * (min(after / g.total, 1.0) if g.total else 1.0)
    reuse = unfragmenting / devices if devices else 0.0
    fit = filled / devices if devices else 0.0
    used_after = used_before | {g.key for g, _ in landed}
    # GPUs in use after the pod, counted up to GPU_USE_SCALE, not as a share of the node's: a
    # share makes a one-GPU node look full after one pod and draws every pod to the smallest
    # nodes, whose GPU models the pods that ask for them then miss (issue 19, gpuspec33 trace:
    # 18.6 % unallocated with the share, 12.1 % counted).
    gpu_use = min(len(used_after), GPU_USE_SCALE) / GPU_USE_SCALE if all_gpus else 0.0
    packed = W_REUSE * reuse + W_GPU_USE * gpu_use + W_FIT * fit
    rank = packed if node_policy == Policy.PACKED else 1.0 - packed
    reason = f"reuse={reuse:.2f} gpu_use={gpu_use:.2f} fit={fit:.2f}"
    if node_policy == Policy.PACKED and admitted is not None:
        measure = fragmentation.measure_for(workload or fragmentation.DEFAULT_TYPICAL_WORKLOAD)
        lost = stranding.stranded_gpus(measure, tuple(free_shares(state, placement).values()), admitted)
        rank -= stranding.STRAND_WEIGHT * lost
        reason += f" stranded={lost:.2f}"
    score = min(max(_round_half_up(rank), MIN_EXTENDER_PRIORITY), MAX_EXTENDER_PRIORITY)
    return NodeScore(True, score, reason, MappingProxyType(dict(placement)), rank=rank)


def _packed_without_gpus(
    state: NodeState, admitted: tuple[int, int], workload: fragmentation.TypicalWorkload | None
) -> NodeScore:
    """`packed` for a pod that takes no GPU but CPU or memory: to the node whose GPU share is
    most used (its CPU is worth least to GPU pods), never taking the CPU the node's free GPUs
    need (`common.stranding`)."""
    free = free_shares(state)
    gpu_use = 1.0 - sum(free.values()) / (fragmentation.MILLI * len(free)) if free else 1.0
    measure = fragmentation.measure_for(workload or fragmentation.DEFAULT_TYPICAL_WORKLOAD)
    lost = stranding.stranded_gpus(measure, tuple(free.values()), admitted)
    rank = W_REUSE + W_GPU_USE * gpu_use + W_FIT * gpu_use - stranding.STRAND_WEIGHT * lost
    score = min(max(_round_half_up(rank), MIN_EXTENDER_PRIORITY), MAX_EXTENDER_PRIORITY)
    return NodeScore(True, score, f"no GPUs; gpu_use={gpu_use:.2f} stranded={lost:.2f}", _EMPTY, rank=rank)


ContainerPlacements = tuple[tuple[str, Placement], ...]  # (container name, its new devices), kubelet order


def container_placements(state: NodeState, request: PodRequest) -> ContainerPlacements | None:
    """Per container, the physical GPUs of the devices it takes beyond what it reuses from the
    pod's pool (one key per device), as `score_node` predicts them: the same loop, split by
    container. Containers that take nothing new are left out (the kubelet does not ask the
    device plugin for them). None when the pod does not fit."""
    per: dict[str, dict[str, tuple[str, ...]]] = {}
    for name, _ in request.totals:
        res = state.resource(name)
        if res is None:
            return None
        new: dict[str, dict[str, int]] = {}
        if isinstance(_simulate(res, request, state.allocation_policy, new), NodeScore):
            return None
        for container, counts in new.items():
            if counts:
                keys = tuple(sorted(k for k, cnt in counts.items() for _ in range(cnt)))
                per.setdefault(container, {})[name] = keys
    return tuple(
        (c.name, MappingProxyType(per[c.name])) for c in request.containers if c.name in per
    )


def whole_as_shares(state: NodeState, placement: Placement, whole_of: WholeOf) -> tuple[NodeState, Placement]:
    """The state and placement in replicas of the shared resource only, for a node that lists
    each GPU both whole and shared (the DRA mode's devices): a whole GPU taken is all its
    replicas. In the two-resource view a GPU with one replica in use is also a taken whole GPU,
    and `free_shares` (the least free over resources, as MIG profiles need) would count it as
    having nothing free for the next share, which is what `fragaware` and the stranding term
    measure. A GPU held whole while its replicas show no use (a whole-GPU pod the extender
    assumed) counts all its replicas taken. Unchanged when either resource is missing."""
    whole, shared = state.resource(whole_of[0]), state.resource(whole_of[1])
    if shared is None or whole is None:
        return state, placement
    held_whole = {g.key for g in whole.gpus if g.total > 0 and g.allocated + g.unhealthy >= g.total}
    gpus = tuple(
        replace(g, allocated=g.total - g.unhealthy) if g.key in held_whole and g.allocated == 0 else g
        for g in shared.gpus
    )
    replicas = {g.key: g.total for g in shared.gpus}
    keys = list(placement.get(shared.name, ()))
    for key in placement.get(whole.name, ()):
        keys.extend([key] * replicas.get(key, 0))
    merged = {name: ks for name, ks in placement.items() if name not in (shared.name, whole.name)}
    if keys:
        merged[shared.name] = tuple(sorted(keys))
    resources = tuple(replace(r, gpus=gpus) if r is shared else r for r in state.resources if r is not whole)
    return replace(state, resources=resources), merged


def free_shares(state: NodeState, taken: Placement = _EMPTY) -> dict[str, int]:
    """Per physical GPU, its free share in milli-GPU (floored), after the pod takes `taken`.

    A GPU listed by several resources (MIG profiles, a full and a shared resource) is as free
    as the least free of them; unhealthy devices count as taken.
    """
    out: dict[str, int] = {}
    for res in state.resources:
        keys = taken.get(res.name, ())
        for g in res.gpus:
            if g.total <= 0:
                continue
            free = max(_free(g) - keys.count(g.key), 0) if keys else max(_free(g), 0)
            share = free * fragmentation.MILLI // g.total
            prev = out.get(g.key)
            out[g.key] = share if prev is None else min(prev, share)
    return out


# A placement `fragaware` may rank, with the node's free shares after it (any order) and the
# share it leaves on the GPUs it lands on.
Candidate = tuple[Placement, tuple[int, ...], int]


@dataclass(frozen=True, slots=True)
class FragawareChoices:
    """What `fragaware`'s verdict on one node state for one request needs, apart from the shapes
    the node admits (its CPU and memory, `admitted`): the node's free shares, and the placements
    to rank, the agent's own or, for a share the extender directs, one per candidate GPU. Nodes
    alike in any order (`directed_ties_are_identical`) share it (`ScoreTemplates`): a new
    request shape prepares it once per group of them and ranks it once per admitted pair."""

    before: tuple[int, ...]  # `free_shares(state)`, any order
    # The agent's placement alone, or a directed share's GPUs with room in the published order,
    # one per distinct (share before, share after) of the GPU: the others leave the same
    # shares, so the same rank, and only the first of equal ranks is taken.
    candidates: tuple[Candidate, ...]


def fragaware_choices(state: NodeState, request: PodRequest, *, directed: bool = False) -> FragawareChoices | NodeScore:
    """The node's `FragawareChoices` for `request`; the verdict itself where the node cannot
    take the pod (that needs no ranking). `directed`: a share's GPU is the extender's choice."""
    if request.empty:
        before = tuple(free_shares(state).values())
        return FragawareChoices(before, ((_EMPTY, before, 0),))
    if directed:
        shares = _share_choices(state, request)
        if shares is not None:
            return shares
    agent = _agent_placement(state, request)
    if isinstance(agent, NodeScore):
        return agent
    return _placed(state, agent[0])


def _placed(state: NodeState, placement: Placement) -> FragawareChoices:
    after = free_shares(state, placement)
    landed = {k for keys in placement.values() for k in keys}
    leftover = sum(after[k] for k in landed if k in after)
    return FragawareChoices(tuple(free_shares(state).values()), ((placement, tuple(after.values()), leftover),))


def _fragaware(
    state: NodeState, placement: Placement, measure: fragmentation.Fragmentation, admitted: tuple[int, int]
) -> NodeScore:
    """`fragaware`: the node's fragmentation (FGD's measure) before minus after the placement,
    on the 0..10 scale (`fragmentation.extender_score`); its rank is `placement_rank`, with
    the share left on the GPUs the pod lands on as the leftover."""
    return _choose(_placed(state, placement), measure, admitted)


def _choose(choices: FragawareChoices, measure: fragmentation.Fragmentation, admitted: tuple[int, int]) -> NodeScore:
    """`fragaware`'s verdict on the best of the candidate placements by `placement_rank` (the
    first of equal ranks), as FGD chooses a share's GPU."""
    weighted_before = measure.weighted(choices.before, admitted[0])
    best: tuple[float, float, Placement, tuple[int, ...]] | None = None
    for placement, after, left in choices.candidates:
        grad = measure.gradient_from(weighted_before, after, admitted[1])
        rank = fragmentation.placement_rank(grad, left)
        if best is None or rank > best[0]:
            best = (rank, grad, placement, after)
    assert best is not None  # every `FragawareChoices` has a candidate
    rank, grad, placement, after = best
    total = measure.total_weight
    reason = f"frag {weighted_before / total:.0f}->{measure.weighted(after, admitted[1]) / total:.0f} milli-GPU"
    score = fragmentation.extender_score(grad)
    return NodeScore(True, score, reason, MappingProxyType(dict(placement)), rank=rank)


def _share_choices(state: NodeState, request: PodRequest) -> FragawareChoices | None:
    """The candidates of a one-container share the extender directs to one GPU, as FGD chooses
    a share's GPU; None where that does not apply (the agent's own placement stands): more
    containers or resources, a resource not replicated or not published, too few free devices,
    a request refused (failRequestsGreaterThanOne), or no GPU with room for the whole share."""
    if len(request.totals) != 1 or len(request.containers) != 1:
        return None
    name, n = request.totals[0]
    res = state.resource(name)
    if res is None or res.sharing is Sharing.NONE or _refused(res, request.containers[0].name, n) is not None:
        return None
    # `free_shares(state)`, per GPU every listing of it with devices (devices the share takes
    # from it, free, total), and the free devices of `res` as the feasibility check counts
    # them (a key listed twice: its last listing), in one pass: this runs per node for every
    # new request shape.
    before: dict[str, int] = {}
    listings: dict[str, list[tuple[int, int, int]]] = {}
    counted: dict[str, int] = {}
    candidates: list[str] = []  # GPUs of `res` with room for the share
    milli = fragmentation.MILLI
    for r in state.resources:
        taken = n if r.name == name else 0
        for g in r.gpus:
            total = g.total
            if total <= 0:
                if r is res:
                    counted[g.key] = 0  # `_free(g)`
                continue
            free = min(max(total - g.allocated - g.unhealthy, 0), total)  # `_free(g)`, inlined
            share = free * milli // total
            key = g.key
            prev = before.get(key)
            if prev is None:
                before[key] = share
                listings[key] = [(taken, free, total)]
            else:
                before[key] = min(prev, share)
                listings[key].append((taken, free, total))
            if r is res:
                counted[key] = free
                if free >= n:
                    candidates.append(key)
    if not candidates or sum(counted.values()) < n:
        return None
    free_before = tuple(before.values())
    position = {k: i for i, k in enumerate(before)}
    after = list(free_before)
    chosen: list[Candidate] = []
    tried: set[tuple[int, int]] = set()
    for key in candidates:
        listed = listings[key]
        if len(listed) == 1:  # the usual GPU, listed by one resource
            left = (listed[0][1] - n) * milli // listed[0][2]  # its free >= n
        else:
            left = min(max(free - taken, 0) * milli // total for taken, free, total in listed)
        i = position[key]
        if (free_before[i], left) not in tried:
            tried.add((free_before[i], left))
            after[i] = left
            chosen.append((MappingProxyType({name: (key,) * n}), tuple(after), left))
            after[i] = free_before[i]
    return FragawareChoices(free_before, tuple(chosen))


@functools.lru_cache(maxsize=1 << 16)
@functools.lru_cache(maxsize=1 << 16)  # asked per node per request by the tier filter
def tie_key(node: str) -> bytes:
    """The tier's tie order of a node: a fixed pseudo-random order, a hash of its name (the same
    in every extender replica and in the simulator; Python's `hash` is salted per process).

    Not the names' own order: names follow pools and racks (the trace lists its nodes in runs of
    one model and size), so ties by name always went to the first pool's nodes. Measured, default
    trace, `fragaware` as shipped, kube model, 10 seeds: 4.42 % unallocated by name, 4.28 % by
    this order (README's lever table)."""
    return hashlib.blake2b(node.encode(), digest_size=8).digest()


def best_tier(entries: Sequence[tuple[float, T]], width: int) -> list[int]:
    """The tier filter's rule: positions in `entries` of the `width` best, by rank (higher
    first), ties by the stable node order (the second item, lower first); every position
    when `width` < 1 (the tier filter is off).

    The scheduler adds its own scores and picks at random among the best totals; passing it
    only the best node (or a narrow tier) is what keeps that choice from scattering pods.
    """
    if width < 1 or width >= len(entries):
        return list(range(len(entries)))
    ranked = heapq.nsmallest(width, range(len(entries)), key=lambda i: (-entries[i][0], entries[i][1]))
    return sorted(ranked)


def apply_placement(state: NodeState, pod_uid: str, placement: Placement) -> NodeState:
    """The state after a pod takes `placement` (how assumed pods and the simulator count it).

    Allocated counts are clamped to each GPU's total: a stale prediction must never make a
    node look more than full.
    """

    def take(g: GpuState, n: int) -> GpuState:
        if not n:
            return g
        pods = g.pods if pod_uid in g.pods else (*g.pods, pod_uid)
        return _gpu_with(g, min(g.allocated + n, g.total), pods)

    return _per_gpu(state, placement, take)


def release_placement(state: NodeState, pod_uid: str, placement: Placement) -> NodeState:
    """The state after a pod that held `placement` has gone, before its agent republishes (how
    the extender frees a deleted pod's devices at once). Counts never go below zero."""

    def free(g: GpuState, n: int) -> GpuState:
        if not n and pod_uid not in g.pods:
            return g
        return _gpu_with(g, max(g.allocated - n, 0), tuple(p for p in g.pods if p != pod_uid))

    return _per_gpu(state, placement, free)


def _per_gpu(state: NodeState, placement: Placement, change: Callable[[GpuState, int], GpuState]) -> NodeState:
    """`change(gpu, devices of the placement on it)` for every GPU of the placement's resources."""
    if not placement:
        return state
    resources = []
    for res in state.resources:
        keys = placement.get(res.name)
        if not keys:
            resources.append(res)
            continue
        counts = Counter(keys)
        gpus = tuple(change(g, counts.get(g.key, 0)) for g in res.gpus)
        resources.append(ResourceState(res.name, res.sharing, res.fail_requests_greater_than_one, gpus))
    return NodeState(state.observed_at, state.agent_version, state.allocation_policy, state.mig_strategy,
                     tuple(resources), state.schema_version)  # fmt: skip


def _gpu_with(g: GpuState, allocated: int, pods: tuple[str, ...]) -> GpuState:
    """`replace(g, allocated=, pods=)` without `replace`'s generic copy: every rebuild of a node
    applies its assumed pods' placements through here (`extender.ledgers.Ledger.effective`)."""
    return GpuState(g.key, g.index, g.product, g.total, allocated, g.unhealthy, pods)


def held_placement(state: NodeState, pod_uid: str, request: PodRequest | None) -> Placement | None:
    """What the published state says the pod holds, one GPU key per device; None when its
    counts cannot tell (the state lists pods per GPU, not how many devices each holds).

    On a GPU the pod holds alone, it holds every allocated device; the rest of the pod's total
    (`request`, as the kubelet counts it) sits on the GPUs it shares, which is known only when
    there is one such GPU."""
    out: dict[str, tuple[str, ...]] = {}
    for res in state.resources:
        mine = [g for g in res.gpus if pod_uid in g.pods]
        if not mine:
            continue
        # Counted first, listed last: the counts come from an agent's word and the pod's spec,
        # so no list grows past what the GPU's own counts allow.
        counts = {g.key: max(g.allocated, 0) for g in mine if len(g.pods) == 1}
        asked = request.total(res.name) if request is not None else None
        if asked is not None and sum(counts.values()) > asked:
            return None  # a pod holds no more than it asked for: others (not listed yet) hold some
        shared = [g for g in mine if len(g.pods) > 1]
        if shared:
            left = (asked or 0) - sum(counts.values())
            if len(shared) != 1 or left <= 0 or left > shared[0].allocated:
                return None
            counts[shared[0].key] = left
        out[res.name] = tuple(key for key in sorted(counts) for _ in range(counts[key]))
    return MappingProxyType(out) if out else None


def placed_gpus(state: NodeState, pod_uid: str) -> dict[str, frozenset[str]]:
    """Per resource, the physical GPUs the published state says the pod holds."""
    out: dict[str, frozenset[str]] = {}
    for res in state.resources:
        keys = frozenset(g.key for g in res.gpus if pod_uid in g.pods)
        if keys:
            out[res.name] = keys
    return out


def placement_gpus(placement: Placement) -> dict[str, frozenset[str]]:
    return {name: frozenset(keys) for name, keys in placement.items() if keys}


def signature(
    state: NodeState, *, any_order: bool = False, published_order: bool = False
) -> tuple[tuple[object, ...], tuple[str, ...]] | None:
    """A key under which node states score alike, and the node's GPU keys in that key's order.

    `score_node` looks at GPU keys only to tell GPUs apart and to break ties by key order, so
    two states that differ only by an order-preserving renaming of keys (identical machines
    with identical usage) get the same score, reason and, renamed, placement. None for states
    with a GPU key repeated within a resource (never shared).

    `any_order`: GPUs ordered by their counts first, so that nodes with the same counts in any
    order share a key (on a busy cluster most nodes differ only so); None where the order of
    GPUs could change the greedy loop's choice. Valid for requests whose every resource one
    container takes (`any_order_applies`) and not for `fragaware` (its directed share breaks
    ties by published order: `directed_ties_are_identical` says where that does not matter).
    Within one call the loop ranks a GPU by its allocated count (total - free) and what the
    pod took from it so far, ties by key: two GPUs tie only if
    they started with the same allocated count. If, in every resource, GPUs with the same
    allocated count have the same counts everywhere, ties only fall between GPUs with
    identical counts, whose relative order the counts-first order keeps.

    `published_order`: the key keeps the order in which the node lists its GPUs, for
    `fragaware`'s directed share, which takes the first of equally ranked GPUs in that order.
    """
    all_keys = {g.key for r in state.resources for g in r.gpus}
    for r in state.resources:
        if len({g.key for g in r.gpus}) != len(r.gpus):
            return None
    keys: list[str] = sorted(all_keys)
    ordered_by = "published" if published_order else "key"
    if any_order:
        counts: dict[str, list[object]] = {k: [] for k in keys}
        for i, r in enumerate(state.resources):
            for g in r.gpus:
                counts[g.key].append((i, g.total, g.allocated, g.unhealthy))
        full = {k: tuple(v) for k, v in counts.items()}
        if not all(_ties_are_identical(r, full) for r in state.resources):
            return None
        keys.sort(key=lambda k: (full[k], k))
        ordered_by = "counts"
    pos = {k: i for i, k in enumerate(keys)}
    parts: list[object] = [ordered_by, state.allocation_policy]
    for r in state.resources:
        listed = [(pos[g.key], g.total, g.allocated, g.unhealthy) for g in r.gpus]
        gpus = tuple(listed if published_order else sorted(listed))
        parts.append((r.name, r.sharing, r.fail_requests_greater_than_one, gpus))
    return tuple(parts), tuple(keys)


def any_order_applies(request: PodRequest) -> bool:
    """Whether `signature(..., any_order=True)` keys are valid for `request`: one container,
    so one call of the greedy loop per resource (a second container would rank GPUs by what
    the first left, where GPUs that started apart can tie)."""
    return len(request.containers) == 1


def directed_ties_are_identical(state: NodeState) -> bool:
    """Whether `fragaware`'s directed share breaks its ties only between GPUs with the same free
    count, so that its verdict (not its placement) is the same in any GPU order: every GPU is
    listed by one resource, and the GPUs of a resource have one total, at most `MILLI` devices.

    The directed share takes the first GPU in the published order among those of the best
    `placement_rank`: FGD's truncated score, an integer, less half the share left on the GPU,
    below one half. Two ranks tie only with the same share left, which with one total of at
    most `MILLI` means the same free count before, so the same free shares after: the same
    score, reason and rank whichever of them is taken."""
    listed: set[str] = set()
    for r in state.resources:
        totals = {g.total for g in r.gpus}
        if len(totals) > 1 or any(t > fragmentation.MILLI for t in totals):
            return False
        keys = {g.key for g in r.gpus}
        if keys & listed:
            return False
        listed |= keys
    return True


def _ties_are_identical(res: ResourceState, full: Mapping[str, tuple[object, ...]]) -> bool:
    """GPUs of `res` that the greedy loop ranks alike (same total - free) have the same counts
    in every resource."""
    seen: dict[int, tuple[object, ...]] = {}
    for g in res.gpus:
        taken = max(g.total, 0) - _free(g)
        other = seen.setdefault(taken, full[g.key])
        if other != full[g.key]:
            return False
    return True


class ScoreTemplates:
    """Scores shared between nodes with the same `signature`, for one node policy.

    On a cluster of identical machines most nodes look alike (empty, or full): the first of
    them pays for the simulation, the others rename the placement. Signatures are interned to
    ints when a scorer is built (on the watch path), so a lookup hashes an int and a string.
    """

    __slots__ = ("node_policy", "workload", "directed", "whole_of", "_ids", "_memo", "_choices", "_next", "max_entries")

    def __init__(
        self,
        node_policy: AnyNodePolicy,
        *,
        max_entries: int = 1 << 16,
        workload: fragmentation.TypicalWorkload | None = None,
        directed: bool = False,
        whole_of: WholeOf | None = None,
    ) -> None:
        self.node_policy = node_policy
        self.workload = workload
        self.directed = directed  # `score_node(directed=)`: the placement the extender directs
        self.whole_of = whole_of  # `score_node(whole_of=)`: GPUs listed whole and shared (DRA)
        self._ids: dict[tuple[object, ...], int] = {}
        self._memo: dict[
            tuple[int, str, tuple[int, int] | None], tuple[NodeScore, tuple[tuple[str, tuple[int, ...]], ...] | None]
        ] = {}
        # (id of a signature in any order, GPU shape) -> `fragaware_choices` of its first node:
        # the placements to rank depend on the counts alone, only their ranks on the shapes a
        # node admits (`_entry`).
        self._choices: dict[tuple[int, str], FragawareChoices | NodeScore] = {}
        self._next = 0
        self.max_entries = max_entries

    def intern(self, sig: tuple[object, ...]) -> int:
        sid = self._ids.get(sig)
        if sid is None:
            if len(self._ids) >= self.max_entries:
                self._ids.clear()  # ids are never reused, so old scorers stay correct
            self._next += 1
            sid = self._ids[sig] = self._next
        return sid

    def _entry(
        self, sid: int, keys: tuple[str, ...], state: NodeState, request: PodRequest,
        admitted: tuple[int, int] | None, *, alike: bool = False,
    ) -> tuple[NodeScore, tuple[tuple[str, tuple[int, ...]], ...] | None]:
        """The shared score and its placement as positions in `keys` (None: not renamable,
        the placement names another node's GPUs). `alike`: `sid` is a signature in any order
        under `fragaware`, whose verdicts only are shared (`directed_ties_are_identical`):
        the placements to rank then come from the first node of that signature."""
        memo_key = (sid, request.gpu_shape, admitted)  # CPU matters only through `admitted`
        hit = self._memo.get(memo_key)
        if hit is None:
            choices = None
            if alike and self.whole_of is None:
                choices_key = (sid, request.gpu_shape)
                choices = self._choices.get(choices_key)
                if choices is None:
                    if len(self._choices) >= self.max_entries:
                        self._choices.clear()
                    choices = fragaware_choices(state, request, directed=self.directed)
                    self._choices[choices_key] = choices
            s = score_node(
                state, request, self.node_policy, workload=self.workload, admitted=admitted, directed=self.directed,
                whole_of=self.whole_of, choices=choices,
            )  # fmt: skip
            where = None
            if choices is None:
                pos = {k: i for i, k in enumerate(keys)}
                where = tuple((r, tuple(pos[k] for k in ks)) for r, ks in s.placement.items())
            if len(self._memo) >= self.max_entries:
                self._memo.clear()
            hit = self._memo[memo_key] = (s, where)
        return hit

    def score(
        self, sid: int, keys: tuple[str, ...], state: NodeState, request: PodRequest,
        admitted: tuple[int, int] | None = None,
    ) -> NodeScore:
        """The node's own score: the shared one with the placement renamed to its GPUs."""
        s, where = self._entry(sid, keys, state, request, admitted)
        if where is None:  # shared as a verdict only (`NodeScorer` never asks this): its own
            return score_node(
                state, request, self.node_policy, workload=self.workload, admitted=admitted, directed=self.directed,
                whole_of=self.whole_of,
            )  # fmt: skip
        if not where:
            return s
        placement = MappingProxyType({r: tuple(sorted(keys[i] for i in idx)) for r, idx in where})
        if placement == s.placement:
            return s
        return NodeScore(s.feasible, s.score, s.reason, placement, s.unresolvable, s.rank)

    def verdict(
        self, sid: int, keys: tuple[str, ...], state: NodeState, request: PodRequest,
        admitted: tuple[int, int] | None = None, *, alike: bool = False,
    ) -> NodeScore:
        """The shared score as is: its placement may name an alike node's GPUs. `alike`: as
        `_entry`."""
        return self._entry(sid, keys, state, request, admitted, alike=alike)[0]


class NodeScorer:
    """Scores of one node state version, memoised per request shape (and, with `templates`,
    shared with alike nodes).

    Build a new one whenever the node's effective state changes; the old memo goes with it.
    """

    __slots__ = (
        "state", "version", "node_policy", "workload", "room", "model", "directed", "whole_of", "_memo", "_verdicts",
        "_templates", "_exact", "_any", "_alike", "_room_admits",
    )  # fmt: skip

    def __init__(
        self,
        state: NodeState,
        node_policy: AnyNodePolicy,
        version: object = None,
        *,
        templates: ScoreTemplates | None = None,
        workload: fragmentation.TypicalWorkload | None = None,
        room: tuple[int, int] | None = None,
        model: str | None = None,
        directed: bool | None = None,
        whole_of: WholeOf | None = None,
    ) -> None:
        self.state = state
        self.version = version
        self.node_policy = node_policy
        # `fragaware`'s workload: given, else the templates' (so a cache passes it once).
        self.workload = workload if workload is not None or templates is None else templates.workload
        # The node's CPU (milli) and memory (MiB) left, when known: the CPU-aware ranks use it.
        self.room = _room_for(node_policy, room)
        # The node's GPU model (`common.gpumodels`), when known: shapes that allow only other
        # models count its GPUs as fragment (with the room: both come from the Node object).
        self.model = model
        self.directed = directed if directed is not None else templates is not None and templates.directed
        self.whole_of = whole_of if whole_of is not None or templates is None else templates.whole_of
        self._memo: dict[str, NodeScore] = {}
        self._verdicts: dict[str, NodeScore] = {}  # `verdict`'s, where it did not score itself
        self._templates: ScoreTemplates | None = None
        # (template id, GPU keys in the signature's order) by key order, computed when first
        # needed, and in any order (`signature`), computed here: most requests use it.
        self._exact: tuple[int, tuple[str, ...]] | None = None
        self._any: tuple[int, tuple[str, ...]] | None = None
        self._alike = False  # `_any` shares `fragaware` verdicts only (`ScoreTemplates._entry`)
        # (measure, the shapes the GPU model admits, those its room admits too, before the
        # pod): computed here, as the state arrives, since `admitted` runs per node for every
        # new request shape.
        self._room_admits: tuple[fragmentation.Fragmentation, int, int] | None = None
        if self.room is not None:
            measure = fragmentation.measure_for(self.workload or fragmentation.DEFAULT_TYPICAL_WORKLOAD)
            access = measure.access(model)
            self._room_admits = (measure, access, access & measure.admitted(*self.room))
        if templates is not None and templates.node_policy == node_policy:
            self._templates = templates
            # `fragaware` (its directed share takes the first GPU in the published order among
            # the best) shares verdicts in any order only where its ties are identical, and
            # placements never (`_template`).
            if node_policy != NodePolicy.FRAGAWARE or directed_ties_are_identical(state):
                sig = signature(state, any_order=True)
                if sig is not None:
                    self._any = (templates.intern(sig[0]), sig[1])
                    self._alike = node_policy == NodePolicy.FRAGAWARE

    def _template(self, request: PodRequest, *, renamed: bool) -> tuple[ScoreTemplates, int, tuple[str, ...]] | None:
        """The shared templates and this node's id and keys there for `request`; None when
        this node shares nothing (no templates, or a GPU key repeated). `renamed`: the shared
        placement is to be renamed to this node's GPUs (`score`), not only its verdict."""
        t = self._templates
        if t is None:
            return None
        # `fragaware` shares only verdicts in any order (`directed_ties_are_identical`).
        any_order = not (renamed and self.node_policy == NodePolicy.FRAGAWARE)
        if self._any is not None and any_order and any_order_applies(request):
            return t, *self._any
        if self._exact is None:
            directing = self.directed and self.node_policy == NodePolicy.FRAGAWARE
            sig = signature(self.state, published_order=directing)
            if sig is None:
                self._templates = None
                return None
            self._exact = (t.intern(sig[0]), sig[1])
        return t, *self._exact

    def built_with(self, room: tuple[int, int] | None, model: str | None) -> bool:
        """Whether this scorer was made with the node's `room` and GPU `model` as they are now
        (its room as its policy keeps it: none where the policy does not look at CPU)."""
        return self.room == _room_for(self.node_policy, room) and self.model == model

    def admitted(self, request: PodRequest) -> tuple[int, int] | None:
        """The typical shapes the node's GPU model, CPU and memory admit before and after
        `request`; None when the node's room is unknown (or the policy does not look at it)."""
        known = self._room_admits
        if known is None:
            return None
        measure, access, before = known
        if not request.cpu and not request.memory:
            return before, before
        cpu, memory = self.room  # type: ignore[misc]  # known with the room
        return before, access & measure.admitted(cpu - request.cpu, memory - request.memory)

    def score(self, request: PodRequest) -> NodeScore:
        hit = self._memo.get(request.shape)
        if hit is None:
            shared = self._template(request, renamed=True)
            admitted = self.admitted(request)
            if shared is None:
                hit = score_node(
                    self.state, request, self.node_policy, workload=self.workload, admitted=admitted,
                    directed=self.directed, whole_of=self.whole_of,
                )  # fmt: skip
            else:
                t, sid, keys = shared
                hit = t.score(sid, keys, self.state, request, admitted)
            self._memo[request.shape] = hit
        return hit

    def verdict(self, request: PodRequest) -> NodeScore:
        """Feasibility, score and reason, as `score` gives them, without renaming a shared
        placement: its `placement` may name the GPUs of an alike node. What filter and
        prioritize need, at two dict lookups per node even when the node is new."""
        hit = self._memo.get(request.shape) or self._verdicts.get(request.shape)
        if hit is not None:
            return hit
        shared = self._template(request, renamed=False)
        if shared is None:
            return self.score(request)
        t, sid, keys = shared
        alike = self._alike and sid == self._any[0]  # type: ignore[index]  # `_alike`: `_any` is set
        # Kept: the best-tier filter asks every node for every request, and this scorer lives
        # until its node changes.
        hit = self._verdicts[request.shape] = t.verdict(
            sid, keys, self.state, request, self.admitted(request), alike=alike
        )
        return hit

    def __len__(self) -> int:
        return len(self._memo)
