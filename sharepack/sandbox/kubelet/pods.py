"""Values the fake kubelet takes and gives: pod specs in, admissions (or an error) out.

A pod names its containers and, per container, how many devices of each extended resource it
requests (requests equal limits for extended resources, so one number suffices). An admission
records, per container and resource, the device IDs the kubelet settled on, what the plugin
preferred, and the plugin's `ContainerAllocateResponse`, so tests can assert on envs, mounts,
device specs, annotations and CDI devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from sharepack.proto.deviceplugin.v1beta1 import api_pb2

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

# The kubelet's reason for a pod its device manager could not admit.
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"


def _frozen_mapping(value: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    requests: Mapping[str, int] = field(default_factory=dict)
    # An init container with restartPolicy: Always (a sidecar) keeps its devices; plain init
    # containers hand theirs on to the containers after them.
    restartable: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", _frozen_mapping(self.requests))
        for resource, count in self.requests.items():
            if count < 0:
                raise ValueError(f"container {self.name}: negative request {count} for {resource}")


@dataclass(frozen=True, slots=True)
class PodSpec:
    uid: str
    name: str
    namespace: str = "default"
    containers: tuple[ContainerSpec, ...] = ()
    init_containers: tuple[ContainerSpec, ...] = ()

    def __post_init__(self) -> None:
        names = [c.name for c in (*self.init_containers, *self.containers)]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pod {self.namespace}/{self.name}: duplicate container names {duplicates}")


@dataclass(frozen=True, slots=True)
class DeviceState:
    """One device as the last ListAndWatch message described it."""

    id: str
    healthy: bool
    numa_nodes: tuple[int, ...]  # () when the plugin reports no topology


@dataclass(frozen=True, slots=True)
class ResourceAllocation:
    resource: str
    device_ids: tuple[str, ...]  # sorted
    # NUMA nodes of each device when it was allocated (what PodResources reports later).
    numa_nodes: Mapping[str, tuple[int, ...]]
    response: api_pb2.ContainerAllocateResponse
    # The plugin's GetPreferredAllocation answer, None when the kubelet did not ask.
    preferred: frozenset[str] | None
    # True when the devices came from init containers of the same pod only.
    reused: bool = False

    @property
    def envs(self) -> dict[str, str]:
        return dict(self.response.envs)

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.response.annotations)

    @property
    def mounts(self) -> tuple[api_pb2.Mount, ...]:
        return tuple(self.response.mounts)

    @property
    def devices(self) -> tuple[api_pb2.DeviceSpec, ...]:
        return tuple(self.response.devices)

    @property
    def cdi_devices(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.response.cdi_devices)


@dataclass(frozen=True, slots=True)
class ContainerAdmission:
    name: str
    init: bool
    restartable: bool
    resources: Mapping[str, ResourceAllocation]

    def devices(self, resource: str) -> tuple[str, ...]:
        allocation = self.resources.get(resource)
        return allocation.device_ids if allocation else ()


@dataclass(frozen=True, slots=True)
class Admission:
    pod: PodSpec
    containers: tuple[ContainerAdmission, ...]  # init containers first, in spec order

    def container(self, name: str) -> ContainerAdmission:
        for container in self.containers:
            if container.name == name:
                return container
        raise KeyError(f"pod {self.pod.namespace}/{self.pod.name}: no container {name!r}")

    def devices(self, container: str, resource: str) -> tuple[str, ...]:
        return self.container(container).devices(resource)

    def allocation(self, container: str, resource: str) -> ResourceAllocation:
        allocation = self.container(container).resources.get(resource)
        if allocation is None:
            raise KeyError(f"pod {self.pod.namespace}/{self.pod.name}: container {container!r} holds no {resource}")
        return allocation

    def response(self, container: str, resource: str) -> api_pb2.ContainerAllocateResponse:
        return self.allocation(container, resource).response

    def held(self, resource: str) -> frozenset[str]:
        """Every device of `resource` the pod holds (init containers' devices included)."""
        return frozenset(d for c in self.containers for d in c.devices(resource))


class AdmissionError(Exception):
    """The kubelet rejected the pod; nothing stays allocated.

    `reason` and `message` are what the kubelet would put in the pod's status: `OutOf<resource>`
    when the node's allocatable cannot fit the pod, `UnexpectedAdmissionError` when the device
    manager failed (then `cause` is the device manager's own error text).
    """

    def __init__(self, pod: PodSpec, cause: str, *, reason: str = UNEXPECTED_ADMISSION_ERROR,
                 message: str | None = None) -> None:
        self.pod = pod
        self.reason = reason
        self.cause = cause
        self.message = message if message is not None else f"Allocate failed due to {cause}, which is unexpected"
        super().__init__(f"pod {pod.namespace}/{pod.name} rejected: {reason}: {self.message}")
