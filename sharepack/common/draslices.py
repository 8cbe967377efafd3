"""The DRA mode's published state: this driver's ResourceSlices and the ResourceClaims allocated
from them (`resource.k8s.io/v1`), decoded into one node's devices in the allocator's order and
into the per-GPU view the device-plugin mode publishes as NodeGpuState (`common.state`), so
`common.scoring` ranks DRA nodes with the same comparators.

Device contract (the agent's DRA kubelet plugin publishes it): driver `gpu.sharepack.io`, one
pool per node named after the node; every device has the attributes `uuid` (string: the
physical GPU's key), `index` (int), `productName` (string) and `type` (`shared` for a shareable
GPU or one replica of it, `gpu` for a whole GPU). A shared GPU is either

* one device per GPU with `allowMultipleAllocations: true` and a capacity `replicas` whose
  `requestPolicy.default` is what one allocation without a capacity request consumes (the
  extended-resource mapping never requests capacity), or
* one device per replica, each with an extra `replica` (int) attribute.

Whole-GPU devices and the shared devices of the same GPU exclude each other (a counter set on
the agent's side); this view counts a GPU taken by either as taken for both.

The allocator's order (k8s.io/dynamic-resource-allocation v0.37.2, `structured/internal/
incubating`, `pools_incubating.go`): pools by (driver, pool name), the slices of a pool by
name, the devices of a slice as listed; only the newest `pool.generation` counts, and a pool
with fewer slices than its `resourceSliceCount` is skipped as incomplete.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sharepack.common.errors import DraSchemaError
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState

DRIVER = "gpu.sharepack.io"
GROUP = "resource.k8s.io"
VERSION = "v1"
REPLICAS = "replicas"  # the capacity a multi-allocatable shared device offers
# The extended resources the DeviceClasses map (`extendedResourceName`), per device type.
SHARED_RESOURCE = "nvidia.com/gpu.shared"
WHOLE_RESOURCE = "nvidia.com/gpu"


class DeviceType(StrEnum):
    SHARED = "shared"
    GPU = "gpu"


DEFAULT_RESOURCES: Mapping[DeviceType, str] = {DeviceType.SHARED: SHARED_RESOURCE, DeviceType.GPU: WHOLE_RESOURCE}


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    gpu: str  # `uuid`: the physical key
    index: int
    product: str
    type: DeviceType
    multiple: bool  # allowMultipleAllocations: several claims share it, each consuming `use`
    capacity: int  # replicas it offers: its `replicas` capacity when multiple, else 1
    use: int  # replicas one allocation without a capacity request consumes
    tainted: bool = False  # a NoSchedule/NoExecute taint: the allocator skips it


@dataclass(frozen=True, slots=True)
class DraNode:
    """One node's pool as the allocator meets it, and what allocated claims hold of it."""

    name: str
    devices: tuple[Device, ...]  # allocator order
    used: Mapping[str, int] = field(default_factory=dict)  # device name -> replicas consumed
    pods: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # device name -> pod UIDs

    def free(self, device: Device) -> int:
        """Replicas of `device` the allocator can still give (0 when in use or tainted)."""
        if device.tainted:
            return 0
        return max(device.capacity - self.used.get(device.name, 0), 0)


