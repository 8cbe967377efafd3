"""The resources the agent serves, built from what the node has (`Inventory`) and the `Config`.

Base resources follow upstream's MIG strategies:

* `none`: every GPU is an `nvidia.com/gpu`, MIG mode or not (MIG instances are not served).
* `single`: if the node's GPUs have MIG enabled, their MIG instances are served as
  `nvidia.com/gpu`; every GPU must then have MIG enabled, with at least one instance, and all
  instances must share one profile. Without MIG anywhere, full GPUs are served.
* `mixed`: GPUs without MIG are `nvidia.com/gpu`; MIG instances are `nvidia.com/mig-<profile>`.

Then sharing (time-slicing or MPS) replaces the selected devices of a shared resource with
replicas `<id>::<n>` (n = 0..count-1), served under `<name>.shared` when `renameByDefault` is set.
Per-GPU counts (`perGpu`) give each device its own count; `Resource.replicas` is the largest.
A replica's physical key is its device's; a MIG instance's physical key is its **parent GPU's
UUID** (upstream keys it by its own UUID, which makes `packed` meaningless for MIG).

Where we differ from upstream on purpose:

* A device reference naming a GPU (index "0" or its UUID) also selects every MIG instance of that
  GPU in a MIG resource; upstream only matches the instance's own "gpu:mig" index or UUID.
* Sharing only some devices of a resource without `renameByDefault` is an error: upstream would
  serve replicated and unreplicated devices under one name, which one `Resource` (one sharing
  mode, one allocation path) cannot describe. Shared resource names that this node does not
  serve are skipped, as upstream does, so one config fits nodes with different GPUs.

Device nodes: a GPU is `/dev/nvidia<minor>`. A MIG instance also needs its GPU instance's and
compute instance's capability nodes, `/dev/nvidia-caps/nvidia-cap<N>`, where N is the minor the
driver lists for `gpu<minor>/gi<gi>/access` and `gpu<minor>/gi<gi>/ci<ci>/access` in
`/proc/driver/nvidia-caps/mig-minors`. `build_resources` stays pure: pass that file parsed with
`parse_mig_minors`, or let it use the driver's fixed numbering (`mig_minor`), which is what the
file holds on every driver we know of.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from sharepack.common import allocation
from sharepack.common import devices as device_ids
from sharepack.common.config import (
    ALL,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    SHARED_SUFFIX,
    Config,
    ReplicatedResource,
    SharingConfig,
    is_gpu_uuid,
    is_mig_uuid,
)
from sharepack.common.errors import ResourceError
from sharepack.common.inventory import Gpu, Inventory, MigDevice
from sharepack.common.policies import MigStrategy, Sharing


@dataclass(frozen=True, slots=True)
class Device:
    id: str  # the ID the kubelet sees: UUID, MIG UUID, or "<uuid>::<n>" for replicas
    physical_key: str  # parent GPU UUID (MIG instances group by parent)
    uuid: str  # underlying GPU or MIG UUID (NVIDIA_VISIBLE_DEVICES with device-id-strategy=uuid)
    index: str  # "0", or "0:1" (gpu:mig) with device-id-strategy=index
    gpu_index: int
    replica: int | None  # None when not replicated
    paths: tuple[str, ...]  # device nodes, e.g. ("/dev/nvidia0",) or MIG caps paths
    numa_node: int | None
    product: str  # e.g. "NVIDIA A100-SXM4-40GB" or "NVIDIA A100-SXM4-40GB MIG 1g.5gb"

    @property
    def is_mig(self) -> bool:
        return self.uuid != self.physical_key


@dataclass(frozen=True, slots=True)
class Resource:
    name: str  # "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb", ...
    sharing: Sharing  # none | time-slicing | mps
    replicas: int  # 1 when not replicated (max per GPU when per-GPU counts differ)
    fail_requests_greater_than_one: bool
    devices: tuple[Device, ...]

    @property
    def replicated(self) -> bool:
        return self.sharing is not Sharing.NONE

    @property
    def full_gpu(self) -> bool:
        """Unreplicated, non-MIG (and not WSL): the topology-aware allocation path applies.

        Decided by `allocation.takes_aligned_path`, upstream's rule, which the shared vectors pin.
        """
        # Replicas never take it (their IDs carry "::"): answer those without a pass over them.
        return not self.replicated and allocation.takes_aligned_path(
            (d.index for d in self.devices),
            (p for d in self.devices for p in d.paths),
            (d.id for d in self.devices),
        )

    def group_of(self) -> Mapping[str, str]:
        """Device id -> physical key, for `allocation.shared_allocation(group_of=...)`."""
        return MappingProxyType({d.id: d.physical_key for d in self.devices})

    def device_ids(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices)

    def by_id(self) -> Mapping[str, Device]:
        return MappingProxyType({d.id: d for d in self.devices})


# --- device nodes -----------------------------------------------------------------------------

# The driver numbers capability minors in a fixed layout: "config" 1, "monitor" 2, then per GPU
# 15 GPU instances, each with its own access node followed by 8 compute-instance nodes.
_FIRST_GPU_MINOR: Final = 3
_CIS_PER_GI: Final = 8
_GIS_PER_GPU: Final = 15
_MINORS_PER_GI: Final = 1 + _CIS_PER_GI
_MINORS_PER_GPU: Final = _GIS_PER_GPU * _MINORS_PER_GI
_MIG_MINORS_LINE: Final = re.compile(r"^(\S+)\s+([0-9]+)$")


def mig_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The nvidia-caps minor of `gpu<gpu_minor>/gi<gi>/access` (ci None) or of
    `gpu<gpu_minor>/gi<gi>/ci<ci>/access`, in the driver's fixed numbering."""
    if not (0 <= gi < _GIS_PER_GPU) or (ci is not None and not 0 <= ci < _CIS_PER_GI):
        name = f"gpu{gpu_minor}/gi{gi}" + ("" if ci is None else f"/ci{ci}") + "/access"
        raise ValueError(f"no nvidia-caps minor for {name}: GPU instance IDs run 0..14 and "
                         "compute instance IDs 0..7")
    base = _FIRST_GPU_MINOR + gpu_minor * _MINORS_PER_GPU + gi * _MINORS_PER_GI
    return base if ci is None else base + 1 + ci


