"""Each node's CPU and memory left, for the CPU-aware ranks (`fragaware`, `packed`).

A GPU whose node has no CPU left for any GPU pod is as idle as a fragment; to see it the extender
needs what kube-scheduler's NodeResourcesFit sees: every Node's `status.allocatable` (a Node
watch) and the requests of every pod bound to it, CPU-only pods included (the pod watch the
extender keeps already lists every bound pod). `NodeResources` keeps both, counted as
`common.noderoom` counts them, and calls `on_change(node)` whenever a node's room changes, so
`ClusterView` rebuilds that node's scorer (its memo is per node state, and the room is part of
it).

A pod counts from the moment this extender binds it (`assume`, before the Binding is written:
kube-scheduler's next scheduling cycle may run before the pod watch delivers the binding) or
the pod watch shows it bound, until it is deleted or ends (Succeeded/Failed). A node without a
known allocatable has no room: its scorer ranks by GPUs alone, as before the watch.

The Node watch also gives each node's GPU model (its `nvidia.com/gpu.product` label,
`common.gpumodels`), so the ranks know which typical shapes the node's GPUs can serve at all: a
shape that allows only other models sees all of them as fragment, as FGD counts it.

Nodes whose allocatable lists none of the GPU resources some agent publishes are `gpu_free`:
a CPU-only pod strands nothing there, so the filter's tier ranks them first for such pods
(`ClusterView.filter_nodes`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sharepack.common import gpumodels, noderoom

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
GPU_RESOURCE_PREFIX = "nvidia.com/"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _has_gpus(obj: Mapping[str, Any]) -> bool:
    status = obj.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(allocatable, Mapping):
        return False
    return any(str(k).startswith(GPU_RESOURCE_PREFIX) and str(v) not in ("0", "") for k, v in allocatable.items())


class NodeResources:
    """Allocatable and requested CPU and memory per node (event loop thread only)."""

    def __init__(self) -> None:
        self.allocatable: dict[str, tuple[int, int]] = {}  # node -> (milli-CPU, MiB)
        self.gpu_nodes: set[str] = set()  # nodes whose allocatable lists a GPU resource
        self.models: dict[str, str] = {}  # node -> its GPU model label (nodes that have one)
        self.pods: dict[str, tuple[str, int, int]] = {}  # pod UID -> (node, milli-CPU, MiB)
        self.requested: dict[str, list[int]] = {}  # node -> [milli-CPU, MiB] of its pods
        self.on_change: Callable[[str], None] | None = None
        self._deferred: dict[str, None] | None = None  # nodes changed while `deferred`, in order

    def room(self, node: str) -> tuple[int, int] | None:
        """(milli-CPU, MiB) the node has left for pods; None when its allocatable is unknown."""
        alloc = self.allocatable.get(node)
        if alloc is None:
            return None
        used = self.requested.get(node)
        return (alloc[0] - used[0], alloc[1] - used[1]) if used else alloc

    def gpu_model(self, node: str) -> str | None:
        """The node's `nvidia.com/gpu.product` label; None when it has none (or is unknown)."""
        return self.models.get(node)

    def gpu_free(self, node: str) -> bool:
        """A node we know (its Node object) that offers no GPU resource."""
        return node in self.allocatable and node not in self.gpu_nodes

    def _changed(self, node: str) -> None:
        if self._deferred is not None:
            self._deferred[node] = None
        elif self.on_change is not None:
            self.on_change(node)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Tell `on_change` of the nodes changed inside once each, at the end: a pod event
        changes a node's room here and its GPUs in `ClusterView`, whose rebuild of the node
        then already has the new room (`ClusterView.refresh_node` skips a scorer that does).
        Synchronous code only: an await inside would defer other tasks' changes too."""
        if self._deferred is not None:  # nested: the outer one tells
            yield
            return
        self._deferred = {}
        try:
            yield
        finally:
            changed, self._deferred = self._deferred, None
            for node in changed:
                self._changed(node)

    # -- Nodes ------------------------------------------------------------------------------

    def replace_nodes(self, objects: list[Any]) -> None:
        names = {str(_meta(o).get("name", "")) for o in objects if isinstance(o, Mapping)}
        for gone in [n for n in self.allocatable if n not in names]:
            self.delete_node({"metadata": {"name": gone}})
        for obj in objects:
            self.upsert_node(obj)

    def upsert_node(self, obj: Any) -> None:
        if not isinstance(obj, Mapping):
            return
        name = str(_meta(obj).get("name", ""))
        alloc = noderoom.node_allocatable(obj)
        if not name or alloc is None:
            return
        gpus = _has_gpus(obj)
        model = gpumodels.node_model(obj)
        if self.allocatable.get(name) == alloc and (name in self.gpu_nodes) == gpus and self.models.get(name) == model:
            return  # a status heartbeat: nothing we count changed
        self.allocatable[name] = alloc
        if gpus:
            self.gpu_nodes.add(name)
        else:
            self.gpu_nodes.discard(name)
        if model is None:
            self.models.pop(name, None)
        else:
            self.models[name] = model
        self._changed(name)

    def delete_node(self, obj: Any) -> None:
        name = str(_meta(obj).get("name", "")) if isinstance(obj, Mapping) else ""
        if self.allocatable.pop(name, None) is not None:
            self.gpu_nodes.discard(name)
            self.models.pop(name, None)
            self._changed(name)

    # -- pods -------------------------------------------------------------------------------

    def replace_pods(self, objects: list[Any]) -> None:
        present = {str(_meta(o).get("uid", "")) for o in objects if isinstance(o, Mapping)}
        for uid in [u for u in self.pods if u not in present]:
            self.forget(uid)
        for obj in objects:
            self.upsert_pod(obj)

    def upsert_pod(self, obj: Any) -> None:
        if not isinstance(obj, Mapping):
            return
        meta = _meta(obj)
        uid = str(meta.get("uid", ""))
        spec = obj.get("spec")
        status = obj.get("status")
        node = str(spec.get("nodeName") or "") if isinstance(spec, Mapping) else ""
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if not uid:
            return
        if not node or phase in TERMINAL_PHASES:
            self.forget(uid)
            return
        cpu, memory = noderoom.pod_requests(obj)
        self.assume(uid, node, cpu, memory)

    def delete_pod(self, obj: Any) -> None:
        if isinstance(obj, Mapping):
            self.forget(str(_meta(obj).get("uid", "")))

    def assume(self, uid: str, node: str, cpu: int, memory: int, *, notify: bool = True) -> None:
        """Count the pod on `node` (idempotent: a later event for it replaces the count);
        `notify` False: `on_change` is not told (the caller rebuilds the node itself)."""
        old = self.pods.get(uid)
        if old == (node, cpu, memory):
            return
        if old is not None:
            self._count(old, -1)
        entry = (node, cpu, memory)
        self.pods[uid] = entry
        self._count(entry, 1)
        if old is not None and old[0] != node:
            self._changed(old[0])
        if notify:
            self._changed(node)

    def forget(self, uid: str) -> None:
        old = self.pods.pop(uid, None)
        if old is not None:
            self._count(old, -1)
            self._changed(old[0])

    def _count(self, entry: tuple[str, int, int], sign: int) -> None:
        node, cpu, memory = entry
        used = self.requested.setdefault(node, [0, 0])
        used[0] += sign * cpu
        used[1] += sign * memory
        if used == [0, 0]:
            del self.requested[node]


def node_handler(resources: NodeResources) -> Callable[[str, Any], None]:
    def on_event(kind: str, obj: Any) -> None:
        if kind == "DELETED":
            resources.delete_node(obj)
        else:
            resources.upsert_node(obj)

    return on_event


def pod_handler(resources: NodeResources, inner: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    """The pod watch's handler counting pods here too, then `inner` (the GPU caches')."""

    def on_event(kind: str, obj: Any) -> None:
        # One rebuild of the pod's node for both: the room changes first (so `inner`'s rebuild,
        # when it makes one, has it) and `on_change` is told last, when nothing is left to do.
        with resources.deferred():
            if kind == "DELETED":
                resources.delete_pod(obj)
            else:
                resources.upsert_pod(obj)
            inner(kind, obj)

    return on_event