def _where(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name", "?") if isinstance(meta, Mapping) else "?"
    return f"{obj.get('kind', 'object')} {name}"


def _int(raw: Any, where: str) -> int:
    """An integer quantity ("4", 4); DRA quantities of this driver are plain counts."""
    if isinstance(raw, bool):
        raise DraSchemaError(f"invalid {where}: {raw!r}: want an integer")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and raw.strip().isdigit():
        return int(raw)
    raise DraSchemaError(f"invalid {where}: {raw!r}: want an integer count")


def _attribute(attrs: Mapping[str, Any], name: str, kind: str, where: str) -> Any:
    # Unqualified names belong to the driver's domain; a qualified one may spell it out.
    raw = attrs.get(name, attrs.get(f"{DRIVER}/{name}"))
    if not isinstance(raw, Mapping) or kind not in raw:
        raise DraSchemaError(f"invalid {where}: attribute {name!r} missing or not a {kind}: {raw!r}")
    value = raw[kind]
    if kind == "int":
        return _int(value, f"{where} attribute {name}")
    if not isinstance(value, str):
        raise DraSchemaError(f"invalid {where}: attribute {name!r}: {value!r} is not a string")
    return value


def _device(raw: Any, where: str) -> Device:
    if not isinstance(raw, Mapping):
        raise DraSchemaError(f"invalid {where}: not an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise DraSchemaError(f"invalid {where}: device without a name")
    where = f"{where} ({name})"
    attrs = raw.get("attributes") or {}
    if not isinstance(attrs, Mapping):
        raise DraSchemaError(f"invalid {where}: attributes is not an object")
    raw_type = _attribute(attrs, "type", "string", where)
    try:
        dtype = DeviceType(raw_type)
    except ValueError:
        raise DraSchemaError(f"invalid {where}: attribute type {raw_type!r}: want shared or gpu") from None
    multiple = raw.get("allowMultipleAllocations") is True
    capacity, use = 1, 1
    if multiple:
        caps = raw.get("capacity") or {}
        cap = caps.get(REPLICAS) if isinstance(caps, Mapping) else None
        if not isinstance(cap, Mapping):
            raise DraSchemaError(f"invalid {where}: a shared device must offer capacity {REPLICAS!r}")
        capacity = _int(cap.get("value"), f"{where} capacity {REPLICAS}")
        policy = cap.get("requestPolicy")
        default = policy.get("default") if isinstance(policy, Mapping) else None
        # Without a default the allocator charges the whole capacity (`fillEmptyRequest`).
        use = capacity if default is None else _int(default, f"{where} capacity {REPLICAS} default")
        if capacity < 1 or not 1 <= use <= capacity:
            raise DraSchemaError(f"invalid {where}: capacity {REPLICAS} {capacity} with default {use}")
    taints = raw.get("taints") or []
    tainted = isinstance(taints, list) and any(
        isinstance(t, Mapping) and t.get("effect") in ("NoSchedule", "NoExecute") for t in taints
    )
    return Device(
        name=name,
        gpu=_attribute(attrs, "uuid", "string", where),
        index=_attribute(attrs, "index", "int", where),
        product=_attribute(attrs, "productName", "string", where),
        type=dtype,
        multiple=multiple,
        capacity=capacity,
        use=use,
        tainted=tainted,
    )


def pool_devices(slices: Iterable[Mapping[str, Any]], pool: str, *, driver: str = DRIVER) -> tuple[Device, ...] | None:
    """The devices of `pool` in the allocator's order; None when the pool is incomplete (the
    allocator then allocates nothing from it) or absent. Slices of other drivers or pools are
    ignored."""
    mine: list[tuple[int, str, Mapping[str, Any]]] = []
    for s in slices:
        spec = s.get("spec")
        if not isinstance(spec, Mapping) or spec.get("driver") != driver:
            continue
        p = spec.get("pool")
        if not isinstance(p, Mapping) or p.get("name") != pool:
            continue
        where = _where(s)
        meta = s.get("metadata")
        name = str(meta.get("name", "")) if isinstance(meta, Mapping) else ""
        mine.append((_int(p.get("generation", 0), f"{where} spec.pool.generation"), name, s))
    if not mine:
        return None
    newest = max(g for g, _, _ in mine)
    current = sorted(((n, s) for g, n, s in mine if g == newest), key=lambda x: x[0])
    expected = current[0][1]["spec"]["pool"].get("resourceSliceCount", 1)
    if len(current) < _int(expected, f"{_where(current[0][1])} spec.pool.resourceSliceCount"):
        return None
    devices: list[Device] = []
    for _, s in current:
        raw = s["spec"].get("devices") or []
        if not isinstance(raw, list):
            raise DraSchemaError(f"invalid {_where(s)}: spec.devices is not a list")
        devices.extend(_device(d, f"{_where(s)} spec.devices[{i}]") for i, d in enumerate(raw))
    return tuple(devices)


@dataclass(frozen=True, slots=True)
class Holding:
    """One allocated device of a claim."""

    pool: str
    device: str
    consumed: int | None  # consumedCapacity replicas when recorded
    pods: tuple[str, ...]  # UIDs of the pods the claim is reserved for


def claim_holdings(claim: Mapping[str, Any], *, driver: str = DRIVER) -> list[Holding]:
    """The devices of this driver an allocated claim holds ([] when not allocated)."""
    where = _where(claim)
    status = claim.get("status")
    if not isinstance(status, Mapping):
        return []
    allocation = status.get("allocation")
    if not isinstance(allocation, Mapping):
        return []
    results = (allocation.get("devices") or {}).get("results") or []
    if not isinstance(results, list):
        raise DraSchemaError(f"invalid {where}: status.allocation.devices.results is not a list")
    reserved = status.get("reservedFor") or []
    pods = tuple(
        str(r["uid"]) for r in reserved if isinstance(r, Mapping) and r.get("resource") == "pods" and r.get("uid")
    )
    out: list[Holding] = []
    for i, r in enumerate(results):
        if not isinstance(r, Mapping) or r.get("driver") != driver:
            continue
        pool, device = r.get("pool"), r.get("device")
        if not isinstance(pool, str) or not isinstance(device, str):
            raise DraSchemaError(f"invalid {where}: status.allocation.devices.results[{i}]: no pool or device")
        consumed = r.get("consumedCapacity")
        replicas = None
        if isinstance(consumed, Mapping) and REPLICAS in consumed:
            replicas = _int(consumed[REPLICAS], f"{where} results[{i}].consumedCapacity.{REPLICAS}")
        out.append(Holding(pool, device, replicas, pods))
    return out


def dra_node(name: str, devices: tuple[Device, ...], holdings: Iterable[Holding]) -> DraNode:
    """The node's pool with what `holdings` (of any pool; others are skipped) consume."""
    by_name = {d.name: d for d in devices}
    used: dict[str, int] = {}
    pods: dict[str, tuple[str, ...]] = {}
    for h in holdings:
        d = by_name.get(h.device)
        if h.pool != name or d is None:
            continue
        take = (h.consumed if h.consumed is not None else d.use) if d.multiple else d.capacity
        used[d.name] = used.get(d.name, 0) + take
        pods[d.name] = tuple(dict.fromkeys((*pods.get(d.name, ()), *h.pods)))
    return DraNode(name, devices, used, pods)


def counted_node(name: str, devices: tuple[Device, ...], state: NodeState, resources: Mapping[DeviceType, str] = DEFAULT_RESOURCES) -> DraNode:
    """The pool `devices` (allocator order) with the use `state` counts per GPU (`node_state`'s
    view, possibly with pods the extender assumed on top): per GPU and device type, its first
    untainted devices in the order are the used ones. Which replicas of a GPU are used does not
    change where first fit goes while a GPU's devices are listed together (GPU-major orders:
    the `packed` static order and `fresh-first`); for a replica-major order it assumes the
    earliest ones, as first fit takes them."""
    allocated: dict[tuple[DeviceType, str], int] = {}
    for dtype, resource in resources.items():
        res = state.resource(resource)
        for g in res.gpus if res is not None else ():
            allocated[(dtype, g.key)] = g.allocated
    # `node_state` shows a GPU with some replicas taken as a taken whole GPU too: only a GPU
    # with none or all of its replicas taken can be held whole.
    replicas: dict[str, int] = {}
    for d in devices:
        if d.type is DeviceType.SHARED:
            replicas[d.gpu] = replicas.get(d.gpu, 0) + d.capacity
    for (dtype, gpu), n in list(allocated.items()):
        if dtype is DeviceType.GPU and 0 < allocated.get((DeviceType.SHARED, gpu), 0) < replicas.get(gpu, 0):
            allocated[(dtype, gpu)] = 0
    used: dict[str, int] = {}
    for tainted in (False, True):
        for d in devices:
            if d.tainted is not tainted:
                continue
            left = allocated.get((d.type, d.gpu), 0)
            if left <= 0:
                continue
            take = min(left, d.capacity)
            used[d.name] = take
            allocated[(d.type, d.gpu)] = left - take
    return DraNode(name, devices, used)


def node_state(
    node: DraNode,
    *,
    resources: Mapping[DeviceType, str] = DEFAULT_RESOURCES,
    observed_at: str = "",
    policy: Policy = Policy.PACKED,
) -> NodeState:
    """The per-GPU view the device-plugin mode publishes (NodeGpuState), one resource per
    device type the node has: per physical GPU `total` replicas (shared) or 1 (whole), and
    `allocated`. A GPU taken whole has all its replicas allocated; a GPU with a replica taken
    is allocated as a whole GPU. Tainted devices count as unhealthy. `policy` is what the
    scorers read as the node's policy; first fit over the node's order is modelled by
    `common.draallocation`, not by it."""
    shared: dict[str, list[int]] = {}  # gpu -> [total, used, unhealthy]
    whole: dict[str, list[int]] = {}
    info: dict[str, Device] = {}
    pods: dict[str, list[str]] = {}
    for d in node.devices:
        info.setdefault(d.gpu, d)
        counts = (shared if d.type is DeviceType.SHARED else whole).setdefault(d.gpu, [0, 0, 0])
        held = min(node.used.get(d.name, 0), d.capacity)
        counts[0] += d.capacity
        counts[1] += held
        if d.tainted:
            counts[2] += d.capacity - held
        pods.setdefault(d.gpu, []).extend(node.pods.get(d.name, ()))
    out: list[ResourceState] = []
    for dtype, table, sharing in (
        (DeviceType.GPU, whole, Sharing.NONE),
        (DeviceType.SHARED, shared, Sharing.TIME_SLICING),
    ):
        if not table or dtype not in resources:
            continue
        other = shared if dtype is DeviceType.GPU else whole
        gpus = []
        for key, (total, used, bad) in sorted(table.items(), key=lambda kv: (info[kv[0]].index, kv[0])):
            if other.get(key, (0, 0))[1]:
                used = total  # the other kind holds this GPU: nothing of it is free here
            gpus.append(
                GpuState(
                    key=key,
                    index=str(info[key].index),
                    product=info[key].product,
                    total=total,
                    allocated=used,
                    unhealthy=min(bad, total - used),
                    pods=tuple(dict.fromkeys(pods.get(key, ()))),
                )
            )
        out.append(ResourceState(resources[dtype], sharing, False, tuple(gpus)))
    return NodeState(
        observed_at=observed_at,
        agent_version="dra",
        allocation_policy=policy,
        mig_strategy=MigStrategy.NONE,
        resources=tuple(out),
    )
