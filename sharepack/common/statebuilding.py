"""Build the published `NodeState` from what the node knows (pure: no I/O, no clock).

Inputs: the resources the agent serves, the device IDs it considers unhealthy, what the kubelet's
PodResources API says each pod holds (already grouped per pod and resource, see `PodDevices`),
the pod UIDs the API server knows for (namespace, name), and device IDs the agent allocated so
recently that PodResources may not show them yet.

Grouping is exactly the allocation core's: per resource, devices are grouped by
`Device.physical_key` (the replica suffix stripped, a MIG instance under its parent GPU), the same
mapping `Resource.group_of()` hands to `allocation.shared_allocation`.

Counts per physical GPU are disjoint, so that `GpuState.free = total - allocated - unhealthy`
is the number of devices the node would still hand out:
* `allocated`: devices of that GPU held by a pod (or just allocated by the agent);
* `unhealthy`: devices that are unhealthy and *not* held (a held device that turns unhealthy
  stays counted once, as allocated).
Device IDs that the current resources do not know (a pod still holding a replica of a previous
config) are ignored: they name no device the node can hand out now.

PodResources never lists plain init containers, yet the kubelet keeps their devices for the pod
until it ends: `with_init_container_devices` adds them back from the agent's Allocate log.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol
from types import MappingProxyType

from sharepack.common.capacity import capacity
from sharepack.common.policies import MigStrategy, Policy
from sharepack.common.resources import Resource
from sharepack.common.state import GpuState, NodeState, ResourceState, to_status


@dataclass(frozen=True, slots=True)
class PodDevices:
    """One pod's devices as PodResources reports them, grouped by resource and de-duplicated."""

    namespace: str
    name: str
    devices: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        frozen = {res: frozenset(ids) for res, ids in self.devices.items()}
        object.__setattr__(self, "devices", MappingProxyType(frozen))


def group_pod_devices(
    namespace: str, name: str, entries: Sequence[tuple[str, Sequence[str]]]
) -> PodDevices:
    """PodResources lists one entry per (device, NUMA node), per container: fold them into one
    set of device IDs per resource for the whole pod."""
    grouped: dict[str, set[str]] = {}
    for resource, ids in entries:
        grouped.setdefault(resource, set()).update(ids)
    return PodDevices(namespace, name, {r: frozenset(ids) for r, ids in grouped.items()})


class AllocationLike(Protocol):
    """One Allocate the agent answered (`agent.running.Allocation`): one container, one resource."""

    @property
    def resource(self) -> str: ...

    @property
    def device_ids(self) -> tuple[str, ...]: ...

    @property
    def at(self) -> float: ...


def app_allocations(allocations: Sequence[AllocationLike], pods: Sequence[PodDevices]) -> set[AllocationLike]:
    """The allocations PodResources shows now: all of their devices held by one listed pod (an
    app container or a sidecar). The publisher remembers them, so that after their pod ended
    they are never mistaken for an init container's (see `with_init_container_devices`)."""
    holder = _holders(pods)
    return {a for a in allocations if _single_holder(holder, a) is not None}


def _holders(pods: Sequence[PodDevices]) -> dict[tuple[str, str], int]:
    """(resource, device id) -> index of the listed pod holding it."""
    return {(res, d): k for k, pod in enumerate(pods) for res, ids in pod.devices.items() for d in ids}


def _single_holder(holder: Mapping[tuple[str, str], int], alloc: AllocationLike) -> int | None:
    """The one listed pod holding every device of `alloc`, if there is one."""
    found = {holder.get((alloc.resource, d)) for d in alloc.device_ids}
    if len(found) != 1:
        return None
    (k,) = found
    return k


def with_init_container_devices(
    pods: Sequence[PodDevices],
    allocations: Sequence[AllocationLike],
    *,
    ever_listed: Collection[AllocationLike],
    window_s: float = 1.0,
) -> tuple[PodDevices, ...]:
    """`pods`, plus the devices their plain init containers still hold.

    The kubelet keeps every device of a pod's init containers allocated until the pod ends
    (later containers reuse them first), but PodResources lists app containers and sidecars
    only. An init container's surplus would look free although the kubelet offers it to no one.
    We recover it from the agent's own Allocate log: the kubelet admits one pod at a time,
    init containers first, and a container reuses the devices of the one before. So an
    allocation never listed in PodResources that is followed, within `window_s` and in the same
    resource, by an allocation of a listed pod sharing a device with it, belongs to that pod
    (and so on backwards through several init containers); its devices that no pod lists are
    held by that pod.

    Misattribution needs an unlisted allocation (a pod the kubelet rejected after Allocate, or
    one that ended before PodResources was read) followed within `window_s` by another pod
    reusing one of its devices: the other pod is then shown holding more, never less, until it
    ends. An init container whose resource no later container uses at all cannot be recovered.
    """
    holder = _holders(pods)
    extra: dict[int, dict[str, set[str]]] = {}
    by_resource: dict[str, list[AllocationLike]] = {}
    for alloc in allocations:
        by_resource.setdefault(alloc.resource, []).append(alloc)
    for res, log in by_resource.items():
        owner: dict[int, int] = {}  # position in log -> index of the pod it belongs to
        for i in range(len(log) - 1, -1, -1):
            ids = frozenset(log[i].device_ids)
            k = _single_holder(holder, log[i])
            if k is not None:
                owner[i] = k
                continue
            if log[i] in ever_listed or i + 1 not in owner:
                continue
            after = log[i + 1]
            if after.at - log[i].at > window_s or not ids & frozenset(after.device_ids):
                continue
            owner[i] = owner[i + 1]
            surplus = {d for d in ids if (res, d) not in holder}
            if surplus:
                extra.setdefault(owner[i], {}).setdefault(res, set()).update(surplus)
    if not extra:
        return tuple(pods)
    out = []
    for k, pod in enumerate(pods):
        if k in extra:
            merged = {res: pod.devices.get(res, frozenset()) | extra[k].get(res, set())
                      for res in set(pod.devices) | set(extra[k])}
            pod = PodDevices(pod.namespace, pod.name, merged)
        out.append(pod)
    return tuple(out)


