"""The simulated cluster: per-node CPU, memory and per-GPU milli left, as numpy arrays.

Fragmentation is kept per node (counts per typical shape plus the weighted amount) and updated
only for the node a pod lands on, so a metric row after every pod costs O(shapes), not O(nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharepack.tracesim.fragmentation import BoolArray, FloatArray, FragModel, IntArray
from sharepack.tracesim.traces import MILLI, NodeList, PodList, accessible
from sharepack.tracesim.workloads import scoring_cpu, scoring_memory

MAX_GPUS = 8
SHARE_TAG = 0  # affinity column of GPU-share pods; column k holds k-GPU pods (k = 1..8)


@dataclass(frozen=True, slots=True)
class Request:
    """One arriving pod, decoded once."""

    index: int  # position in the arrival sequence
    cpu: int  # as requested (feasibility)
    cpu_score: int  # as scored (zero counts as 100m)
    memory: int
    num_gpu: int
    milli: int
    spec: str

    @property
    def total_milli(self) -> int:
        return self.num_gpu * self.milli

    @property
    def shared(self) -> bool:
        return self.num_gpu == 1 and self.milli < MILLI

    @property
    def affinity(self) -> int:
        """Affinity column for GPU clustering (-1: CPU pod)."""
        if self.num_gpu == 0:
            return -1
        return SHARE_TAG if self.shared else min(self.num_gpu, MAX_GPUS)

    @property
    def pod_class(self) -> str:
        if self.num_gpu == 0:
            return "cpu"
        if self.shared:
            return "share"
        return f"{self.num_gpu}gpu" if self.num_gpu in (1, 2, 4, 8) else "other"


def requests_of(pods: PodList) -> list[Request]:
    return [
        Request(
            index=i,
            cpu=int(pods.cpu[i]),
            cpu_score=scoring_cpu(int(pods.cpu[i])),
            memory=int(pods.memory[i]),
            num_gpu=int(pods.num_gpu[i]),
            milli=int(pods.milli[i]),
            spec=pods.spec[i],
        )
        for i in range(len(pods))
    ]


class Cluster:
    def __init__(self, nodes: NodeList, frag_model: FragModel, rank: IntArray | None = None) -> None:
        self.nodes = nodes
        # Node order for breaking score ties (lower first); identity when not given.
        self.rank: IntArray = np.arange(len(nodes), dtype=np.int64) if rank is None else rank
        self.model = frag_model
        n = len(nodes)
        self.size = n
        self.num_gpu: IntArray = nodes.num_gpu.copy()
        self.cpu_cap: IntArray = nodes.cpu.copy()
        self.cpu_left: IntArray = nodes.cpu.copy()
        self.mem_left: IntArray = nodes.memory.copy()
        # Requests as kube-scheduler's LeastAllocated/MostAllocated count them (a zero request
        # counts as its default): `kubescheduler` scores with these.
        self.cpu_nonzero: IntArray = np.zeros(n, dtype=np.int64)
        self.mem_nonzero: IntArray = np.zeros(n, dtype=np.int64)
        present = np.arange(MAX_GPUS)[None, :] < self.num_gpu[:, None]
        self.present: BoolArray = present
        self.gpu_left: IntArray = np.where(present, MILLI, 0).astype(np.int64)
        self.gpu_total_left: IntArray = self.gpu_left.sum(axis=1)
        self.affinity: IntArray = np.zeros((n, MAX_GPUS + 1), dtype=np.int64)
        self.fits, self.small = frag_model.counts(self.gpu_left)
        self.frag: FloatArray = frag_model.frag(
            self.cpu_left, self.fits, self.small, self.gpu_total_left, frag_model.access
        )
        self.capacity_milli = int(self.num_gpu.sum()) * MILLI
        self.used_milli = 0
        self.frag_total = float(self.frag.sum())
        self.free_gpus = int(self.num_gpu.sum())
        self._spec_masks: dict[str, BoolArray] = {}

    def spec_mask(self, spec: str) -> BoolArray:
        """Nodes with GPUs whose model the pod admits."""
        mask = self._spec_masks.get(spec)
        if mask is None:
            mask = np.array(
                [g > 0 and accessible(m, spec) for g, m in zip(self.num_gpu, self.nodes.model, strict=True)],
                dtype=np.bool_,
            ).reshape(self.size)
            self._spec_masks[spec] = mask
        return mask

    def feasible(self, req: Request, *, replicas: int | None = None) -> IntArray:
        """Indices of nodes that pass the study's filters: CPU, memory, GPU model, GPU share.

        With `replicas`, the GPU test is the replica model's instead: enough free replicas on
        the node, wherever they are.
        """
        ok = (self.cpu_left >= req.cpu) & (self.mem_left >= req.memory)
        if req.num_gpu > 0:
            ok &= self.spec_mask(req.spec)
            if replicas is None:
                ok &= (self.gpu_left >= req.milli).sum(axis=1) >= req.num_gpu
            else:
                need = req.num_gpu * -((-req.milli * replicas) // MILLI)
                ok &= ((self.gpu_left * replicas) // MILLI).sum(axis=1) >= need
        return np.flatnonzero(ok).astype(np.int64)

    def fully_free(self, idx: IntArray) -> IntArray:
        counted: IntArray = (self.gpu_left[idx] == MILLI).sum(axis=1)
        return counted

    def place(
        self, node: int, req: Request, gpus: list[int] | dict[int, int], *, charged: int | None = None
    ) -> None:
        """Bind `req` on `node`; `gpus` lists GPU indices (one per GPU requested) or maps index -> milli.

        `charged`: GPU milli counted as allocated (default: what the GPUs give); the replica model
        charges what the pod asked for, so rounding up to whole replicas shows as idle.
        """
        take = gpus if isinstance(gpus, dict) else {g: req.milli for g in gpus}
        self.cpu_left[node] -= req.cpu
        self.mem_left[node] -= req.memory
        self.cpu_nonzero[node] += req.cpu_score
        self.mem_nonzero[node] += scoring_memory(req.memory)
        row = self.gpu_left[node]
        before_free = int((row == MILLI).sum())
        for g, milli in take.items():
            if not self.present[node, g] or row[g] < milli:
                raise AssertionError(f"placement of pod {req.index} on node {node} GPU {g} over capacity")
            row[g] -= milli
        used = sum(take.values())
        self.used_milli += used if charged is None else charged
        self.gpu_total_left[node] -= used
        self.free_gpus += int((row == MILLI).sum()) - before_free
        if req.affinity >= 0:
            self.affinity[node, req.affinity] += 1
        self._refresh(node)

    def _refresh(self, node: int) -> None:
        fits, small = self.model.counts(self.gpu_left[node : node + 1])
        self.fits[node] = fits[0]
        self.small[node] = small[0]
        new = self.model.frag(
            self.cpu_left[node : node + 1],
            fits,
            small,
            self.gpu_total_left[node : node + 1],
            self.model.access[node : node + 1],
        )[0]
        self.frag_total += float(new) - float(self.frag[node])
        self.frag[node] = new

    def first_free(self, node: int, count: int) -> list[int]:
        """The first `count` fully free GPUs by index (the study's exclusive-GPU choice)."""
        free = np.flatnonzero(self.gpu_left[node] == MILLI)
        return [int(g) for g in free[:count]]
