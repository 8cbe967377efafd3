"""The kubelet's PodResources API (`v1.PodResourcesLister`) served from the fake kubelet's state.

Faithful to the kubelet where clients can tell:
* one `ContainerDevices` entry per (device, NUMA node), each holding a single device ID (a device
  without topology gets one entry without topology); clients must group and de-duplicate;
* pods are named by namespace and name; `List` shows app containers and restartable init
  containers (sidecars), not plain init containers;
* `GetAllocatableResources` lists the healthy devices, no CPUs or memory;
* `Get` of an unknown pod fails with the kubelet's text (status UNKNOWN);
* every call passes a token bucket (kubelet defaults: 100 qps, burst 10) and is answered
  `RESOURCE_EXHAUSTED` "rejected by rate limit" beyond it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import grpc.aio

from sharepack.proto.podresources.v1 import api_pb2, api_pb2_grpc
from sharepack.sandbox.kubelet.pods import Admission, DeviceState

log = logging.getLogger(__name__)

DEFAULT_QPS = 100.0
DEFAULT_BURST = 10
RATE_LIMIT_MESSAGE = "rejected by rate limit"


class PodResourcesSource(Protocol):
    def admissions(self) -> Sequence[Admission]: ...

    def allocatable_devices(self) -> Mapping[str, Sequence[DeviceState]]: ...


class TokenBucket:
    """golang.org/x/time/rate semantics for `Allow`: starts full, refills at `qps` per second."""

    def __init__(self, qps: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"rate limit: qps must be > 0 and burst >= 1, got qps={qps} burst={burst}")
        self._qps = qps
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._qps)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


async def _reject(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMIT_MESSAGE)


_REJECT = grpc.unary_unary_rpc_method_handler(_reject)


if TYPE_CHECKING:
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # generic only in the stubs
    _Interceptor = grpc.aio.ServerInterceptor


class _RateLimit(_Interceptor):
    def __init__(self, bucket: TokenBucket) -> None:
        self._bucket = bucket

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        if not self._bucket.allow():
            return _REJECT
        return await continuation(handler_call_details)


def container_devices(resource: str, device_id: str, numa_nodes: Sequence[int]) -> list[api_pb2.ContainerDevices]:
    """The kubelet's flattening: one entry per (device, NUMA node)."""
    if not numa_nodes:
        return [api_pb2.ContainerDevices(resource_name=resource, device_ids=[device_id])]
    return [
        api_pb2.ContainerDevices(
            resource_name=resource,
            device_ids=[device_id],
            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=node)]),
        )
        for node in numa_nodes
    ]


def pod_resources(admission: Admission) -> api_pb2.PodResources:
    containers = []
    for container in admission.containers:
        if container.init and not container.restartable:
            continue
        devices: list[api_pb2.ContainerDevices] = []
        for resource in sorted(container.resources):
            allocation = container.resources[resource]
            for device_id in allocation.device_ids:
                devices.extend(container_devices(resource, device_id, allocation.numa_nodes.get(device_id, ())))
        containers.append(api_pb2.ContainerResources(name=container.name, devices=devices))
    return api_pb2.PodResources(name=admission.pod.name, namespace=admission.pod.namespace, containers=containers)


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, source: PodResourcesSource) -> None:
        self._source = source

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.ListPodResourcesResponse:
        return api_pb2.ListPodResourcesResponse(pod_resources=[pod_resources(a) for a in self._source.admissions()])

    async def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.AllocatableResourcesResponse:
        devices: list[api_pb2.ContainerDevices] = []
        for resource, states in sorted(self._source.allocatable_devices().items()):
            for state in states:
                devices.extend(container_devices(resource, state.id, state.numa_nodes))
        return api_pb2.AllocatableResourcesResponse(devices=devices)

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.GetPodResourcesResponse:
        for admission in self._source.admissions():
            if admission.pod.name == request.pod_name and admission.pod.namespace == request.pod_namespace:
                return api_pb2.GetPodResourcesResponse(pod_resources=pod_resources(admission))
        await context.abort(
            grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
        )
        raise AssertionError("unreachable: abort raises")


class PodResourcesServer:
    """One serving lifetime of `<root>/pod-resources/kubelet.sock` (a kubelet restart makes a new one)."""

    def __init__(
        self,
        source: PodResourcesSource,
        socket_path: Path,
        *,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = socket_path
        self._bucket = TokenBucket(qps, burst, clock=clock)
        self._source = source
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)  # a stale socket from an earlier life
        server = grpc.aio.server(interceptors=[_RateLimit(self._bucket)])
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self._source), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        log.debug("pod-resources server listening on %s", self.socket_path)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)
            self.socket_path.unlink(missing_ok=True)
