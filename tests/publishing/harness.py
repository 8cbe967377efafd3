"""A node in a box for the publishing tests: the sandbox API server, the fake kubelet, the real
agent (on a small GPU inventory) and `run_publication`, talking over real HTTP and unix sockets.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig

from sharepack.agent import configwatching, publishing
from sharepack.agent.reloading import ConfigReloader
from sharepack.agent.running import Agent, Settings
from sharepack.common import state as schema
from sharepack.common.config import Config, load_config
from sharepack.common.inventory import Gpu, Inventory
from sharepack.common.state import NodeState
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer
from sharepack.sandbox.kubelet.devicemanager import FakeKubelet
from sharepack.sandbox.kubelet.pods import ContainerSpec, PodSpec

NODE = "node-0"
SHARED = "nvidia.com/gpu"
LOADED_RPC_TIMEOUT_S = 30.0  # pytest-timeout (60 s) still ends a hung test
FAST = publishing.PublishSettings(resync_s=5.0, retry_initial_s=0.05, retry_max_s=0.2)


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-4000-8000-000000000000"


def gpus(n: int) -> Inventory:
    return Inventory(
        gpus=tuple(
            Gpu(index=i, uuid=gpu_uuid(i), name="NVIDIA A100-SXM4-40GB", memory_mib=40960, minor=i,
                pci_bus_id=f"00000000:{i + 7:02X}:00.0", numa_node=0, compute_capability=(8, 0))
            for i in range(n)
        )
    )


def time_slicing(replicas: int, policy: str = "distributed") -> str:
    return f"""
