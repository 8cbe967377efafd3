"""Socket names, and noticing a kubelet restart even when the new kubelet.sock reuses the inode."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest

from sharepack.agent import registering


@pytest.mark.parametrize(
    ("resource", "socket"),
    [
        pytest.param("nvidia.com/gpu", "nvidia-gpu.sock", id="full gpus"),
        pytest.param("nvidia.com/gpu.shared", "nvidia-gpu-shared.sock", id="renamed replicas"),
        pytest.param("nvidia.com/mig-1g.5gb", "nvidia-mig-1g-5gb.sock", id="mig profile"),
    ],
)
def test_socket_names(resource: str, socket: str) -> None:
    assert registering.socket_name(resource) == socket


async def _watch_until_restart(change: str) -> str:
    root = Path(tempfile.mkdtemp(prefix="spr-", dir="/tmp"))
    kubelet, plugin = root / "kubelet.sock", root / "nvidia-gpu.sock"
    kubelet.write_text("")
    plugin.write_text("")
    restarted: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def on_restart(reason: str) -> None:
        if not restarted.done():
            restarted.set_result(reason)

    watcher = asyncio.create_task(
        registering.watch_kubelet(kubelet, lambda: [plugin], on_restart, interval=0.01)
    )
    try:
        await asyncio.sleep(0.03)  # let the watcher take its first look
        assert not restarted.done()
        if change == "plugin socket removed":
            plugin.unlink()  # kubelet.sock untouched: same inode, same ctime
        else:
            kubelet.unlink()
            kubelet.write_text("")
        return await asyncio.wait_for(restarted, 30)
    finally:
        watcher.cancel()
        await asyncio.wait([watcher])
        for p in (kubelet, plugin):
            p.unlink(missing_ok=True)
        os.rmdir(root)


async def test_a_removed_plugin_socket_is_a_restart() -> None:
    assert "nvidia-gpu.sock was removed" in await _watch_until_restart("plugin socket removed")


async def test_a_re_created_kubelet_socket_is_a_restart() -> None:
    assert "kubelet.sock was re-created" in await _watch_until_restart("kubelet socket re-created")
