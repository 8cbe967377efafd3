"""The FGD study's node-scoring policies, re-implemented from their published definitions.

Each scorer returns integer scores (the scheduler framework's int64 scores, truncated as there),
one per feasible node; the replayer then picks uniformly among the top-scoring nodes, as
kube-scheduler's `selectHost` does. GPU choice on the chosen node is per policy, as configured in
the study's runs: Random picks a random fitting GPU, FGD its own best GPU, every other policy the
best-fit GPU (least milli left that still fits). Exclusive (whole-GPU) pods always take the first
fully free GPUs.

Constants are the study's: `MaxSpecCpu` 128 CPUs, `MaxSpecGpu` 8 GPUs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sharepack.tracesim.clusters import MAX_GPUS, Cluster, Request
from sharepack.tracesim.fragmentation import FloatArray, IntArray
from sharepack.tracesim.traces import MILLI

MAX_SPEC_CPU = 128_000.0
MAX_SPEC_GPU = 8_000.0
MAX_NODE_SCORE = 100


@dataclass(frozen=True, slots=True)
class Choice:
    node: int
    gpus: list[int] | dict[int, int]  # GPU indices (one per GPU requested), or index -> milli


Scorer = Callable[[Cluster, Request, IntArray, np.random.Generator], Choice]


def pick_top(cluster: Cluster, idx: IntArray, scores: IntArray | FloatArray) -> int:
    """Among the nodes with the highest score, the first in the cluster's node order.

    The study's scheduler (a kube-scheduler fork) breaks ties by node order, and its nodes are
    ordered by a seeded random permutation (a random prefix on each name). Uniform random tie
    breaking instead spreads FGD's many equal scores over empty nodes and costs it about 5
    points of allocation; node order reproduces the published figures.
    """
    top = idx[scores == scores.max()]
    if len(top) == 1:
        return int(top[0])
    return int(top[cluster.rank[top].argmin()])


def best_fit_gpu(cluster: Cluster, node: int, req: Request) -> list[int]:
    if not req.shared:
        return cluster.first_free(node, req.num_gpu)
    row = cluster.gpu_left[node]
    masked = np.where(row >= req.milli, row, MILLI + 1)
    return [int(masked.argmin())]


def random_gpu(cluster: Cluster, node: int, req: Request, rng: np.random.Generator) -> list[int]:
    if not req.shared:
        return cluster.first_free(node, req.num_gpu)
    fitting = np.flatnonzero(cluster.gpu_left[node] >= req.milli)
    return [int(fitting[rng.integers(len(fitting))])]


def score_random(cluster: Cluster, req: Request, idx: IntArray, rng: np.random.Generator) -> Choice:
    node = int(idx[rng.integers(len(idx))])
    return Choice(node, random_gpu(cluster, node, req, rng))


def dotprod_scores(cluster: Cluster, req: Request, idx: IntArray) -> IntArray:
    """Tetris-style dot product of free and requested (CPU, total GPU), each over the max spec.

    The study's variant scores the *smaller* product higher (1 - dot/2), so it fills nodes whose
    free vector is short in the request's direction.
    """
    n0 = cluster.cpu_left[idx] / MAX_SPEC_CPU
    n1 = cluster.gpu_total_left[idx] / MAX_SPEC_GPU
    p0 = req.cpu_score / MAX_SPEC_CPU
    p1 = req.total_milli / MAX_SPEC_GPU
    dot = n0 * p0 + n1 * p1
    score = 1.0 - dot / 2.0
    out = (MAX_NODE_SCORE * score).astype(np.int64)
    return np.where(cluster.cpu_left[idx] >= req.cpu_score, out, 0)


def score_dotprod(cluster: Cluster, req: Request, idx: IntArray, rng: np.random.Generator) -> Choice:
    node = pick_top(cluster, idx, dotprod_scores(cluster, req, idx))
    return Choice(node, best_fit_gpu(cluster, node, req))


def bestfit_scores(cluster: Cluster, req: Request, idx: IntArray) -> IntArray:
    """100 x (1 - half the CPU left after the pod / 128 CPUs - half the GPU left / 8 GPUs)."""
    cpu = (cluster.cpu_left[idx] - req.cpu_score) / MAX_SPEC_CPU * 0.5
    gpu = (cluster.gpu_total_left[idx] - req.total_milli) / MAX_SPEC_GPU * 0.5
    score = (1.0 - (0.0 + cpu + gpu)) * MAX_NODE_SCORE
    out: IntArray = np.trunc(score).astype(np.int64)
    return out


def score_bestfit(cluster: Cluster, req: Request, idx: IntArray, rng: np.random.Generator) -> Choice:
    node = pick_top(cluster, idx, bestfit_scores(cluster, req, idx))
    return Choice(node, best_fit_gpu(cluster, node, req))


def packing_scores(cluster: Cluster, req: Request, idx: IntArray) -> IntArray:
    """GPU packing: shared GPUs first (fuller is better), then free GPUs of used nodes, then idle nodes."""
    if req.num_gpu == 0:
        return np.zeros(len(idx), dtype=np.int64)
    free = cluster.fully_free(idx)
    ngpu = cluster.num_gpu[idx]
    idle_node = np.maximum(MAX_NODE_SCORE // 3 - free, free)
    if req.shared:
        left = cluster.gpu_left[idx]
        tightest = np.where(left >= req.milli, left, MILLI + 1).min(axis=1)
        used_free_gpu = np.full(len(idx), max(MAX_NODE_SCORE // 2 - 1, MAX_NODE_SCORE // 3))
        shared_gpu = np.maximum(MAX_NODE_SCORE - (tightest * 100 // MILLI) // 10, MAX_NODE_SCORE // 2)
        busy = np.where(tightest == MILLI, used_free_gpu, shared_gpu)
    else:
        busy = np.full(len(idx), max(MAX_NODE_SCORE // 2 - req.num_gpu, MAX_NODE_SCORE // 3))
    out: IntArray = np.where(free == ngpu, idle_node, busy).astype(np.int64)
    return out


def score_packing(cluster: Cluster, req: Request, idx: IntArray, rng: np.random.Generator) -> Choice:
    node = pick_top(cluster, idx, packing_scores(cluster, req, idx))
    return Choice(node, best_fit_gpu(cluster, node, req))


def clustering_scores(cluster: Cluster, req: Request, idx: IntArray) -> IntArray:
    """GPU clustering: put pods of one kind (share, 1-GPU, 2-GPU, ...) together, fuller nodes first."""
    if req.num_gpu == 0:
        return np.zeros(len(idx), dtype=np.int64)
    aff = cluster.affinity[idx]
    kinds = (aff > 0).sum(axis=1)
    has = aff[:, req.affinity] > 0
    quarter = MAX_NODE_SCORE // 4
    base = quarter * (int(MAX_SPEC_GPU) - cluster.gpu_total_left[idx]) // int(MAX_SPEC_GPU)
    offset = np.where(has, np.where(kinds == 1, 3 * quarter, 2 * quarter), np.where(kinds == 0, quarter, 0))
    out: IntArray = (base + offset).astype(np.int64)
    return out


def score_clustering(cluster: Cluster, req: Request, idx: IntArray, rng: np.random.Generator) -> Choice:
    node = pick_top(cluster, idx, clustering_scores(cluster, req, idx))
    return Choice(node, best_fit_gpu(cluster, node, req))


def _sigmoid_score(delta: FloatArray) -> IntArray:
    # Snap float noise so that "no change" scores exactly 50, as the study's exact sums do.
    delta = np.where(np.abs(delta) < 1e-6, 0.0, delta)
    # Clipped: beyond |50| the truncated score is 0 or 100 anyway, and exp() would overflow.
    out: IntArray = (1.0 / (1.0 + np.exp(np.clip(-delta / 1000.0, -50.0, 50.0))) * MAX_NODE_SCORE).astype(np.int64)
    return out


def frag_deltas(cluster: Cluster, req: Request, idx: IntArray) -> tuple[IntArray, IntArray, FloatArray]:
    """(node position in idx, GPU index or -1, frag before - frag after) of every placement FGD
    considers: each GPU that can hold a shared pod, or the node as a whole for the others."""
    m = cluster.model
    before = cluster.frag[idx]
    if req.shared:
        left = cluster.gpu_left[idx]
        pos, gpu = np.nonzero(left >= req.milli)
        nodes = idx[pos]
        a = left[pos, gpu][:, None]
        after_a = a - req.milli
        ms = m.milli[None, :]
        fits = cluster.fits[nodes] - (a >= ms) + (after_a >= ms)
        small = cluster.small[nodes] - np.where(a < ms, a, 0) + np.where(after_a < ms, after_a, 0)
        total = cluster.gpu_total_left[nodes] - req.milli
        cpu = cluster.cpu_left[nodes] - req.cpu_score
        after = m.frag(cpu, fits, small, total, m.access[nodes])
        return pos.astype(np.int64), gpu.astype(np.int64), before[pos] - after
    k = req.num_gpu
    fits = cluster.fits[idx] - k * m.gpu_shape[None, :]
    total = cluster.gpu_total_left[idx] - k * MILLI
    cpu = cluster.cpu_left[idx] - req.cpu_score
    after = m.frag(cpu, fits, cluster.small[idx], total, m.access[idx])
    pos = np.arange(len(idx), dtype=np.int64)
    return pos, np.full(len(idx), -1, dtype=np.int64), before - after


def fgd_score(delta: FloatArray) -> IntArray:
    """100 x sigmoid(delta / 1000), truncated: the placement that grows fragmentation least wins."""
    return _sigmoid_score(delta)


def choose_placement(
    cluster: Cluster, req: Request, idx: IntArray, pos: IntArray, gpu: IntArray, score: IntArray | FloatArray
) -> Choice:
    """Best node by its best placement (ties: node order), and on it the lowest GPU index among
    its best placements (candidates come sorted by node, then GPU)."""
    node_best = np.full(len(idx), -np.inf)
    np.maximum.at(node_best, pos, score.astype(np.float64))
    node = pick_top(cluster, idx, node_best)
    if not req.shared:
        return Choice(node, cluster.first_free(node, req.num_gpu))
    here = int(np.flatnonzero(idx == node)[0])
    mine = (pos == here) & (score == node_best[here])
    return Choice(node, [int(gpu[mine][0])])


def score_fgd(cluster: Cluster, req: Request, idx: IntArray, rng: np.random.Generator) -> Choice:
    pos, gpu, delta = frag_deltas(cluster, req, idx)
    return choose_placement(cluster, req, idx, pos, gpu, fgd_score(delta))


BASELINES: dict[str, Scorer] = {
    "random": score_random,
    "dotprod": score_dotprod,
    "clustering": score_clustering,
    "packing": score_packing,
    "bestfit": score_bestfit,
    "fgd": score_fgd,
}

# The cached results name them so.
PUBLISHED_NAMES: dict[str, str] = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "clustering": "03-GpuClustering",
    "packing": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}

assert MAX_GPUS == 8
