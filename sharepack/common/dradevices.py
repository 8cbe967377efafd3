"""The devices a node publishes in DRA mode: one ResourceSlice device per replica (or whole GPU),
in the order that steers kube-scheduler's first-fit allocator to the node's policy.

Why one device per replica, not one shareable device per GPU with a `replicas` capacity
(consumable capacity): the DRA extended-resource mapping turns a container's
`nvidia.com/gpu.shared: N` into one ExactCount request for N devices with no capacity request,
and the v1.37 allocator (dynamic-resource-allocation structured/internal/incubating,
`allocateOne`) looks for the next device of a request strictly after the previous one, so the N
devices are always N *distinct* devices. With one device per GPU, N > 1 would always span N GPUs
and a pod could never hold two shares (or all shares) of one GPU. With one device per replica,
N replicas can come from one GPU, in slice order, as in the device-plugin mode.

The allocator is first fit over the slice's devices in order (slices of a pool by name, devices
by index), so the order is the policy:

* `packed`: GPU-major (every replica of GPU 0, then GPU 1, ...): a request takes the free
  replicas of the lowest-numbered GPU that has any, so shares fill one GPU before the next and
  whole GPUs stay free. It differs from the device-plugin `packed` ("most allocated first") only
  after pods leave: first fit refills the lowest-numbered GPU with a free replica, not the fullest.
* `distributed` and `spread`: replica-major (replica 0 of every GPU, then replica 1, ...): round
  robin over GPUs, so single replicas spread and an N-replica request gets N distinct GPUs while
  they have free replicas. Approximate once pods leave, for the same reason.

What DRA cannot do: order by the live count (the order is fixed when the slice is written), and
directed GPUs (the extender's `sharepack.io/gpus`): the scheduler allocates, not the agent. MIG
instances are not published (they need partitionable devices with counter sets).

Device contract (shared with the extender's DRA ranking and tracesim's DRA model), attributes in
the driver's domain `gpu.sharepack.io`: `uuid` (string, the physical GPU key), `index` (int),
`productName` (string), `type` (`shared` for a replica, `gpu` for a whole GPU), `replica` (int,
replicas only) and `resource` (string, the extended resource name the device serves, which the
DeviceClasses select on).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sharepack.common.policies import Policy
from sharepack.common.resources import Device, Resource

DRIVER: Final = "gpu.sharepack.io"
TYPE_SHARED: Final = "shared"
TYPE_GPU: Final = "gpu"
# resource.k8s.io/v1 allows 64 devices in a slice where any device has taints (128 without):
# always 64, so tainting an unhealthy GPU never changes how the pool is cut into slices.
MAX_DEVICES_PER_SLICE: Final = 64
# Devices of a GPU with a critical XID carry this taint; the allocator skips a tainted device
# unless the claim tolerates it (DRADeviceTaints, GA in Kubernetes 1.37).
UNHEALTHY_TAINT: Final = {"key": f"{DRIVER}/unhealthy", "value": "xid", "effect": "NoSchedule"}


@dataclass(frozen=True, slots=True)
class DraDevice:
    name: str  # the device's name in the slice: a DNS label, unique in the pool
    resource: str  # the extended resource it serves: "nvidia.com/gpu.shared", "nvidia.com/gpu"
    device: Device

    @property
    def type(self) -> str:
        return TYPE_GPU if self.device.replica is None else TYPE_SHARED


def device_name(device: Device) -> str:
    """`gpu-<index>` for a whole GPU, `gpu-<index>-replica-<n>` for a replica."""
    if device.replica is None:
        return f"gpu-{device.gpu_index}"
    return f"gpu-{device.gpu_index}-replica-{device.replica}"


def _order(policy: Policy, device: Device) -> tuple[int, int]:
    replica = device.replica or 0
    if policy is Policy.PACKED:
        return (device.gpu_index, replica)
    return (replica, device.gpu_index)


def slice_devices(resources: Sequence[Resource], policy: Policy) -> tuple[DraDevice, ...]:
    """Every published device, resource by resource (by name), each in `policy`'s order. MIG
    resources are left out (see the module docstring)."""
    out: list[DraDevice] = []
    for resource in sorted(resources, key=lambda r: r.name):
        if any(d.is_mig for d in resource.devices):
            continue
        ordered = sorted(resource.devices, key=lambda d: _order(policy, d))
        out.extend(DraDevice(device_name(d), resource.name, d) for d in ordered)
    return tuple(out)


def mig_resources(resources: Sequence[Resource]) -> tuple[str, ...]:
    """The resources `slice_devices` leaves out, so the agent can say so."""
    return tuple(r.name for r in resources if any(d.is_mig for d in r.devices))


def api_device(device: DraDevice, *, unhealthy: bool = False) -> dict[str, Any]:
    """The device as resource.k8s.io/v1 `ResourceSlice.spec.devices[]`; `unhealthy`: tainted."""
    d = device.device
    attributes: dict[str, Any] = {
        "uuid": {"string": d.physical_key},
        "index": {"int": d.gpu_index},
        "productName": {"string": d.product},
        "type": {"string": device.type},
        "resource": {"string": device.resource},
    }
    if d.replica is not None:
        attributes["replica"] = {"int": d.replica}
    doc: dict[str, Any] = {"name": device.name, "attributes": attributes}
    if unhealthy:
        doc["taints"] = [dict(UNHEALTHY_TAINT)]
    return doc


def slice_name(node: str, index: int) -> str:
    """Slices of a pool are met in name order: the zero-padded index keeps that the device order."""
    return f"{node}-{DRIVER}-{index:03d}"


def slice_bodies(
    node: str,
    devices: Sequence[DraDevice],
    *,
    generation: int,
    owner: Mapping[str, str] | None = None,
    unhealthy: Collection[str] = (),
) -> list[dict[str, Any]]:
    """The node's pool (named after the node) as ResourceSlice objects, at most
    `MAX_DEVICES_PER_SLICE` devices each, in order. `owner`: the Node's name and uid, so the
    slices are garbage-collected with it. `unhealthy`: physical GPU keys whose devices are
    tainted."""
    chunks = [devices[i:i + MAX_DEVICES_PER_SLICE] for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)]
    chunks = chunks or [()]  # an empty pool still says "this node has none"
    bodies = []
    for i, chunk in enumerate(chunks):
        metadata: dict[str, Any] = {"name": slice_name(node, i)}
        if owner is not None:
            metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": owner["name"], "uid": owner["uid"]}]
        bodies.append({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": metadata,
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
                "devices": [api_device(d, unhealthy=d.device.physical_key in unhealthy) for d in chunk],
            },
        })
    return bodies


def by_name(devices: Sequence[DraDevice]) -> Mapping[str, DraDevice]:
    return {d.name: d for d in devices}