def parse_mig_minors(text: str) -> dict[str, int]:
    """Parse `/proc/driver/nvidia-caps/mig-minors` ("gpu0/gi1/ci0/access 13" per line)."""
    minors: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        m = _MIG_MINORS_LINE.match(line)
        if m is None:
            raise ValueError(f"mig-minors line {n}: want '<name> <minor>', got {line!r}")
        minors[m.group(1)] = int(m.group(2))
    return minors


def _mig_paths(gpu: Gpu, mig: MigDevice, minors: Mapping[str, int] | None) -> tuple[str, ...]:
    gi_key = f"gpu{gpu.minor}/gi{mig.gi_id}/access"
    ci_key = f"gpu{gpu.minor}/gi{mig.gi_id}/ci{mig.ci_id}/access"
    if minors is None:
        try:
            gi_minor, ci_minor = mig_minor(gpu.minor, mig.gi_id), mig_minor(gpu.minor, mig.gi_id,
                                                                             mig.ci_id)
        except ValueError as e:
            raise ResourceError(f"MIG device {mig.uuid}: {e}") from e
    else:
        missing = [k for k in (gi_key, ci_key) if k not in minors]
        if missing:
            raise ResourceError(f"MIG device {mig.uuid}: no nvidia-caps minor for "
                                f"{', '.join(missing)} in mig-minors")
        gi_minor, ci_minor = minors[gi_key], minors[ci_key]
    return (f"/dev/nvidia{gpu.minor}", f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
            f"/dev/nvidia-caps/nvidia-cap{ci_minor}")


# --- base resources (MIG strategies) ----------------------------------------------------------

def _gpu_device(gpu: Gpu) -> Device:
    return Device(id=gpu.uuid, physical_key=gpu.uuid, uuid=gpu.uuid, index=str(gpu.index),
                  gpu_index=gpu.index, replica=None, paths=(f"/dev/nvidia{gpu.minor}",),
                  numa_node=gpu.numa_node, product=gpu.name)