def build_node_state(
    *,
    resources: Sequence[Resource],
    unhealthy: Collection[str],
    pods: Sequence[PodDevices],
    pod_uids: Mapping[tuple[str, str], str],
    allocation_policy: Policy,
    mig_strategy: MigStrategy,
    agent_version: str,
    observed_at: str,
    recently_allocated: Mapping[str, Collection[str]] | None = None,
    recent_holders: Mapping[str, str] | None = None,
) -> NodeState:
    """The node's state. A pod whose UID is not known yet holds its devices without being
    listed in `pods`; it is listed once the caller learns its UID. `recent_holders`: device ID
    -> UID of the pod a recent allocation was for, when the caller knows it before PodResources
    does (directed GPUs name the pod): such a pod is listed at once."""
    sick = frozenset(unhealthy)
    out: list[ResourceState] = []
    for res in resources:
        by_id = res.by_id()
        holders: dict[str, set[str]] = {}  # device id -> pod UIDs ("" when unknown)
        for pod in pods:
            uid = pod_uids.get((pod.namespace, pod.name), "")
            for device_id in pod.devices.get(res.name, ()):
                if device_id in by_id:
                    holders.setdefault(device_id, set()).add(uid)
        for device_id in (recently_allocated or {}).get(res.name, ()):
            if device_id in by_id:
                held = holders.setdefault(device_id, set())
                directed_to = (recent_holders or {}).get(device_id)
                if directed_to and not held:
                    held.add(directed_to)

        tallies: dict[str, _Tally] = {}
        for device in res.devices:
            tally = tallies.get(device.physical_key)
            if tally is None:
                tally = tallies[device.physical_key] = _Tally(device.gpu_index, device.product)
            tally.total += 1
            if device.id in holders:
                tally.allocated += 1
                tally.pods.update(u for u in holders[device.id] if u)
            elif device.id in sick:
                tally.unhealthy += 1
        ordered = sorted(tallies.items(), key=lambda kv: (kv[1].gpu_index, kv[0]))
        out.append(
            ResourceState(
                name=res.name,
                sharing=res.sharing,
                fail_requests_greater_than_one=res.fail_requests_greater_than_one,
                gpus=tuple(t.state(key) for key, t in ordered),
            )
        )
    return NodeState(
        observed_at=observed_at,
        agent_version=agent_version,
        allocation_policy=allocation_policy,
        mig_strategy=mig_strategy,
        resources=tuple(sorted(out, key=lambda r: r.name)),
    )


@dataclass(slots=True)
class _Tally:
    gpu_index: int
    product: str
    total: int = 0
    allocated: int = 0
    unhealthy: int = 0
    pods: set[str] = field(default_factory=set)

    def state(self, key: str) -> GpuState:
        return GpuState(
            key=key,
            index=str(self.gpu_index),
            product=self.product,
            total=self.total,
            allocated=self.allocated,
            unhealthy=self.unhealthy,
            pods=tuple(sorted(self.pods)),
        )


def same_content(a: NodeState | None, b: NodeState | None) -> bool:
    """Equal apart from the observation time: whether a new write would change anything."""
    if a is None or b is None:
        return a is b
    return replace(a, observed_at="") == replace(b, observed_at="")


def same_use(a: NodeState, b: NodeState) -> bool:
    """Equal apart from the observation time and the order each GPU lists its pods in: a node
    scored on one is scored alike on the other. (An extender counts a pod it binds at the end
    of its GPUs' lists; the agent then publishes the same pods sorted.) The extender asks this
    of every state its agents publish, so it compares field by field rather than building
    sorted copies; every field but `observed_at` is compared."""
    if (a.agent_version, a.allocation_policy, a.mig_strategy, a.schema_version) != (
        b.agent_version, b.allocation_policy, b.mig_strategy, b.schema_version
    ) or len(a.resources) != len(b.resources):  # fmt: skip
        return False
    for ra, rb in zip(a.resources, b.resources):
        if (ra.name, ra.sharing, ra.fail_requests_greater_than_one) != (rb.name, rb.sharing, rb.fail_requests_greater_than_one) \
                or len(ra.gpus) != len(rb.gpus):  # fmt: skip
            return False
        for ga, gb in zip(ra.gpus, rb.gpus):
            if (ga.key, ga.index, ga.product, ga.total, ga.allocated, ga.unhealthy) != (
                gb.key, gb.index, gb.product, gb.total, gb.allocated, gb.unhealthy
            ) or (ga.pods != gb.pods and sorted(ga.pods) != sorted(gb.pods)):  # fmt: skip
                return False
    return True


def summary(state: NodeState) -> dict[str, int | str]:
    """The one-line view `kubectl get nodegpustates` prints (`status.summary`): physical GPUs
    with nothing held and nothing unhealthy in any resource, and devices held / served."""
    c = capacity(state)
    return {
        "freeGpus": c.whole_gpus_free,
        "gpus": c.gpus,
        "replicasUsed": c.used,
        "replicasTotal": c.total,
        "replicas": f"{c.used}/{c.total}",
    }


def status_document(state: NodeState) -> dict[str, object]:
    """`state.to_status` plus the summary (an added field: schema version 1 still reads it)."""
    doc = to_status(state)
    doc["summary"] = summary(state)
    return doc
