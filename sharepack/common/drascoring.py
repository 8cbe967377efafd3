"""Node scoring in the DRA mode: the placement is the scheduler's own first fit
(`common.draallocation`), ranked with the device-plugin mode's terms (`common.scoring`) over
the same per-GPU view (`common.draslices.node_state`).

Under DRA the scheduler picks the devices, so the prediction is exact by construction (up to
the allocator's backtracking on mixed pods, see `common.draallocation`): what is left to rank
is which node's first fit is best for the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from sharepack.common import draallocation, fragmentation, scoring
from sharepack.common.draslices import DEFAULT_RESOURCES, DeviceType, DraNode, node_state
from sharepack.common.podrequests import PodRequest
from sharepack.common.scoring import AnyNodePolicy, NodeScore, Placement
from sharepack.common.state import NodeState

_ALL_ADMITTED = (fragmentation.ALL_ADMITTED, fragmentation.ALL_ADMITTED)


def score_node(
    node: DraNode,
    request: PodRequest,
    node_policy: AnyNodePolicy,
    *,
    resources: Mapping[DeviceType, str] = DEFAULT_RESOURCES,
    workload: fragmentation.TypicalWorkload | None = None,
    admitted: tuple[int, int] | None = None,
    state: NodeState | None = None,
) -> NodeScore:
    """`common.scoring.score_node` for a DRA node: feasible when the allocator's first fit
    succeeds; score and rank of that placement under `node_policy`. `state`: the node's
    `node_state`, when the caller keeps it."""
    view = state if state is not None else node_state(node, resources=resources)
    requests = draallocation.claim_requests(request, resources)
    if not requests:
        # A pod without GPUs is ranked as in the device-plugin mode (`fragaware` counts the CPU
        # it takes); one asking only resources no DeviceClass maps is not DRA's to judge.
        if request.empty:
            return scoring.score_node(view, request, node_policy, workload=workload, admitted=admitted)
        return scoring.NO_REQUEST
    for r in requests:
        if not any(d.type is r.type for d in node.devices):
            return NodeScore(False, 0, f"{r.resource}: node publishes no {r.type} devices", {}, unresolvable=True)
    wanted_devices = sum(r.count for r in requests)
    if wanted_devices > draallocation.ALLOCATION_RESULTS_MAX_SIZE:
        return NodeScore(
            False,
            0,
            f"the claim needs {wanted_devices} devices, more than one claim may hold "
            f"({draallocation.ALLOCATION_RESULTS_MAX_SIZE})",
            {},
            unresolvable=True,
        )
    placement = draallocation.allocate(node, requests)
    if placement is None:
        wanted = ", ".join(f"{r.name}: {r.count} {r.type}" for r in requests)
        return NodeScore(False, 0, f"the allocator's first fit finds no room for {wanted}", {})
    shared_view, shared_placement = _as_shares(view, placement, resources)
    scored = scoring.score_placement(shared_view, shared_placement, node_policy, workload=workload, admitted=admitted)
    return replace(scored, placement=MappingProxyType(placement))  # what the allocator gives, per resource


def _as_shares(
    state: NodeState, placement: Placement, resources: Mapping[DeviceType, str]
) -> tuple[NodeState, Placement]:
    """The state and placement in replicas of the shared resource only, when the node has both
    kinds: a whole GPU taken is all its replicas. In the two-resource view a GPU with one
    replica in use is a taken whole GPU, and `free_shares` (the least free over resources, as
    MIG profiles need) would count it as having nothing free for the next share, which is
    what `fragaware` measures."""
    shared, whole = state.resource(resources[DeviceType.SHARED]), state.resource(resources[DeviceType.GPU])
    if shared is None or whole is None:
        return state, placement
    replicas = {g.key: g.total for g in shared.gpus}
    keys = list(placement.get(shared.name, ()))
    for key in placement.get(whole.name, ()):
        keys.extend([key] * replicas.get(key, 0))
    merged = {name: ks for name, ks in placement.items() if name not in (shared.name, whole.name)}
    if keys:
        merged[shared.name] = tuple(sorted(keys))
    return replace(state, resources=tuple(r for r in state.resources if r.name != whole.name)), merged
