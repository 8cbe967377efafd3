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
from sharepack.common.scoring import AnyNodePolicy, NodeScore
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
    whole_of = (resources[DeviceType.GPU], resources[DeviceType.SHARED])
    requests = draallocation.claim_requests(request, resources)
    if not requests:
        # A pod without GPUs is ranked as in the device-plugin mode (`fragaware` counts the CPU
        # it takes), over the GPUs' free replicas; one asking only resources no DeviceClass maps
        # is not DRA's to judge.
        if request.empty:
            return scoring.score_node(view, request, node_policy, workload=workload, admitted=admitted, whole_of=whole_of)
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
    shared_view, shared_placement = scoring.whole_as_shares(view, placement, whole_of)
    scored = scoring.score_placement(shared_view, shared_placement, node_policy, workload=workload, admitted=admitted)
    return replace(scored, placement=MappingProxyType(placement))  # what the allocator gives, per resource
