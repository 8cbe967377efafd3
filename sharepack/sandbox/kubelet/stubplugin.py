"""A tiny device plugin for exercising the fake kubelet: a real grpc.aio server on a unix socket.

It records every call it serves, can hold GetDevicePluginOptions until released, pushes new device
lists to its ListAndWatch streams, can end them, and answers GetPreferredAllocation with whatever
the test asks for. Not a GPU plugin: the agent is that.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from sharepack.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

RESOURCE = "example.com/gpu"


def dev(device_id: str, healthy: bool = True, numa: Sequence[int] = (0,)) -> api_pb2.Device:
    device = api_pb2.Device(ID=device_id, health="Healthy" if healthy else "Unhealthy")
    if numa:
        device.topology.nodes.extend(api_pb2.NUMANode(ID=n) for n in numa)
    return device


Preferrer = Callable[[api_pb2.ContainerPreferredAllocationRequest], Sequence[str]]


def prefer_first(request: api_pb2.ContainerPreferredAllocationRequest) -> list[str]:
    chosen = list(request.must_include_deviceIDs)
    for device in sorted(request.available_deviceIDs):
        if len(chosen) >= request.allocation_size:
            break
        if device not in chosen:
            chosen.append(device)
    return chosen


class StubPlugin(api_pb2_grpc.DevicePluginServicer):
    def __init__(
        self,
        directory: Path,
        resource: str = RESOURCE,
        devices: Sequence[api_pb2.Device] = (),
        *,
        socket_name: str = "stub.sock",
        preferred: Preferrer | None = prefer_first,
        pre_start_required: bool = False,
    ) -> None:
        self.directory = directory
        self.resource = resource
        self.socket = directory / socket_name
        self.devices = list(devices)
        self.preferred = preferred
        self.options = api_pb2.DevicePluginOptions(
            get_preferred_allocation_available=preferred is not None, pre_start_required=pre_start_required
        )
        self.calls: list[tuple[str, Any]] = []
        self.options_called = asyncio.Event()
        self.options_served = asyncio.Event()
        self.options_gate: asyncio.Event | None = None  # set by a test to hold GetDevicePluginOptions
        self.options_error: grpc.StatusCode | None = None
        self.allocate_error: tuple[grpc.StatusCode, str] | None = None
        self.allocate_envs: dict[str, str] = {}
        self.stream_started = asyncio.Event()
        self.stream_closed = asyncio.Event()
        self._streams: list[asyncio.Queue[list[api_pb2.Device] | None]] = []
        self._server: grpc.aio.Server | None = None

    def served(self, method: str) -> list[Any]:
        return [request for name, request in self.calls if name == method]

    async def start(self) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            self.end_streams()
            await server.stop(None)
        self.socket.unlink(missing_ok=True)

    async def register(
        self, kubelet_socket: Path, *, version: str = "v1beta1", resource: str | None = None, endpoint: str | None = None
    ) -> None:
        async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=version,
                    endpoint=self.socket.name if endpoint is None else endpoint,
                    resource_name=self.resource if resource is None else resource,
                    options=self.options,
                ),
                timeout=10,
            )

    def set_devices(self, devices: Sequence[api_pb2.Device]) -> None:
        self.devices = list(devices)
        for stream in self._streams:
            stream.put_nowait(list(devices))

    def end_streams(self) -> None:
        for stream in self._streams:
            stream.put_nowait(None)

    # --- the DevicePlugin service

    async def GetDevicePluginOptions(self, request: api_pb2.Empty, context: Any) -> api_pb2.DevicePluginOptions:
        self.calls.append(("GetDevicePluginOptions", request))
        self.options_called.set()
        if self.options_gate is not None:
            await self.options_gate.wait()
        if self.options_error is not None:
            await context.abort(self.options_error, "boom")
        self.options_served.set()
        return self.options

    async def ListAndWatch(self, request: api_pb2.Empty, context: Any) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        self.calls.append(("ListAndWatch", request))
        queue: asyncio.Queue[list[api_pb2.Device] | None] = asyncio.Queue()
        self._streams.append(queue)
        try:
            yield api_pb2.ListAndWatchResponse(devices=self.devices)
            self.stream_started.set()
            while (devices := await queue.get()) is not None:
                yield api_pb2.ListAndWatchResponse(devices=devices)
        finally:
            self._streams.remove(queue)
            self.stream_closed.set()

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        self.calls.append(("GetPreferredAllocation", request))
        assert self.preferred is not None
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=list(self.preferred(r)))
                for r in request.container_requests
            ]
        )

    async def Allocate(self, request: api_pb2.AllocateRequest, context: Any) -> api_pb2.AllocateResponse:
        self.calls.append(("Allocate", request))
        if self.allocate_error is not None:
            await context.abort(*self.allocate_error)
        responses = []
        for container in request.container_requests:
            ids = ",".join(container.devices_ids)
            responses.append(
                api_pb2.ContainerAllocateResponse(
                    envs={"STUB_DEVICES": ids, **self.allocate_envs},
                    mounts=[api_pb2.Mount(container_path="/stub", host_path="/var/stub", read_only=True)],
                    devices=[
                        api_pb2.DeviceSpec(container_path=f"/dev/{d}", host_path=f"/dev/{d}", permissions="rw")
                        for d in container.devices_ids
                    ],
                    annotations={"stub/devices": ids},
                    cdi_devices=[api_pb2.CDIDevice(name=f"example.com/gpu={d}") for d in container.devices_ids],
                )
            )
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Any
    ) -> api_pb2.PreStartContainerResponse:
        self.calls.append(("PreStartContainer", request))
        return api_pb2.PreStartContainerResponse()


# What the tests' `make_plugin` fixture is: StubPlugin's arguments, minus the directory.
PluginFactory = Callable[..., Awaitable[StubPlugin]]
