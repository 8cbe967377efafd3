"""Simulated GPU nodes at scale: Node objects and their agents' published state, without
kubelets or agent processes, for thousands of nodes from one asyncio process.

What a node's kubelet and agent would do, done centrally:

* **Nodes** are created with their status (capacity and allocatable: cpu, memory, pods, and
  the GPU resources the agent's config makes of the node's GPUs; a Ready condition), labelled
  as GPU feature discovery labels them (`nvidia.com/gpu.present`, `nvidia.com/gpu.product`).
* **Admission**: one watch of every bound pod (`spec.nodeName!=`) for all nodes. A new pod gets
  devices as the kubelet's device manager gives them, asking the agent's own allocation code
  (`agent.responses.preferred_allocation`, i.e. `common.allocation` under the node's policy,
  over the resources `common.resources.build_resources` makes of the node's GPUs and config);
  then it is marked Running, as its kubelet would. Directed GPUs (the extender's
  `sharepack.io/gpus` annotation, ships on) are honoured as the agent honours them
  (`agent.directing`): a container with directions for this node gets devices on exactly
  those GPUs (`common.directions.choose_devices`) when they have enough free; otherwise, and
  without usable directions, the node's policy answers (a fallback, counted by reason in
  `Fleet.directed`). Init containers' device reuse is not
  modelled: every container takes new devices (the pods of the benchmark and the trace have one
  container; `sandbox.kubelet` is the faithful device manager).
* **Publishing**: each node's `NodeGpuState` is built by `common.statebuilding.build_node_state`
  from the pods' devices (what the agent builds from PodResources) and written when it changed,
  debounced and batched over all nodes, plus a heartbeat rewrite every `heartbeat_s` so the
  extender never sees a state go stale. Writes use whatever credentials the session has (the
  admin's here: deploy/base's ValidatingAdmissionPolicy binds only the agent service account to
  its own node).

Not modelled: device health, MIG, pods' own lifecycle beyond Running (no container ever ends).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from sharepack.agent import responses
from sharepack.agent.directing import DirectedCounters, Fallback
from sharepack.common import config as agentconfig
from sharepack.common import directions, podrequests, statebuilding
from sharepack.common.directions import Directions
from sharepack.common import state as gpustate
from sharepack.common.errors import AllocationError, DirectionsError, RequestError
from sharepack.common.inventory import Gpu, Inventory
from sharepack.common.policies import MigStrategy, Policy
from sharepack.common.resources import Resource, build_resources
from sharepack.common.state import NodeState
from sharepack.common.statebuilding import PodDevices
from sharepack.sandbox.apiwatch import ApiSession, WatchError, reflect
from sharepack.sandbox.kubelet.api import now, running_status

log = logging.getLogger(__name__)

AGENT_VERSION = "fleet"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
TERMINAL = ("Succeeded", "Failed")
CONCURRENCY = 24  # API requests in flight at once
DEBOUNCE_S = 0.02
HEARTBEAT_S = 60.0
NGS_PATH = f"/apis/{gpustate.GROUP}/{gpustate.VERSION}/{gpustate.PLURAL}"


@dataclass(frozen=True, slots=True)
class NodeShape:
    """One node: its GPUs and what the kubelet reports besides them."""

    name: str
    gpus: int
    product: str  # GPU model ("" when the node has none)
    cpu_milli: int
    memory_mib: int
    max_pods: int = 1000  # the trace does not limit pods per node


def synthetic_shapes(
    count: int, *, gpus: int = 8, product: str = "A100", cpu_milli: int = 128_000, memory_mib: int = 1_048_576,
    prefix: str = "sim-node",
) -> list[NodeShape]:  # fmt: skip
    return [NodeShape(f"{prefix}-{i:05d}", gpus, product, cpu_milli, memory_mib) for i in range(count)]


def agent_config(replicas: int, policy: Policy) -> agentconfig.Config:
    """The agent's config: `replicas` time-slicing replicas per GPU (renamed `.shared`), or
    whole GPUs when `replicas` is 1."""
    doc: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "none"}}
    if replicas > 1:
        doc["sharing"] = {
            "timeSlicing": {
                "renameByDefault": True,
                "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}],
            }
        }
    return agentconfig.load_config(
        file_text=yaml.safe_dump(doc), file_source="fleet agent config",
        env={}, flags={"shared-devices-allocation-policy": str(policy)},
    )  # fmt: skip


def inventory(shape: NodeShape) -> Inventory:
    # Keys sort in index order (one digit), as the trace simulator's GPU keys do: the loop's
    # tie-break then picks the same GPU in both.
    return Inventory(
        gpus=tuple(
            Gpu(
                index=i, uuid=f"GPU-{shape.name}-{i}", name=shape.product, memory_mib=81_920, minor=i,
                pci_bus_id=f"00000000:{i + 1:02x}:00.0", numa_node=None, compute_capability=(8, 0),
            )  # fmt: skip
            for i in range(shape.gpus)
        )
    )


class AdmissionFailed(Exception):
    pass


class NodeDevices:
    """One node's device manager and agent, over counts held in memory."""

    def __init__(self, shape: NodeShape, config: agentconfig.Config) -> None:
        self.shape = shape
        self.policy = config.allocation_policy
        self.resources: tuple[Resource, ...] = build_resources(inventory(shape), config) if shape.gpus else ()
        self._by_name = {r.name: r for r in self.resources}
        self.pods: dict[str, PodDevices] = {}  # uid -> devices
        self._names: dict[tuple[str, str], str] = {}  # (namespace, name) -> uid
        self._in_use: dict[str, set[str]] = {r.name: set() for r in self.resources}

    def capacity(self) -> dict[str, str]:
        out = {"cpu": f"{self.shape.cpu_milli}m", "memory": f"{self.shape.memory_mib}Mi", "pods": str(self.shape.max_pods)}
        out.update({r.name: str(len(r.devices)) for r in self.resources})
        return out

    def admit(
        self, request: podrequests.PodRequest, directed: Directions | None = None,
        counters: DirectedCounters | None = None, why_not: Fallback = Fallback.NO_DIRECTIONS,
    ) -> PodDevices:  # fmt: skip
        """Devices for every container (kubelet order), or AdmissionFailed saying why.
        `directed`: the pod's directions for this node (honoured where they fit, as the agent
        does); `counters`: where honoured and fallen-back directed allocations are counted, per
        container and resource; `why_not`: the fallback when a container has no directions."""
        chosen: dict[str, list[str]] = {}
        wanted = {c.name: c.gpus for c in directed.containers} if directed is not None else {}
        for container in request.containers:
            for name, size in container.amounts:
                res = self._by_name.get(name)
                if res is None:
                    raise AdmissionFailed(f"node {self.shape.name} has no {name}")
                taken = chosen.setdefault(name, [])
                available = sorted(set(res.device_ids()) - self._in_use[name] - set(taken))
                keys = wanted.get(container.name, {}).get(name)
                if keys:
                    steered = directions.choose_devices(keys, available, [], size, res.group_of())
                    if not isinstance(steered, str):
                        if counters is not None:
                            counters.honoured += 1
                        taken.extend(steered)
                        continue
                    if counters is not None:
                        counters.fallback(Fallback.UNAVAILABLE)
                elif counters is not None:
                    counters.fallback(why_not)
                try:
                    picked = responses.preferred_allocation(res, self.policy, {}, available, [], size)
                except AllocationError as e:
                    raise AdmissionFailed(
                        f"requested number of devices unavailable for {name}. Requested: {size}, "
                        f"Available: {len(available)} ({e})"
                    ) from None
                taken.extend(picked)
        devices = PodDevices(request.namespace, request.name, {r: frozenset(ids) for r, ids in chosen.items()})
        for name, ids in devices.devices.items():
            self._in_use[name].update(ids)
        self.pods[request.uid] = devices
        self._names[(request.namespace, request.name)] = request.uid
        return devices

    def remove(self, uid: str) -> bool:
        devices = self.pods.pop(uid, None)
        if devices is None:
            return False
        self._names.pop((devices.namespace, devices.name), None)
        for name, ids in devices.devices.items():
            self._in_use[name].difference_update(ids)
        return True

    def state(self, observed_at: str = "") -> NodeState:
        """What the agent publishes for these pods (`common.statebuilding`)."""
        return statebuilding.build_node_state(
            resources=self.resources, unhealthy=(), pods=tuple(self.pods.values()), pod_uids=self._names,
            allocation_policy=self.policy, mig_strategy=MigStrategy.NONE, agent_version=AGENT_VERSION,
            observed_at=observed_at,
        )  # fmt: skip


