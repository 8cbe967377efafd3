"""What the agent answers the kubelet, as plain values (no gRPC here; serving.py translates).

* `preferred_allocation`: topology-aware for full GPUs, the node's shared policy otherwise.
* `container_response`: the Allocate answer for one container, following the upstream NVIDIA
  device plugin's conventions so that the NVIDIA container runtime / CDI understand it:
  - `envvar`: `NVIDIA_VISIBLE_DEVICES=<id>,<id>` (UUIDs, or indices with `device-id-strategy=index`);
  - `volume-mounts`: `NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices` plus one mount per
    device of `/dev/null` at `/var/run/nvidia-container-devices/<id>`;
  - `cdi-annotations`: annotation `cdi.k8s.io/nvidia-device-plugin_<response id>` whose value lists
    the qualified CDI names `nvidia.com/gpu=<id>`;
  - `cdi-cri`: the same names in the response's `cdi_devices` field;
  - `passDeviceSpecs`: device nodes (the control nodes that exist, then each device's own nodes);
  - MPS: `CUDA_MPS_PIPE_DIRECTORY=/mps/<resource>/pipe`, the per-resource pipe directory and the
    daemon's shm mounted from the MPS root on the host.
  When only CDI strategies are selected, nothing else is added (the runtime injects devices).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sharepack.common import allocation
from sharepack.common.config import Config
from sharepack.common.errors import AllocationError
from sharepack.common.policies import Policy, Sharing
from sharepack.common.resources import Device, Resource

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
CDI_KIND = "nvidia.com/gpu"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
CDI_PLUGIN_NAME = "nvidia-device-plugin"
MPS_CONTAINER_ROOT = "/mps"
MPS_HOST_ROOT = "/run/nvidia/mps"
MPS_SHM_CONTAINER_PATH = "/dev/shm"
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")

ENVVAR = "envvar"
VOLUME_MOUNTS = "volume-mounts"
CDI_ANNOTATIONS = "cdi-annotations"
CDI_CRI = "cdi-cri"
CDI_STRATEGIES = frozenset({CDI_ANNOTATIONS, CDI_CRI})


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class ContainerResponse:
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ResponseOptions:
    device_list_strategy: tuple[str, ...] = (ENVVAR,)
    device_id_strategy: str = "uuid"
    pass_device_specs: bool = False
    dev_root: str = "/"  # where device nodes live on the host (driver container: /run/nvidia/driver)
    mps_root: str = MPS_HOST_ROOT
    cdi_annotation_prefix: str = CDI_ANNOTATION_PREFIX
    # Upstream passes the optional control nodes only when they exist on the host.
    node_exists: Callable[[str], bool] = os.path.exists


def options_from(config: Config) -> ResponseOptions:
    """The answer's options as the config sets them (both modes answer alike)."""
    return ResponseOptions(
        device_list_strategy=tuple(config.device_list_strategy),
        device_id_strategy=str(config.device_id_strategy),
        pass_device_specs=config.pass_device_specs,
        dev_root=config.nvidia_driver_root,
        mps_root=config.mps_root,
        cdi_annotation_prefix=config.cdi_annotation_prefix,
    )


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


def container_ids(devices: Sequence[Device], strategy: str) -> list[str]:
    """The IDs the container runtime gets: replicas of one GPU name that GPU once."""
    if strategy == "index":
        return _unique([d.index for d in devices])
    return _unique([d.uuid for d in devices])