def _mig_device(gpu: Gpu, mig: MigDevice, minors: Mapping[str, int] | None) -> Device:
    return Device(id=mig.uuid, physical_key=gpu.uuid, uuid=mig.uuid,
                  index=f"{gpu.index}:{mig.index}", gpu_index=gpu.index, replica=None,
                  paths=_mig_paths(gpu, mig, minors), numa_node=gpu.numa_node,
                  product=f"{gpu.name} MIG {mig.profile}")


def _sorted_gpus(inventory: Inventory) -> list[Gpu]:
    return sorted(inventory.gpus, key=lambda g: g.index)


def _sorted_migs(gpu: Gpu) -> list[MigDevice]:
    return sorted(gpu.mig_devices, key=lambda m: (m.index, m.gi_id, m.ci_id))


def _base_resources(inventory: Inventory, strategy: MigStrategy,
                    minors: Mapping[str, int] | None) -> dict[str, list[Device]]:
    gpus = _sorted_gpus(inventory)
    base: dict[str, list[Device]] = {}
    if strategy is MigStrategy.NONE:
        if gpus:
            base[GPU_RESOURCE] = [_gpu_device(g) for g in gpus]
        return base

    problems = [f"invalid MIG configuration: GPU {g.index} ({g.uuid}) has MIG enabled but no "
                "MIG devices" for g in gpus if g.mig_enabled and not g.mig_devices]
    if strategy is MigStrategy.SINGLE:
        on = [str(g.index) for g in gpus if g.mig_enabled]
        off = [str(g.index) for g in gpus if not g.mig_enabled]
        if on and off:
            problems.append("all devices on the node must be configured with the same "
                            f"migEnabled value (mig strategy single): MIG enabled on GPU "
                            f"{','.join(on)} and disabled on GPU {','.join(off)}")
        profiles = sorted({m.profile for g in gpus for m in g.mig_devices})
        if len(profiles) > 1:
            problems.append("invalid MIG configuration: mig strategy single needs one MIG "
                            f"profile on the node, found {', '.join(profiles)}")
    if problems:
        raise ResourceError("; ".join(problems))

    for gpu in gpus:
        if not gpu.mig_enabled:
            base.setdefault(GPU_RESOURCE, []).append(_gpu_device(gpu))
            continue
        for mig in _sorted_migs(gpu):
            single = strategy is MigStrategy.SINGLE
            # "+" (media extensions, "1g.5gb+me") is not allowed in a resource name: upstream
            # serves that profile as "nvidia.com/mig-1g.5gb.me".
            name = GPU_RESOURCE if single else MIG_RESOURCE_PREFIX + mig.profile.replace("+", ".")
            base.setdefault(name, []).append(_mig_device(gpu, mig, minors))
    return base


# --- sharing ----------------------------------------------------------------------------------

def _matches(ref: str, device: Device) -> int:
    """How specifically `ref` names `device`: 2 its own index or UUID, 1 its parent GPU (MIG
    instances only), 0 not at all."""
    if ref in (device.uuid, device.index):
        return 2
    if device.is_mig and ref in (device.physical_key, str(device.gpu_index)):
        return 1
    return 0


def _no_match(ref: str) -> str:
    if is_gpu_uuid(ref) or is_mig_uuid(ref):
        return f"no matching device with UUID: {ref}"
    return f"no matching device at index: {ref}"


def _select(r: ReplicatedResource, devices: list[Device]) -> list[Device]:
    """Upstream's getIDsOfDevicesToReplicate, with the GPU-covers-its-MIG-instances extension;
    `perGpu` alone selects when `replicas` is left out. Raises ValueError (upstream texts)."""
    if r.replicas is None:
        chosen_refs: Iterable[str] = r.per_gpu
    elif r.devices == ALL:
        return list(devices)
    elif isinstance(r.devices, int):
        if r.devices > len(devices):
            raise ValueError(f"requested {r.devices} devices to be replicated, but only "
                             f"{len(devices)} devices available")
        return devices[: r.devices]
    else:
        chosen_refs = r.devices
    chosen: set[str] = set()
    for ref in chosen_refs:
        hits = [d.id for d in devices if _matches(ref, d)]
        if not hits:
            raise ValueError(_no_match(ref))
        chosen.update(hits)
    return [d for d in devices if d.id in chosen]