version: v1
flags:
  plugin:
    sharedDevicesAllocationPolicy: {policy}
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: {replicas}
"""


def config(text: str) -> Config:
    return load_config(file_text=text, file_source="test config", env={}, flags={})


class PollCounter:
    """Counts the publisher's PodResources polls: each poll ends with GetAllocatableResources,
    which the fake kubelet answers from `allocatable_devices` (wrapped here, on the instance).
    Tests wait for polls, not for durations: a loaded machine polls later, never less."""

    def __init__(self, kubelet: FakeKubelet) -> None:
        self.count = 0
        original = kubelet.allocatable_devices

        def counted() -> Any:
            self.count += 1
            return original()

        kubelet.allocatable_devices = counted  # type: ignore[method-assign]

    async def wait(self, more: int, *, timeout: float = 30.0) -> None:
        """Until `more` polls have completed after this call (a poll in flight may not count)."""
        target = self.count + more + 1
        async with asyncio.timeout(timeout):
            while self.count < target:
                await asyncio.sleep(0.01)


@dataclass
class Node:
    server: FakeApiServer
    kubelet: FakeKubelet
    agent: Agent
    api: kclient.ApiClient
    polls: PollCounter
    started: dict[str, str] = field(default_factory=dict)  # pod name -> uid

    @property
    def core(self) -> kclient.CoreV1Api:
        return kclient.CoreV1Api(self.api)

    async def start_pod(self, name: str, count: int = 1, resource: str = SHARED) -> str:
        """A pod bound to the node in the API, then admitted by the kubelet; returns its UID."""
        pod = self.server.store.create(kinds.PODS, "default", {
            "metadata": {"name": name},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "cuda"}]},
        })
        uid = str(pod["metadata"]["uid"])
        await self.kubelet.admit_pod(
            PodSpec(uid=uid, name=name, containers=(ContainerSpec("main", {resource: count}),))
        )
        self.started[name] = uid
        return uid

    async def stop_pod(self, name: str) -> None:
        await self.kubelet.remove_pod(self.started.pop(name))
        self.server.store.delete(kinds.PODS, "default", name)

    def published(self) -> NodeState | None:
        try:
            obj = self.server.store.get(kinds.NODE_GPU_STATES, "", NODE)
        except Exception:
            return None
        return schema.from_status(obj["status"]) if "status" in obj else None

    async def wait_state(self, predicate: Callable[[NodeState], bool], *, timeout: float = 30.0) -> NodeState:
        """The first published state (now or from the store's watch) that satisfies `predicate`.

        The timeout is a deadline for a hung test, not a speed claim (those live in
        benchmarks/bench_publishing.py): generous, so a loaded machine passes."""
        store = self.server.store
        watcher = store.watch(kinds.NODE_GPU_STATES, None, lambda _o: True, str(store.rv))
        try:
            current = self.published()
            if current is not None and predicate(current):
                return current
            async with asyncio.timeout(timeout):
                while True:
                    event = await watcher.queue.get()
                    assert event is not None, "the API server closed the watch"
                    status = event["object"].get("status")
                    if event["type"] != "DELETED" and status:
                        found = schema.from_status(status)
                        if predicate(found):
                            return found
        finally:
            store.unwatch(watcher)


def held(state: NodeState, resource: str = SHARED) -> dict[str, int]:
    res = state.resource(resource)
    assert res is not None
    return {g.key: g.allocated for g in res.gpus}


def pods_of(state: NodeState, resource: str = SHARED) -> set[str]:
    res = state.resource(resource)
    return set() if res is None else {p for g in res.gpus for p in g.pods}


@asynccontextmanager
async def node(
    cfg: Config,
    inventory: Inventory,
    *,
    settings: publishing.PublishSettings = FAST,
    config_source: configwatching.ConfigSource | None = None,
    before_start: Callable[[FakeApiServer], Any] | None = None,
    reloader: ConfigReloader | None = None,
) -> AsyncIterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="spp-", dir="/tmp"))
    server = FakeApiServer()
    await server.start()
    # The kubelet-to-agent calls share this loop with everything else here: on a loaded machine
    # the fake kubelet's 10 s hang guard can run out before a starved loop answers.
    kubelet = FakeKubelet(root / "k", rpc_timeout=LOADED_RPC_TIMEOUT_S)
    polls = PollCounter(kubelet)
    agent_task: asyncio.Task[None] | None = None
    publication: asyncio.Task[None] | None = None
    api: kclient.ApiClient | None = None
    try:
        server.store.create(kinds.NODES, "", {"metadata": {"name": NODE, "labels": {}}})
        if before_start is not None:
            before_start(server)
        await kubelet.start()
        agent = Agent(
            Settings(kubelet_socket=kubelet.socket_path, watch_interval_s=0.05, drain_grace_s=0.1),
            cfg, inventory, config_loader=reloader,
        )
        agent_task = asyncio.create_task(agent.run(), name="agent-under-test")
        for resource in agent.resources:
            await kubelet.wait_for_resource(resource.name)
        api = await kconfig.new_client_from_config(
            config_file=str(server.write_kubeconfig(root / "kubeconfig"))
        )
        publication = asyncio.create_task(
            publishing.run_publication(
                agent, api, NODE, pod_resources_socket=kubelet.pod_resources_socket,
                settings=settings, config_source=config_source, reloader=reloader, metrics=agent.metrics,
            ),
            name="publication-under-test",
        )
        yield Node(server, kubelet, agent, api, polls)
        assert not publication.done(), f"publication ended: {publication.exception()!r}"
    finally:
        if publication is not None:
            publication.cancel()
            await asyncio.wait([publication])
        if agent_task is not None:
            agent.request_stop()
            await agent_task
        if api is not None:
            await api.close()
        await kubelet.stop()
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def wait_object(
    server: FakeApiServer, kind: Any, predicate: Callable[[dict[str, Any]], bool], *, timeout: float = 30.0
) -> dict[str, Any]:
    """The first object of `kind` (existing, or from the store's watch) that satisfies `predicate`."""
    store = server.store
    watcher = store.watch(kind, None, lambda _o: True, "")  # current objects first, then changes
    try:
        async with asyncio.timeout(timeout):
            while True:
                event = await watcher.queue.get()
                assert event is not None, "the API server closed the watch"
                if event["type"] != "DELETED" and predicate(event["object"]):
                    return dict(event["object"])
    finally:
        store.unwatch(watcher)
