"""Registration: validation like the kubelet's, synchronous dial-back, endpoint replacement."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from sharepack.sandbox.kubelet import validation
from sharepack.sandbox.kubelet.devicemanager import FakeKubelet
from sharepack.sandbox.kubelet.stubplugin import RESOURCE, PluginFactory, StubPlugin, dev


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        pytest.param("nvidia.com/gpu", True, id="vendor domain resource is extended"),
        pytest.param("nvidia.com/gpu.shared", True, id="dots in the name are allowed"),
        pytest.param("nvidia.com/mig-1g.5gb", True, id="mig profile name is extended"),
        pytest.param("example.com/A_b", True, id="upper case and underscore in the name part"),
        pytest.param("gpu", False, id="unprefixed name is native"),
        pytest.param("kubernetes.io/gpu", False, id="kubernetes.io namespace is native"),
        pytest.param("foo.kubernetes.io/gpu", False, id="kubernetes.io subdomain is native"),
        pytest.param("requests.example.com/gpu", False, id="quota prefix requests. is refused"),
        pytest.param("example.com/", False, id="empty name part"),
        pytest.param("/gpu", False, id="empty prefix"),
        pytest.param("Example.com/gpu", False, id="upper case domain"),
        pytest.param("example.com/gpu/x", False, id="two slashes"),
        pytest.param("example.com/-gpu", False, id="name starting with a dash"),
        pytest.param("example.com/gpu.", False, id="name ending with a dot"),
        pytest.param("example.com/" + "g" * 63, True, id="63 character name fits"),
        pytest.param("example.com/" + "g" * 64, False, id="64 character name is too long"),
        pytest.param("a" * 235 + ".com/gpu", True, id="prefix fits 253 with requests. prepended"),
        pytest.param("a" * 241 + ".com/gpu", False, id="prefix too long once requests. is prepended"),
    ],
)
def test_extended_resource_names_follow_the_kubelet(name: str, valid: bool) -> None:
    assert validation.is_extended_resource_name(name) is valid


async def test_registration_lists_devices_and_records_the_request(
    kubelet: FakeKubelet, make_plugin: PluginFactory
) -> None:
    plugin: StubPlugin = await make_plugin(devices=[dev("a"), dev("b", healthy=False)])
    await plugin.register(kubelet.socket_path)
    await kubelet.wait_for_resource(RESOURCE)

    assert kubelet.capacity() == {RESOURCE: 2}
    assert kubelet.allocatable() == {RESOURCE: 1}
    (registration,) = kubelet.registrations
    assert (registration.resource, registration.endpoint, registration.version, registration.error) == (
        RESOURCE,
        "stub.sock",
        "v1beta1",
        None,
    )
    assert registration.options.get_preferred_allocation_available
    assert kubelet.plugin_options(RESOURCE) == plugin.options
    assert [name for name, _ in plugin.calls] == ["GetDevicePluginOptions", "ListAndWatch"]


@pytest.mark.parametrize(
    ("version", "resource", "message"),
    [
        pytest.param(
            "v1alpha",
            RESOURCE,
            'requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]',
            id="older version is refused",
        ),
        pytest.param(
            "",
            RESOURCE,
            'requested API version "" is not supported by kubelet. Supported version is ["v1beta1"]',
            id="empty version is refused",
        ),
        pytest.param("v1beta1", "gpu", 'the ResourceName "gpu" is invalid', id="native resource name is refused"),
        pytest.param(
            "v1beta1",
            "requests.example.com/gpu",
            'the ResourceName "requests.example.com/gpu" is invalid',
            id="quota-prefixed name is refused",
        ),
    ],
)
async def test_invalid_registrations_fail_with_unknown_and_the_kubelet_text(
    kubelet: FakeKubelet, make_plugin: PluginFactory, version: str, resource: str, message: str
) -> None:
    plugin: StubPlugin = await make_plugin(devices=[dev("a")])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plugin.register(kubelet.socket_path, version=version, resource=resource)

    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == message
    assert plugin.calls == [], "an invalid registration must not dial the plugin"
    assert kubelet.capacity() == {}
    assert kubelet.registrations[-1].error == message


async def test_register_returns_only_after_the_options_were_served(kubelet: FakeKubelet, make_plugin: PluginFactory) -> None:
    plugin: StubPlugin = await make_plugin(devices=[dev("a")])
    plugin.options_gate = asyncio.Event()
    registering = asyncio.create_task(plugin.register(kubelet.socket_path))

    await asyncio.wait_for(plugin.options_called.wait(), 5)
    # The kubelet is inside Register, waiting on the plugin: no answer yet (give the reply,
    # were there one, time to arrive; this checks an absence, nothing waits on it).
    await asyncio.sleep(0.05)
    assert not registering.done()
    assert not kubelet.connected(RESOURCE)

    plugin.options_gate.set()
    await asyncio.wait_for(registering, 30)
    assert plugin.options_served.is_set()
    assert kubelet.connected(RESOURCE)


async def test_plugin_not_serving_fails_registration_with_dial_error(kubelet: FakeKubelet, root: Path) -> None:
    silent = StubPlugin(kubelet.device_plugin_dir, devices=[dev("a")], socket_name="absent.sock")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await silent.register(kubelet.socket_path)

    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == "failed to dial device plugin: context deadline exceeded"
    assert not kubelet.connected(RESOURCE)


async def test_options_failure_fails_registration(kubelet: FakeKubelet, make_plugin: PluginFactory) -> None:
    plugin: StubPlugin = await make_plugin(devices=[dev("a")])
    plugin.options_error = grpc.StatusCode.INTERNAL

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plugin.register(kubelet.socket_path)

    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    assert caught.value.details() == "failed to get device plugin options: rpc error: code = Internal desc = boom"
    assert kubelet.capacity() == {}


async def test_endpoint_is_a_file_name_joined_to_the_kubelet_directory(
    kubelet: FakeKubelet, make_plugin: PluginFactory
) -> None:
    plugin: StubPlugin = await make_plugin(devices=[dev("a")])
    # Go's filepath.Join keeps even an absolute-looking endpoint inside the directory.
    await plugin.register(kubelet.socket_path, endpoint="/stub.sock")
    await kubelet.wait_for_resource(RESOURCE)
    assert kubelet.capacity() == {RESOURCE: 1}


async def test_re_registration_replaces_the_endpoint(kubelet: FakeKubelet, make_plugin: PluginFactory) -> None:
    first: StubPlugin = await make_plugin(devices=[dev("a"), dev("b")], socket_name="one.sock")
    await first.register(kubelet.socket_path)
    await kubelet.wait_for_resource(RESOURCE)
    second: StubPlugin = await make_plugin(devices=[dev("c")], socket_name="two.sock")

    await second.register(kubelet.socket_path)
    await kubelet.wait_until(lambda: set(kubelet.devices(RESOURCE)) == {"c"}, what="second plugin's list")

    # The kubelet dropped the first plugin's stream; its end does not mark the new devices unhealthy.
    await asyncio.wait_for(first.stream_closed.wait(), 5)
    assert kubelet.allocatable() == {RESOURCE: 1}
    assert kubelet.connected(RESOURCE)
    first.set_devices([dev("a", healthy=False)])
    assert set(kubelet.devices(RESOURCE)) == {"c"}