def _counts(r: ReplicatedResource, selected: list[Device]) -> dict[str, int]:
    """Replica count per selected device: the most specific `perGpu` entry, else `replicas`."""
    for ref in r.per_gpu:
        if not any(_matches(ref, d) for d in selected):
            raise ValueError(f"perGpu: {_no_match(ref)} among the devices selected for sharing")
    counts: dict[str, int] = {}
    for d in selected:
        best = 0
        named_by: list[str] = []
        for ref, count in r.per_gpu.items():
            level = _matches(ref, d)
            if level and level > best:
                best, named_by, counts[d.id] = level, [ref], count
            elif level and level == best:
                named_by.append(ref)
        if len(named_by) > 1:
            raise ValueError(f"perGpu: device {d.index} ({d.uuid}) is named twice: "
                             f"{', '.join(named_by)}")
        if d.id not in counts:
            assert r.replicas is not None  # perGpu-only selection names every selected device
            counts[d.id] = r.replicas
    return counts


def _replicas(device: Device, count: int) -> list[Device]:
    return [Device(id=device_ids.replica_id(device.id, n), physical_key=device.physical_key,
                   uuid=device.uuid, index=device.index, gpu_index=device.gpu_index, replica=n,
                   paths=device.paths, numa_node=device.numa_node, product=device.product)
            for n in range(count)]


def _share(sharing: SharingConfig, base: dict[str, list[Device]]) -> list[Resource]:
    section = "sharing.mps" if sharing.mode is Sharing.MPS else "sharing.timeSlicing"
    problems: list[str] = []
    shared: list[Resource] = []
    for i, r in enumerate(sharing.resources):
        where = f"{section}.resources[{i}] ({r.name})"
        devices = base.get(r.name)
        if not devices:
            continue  # not on this node: skipped, as upstream does
        if sharing.mode is Sharing.MPS and any(d.is_mig for d in devices):
            problems.append(f"{where}: sharing MIG devices with MPS is not supported")
            continue
        try:
            selected = _select(r, devices)
            counts = _counts(r, selected)
        except ValueError as e:
            problems.append(f"{where}: unable to get IDs of devices to replicate for "
                            f"'{r.name}' resource: {e}")
            continue
        name = r.name + SHARED_SUFFIX if sharing.rename_by_default else r.name
        rest = [d for d in devices if d.id not in counts]
        if rest and not sharing.rename_by_default:
            problems.append(f"{where}: sharing only some of its devices needs renameByDefault: "
                            f"the {len(rest)} unshared ones would be served under the same name")
            continue
        replicas = [rep for d in selected for rep in _replicas(d, counts[d.id])]
        shared.append(Resource(
            name=name, sharing=sharing.mode, replicas=max(counts.values()),
            fail_requests_greater_than_one=sharing.fail_requests_greater_than_one,
            devices=tuple(replicas)))
        if rest:
            base[r.name] = rest
        else:
            del base[r.name]
    if problems:
        raise ResourceError("; ".join(problems))
    return shared


def build_resources(inventory: Inventory, config: Config, *,
                    mig_minors: Mapping[str, int] | None = None) -> tuple[Resource, ...]:
    """Every resource this node serves, sorted by name, none of them empty. Raises
    `ResourceError` naming each problem (MIG layout vs strategy, unmatched device references,
    MPS on MIG, ...). `mig_minors`: `parse_mig_minors` of the driver's mig-minors file, or None
    for the driver's fixed numbering."""
    base = _base_resources(inventory, config.mig_strategy, mig_minors)
    shared = _share(config.sharing, base) if config.sharing is not None else []
    plain = [Resource(name=name, sharing=Sharing.NONE, replicas=1,
                      fail_requests_greater_than_one=False, devices=tuple(devices))
             for name, devices in base.items() if devices]
    # Names cannot clash: base names are distinct, and a shared resource either replaces its
    # base entry or (renamed) gets the `.shared` suffix, which no base name carries.
    return tuple(sorted(plain + shared, key=lambda r: r.name))
