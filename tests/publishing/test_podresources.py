"""agent.podresources against a canned PodResources server on a real unix socket."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from sharepack.agent.podresources import PodResourcesClient, PodResourcesError
from sharepack.proto.podresources.v1 import api_pb2, api_pb2_grpc


def _dev(resource: str, device_id: str, numa: int | None = None) -> api_pb2.ContainerDevices:
    topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)]) if numa is not None else None
    return api_pb2.ContainerDevices(resource_name=resource, device_ids=[device_id], topology=topology)


class Canned(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.listing = api_pb2.ListPodResourcesResponse()
        self.allocatable = api_pb2.AllocatableResourcesResponse()
        self.reject_next = 0
        self.calls = 0

    async def _limit(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.calls += 1
        if self.reject_next > 0:
            self.reject_next -= 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")

    async def List(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:  # noqa: N802
        await self._limit(context)
        return self.listing

    async def GetAllocatableResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:  # noqa: N802
        await self._limit(context)
        return self.allocatable


@pytest.fixture
async def kubelet() -> AsyncIterator[tuple[Canned, Path]]:
    root = Path(tempfile.mkdtemp(prefix="spr-", dir="/tmp"))
    socket = root / "kubelet.sock"
    canned = Canned()
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(canned, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield canned, socket
    finally:
        await server.stop(None)
        shutil.rmtree(root, ignore_errors=True)


async def test_list_groups_each_pods_devices_and_drops_numa_duplicates(kubelet: tuple[Canned, Path]) -> None:
    canned, socket = kubelet
    canned.listing = api_pb2.ListPodResourcesResponse(pod_resources=[
        api_pb2.PodResources(name="a", namespace="ns", containers=[
            api_pb2.ContainerResources(name="c1", devices=[
                _dev("nvidia.com/gpu", "GPU-1::0", 0), _dev("nvidia.com/gpu", "GPU-1::0", 1),
            ]),
            api_pb2.ContainerResources(name="c2", devices=[_dev("nvidia.com/gpu", "GPU-2::1")]),
        ]),
        api_pb2.PodResources(name="no-devices", namespace="ns", containers=[api_pb2.ContainerResources(name="c")]),
    ])
    async with PodResourcesClient(socket) as client:
        pods = await client.list()
    assert [(p.namespace, p.name, dict(p.devices)) for p in pods] == [
        ("ns", "a", {"nvidia.com/gpu": frozenset({"GPU-1::0", "GPU-2::1"})}),
    ]


async def test_allocatable_is_grouped_by_resource(kubelet: tuple[Canned, Path]) -> None:
    canned, socket = kubelet
    canned.allocatable = api_pb2.AllocatableResourcesResponse(devices=[
        _dev("nvidia.com/gpu", "GPU-1::0", 0), _dev("nvidia.com/gpu", "GPU-1::0", 1), _dev("nvidia.com/gpu", "GPU-1::1"),
    ])
    async with PodResourcesClient(socket) as client:
        assert await client.allocatable() == {"nvidia.com/gpu": frozenset({"GPU-1::0", "GPU-1::1"})}


async def test_rate_limited_calls_back_off_and_succeed(kubelet: tuple[Canned, Path]) -> None:
    canned, socket = kubelet
    canned.reject_next = 3
    async with PodResourcesClient(socket, backoff_initial=0.01, backoff_max=0.05) as client:
        assert await client.list() == ()
        assert client.rate_limited == 3
    assert canned.calls == 4


async def test_a_rate_limit_that_does_not_clear_is_an_error(kubelet: tuple[Canned, Path]) -> None:
    canned, socket = kubelet
    canned.reject_next = 100
    async with PodResourcesClient(socket, backoff_initial=0.01, backoff_max=0.02, attempts=3) as client:
        with pytest.raises(PodResourcesError, match="still rate limited after 3 attempts"):
            await client.list()
    assert canned.calls == 3


async def test_a_missing_kubelet_is_an_error_naming_the_socket() -> None:
    root = Path(tempfile.mkdtemp(prefix="spr-", dir="/tmp"))
    try:
        async with PodResourcesClient(root / "kubelet.sock", timeout=0.5) as client:
            with pytest.raises(PodResourcesError, match=r"podresources List at .*kubelet.sock: UNAVAILABLE"):
                await client.list()
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_responses_beyond_grpcs_default_4_mib_are_received(kubelet: tuple[Canned, Path]) -> None:
    canned, socket = kubelet
    long_id = "GPU-" + "f" * 90
    devices = [_dev("nvidia.com/gpu", f"{long_id}::{i}", i % 2) for i in range(50_000)]
    canned.listing = api_pb2.ListPodResourcesResponse(pod_resources=[
        api_pb2.PodResources(name="big", namespace="ns", containers=[api_pb2.ContainerResources(name="c", devices=devices)])
    ])
    assert canned.listing.ByteSize() > 4 * 1024 * 1024
    async with PodResourcesClient(socket, timeout=30) as client:  # a loaded CI box is slow at 6 MB
        (pod,) = await client.list()
    assert len(pod.devices["nvidia.com/gpu"]) == 50_000


async def test_a_response_over_the_limit_is_an_error_not_a_rate_limit(
    kubelet: tuple[Canned, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    canned, socket = kubelet
    devices = [_dev("nvidia.com/gpu", f"GPU-{i:090d}") for i in range(2_000)]
    canned.listing = api_pb2.ListPodResourcesResponse(pod_resources=[
        api_pb2.PodResources(name="big", namespace="ns", containers=[api_pb2.ContainerResources(name="c", devices=devices)])
    ])
    monkeypatch.setattr("sharepack.agent.podresources.MAX_RECEIVE_BYTES", 64 * 1024)
    async with PodResourcesClient(socket) as client:
        with pytest.raises(PodResourcesError, match="RESOURCE_EXHAUSTED"):
            await client.list()
    assert canned.calls == 1 and client.rate_limited == 0
