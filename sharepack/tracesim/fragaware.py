"""`ours`: the fragmentation-aware node policy of `common.fragmentation`, in the simulator.

The policy itself (the measure, the gradient, FGD's truncated score, then the GPU left with the
least spare share) lives in `common.fragmentation`, pure Python, and is what the extender runs
as `--node-policy fragaware`; this module only feeds it the simulated cluster:

* the typical workload is the study's (shapes with CPU and GPU model), so a node's `admitted`
  mask carries what the common measure cannot see: the node's GPU model admits the shape, and
  its CPU left covers the shape's CPU (before the pod lands, and after it, as FGD counts it);
* ties go to the scheduler's node order, as for every policy here.

Speed: a node's rank for a request depends only on that node's state, and a pod changes one
node. Ranks are kept per request kind (CPU, share, GPU count) in arrays and recomputed only for
nodes that changed since the kind was last ranked; `common.fragmentation` memoises per free-share
vector underneath.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharepack.common import fragmentation
from sharepack.tracesim.baselines import Choice, pick_top
from sharepack.tracesim.clusters import Cluster, Request
from sharepack.tracesim.fragmentation import FloatArray, FragModel, IntArray
from sharepack.tracesim.traces import MILLI

NAME = "ours"


def common_workload(model: FragModel) -> fragmentation.TypicalWorkload:
    """The study's typical workload as `common.fragmentation` shapes (same order and weights,
    the GPU models each allows)."""
    specs = model.spec or ("",) * len(model.cpu)
    shapes = tuple(
        fragmentation.Shape(int(n), int(m), float(f), cpu=int(c), models=frozenset(x for x in s.split("|") if x))
        for n, m, f, c, s in zip(model.num_gpu, model.milli, model.freq, model.cpu, specs, strict=True)
    )
    return fragmentation.TypicalWorkload(shapes, source="trace typical workload")


def access_masks(model: FragModel) -> list[int]:
    """Per node, the shapes its GPU model admits, as an `admitted` bit mask."""
    return [sum(1 << s for s, ok in enumerate(row) if ok) for row in model.access.tolist()]


@dataclass(slots=True)
class _Ranks:
    rank: FloatArray  # [N] the node's best placement_rank for this request kind
    gpu: IntArray  # [N] the GPU of that placement (-1: whole GPUs / none)
    seen: IntArray  # [N] node version the entry was computed at


class _Run:
    """Per-run state: node versions, per-kind ranks, admitted masks."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        m = cluster.model
        self.measure = fragmentation.Fragmentation(common_workload(m))
        self.access = access_masks(m)
        self.version = np.zeros(cluster.size, dtype=np.int64)
        self.gpu_seen = cluster.gpu_left.copy()
        self.cpu_seen = cluster.cpu_left.copy()
        self.kinds: dict[tuple[int, int, int], _Ranks] = {}

    def _sync(self) -> None:
        c = self.cluster
        changed = np.flatnonzero((c.gpu_left != self.gpu_seen).any(axis=1) | (c.cpu_left != self.cpu_seen))
        if len(changed):
            self.version[changed] += 1
            self.gpu_seen[changed] = c.gpu_left[changed]
            self.cpu_seen[changed] = c.cpu_left[changed]

    def _rank(self, node: int, req: Request) -> tuple[float, int]:
        c = self.cluster
        free = c.gpu_left[node, : c.num_gpu[node]].tolist()
        cpu = int(c.cpu_left[node])
        # The study's shapes carry CPU, not memory: memory admits every shape here.
        before = self.access[node] & self.measure.admitted(cpu, 0)
        after = self.access[node] & self.measure.admitted(cpu - req.cpu_score, 0)
        if req.shared:
            best = self.measure.best_share_gpu(free, req.milli, before, after)
            assert best is not None, "feasible node without room for the share"
            return best
        taken = list(free)
        need = req.num_gpu
        for g, left in enumerate(taken):
            if need and left == MILLI:
                taken[g] = 0
                need -= 1
        grad = self.measure.gradient(free, taken, before, after)
        return fragmentation.placement_rank(grad, 0), -1

    def choose(self, req: Request, idx: IntArray) -> Choice:
        self._sync()
        kind = (req.cpu_score, req.milli, req.num_gpu)
        ranks = self.kinds.get(kind)
        if ranks is None:
            n = self.cluster.size
            ranks = self.kinds[kind] = _Ranks(
                np.zeros(n, dtype=np.float64), np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
            )
        for node in idx[ranks.seen[idx] != self.version[idx]].tolist():
            ranks.rank[node], ranks.gpu[node] = self._rank(node, req)
            ranks.seen[node] = self.version[node]
        node = pick_top(self.cluster, idx, ranks.rank[idx])
        if req.shared:
            return Choice(node, [int(ranks.gpu[node])])
        return Choice(node, self.cluster.first_free(node, req.num_gpu))


class FragAwareScorer:
    """The `ours` scorer; keeps its incremental state for the cluster of the current run."""

    def __init__(self) -> None:
        self._run: _Run | None = None

    def __call__(self, cluster: Cluster, req: Request, idx: IntArray, rng: np.random.Generator) -> Choice:
        run = self._run
        if run is None or run.cluster is not cluster:
            run = self._run = _Run(cluster)
        return run.choose(req, idx)
