"""Shared pieces of the agent's tests: inventories, configs, a fake XID source, a running agent.

The fakes sit at process boundaries only: NVML (an XID queue, or the simulator) and the kubelet
(sandbox.kubelet.FakeKubelet over real unix sockets).
"""

from __future__ import annotations

import asyncio
import queue
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from sharepack.agent import nvml
from sharepack.agent.health import XidPolicy
from sharepack.agent.running import Agent, Settings
from sharepack.common.config import Config, load_config
from sharepack.common.inventory import Gpu, Inventory, MigDevice
from sharepack.sandbox.kubelet.devicemanager import FakeKubelet
from sharepack.sandbox.kubelet.pods import ContainerSpec, PodSpec


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-0000-4000-8000-000000000000"


def plain_gpus(n: int, *, name: str = "NVIDIA A100-SXM4-40GB", numa: bool = True) -> Inventory:
    gpus = tuple(
        Gpu(index=i, uuid=gpu_uuid(i), name=name, memory_mib=40960, minor=i,
            pci_bus_id=f"00000000:{i + 7:02X}:00.0", numa_node=(i * 2 // n) if numa else None,
            compute_capability=(8, 0))
        for i in range(n)
    )
    return Inventory(gpus=gpus)


def mig_gpus(n: int, layout: tuple[tuple[str, int], ...]) -> Inventory:
    """n A100-40GB GPUs with MIG on, each with the same (profile, start) layout."""
    gpus = []
    for i in range(n):
        migs = tuple(
            MigDevice(uuid=f"MIG-{i:04x}{k:04x}-0000-4000-8000-000000000000", parent_uuid=gpu_uuid(i),
                      parent_index=i, gi_id=k + 1, ci_id=0, profile=profile, placement_start=start,
                      placement_size=1 if profile.startswith("1g") else 4,
                      memory_mib=4864 if profile == "1g.5gb" else 19968, index=k)
            for k, (profile, start) in enumerate(layout)
        )
        gpus.append(Gpu(index=i, uuid=gpu_uuid(i), name="NVIDIA A100-SXM4-40GB", memory_mib=40960, minor=i,
                        pci_bus_id=f"00000000:{i + 7:02X}:00.0", numa_node=0, compute_capability=(8, 0),
                        mig_enabled=True, mig_devices=migs))
    return Inventory(gpus=tuple(gpus))


def config(text: str = "", **flags: str) -> Config:
    return load_config(file_text=text or None, file_source="test config", env={}, flags=flags)


def time_slicing(replicas: int, *, rename: bool = False, fail_gt_one: bool = False, name: str = "nvidia.com/gpu") -> str:
    return f"""
version: v1
sharing:
  timeSlicing:
    renameByDefault: {str(rename).lower()}
    failRequestsGreaterThanOne: {str(fail_gt_one).lower()}
    resources:
    - name: {name}
      replicas: {replicas}
"""


@dataclass(frozen=True)
class FakeXid:
    uuid: str
    xid: int
    mig_gi: int | None = None
    mig_ci: int | None = None


class XidQueue:
    """Stands in for NVML's blocking event wait: tests put events, the agent's thread takes them."""

    def __init__(self) -> None:
        self._q: queue.Queue[FakeXid] = queue.Queue()

    def put(self, event: FakeXid) -> None:
        self._q.put(event)

    def wait(self, timeout_ms: int) -> FakeXid | None:
        try:
            return self._q.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None


@asynccontextmanager
async def fake_kubelet() -> AsyncIterator[FakeKubelet]:
    root = Path(tempfile.mkdtemp(prefix="spa-", dir="/tmp"))
    kubelet = FakeKubelet(root, rpc_timeout=30.0)  # the agent shares this loop: starved when loaded
    await kubelet.start()
    try:
        yield kubelet
    finally:
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


@asynccontextmanager
async def running_agent(
    kubelet: FakeKubelet,
    cfg: Config,
    inventory: Inventory,
    *,
    xids: XidQueue | nvml.XidWatcher | None = None,
    loader: Callable[[], Config] | None = None,
    recovery_after_s: float = 0.0,
    xid_policy: XidPolicy | None = None,
) -> AsyncIterator[Agent]:
    settings = Settings(
        kubelet_socket=kubelet.socket_path,
        xid_policy=xid_policy or XidPolicy(),
        recovery_after_s=recovery_after_s,
        watch_interval_s=0.05,
        drain_grace_s=0.1,
        xid_wait_ms=50,
    )
    agent = Agent(settings, cfg, inventory, wait_for_xid=xids.wait if xids else None, config_loader=loader)
    registered = len(kubelet.registrations)
    task = asyncio.create_task(agent.run(), name="agent-under-test")
    try:
        # This agent's own registrations first: the kubelet may still hold a previous agent's
        # endpoints (their streams' end not seen yet), which would pass for this one's before it
        # has even started (it restores its allocation log before registering).
        await kubelet.wait_until(lambda: len(kubelet.registrations) >= registered + len(agent.resources),
                                 what="the agent's registrations")  # fmt: skip
        for resource in agent.resources:
            await kubelet.wait_for_resource(resource.name)
        yield agent
    finally:
        agent.request_stop()
        await task


async def stop_process(proc: asyncio.subprocess.Process, *, timeout: float = 10.0) -> int | None:
    """SIGTERM a child that may still run and wait for its exit code; kill it if it will not go
    in time (the code is then None). Safe to call on one that has exited."""
    if proc.returncode is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None


def pod(uid: str, resource: str, count: int = 1) -> PodSpec:
    return PodSpec(uid=uid, name=f"pod-{uid}", containers=(ContainerSpec("main", {resource: count}),))
