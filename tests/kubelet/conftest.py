"""Fixtures for the fake kubelet tests: a short temp root, a started kubelet, stub plugins."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sharepack.sandbox.kubelet.devicemanager import FakeKubelet
from sharepack.sandbox.kubelet.stubplugin import RESOURCE, PluginFactory, StubPlugin, dev

@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(root: Path) -> AsyncIterator[FakeKubelet]:
    fake = FakeKubelet(root, dial_timeout=0.5, rpc_timeout=5.0)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
async def make_plugin(kubelet: FakeKubelet) -> AsyncIterator[PluginFactory]:
    """Start stub plugins in the kubelet's directory (not registered); all stopped at the end."""
    plugins: list[StubPlugin] = []

    async def make(*args: Any, **kwargs: Any) -> StubPlugin:
        plugin = StubPlugin(kubelet.device_plugin_dir, *args, **kwargs)
        await plugin.start()
        plugins.append(plugin)
        return plugin

    try:
        yield make
    finally:
        for plugin in plugins:
            await plugin.stop()


@pytest.fixture
async def registered(kubelet: FakeKubelet, make_plugin: PluginFactory) -> StubPlugin:
    """A plugin with four healthy devices on two NUMA nodes, registered and listed."""
    plugin = await make_plugin(devices=[dev("d0", numa=(0,)), dev("d1", numa=(0,)), dev("d2", numa=(1,)), dev("d3", numa=(1,))])
    await plugin.register(kubelet.socket_path)
    await kubelet.wait_for_resource(RESOURCE)
    return plugin
