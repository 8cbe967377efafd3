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

* `fresh-first` (`--dra-device-order=fresh-first`, what deploy/dra ships): GPU-major, the GPUs no
  prepared claim holds first, then the GPUs in use, the most used first; republished whenever a
  claim is prepared or unprepared (`fresh_first`). A share then opens a free GPU while the node
  has one, as FGD places the typical share (the extender ranks each node by that first fit, so
  its ranking chooses where a GPU is opened and where one is topped up); on a node with no free
  GPU it tops up the fullest. Measured on the default trace (docs/dra.md): 4.22 % of the GPUs
  unallocated against 4.52 % with the static `packed` order.

What DRA cannot do: order by the live count between two publications (the allocator reads the
slice as last written: an allocation the agent has not prepared yet does not move it), and
directed GPUs (the extender's `sharepack.io/gpus`): the scheduler allocates, not the agent. MIG
instances are not published (they need partitionable devices with counter sets).

Device contract (shared with the extender's DRA ranking and tracesim's DRA model), attributes in
the driver's domain `gpu.sharepack.io`: `uuid` (string, the physical GPU key), `index` (int),
`productName` (string), `type` (`shared` for a replica, `gpu` for a whole GPU), `replica` (int,
replicas only) and `resource` (string, the extended resource name the device serves, which the
DeviceClasses select on).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from sharepack.common.policies import Policy
from sharepack.common.resources import Device, Resource

K = TypeVar("K")

DRIVER: Final = "gpu.sharepack.io"
# `--dra-device-order`: the policy's order, fixed when the slice is first written, or
# `fresh_first`, republished as claims are prepared and unprepared.
STATIC_ORDER: Final = "static"
FRESH_FIRST: Final = "fresh-first"
DEVICE_ORDERS: Final = (STATIC_ORDER, FRESH_FIRST)
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


def fresh_first(gpus: Sequence[K], used: Mapping[K, int]) -> list[K]:
    """`gpus` (in the static order) reordered fresh first: those with nothing `used` first, as
    they were, then the used ones, the most used first (ties as they were). The agent's slice
    and the simulator's DRA model (`tracesim.dra`) order GPUs with this one rule."""
    position = {g: i for i, g in enumerate(gpus)}
    return sorted(gpus, key=lambda g: (used.get(g, 0) > 0, -used.get(g, 0), position[g]))


def republished(devices: Sequence[DraDevice], used: Mapping[str, int]) -> tuple[DraDevice, ...]:
    """`devices` (`slice_devices`' order) in the `fresh-first` order for `used` (devices held
    per physical GPU key): per resource, GPU by GPU, `fresh_first` over the GPUs in their
    static order; a GPU's devices keep their order among themselves."""
    out: list[DraDevice] = []
    for resource in dict.fromkeys(d.resource for d in devices):
        groups: dict[str, list[DraDevice]] = {}
        for d in devices:
            if d.resource == resource:
                groups.setdefault(d.device.physical_key, []).append(d)
        for key in fresh_first(list(groups), used):
            out.extend(sorted(groups[key], key=lambda d: d.device.replica or 0))
    return tuple(out)


def held_per_gpu(devices: Mapping[str, DraDevice], held: Iterable[str]) -> dict[str, int]:
    """Devices held per physical GPU key, from the names of held devices (unknown names skipped)."""
    out: dict[str, int] = {}
    for name in held:
        d = devices.get(name)
        if d is not None:
            out[d.device.physical_key] = out.get(d.device.physical_key, 0) + 1
    return out


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
