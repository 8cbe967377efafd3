"""kube-scheduler's DRA allocation of a pod's extended-resource claim, as a pure model: what the
DynamicResources plugin would give a pod on one node, so the extender and the trace simulator
predict the devices the scheduler itself picks.

From the v1.37.2 source:

* The claim (k8s.io/kubernetes pkg/scheduler/framework/plugins/dynamicresources/
  extendeddynamicresources.go, `createRequestsAndMappings` and
  `createResourceRequestAndMappings`): per mapped resource, one ExactCount request of N devices
  of the mapped DeviceClass per long-lived container (app container or sidecar) asking N, named
  `container-<i>-request-<j>` (i: the container's index among init containers then containers,
  j: the resource's index among the container's sorted request names); the non-sidecar init
  containers first reuse the requests of the long-lived containers at or after them and add
  one request, the largest shortfall among them. No capacity request, no constraint. Requests
  are sorted by name.
* The allocator (k8s.io/dynamic-resource-allocation v0.37.2 `structured/internal/incubating`,
  chosen because the default feature set, consumable capacity included, is within what it
  supports; `allocateOne`, `allocateDevice`): requests in order, each taking the first devices
  in the pool's order (`common.draslices`) that are not in use and have room, never the same
  device twice in one request (the search resumes after the device it took). A device with
  `allowMultipleAllocations` is never "in use": it takes another allocation while its capacity
  has room for what one consumes (`requestPolicy.default`, else the whole capacity). First fit,
  no scoring: the first solution found is the one used. A claim holds at most 32 devices
  (`AllocationResultsMaxSize`): with one device per replica, `nvidia.com/gpu.shared: 40` cannot
  be allocated at all.

The model is the allocator's first solution except where the allocator would backtrack: a pod
that mixes whole-GPU and shared requests, whose earlier request's first fit blocks a later one
through the GPU they share (the model then reports no fit). Pods requesting one device type,
the common case, are exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sharepack.common.draslices import DEFAULT_RESOURCES, Device, DeviceType, DraNode
from sharepack.common.podrequests import ContainerKind, PodRequest

Placement = dict[str, tuple[str, ...]]  # resource -> physical GPU keys, one per replica (or whole GPU)
# k8s.io/api resource/v1 `AllocationResultsMaxSize`: the devices one claim may be allocated; the
# allocator gives up on a claim that needs more (`errAllocationResultMaxSizeExceeded`).
ALLOCATION_RESULTS_MAX_SIZE = 32


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    name: str  # as the scheduler names it: container-<i>-request-<j>
    resource: str  # the extended resource it stands for
    type: DeviceType
    count: int


def claim_requests(request: PodRequest, resources: Mapping[DeviceType, str] = DEFAULT_RESOURCES) -> list[DeviceRequest]:
    """The device requests of the claim the scheduler makes for `request`'s mapped resources
    (resources no DeviceClass maps are left out: they are not DRA's)."""
    types = {name: t for t, name in resources.items()}
    containers = request.containers
    out: list[DeviceRequest] = []
    for resource in sorted(types):
        dtype = types[resource]
        long_lived: list[DeviceRequest | None] = [None] * len(containers)
        for i, c in enumerate(containers):
            n = c.amount(resource)
            if c.kind is not ContainerKind.INIT and n > 0:
                long_lived[i] = DeviceRequest(_name(i, c.amounts, resource), resource, dtype, n)
        largest: DeviceRequest | None = None
        for i, c in enumerate(containers):
            n = c.amount(resource)
            if c.kind is not ContainerKind.INIT or n == 0:
                continue
            reused = 0
            for r in long_lived[i:]:
                if r is not None:
                    reused += r.count
                    if reused >= n:
                        break
            if reused < n and (largest is None or largest.count < n - reused):
                largest = DeviceRequest(_name(i, c.amounts, resource), resource, dtype, n - reused)
        if largest is not None:
            out.append(largest)
        out.extend(r for r in long_lived if r is not None)
    return sorted(out, key=lambda r: r.name)


def _name(index: int, amounts: tuple[tuple[str, int], ...], resource: str) -> str:
    # The scheduler indexes the resource among all the container's request names (cpu and
    # memory too); the request only knows its managed ones, which orders them the same way
    # among themselves, and the names only order requests of one claim.
    names = sorted(n for n, _ in amounts)
    return f"container-{index}-request-{names.index(resource)}"


def _usable(node: DraNode, d: Device, used: Mapping[str, int], whole_taken: set[str], shared_taken: set[str]) -> bool:
    if d.tainted:
        return False
    if d.type is DeviceType.GPU:
        # The GPU's shared devices and its whole device exclude each other (the counter set).
        return used.get(d.name, 0) == 0 and d.gpu not in shared_taken
    if d.gpu in whole_taken:
        return False
    if d.multiple:
        return d.capacity - used.get(d.name, 0) >= d.use
    return used.get(d.name, 0) == 0


def allocate(node: DraNode, requests: list[DeviceRequest]) -> Placement | None:
    """The allocator's first fit for `requests` on `node`: per resource, the physical GPU of
    every replica (shared) or whole GPU taken; None when they do not fit, or need more devices
    than one claim may hold."""
    if sum(r.count for r in requests) > ALLOCATION_RESULTS_MAX_SIZE:
        return None
    used = dict(node.used)
    whole_taken = {d.gpu for d in node.devices if d.type is DeviceType.GPU and used.get(d.name, 0)}
    shared_taken = {d.gpu for d in node.devices if d.type is DeviceType.SHARED and used.get(d.name, 0)}
    out: dict[str, list[str]] = {}
    for req in requests:
        keys = out.setdefault(req.resource, [])
        taken = 0
        for d in node.devices:
            if taken == req.count:
                break
            if d.type is not req.type or not _usable(node, d, used, whole_taken, shared_taken):
                continue
            consumed = d.use if d.multiple else d.capacity
            used[d.name] = used.get(d.name, 0) + consumed
            (whole_taken if d.type is DeviceType.GPU else shared_taken).add(d.gpu)
            keys.extend([d.gpu] * (1 if d.type is DeviceType.GPU else consumed))
            taken += 1
        if taken < req.count:
            return None
    return {name: tuple(sorted(keys)) for name, keys in out.items()}