class Fleet:
    """Simulated nodes on one API server; `register()` then `run()` (until cancelled)."""

    def __init__(
        self,
        api: ApiSession,
        shapes: Sequence[NodeShape],
        *,
        replicas: int = 10,
        policy: Policy = Policy.PACKED,
        mark_running: bool = True,
        heartbeat_s: float = HEARTBEAT_S,
        concurrency: int = CONCURRENCY,
    ) -> None:
        config = agent_config(replicas, policy)
        self.api = api
        self.nodes = {s.name: NodeDevices(s, config) for s in shapes}
        self.mark_running = mark_running
        self.heartbeat_s = heartbeat_s
        self._slots = asyncio.Semaphore(concurrency)
        self._node_uids: dict[str, str] = {}
        self._dirty: set[str] = set()
        self._running: dict[str, dict[str, Any]] = {}  # uid -> pod to mark Running
        self._deletes: list[tuple[str, dict[str, Any]]] = []  # graceful deletions to complete
        self._beats: set[str] = set()  # nodes due a heartbeat rewrite (not pod-driven: `settled` ignores them)
        self._wake = asyncio.Event()
        self._written: dict[str, tuple[NodeState, float]] = {}  # node -> last state, when
        self._handled: dict[str, str] = {}  # pod uid -> node (admitted or rejected)
        self.rejected: dict[str, str] = {}  # pod uid -> why
        self.directed = DirectedCounters()  # directed allocations honoured, fallbacks by reason
        self.writes = 0
        self.idle = asyncio.Event()  # set when no pod-driven write is left
        self.idle.set()

    # -- API calls ------------------------------------------------------------------------

    async def _call(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                    ok: Iterable[int] = ()) -> dict[str, Any]:  # fmt: skip
        async with self._slots:
            return await self.api.send(method, path, body, content_type=content_type, ok=ok)

    async def _gather(self, calls: Iterable[Awaitable[Any]]) -> None:
        async with asyncio.TaskGroup() as group:
            for call in calls:
                group.create_task(call)  # type: ignore[arg-type]

    # -- registration ----------------------------------------------------------------------

    def node_object(self, node: NodeDevices) -> dict[str, Any]:
        shape = node.shape
        labels = {"kubernetes.io/hostname": shape.name, "kubernetes.io/os": "linux"}
        if shape.gpus:
            labels.update({GPU_PRESENT_LABEL: "true", GPU_PRODUCT_LABEL: shape.product, "nvidia.com/gpu.count": str(shape.gpus)})
        stamp = now()
        capacity = node.capacity()
        return {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": shape.name, "labels": labels},
            "status": {
                "capacity": capacity, "allocatable": capacity,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "simulated node", "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": shape.name}],
                "nodeInfo": {"kubeletVersion": "v0.0.0-fleet", "kubeProxyVersion": "", "containerRuntimeVersion": "fleet://0",
                             "operatingSystem": "linux", "architecture": "amd64", "osImage": "sharepack fleet",
                             "kernelVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
            },
        }  # fmt: skip

    async def register(self) -> None:
        """Create every Node (status included) and its NodeGpuState, owned by the Node."""

        async def one(node: NodeDevices) -> None:
            name = node.shape.name
            created = await self._call("POST", "/api/v1/nodes", self.node_object(node))
            self._node_uids[name] = str(created["metadata"]["uid"])
            if node.resources:
                body = {
                    "apiVersion": f"{gpustate.GROUP}/{gpustate.VERSION}", "kind": gpustate.KIND,
                    "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "sharepack-fleet"},
                                 "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                                      "uid": self._node_uids[name]}]},
                }  # fmt: skip
                await self._call("POST", NGS_PATH, body)
                await self._write_state(name)

        await self._gather(one(n) for n in self.nodes.values())

    async def _write_state(self, name: str) -> None:
        node = self.nodes[name]
        state = node.state(now())
        body = {"status": statebuilding.status_document(state)}
        await self._call(
            "PATCH", f"{NGS_PATH}/{name}/status", body, content_type="application/merge-patch+json"
        )
        self._written[name] = (state, time.monotonic())
        self.writes += 1

    def published(self, name: str) -> NodeState | None:
        entry = self._written.get(name)
        return entry[0] if entry else None

    # -- the loops -------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(
                reflect(self.api, "/api/v1/pods", {"fieldSelector": "spec.nodeName!="}, self._on_pod), name="fleet-pods"
            )
            group.create_task(self._write_loop(), name="fleet-writes")
            if self.heartbeat_s > 0:
                group.create_task(self._heartbeat_loop(), name="fleet-heartbeat")

    async def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid"))
        node_name = str((pod.get("spec") or {}).get("nodeName") or "")
        node = self.nodes.get(node_name)
        if node is None:
            return  # bound to a node that is not ours
        phase = (pod.get("status") or {}).get("phase")
        if kind == "DELETED" or phase in TERMINAL or meta.get("deletionTimestamp"):
            self._handled.pop(uid, None)
            if node.remove(uid):
                self._mark(node_name)
            if kind != "DELETED" and meta.get("deletionTimestamp"):
                # The kubelet completes a graceful deletion once the containers are gone.
                self._spawn_delete(meta)
            return
        if uid in self._handled:
            return
        self._handled[uid] = node_name
        try:
            request = podrequests.decode_pod_request(pod)
            directed, why_not = self._directions(pod, node_name)
            if directed is not None and directions.mismatch(directed, request) is not None:
                directed, why_not = None, Fallback.MISMATCHED  # as the agent: not the extender's
            node.admit(request, directed, self.directed, why_not)
        except (AdmissionFailed, RequestError) as e:
            self.rejected[uid] = str(e)
            log.warning("node %s rejects pod %s/%s: %s", node_name, meta.get("namespace"), meta.get("name"), e)
            self._running[uid] = {**pod, "_failed": str(e)}
        else:
            if self.mark_running:
                self._running[uid] = pod
            self._mark(node_name)
        self._wake.set()

    @staticmethod
    def _directions(pod: Mapping[str, Any], node_name: str) -> tuple[Directions | None, Fallback]:
        """The pod's directions for `node_name`, or None and why there are none to use."""
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(directions.ANNOTATION)
        if text is None:
            return None, Fallback.NO_DIRECTIONS
        try:
            found = directions.decode(str(text), where=f"pod {meta.get('namespace')}/{meta.get('name')}")
        except DirectionsError as e:
            log.warning("%s", e)
            return None, Fallback.MALFORMED
        if found.node != node_name:
            return None, Fallback.OTHER_NODE
        return found, Fallback.NO_DIRECTIONS

    def _mark(self, name: str) -> None:
        self._dirty.add(name)
        self.idle.clear()
        self._wake.set()

    def _spawn_delete(self, meta: Mapping[str, Any]) -> None:
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta.get("uid")}}
        self._deletes.append((path, body))
        self._wake.set()

    async def _write_loop(self) -> None:
        while True:
            if not (self._dirty or self._running or self._deletes or self._beats):
                self._wake.clear()
                await self._wake.wait()
            await asyncio.sleep(DEBOUNCE_S)  # let a burst of binds collect into one batch
            dirty, self._dirty = self._dirty, set()
            beats, self._beats = self._beats - dirty, set()
            running, self._running = self._running, {}
            deletes, self._deletes = self._deletes, []
            calls: list[Awaitable[Any]] = [self._write_state(n) for n in dirty | beats if self.nodes[n].resources]
            calls += [self._pod_status(p) for p in running.values()]
            calls += [self._call("DELETE", path, body, ok=(404, 409)) for path, body in deletes]
            try:
                await self._gather(calls)
            except* (WatchError, OSError) as failed:
                log.warning("fleet: %d write(s) failed, retrying the nodes: %s", len(failed.exceptions), failed.exceptions[0])
                self._dirty |= dirty
                self._beats |= beats
                await asyncio.sleep(0.5)
            if not (self._dirty or self._running or self._deletes):
                self.idle.set()

    async def _pod_status(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        failed = pod.get("_failed")
        status: dict[str, Any] = (
            {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": failed}
            if failed else running_status(pod, now())
        )  # fmt: skip
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        await self._call(
            "PATCH", path, {"status": status}, content_type="application/strategic-merge-patch+json", ok=(404,)
        )

    async def _heartbeat_loop(self) -> None:
        """Rewrite states older than the heartbeat, a slice at a time (as agents spread theirs)."""
        while True:
            await asyncio.sleep(self.heartbeat_s / 10)
            horizon = time.monotonic() - self.heartbeat_s * 0.9
            old = [n for n, (_, at) in self._written.items() if at < horizon]
            if old:
                self._beats.update(old)
                self._wake.set()

    async def settled(self, timeout: float = 120.0) -> None:
        """Wait until every admitted or removed pod is published and marked, heartbeats aside
        (on thousands of nodes they never stop)."""
        async with asyncio.timeout(timeout):
            while True:
                await self.idle.wait()
                if not (self._dirty or self._running or self._deletes):
                    return
                await asyncio.sleep(DEBOUNCE_S)


def shapes_from_columns(
    names: Sequence[str], gpus: Sequence[int], models: Sequence[str], cpu: Sequence[int], memory: Sequence[int]
) -> list[NodeShape]:
    """Node shapes from a node list's columns (the trace's: sn, gpu, model, cpu_milli, memory_mib)."""
    return [
        NodeShape(str(n).lower(), int(g), str(m), int(c), int(mem))
        for n, g, m, c, mem in zip(names, gpus, models, cpu, memory, strict=True)
    ]


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 120.0, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        await asyncio.sleep(step)


__all__ = [
    "AdmissionFailed", "Fleet", "NodeDevices", "NodeShape", "agent_config", "shapes_from_columns",
    "synthetic_shapes", "wait_for",
]  # fmt: skip