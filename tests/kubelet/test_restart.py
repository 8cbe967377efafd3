"""Kubelet restart (sockets deleted and re-created, allocations kept) and clean shutdown."""

from __future__ import annotations

import asyncio
import socket
import stat
from pathlib import Path

import grpc.aio
import pytest

from sharepack.sandbox.kubelet.devicemanager import ContainerSpec, FakeKubelet, PodSpec
from sharepack.sandbox.kubelet.stubplugin import RESOURCE, PluginFactory, StubPlugin, dev


def is_socket(path: Path) -> bool:
    return path.exists() and stat.S_ISSOCK(path.stat().st_mode)


def bind_stray_socket(path: Path) -> socket.socket:
    stray = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stray.bind(str(path))
    return stray


async def test_restart_deletes_every_socket_and_recreates_the_kubelets(
    kubelet: FakeKubelet, registered: StubPlugin
) -> None:
    directory = kubelet.device_plugin_dir
    stray = bind_stray_socket(directory / "other-vendor.sock")
    (directory / "notes.txt").write_text("not a socket")
    (directory / "subdir").mkdir()
    try:
        await kubelet.restart()
    finally:
        stray.close()

    assert not registered.socket.exists(), "the plugin's socket must be deleted"
    assert not (directory / "other-vendor.sock").exists()
    assert (directory / "notes.txt").exists() and (directory / "subdir").is_dir()
    assert is_socket(kubelet.socket_path)
    assert is_socket(kubelet.pod_resources_socket)
    assert kubelet.restarts == 1


async def test_restart_cuts_streams_keeps_allocations_and_waits_for_re_registration(
    kubelet: FakeKubelet, registered: StubPlugin
) -> None:
    first = await kubelet.admit_pod(PodSpec("a", "a", containers=(ContainerSpec("main", {RESOURCE: 2}),)))

    await kubelet.restart()

    await asyncio.wait_for(registered.stream_closed.wait(), 5)
    assert kubelet.capacity() == {RESOURCE: 0}
    assert not kubelet.connected(RESOURCE)
    assert [a.pod.uid for a in kubelet.admissions()] == ["a"]

    # The plugin notices its socket is gone, serves again and registers with the new kubelet.
    await registered.stop()
    await registered.start()
    await registered.register(kubelet.socket_path)
    await kubelet.wait_for_resource(RESOURCE, timeout=30)

    assert kubelet.capacity() == {RESOURCE: 4}
    assert kubelet.allocated(RESOURCE) == set(first.devices("main", RESOURCE))
    second = await kubelet.admit_pod(PodSpec("b", "b", containers=(ContainerSpec("main", {RESOURCE: 2}),)))
    assert set(second.devices("main", RESOURCE)).isdisjoint(first.devices("main", RESOURCE))


async def test_stop_removes_the_kubelet_sockets_and_start_twice_is_refused(root: Path) -> None:
    kubelet = FakeKubelet(root)
    await kubelet.start()
    with pytest.raises(RuntimeError, match="already started"):
        await kubelet.start()
    plugin = StubPlugin(kubelet.device_plugin_dir, devices=[dev("a")])
    await plugin.start()
    try:
        await plugin.register(kubelet.socket_path)
        await kubelet.wait_for_resource(RESOURCE)
    finally:
        await kubelet.stop()
        await plugin.stop()

    assert not kubelet.socket_path.exists()
    assert not kubelet.pod_resources_socket.exists()
    assert list(kubelet.device_plugin_dir.iterdir()) == []


async def test_start_removes_stale_sockets_left_by_an_earlier_life(root: Path) -> None:
    directory = root / "device-plugins"
    directory.mkdir()
    stale = bind_stray_socket(directory / "kubelet.sock")
    stale.close()

    async with FakeKubelet(root) as kubelet:
        plugin = StubPlugin(kubelet.device_plugin_dir, devices=[dev("a")])
        await plugin.start()
        try:
            await plugin.register(kubelet.socket_path)
            await kubelet.wait_for_resource(RESOURCE)
        finally:
            await plugin.stop()


def test_root_too_long_for_unix_sockets_is_refused() -> None:
    with pytest.raises(ValueError, match="too long for unix socket paths"):
        FakeKubelet(Path("/tmp") / ("x" * 90))


async def test_restart_during_a_registration_drops_it_cleanly(kubelet: FakeKubelet, make_plugin: PluginFactory) -> None:
    plugin = await make_plugin(devices=[dev("a")])
    plugin.options_gate = asyncio.Event()
    registering = asyncio.create_task(plugin.register(kubelet.socket_path))
    await asyncio.wait_for(plugin.options_called.wait(), 5)

    await kubelet.restart()
    plugin.options_gate.set()

    with pytest.raises(grpc.aio.AioRpcError):
        await registering
    assert not kubelet.connected(RESOURCE)
    assert kubelet.capacity() == {}
