"""The PodResources API served from the fake kubelet's allocations, as the kubelet shapes it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from sharepack.proto.podresources.v1 import api_pb2, api_pb2_grpc
from sharepack.sandbox.kubelet.devicemanager import ContainerSpec, FakeKubelet, PodSpec
from sharepack.sandbox.kubelet.stubplugin import RESOURCE, PluginFactory, dev
from sharepack.sandbox.kubelet.podresources import TokenBucket

MAX_MESSAGE = 16 * 1024 * 1024  # what upstream clients allow


@pytest.fixture
async def lister(kubelet: FakeKubelet) -> AsyncIterator[api_pb2_grpc.PodResourcesListerStub]:
    channel = grpc.aio.insecure_channel(
        f"unix://{kubelet.pod_resources_socket}", options=[("grpc.max_receive_message_length", MAX_MESSAGE)]
    )
    try:
        yield api_pb2_grpc.PodResourcesListerStub(channel)
    finally:
        await channel.close()


def entries(devices: list[api_pb2.ContainerDevices]) -> list[tuple[str, tuple[str, ...], tuple[int, ...] | None]]:
    return [
        (
            d.resource_name,
            tuple(d.device_ids),
            tuple(n.ID for n in d.topology.nodes) if d.HasField("topology") else None,
        )
        for d in devices
    ]


@pytest.fixture
async def node(kubelet: FakeKubelet, make_plugin: PluginFactory) -> FakeKubelet:
    """d1 sits on two NUMA nodes, d2 reports no topology; one pod with init, sidecar and app containers."""
    plugin = await make_plugin(devices=[dev("d0", numa=(0,)), dev("d1", numa=(0, 1)), dev("d2", numa=()), dev("d3", numa=(1,))])
    await plugin.register(kubelet.socket_path)
    await kubelet.wait_for_resource(RESOURCE)
    await kubelet.admit_pod(
        PodSpec(
            uid="uid-1",
            name="trainer",
            namespace="ml",
            init_containers=(
                ContainerSpec("setup", {RESOURCE: 1}),  # d0, handed on to the sidecar
                ContainerSpec("sidecar", {RESOURCE: 1}, restartable=True),  # reuses d0 and keeps it
            ),
            containers=(ContainerSpec("main", {RESOURCE: 2}), ContainerSpec("cpu-only")),  # d1 + d2
        )
    )
    return kubelet


async def test_list_names_pods_by_namespace_and_flattens_devices_per_numa_node(
    node: FakeKubelet, lister: api_pb2_grpc.PodResourcesListerStub
) -> None:
    response = await lister.List(api_pb2.ListPodResourcesRequest())

    (pod,) = response.pod_resources
    assert (pod.name, pod.namespace) == ("trainer", "ml")
    # Plain init containers are not listed; sidecars and app containers are, device-less ones too.
    assert [c.name for c in pod.containers] == ["sidecar", "main", "cpu-only"]
    sidecar, main, cpu_only = pod.containers
    assert entries(list(sidecar.devices)) == [(RESOURCE, ("d0",), (0,))]
    assert entries(list(main.devices)) == [
        (RESOURCE, ("d1",), (0,)),
        (RESOURCE, ("d1",), (1,)),
        (RESOURCE, ("d2",), None),
    ]
    assert list(cpu_only.devices) == []


async def test_allocatable_resources_lists_healthy_devices_per_numa_node(
    node: FakeKubelet, lister: api_pb2_grpc.PodResourcesListerStub
) -> None:
    response = await lister.GetAllocatableResources(api_pb2.AllocatableResourcesRequest())

    assert entries(list(response.devices)) == [
        (RESOURCE, ("d0",), (0,)),
        (RESOURCE, ("d1",), (0,)),
        (RESOURCE, ("d1",), (1,)),
        (RESOURCE, ("d2",), None),
        (RESOURCE, ("d3",), (1,)),
    ]
    assert list(response.cpu_ids) == [] and list(response.memory) == []


async def test_get_finds_a_pod_by_namespace_and_name(
    node: FakeKubelet, lister: api_pb2_grpc.PodResourcesListerStub
) -> None:
    response = await lister.Get(api_pb2.GetPodResourcesRequest(pod_name="trainer", pod_namespace="ml"))
    assert [c.name for c in response.pod_resources.containers] == ["sidecar", "main", "cpu-only"]

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await lister.Get(api_pb2.GetPodResourcesRequest(pod_name="trainer", pod_namespace="default"))
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == "pod trainer in namespace default not found"


async def test_removed_pods_leave_the_list(node: FakeKubelet, lister: api_pb2_grpc.PodResourcesListerStub) -> None:
    await node.remove_pod("uid-1")
    response = await lister.List(api_pb2.ListPodResourcesRequest())
    assert list(response.pod_resources) == []


async def test_calls_beyond_the_burst_are_rejected_until_a_restart(root: Path) -> None:
    async with FakeKubelet(root, pod_resources_qps=0.001, pod_resources_burst=3) as kubelet:
        for life in ("first", "after restart"):
            async with grpc.aio.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                for _ in range(3):
                    await stub.List(api_pb2.ListPodResourcesRequest())
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest())
                assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, life
                assert caught.value.details() == "rejected by rate limit"
            if life == "first":
                await kubelet.restart()


def test_token_bucket_starts_full_and_refills_at_qps() -> None:
    now = [0.0]
    bucket = TokenBucket(10, 2, clock=lambda: now[0])

    assert [bucket.allow() for _ in range(3)] == [True, True, False]
    now[0] += 0.1  # one token back
    assert [bucket.allow() for _ in range(2)] == [True, False]
    now[0] += 5.0  # refills only up to the burst
    assert [bucket.allow() for _ in range(3)] == [True, True, False]


@pytest.mark.parametrize(("qps", "burst"), [(0, 1), (-1, 1), (1, 0)])
def test_token_bucket_refuses_nonsense_limits(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="rate limit"):
        TokenBucket(qps, burst)