def container_response(
    resource: Resource, requested: Sequence[str], options: ResponseOptions, *, response_id: str
) -> ContainerResponse:
    """The Allocate answer for one container; `requested` must already be validated."""
    by_id = {d.id: d for d in resource.devices}
    devices = [by_id[i] for i in requested]
    ids = container_ids(devices, options.device_id_strategy)
    strategies = set(options.device_list_strategy)
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    annotations: dict[str, str] = {}
    cdi_devices: tuple[str, ...] = ()
    specs: list[DeviceSpec] = []

    if strategies & CDI_STRATEGIES:
        names = tuple(f"{CDI_KIND}={i}" for i in ids)
        if CDI_ANNOTATIONS in strategies and names:
            key = f"{options.cdi_annotation_prefix}{CDI_PLUGIN_NAME}_{response_id}"
            annotations[key] = ",".join(names)
        if CDI_CRI in strategies:
            cdi_devices = names
    if resource.sharing is Sharing.MPS:
        pipe = os.path.join(MPS_CONTAINER_ROOT, resource.name, "pipe")
        envs[MPS_PIPE_ENV] = pipe
        mounts.append(Mount(pipe, os.path.join(options.mps_root, resource.name, "pipe")))
        mounts.append(Mount(MPS_SHM_CONTAINER_PATH, os.path.join(options.mps_root, "shm")))

    if strategies - CDI_STRATEGIES:
        if ENVVAR in strategies:
            envs[VISIBLE_DEVICES] = ",".join(ids)
        if VOLUME_MOUNTS in strategies:
            envs[VISIBLE_DEVICES] = VOLUME_MOUNTS_ROOT
            mounts.extend(
                Mount(os.path.join(VOLUME_MOUNTS_ROOT, i), VOLUME_MOUNTS_HOST_PATH) for i in ids
            )
        if options.pass_device_specs:
            specs = device_specs(devices, options)

    return ContainerResponse(
        envs=envs,
        mounts=tuple(mounts),
        devices=tuple(specs),
        annotations=annotations,
        cdi_devices=cdi_devices,
    )


def device_specs(devices: Sequence[Device], options: ResponseOptions) -> list[DeviceSpec]:
    paths = [p for p in CONTROL_DEVICE_NODES if options.node_exists(p)]
    paths += [p for d in devices for p in d.paths]
    return [
        DeviceSpec(container_path=p, host_path=os.path.join(options.dev_root, p.lstrip("/")))
        for p in _unique(paths)
    ]


def preferred_allocation(
    resource: Resource,
    policy: Policy,
    pair_scores: Mapping[tuple[str, str], int],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """Which devices the kubelet should give a container.

    Full, unreplicated GPUs take the topology-aware path (best NVLink/PCIe score) and ignore the
    shared policy; every other resource (replicas, MIG instances grouped by parent GPU) uses the
    node's shared allocation policy.

    Differs from upstream: when the topology-aware path finds no set (fewer available GPUs than
    `size`, or a must-include GPU that is not available), upstream answers an empty list and the
    kubelet picks devices itself; we raise `AllocationError` (RESOURCE_EXHAUSTED), as the shared
    path does. The kubelet never sends such a request, so only broken callers see the difference.

    As upstream, the topology-aware path refuses an available or must-include ID that is not a
    GPU of the resource (upstream's NVML lookup fails on it) rather than handing it back; the
    shared path ignores unknown available IDs, as upstream's does.
    """
    if resource.full_gpu:
        # Ties go to the lowest GPU index, whatever order the kubelet's set listed the IDs in.
        index_of = {d.id: d.gpu_index for d in resource.devices}
        for what, ids in (("available", available), ("required", must_include)):
            for device_id in ids:
                if device_id not in index_of:
                    raise AllocationError(
                        f"unable to retrieve list of {what} devices: "
                        f"no device with uuid: {device_id}"
                    )
        chosen = allocation.aligned_allocation(
            pair_scores, available, must_include, size, index_of=index_of
        )
        if size > 0 and not chosen:
            raise AllocationError(
                f"{allocation.NOT_ENOUGH_DEVICES}: {resource.name} wants {size} of "
                f"{len(available)} available"
            )
        return list(chosen)
    return list(
        allocation.shared_allocation(
            policy,
            [d.id for d in resource.devices],
            available,
            must_include,
            size,
            group_of=resource.group_of(),
        )
    )
