"""ListAndWatch: each message replaces the list; the end of the stream makes everything unhealthy."""

from __future__ import annotations

import asyncio

import pytest

from sharepack.sandbox.kubelet.devicemanager import FakeKubelet
from sharepack.sandbox.kubelet.pods import DeviceState
from sharepack.sandbox.kubelet.stubplugin import RESOURCE, PluginFactory, StubPlugin, dev


async def test_each_message_replaces_the_whole_list(kubelet: FakeKubelet, registered: StubPlugin) -> None:
    assert kubelet.capacity() == {RESOURCE: 4}
    before = kubelet.updates(RESOURCE)

    registered.set_devices([dev("d0"), dev("d9", healthy=False, numa=())])
    await kubelet.wait_until(lambda: kubelet.updates(RESOURCE) == before + 1, what="next list")

    assert dict(kubelet.devices(RESOURCE)) == {
        "d0": DeviceState("d0", True, (0,)),
        "d9": DeviceState("d9", False, ()),
    }
    assert kubelet.capacity() == {RESOURCE: 2}
    assert kubelet.allocatable() == {RESOURCE: 1}


async def test_health_flips_both_ways(kubelet: FakeKubelet, registered: StubPlugin) -> None:
    registered.set_devices([dev("d0", healthy=False), dev("d1"), dev("d2"), dev("d3")])
    await kubelet.wait_until(lambda: kubelet.allocatable() == {RESOURCE: 3}, what="d0 unhealthy")
    registered.set_devices([dev("d0"), dev("d1"), dev("d2"), dev("d3")])
    await kubelet.wait_until(lambda: kubelet.allocatable() == {RESOURCE: 4}, what="d0 healthy again")
    assert kubelet.capacity() == {RESOURCE: 4}


@pytest.mark.parametrize("how", ["plugin ends the stream", "plugin server stops"])
async def test_stream_end_marks_every_device_unhealthy_and_never_redials(
    kubelet: FakeKubelet, registered: StubPlugin, how: str
) -> None:
    if how == "plugin ends the stream":
        registered.end_streams()
    else:
        await registered.stop()

    await kubelet.wait_until(lambda: not kubelet.connected(RESOURCE), what="endpoint stopped")
    assert kubelet.capacity() == {RESOURCE: 4}
    assert kubelet.allocatable() == {RESOURCE: 0}
    assert all(not d.healthy for d in kubelet.devices(RESOURCE).values())
    assert len(registered.served("ListAndWatch")) == 1


async def test_registering_again_after_the_stream_ended_restores_health(
    kubelet: FakeKubelet, registered: StubPlugin
) -> None:
    registered.end_streams()
    await kubelet.wait_until(lambda: kubelet.allocatable() == {RESOURCE: 0}, what="all unhealthy")

    await registered.register(kubelet.socket_path)
    await kubelet.wait_for_resource(RESOURCE)

    assert kubelet.allocatable() == {RESOURCE: 4}
    assert len(registered.served("ListAndWatch")) == 2


async def test_two_resources_are_tracked_apart(
    kubelet: FakeKubelet, registered: StubPlugin, make_plugin: PluginFactory
) -> None:
    other = await make_plugin("example.com/nic", [dev("n0"), dev("n1", healthy=False)], socket_name="nic.sock")
    await other.register(kubelet.socket_path)
    await kubelet.wait_for_resource("example.com/nic")

    other.end_streams()
    await kubelet.wait_until(lambda: not kubelet.connected("example.com/nic"), what="nic endpoint stopped")

    assert kubelet.capacity() == {RESOURCE: 4, "example.com/nic": 2}
    assert kubelet.allocatable() == {RESOURCE: 4, "example.com/nic": 0}


async def test_wait_for_resource_names_what_it_waited_for(kubelet: FakeKubelet) -> None:
    with pytest.raises(TimeoutError, match="resource example.com/none registered with devices: not reached within 0.05 s"):
        await kubelet.wait_for_resource("example.com/none", timeout=0.05)


async def test_listing_an_empty_device_list_registers_zero_capacity(
    kubelet: FakeKubelet, make_plugin: PluginFactory
) -> None:
    plugin = await make_plugin(devices=[])
    await plugin.register(kubelet.socket_path)
    await kubelet.wait_for_resource(RESOURCE)
    assert kubelet.capacity() == {RESOURCE: 0}
    await asyncio.wait_for(plugin.stream_started.wait(), 5)
