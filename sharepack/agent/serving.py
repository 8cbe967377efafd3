"""One grpc.aio DevicePlugin server per resource, on its own unix socket.

The servicer only translates protobuf to plain values and back; the decisions live behind
`PluginLogic` (implemented by the agent per resource, see running.py) and in responses.py.
Failures become gRPC status codes in one place: `agent.errors.grpc_status`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import NoReturn, Protocol

import grpc

from sharepack.agent import registering
from sharepack.agent.errors import ServingError, grpc_status
from sharepack.agent.metrics import AgentMetrics
from sharepack.agent.responses import ContainerResponse
from sharepack.common.errors import SharepackError
from sharepack.common.resources import Device, Resource
from sharepack.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# Upstream's prefix for a refused GetPreferredAllocation (the status code stays ours).
PREFERRED_PREFIX = "error getting list of preferred allocation devices: "


class PluginLogic(Protocol):
    """What a resource's server asks the agent."""

    @property
    def resource(self) -> Resource: ...
    def device_health(self) -> Sequence[tuple[Device, bool]]: ...
    async def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]: ...
    def allocate(self, requested: Sequence[str]) -> ContainerResponse: ...


def api_device(device: Device, healthy: bool) -> api_pb2.Device:
    topology = None
    if device.numa_node is not None:
        topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=device.numa_node)])
    return api_pb2.Device(ID=device.id, health=HEALTHY if healthy else UNHEALTHY, topology=topology)


def api_container_response(response: ContainerResponse) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=dict(response.envs),
        mounts=[
            api_pb2.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in response.mounts
        ],
        devices=[
            api_pb2.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in response.devices
        ],
        annotations=dict(response.annotations),
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in response.cdi_devices],
    )


class _Servicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, server: PluginServer) -> None:
        self._server = server

    @property
    def _logic(self) -> PluginLogic:
        return self._server.logic

    async def _fail(
        self, context: grpc.aio.ServicerContext[object, object], what: str, exc: Exception, *, prefix: str = ""
    ) -> NoReturn:
        if isinstance(exc, SharepackError):
            log.warning("%s for %s refused: %s", what, self._logic.resource.name, exc)
            message = prefix + str(exc)
        else:
            log.error("%s for %s failed", what, self._logic.resource.name, exc_info=exc)
            message = f"{what} for {self._logic.resource.name}: internal error: {exc!r}"
        await context.abort(grpc_status(exc), message)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    async def GetDevicePluginOptions(  # noqa: N802 - gRPC method name
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(  # noqa: N802
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        # Every message replaces the kubelet's whole list; resend only when it changed.
        last: list[tuple[str, bool]] | None = None
        server = self._server
        server.streams += 1
        try:
            while not server.stopping:
                wake = server.wake
                pairs = list(self._logic.device_health())
                current = [(d.id, ok) for d, ok in pairs]
                if current != last:
                    last = current
                    yield api_pb2.ListAndWatchResponse(devices=[api_device(d, ok) for d, ok in pairs])
                await wake.wait()
        finally:
            server.streams -= 1
            if not server.stopping and server.streams == 0 and server.on_stream_lost is not None:
                # The kubelet hung up on us without restarting (its sockets are all there): it
                # now counts our devices unhealthy and never redials. The agent registers again.
                server.on_stream_lost(server)

    async def GetPreferredAllocation(  # noqa: N802
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.PreferredAllocationResponse:
        started = time.perf_counter()
        answers = []
        try:
            for req in request.container_requests:
                try:
                    chosen = await self._logic.preferred(
                        list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size
                    )
                except Exception as exc:  # noqa: BLE001 - mapped to a status code
                    # Upstream's wrapping: the kubelet shows it in the pod's admission error.
                    await self._fail(context, "preferred allocation", exc, prefix=PREFERRED_PREFIX)
                answers.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
            return api_pb2.PreferredAllocationResponse(container_responses=answers)
        finally:
            self._server.observe_preferred(time.perf_counter() - started)

    async def Allocate(  # noqa: N802
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.AllocateResponse:
        started = time.perf_counter()
        answers = []
        try:
            for req in request.container_requests:
                try:
                    response = self._logic.allocate(list(req.devices_ids))
                except Exception as exc:  # noqa: BLE001 - mapped to a status code
                    await self._fail(context, "allocate", exc)
                answers.append(api_container_response(response))
            return api_pb2.AllocateResponse(container_responses=answers)
        finally:
            self._server.observe_allocate(time.perf_counter() - started)

    async def PreStartContainer(  # noqa: N802
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


class PluginServer:
    """A resource's DevicePlugin server: remove a stale socket, serve, dial ourselves."""

    def __init__(self, logic: PluginLogic, socket_path: Path, *, metrics: AgentMetrics | None = None) -> None:
        self.logic = logic
        self.socket_path = socket_path
        metrics = metrics or AgentMetrics()
        name = logic.resource.name
        self.observe_preferred = metrics.preferred_seconds.labels(name).observe
        self.observe_allocate = metrics.allocate_seconds.labels(name).observe
        self.stopping = False
        self.wake = asyncio.Event()
        self.streams = 0  # ListAndWatch streams open now
        # Called when the last ListAndWatch stream ends while we still serve.
        self.on_stream_lost: Callable[[PluginServer], None] | None = None
        self._server: grpc.aio.Server | None = None

    @property
    def resource_name(self) -> str:
        return self.logic.resource.name

    @property
    def endpoint(self) -> str:
        return self.socket_path.name

    def notify(self) -> None:
        """Devices or their health changed: let every ListAndWatch stream resend."""
        wake, self.wake = self.wake, asyncio.Event()
        wake.set()

    async def start(self, *, dial_timeout: float = 5.0) -> None:
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise ServingError(f"remove stale socket {self.socket_path}: {e.strerror}") from e
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        target = f"unix:{os.path.abspath(self.socket_path)}"
        try:
            server.add_insecure_port(target)
        except RuntimeError as e:
            raise ServingError(f"serve {self.resource_name} on {self.socket_path}: {e}") from e
        await server.start()
        self._server = server
        self.stopping = False
        try:
            await registering.dial(self.socket_path, timeout=dial_timeout)
        except BaseException:
            await self.stop(grace=0)
            raise
        log.info(
            "serving %s on %s", self.resource_name, self.socket_path,
            extra={"resource": self.resource_name, "devices": len(self.logic.resource.devices)},
        )

    async def stop(self, *, grace: float = 1.0) -> None:
        """End ListAndWatch streams (the kubelet then marks our devices unhealthy), stop serving."""
        self.stopping = True
        self.notify()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        try:
            # Only our own socket: after a kubelet restart the path may already be gone.
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
