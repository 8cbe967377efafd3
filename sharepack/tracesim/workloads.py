"""The arrival sequence of one run, and the typical workload that defines fragmentation.

Both follow the FGD study's simulator (ATC'23, hkust-adsl/kubernetes-scheduler-simulator):

* Arrival: pods sorted by name, shuffled with the run's seed; then the workload is *tuned* to
  `ratio` x the cluster's GPU capacity. Tuning up samples pods with replacement (uniformly, from
  the name-sorted list) and appends them after the shuffled originals, stopping at the first
  sample whose per-GPU share would overshoot the target (the study compares the per-GPU share,
  not the pod's total, at that point; we do the same). Tuning down drops random pods until the
  total fits.
* Typical workload: the pod shapes (CPU, per-GPU share, GPU count, GPU model constraint) of the
  original list, most frequent first, taken until they cover `threshold` of the pods, their
  frequencies renormalised to sum to 1. CPU-only pods count as shapes too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sharepack.tracesim.traces import IntArray, NodeList, PodList

TUNE_RATIO = 1.3
TYPICAL_THRESHOLD = 0.95
DEFAULT_CPU_REQUEST = 100  # kube-scheduler counts a zero CPU request as 100m when scoring
DEFAULT_MEMORY_REQUEST = 200  # and a zero memory request as 200 MB (MiB here: the trace's unit)


def scoring_cpu(cpu: int) -> int:
    return cpu if cpu > 0 else DEFAULT_CPU_REQUEST


def scoring_memory(memory: int) -> int:
    return memory if memory > 0 else DEFAULT_MEMORY_REQUEST


def arrival_order(pods: PodList, nodes: NodeList, seed: int, ratio: float = TUNE_RATIO) -> IntArray:
    """Indices into `pods` (name-sorted) in arrival order, tuned to `ratio` x GPU capacity."""
    rng = np.random.default_rng(seed)
    order = [int(i) for i in rng.permutation(len(pods))]
    total = int(pods.total_milli.sum())
    target = ratio * float(nodes.total_gpus * 1000)
    if ratio <= 0 or total == target:
        return np.array(order, dtype=np.int64)
    if total > target:
        while total > target and order:
            victim = int(rng.integers(len(order)))
            total -= int(pods.total_milli[order[victim]])
            del order[victim]
        return np.array(order, dtype=np.int64)
    while True:
        idx = int(rng.integers(len(pods)))
        if total + int(pods.milli[idx]) > target:
            break
        total += int(pods.total_milli[idx])
        order.append(idx)
    return np.array(order, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Shape:
    cpu: int  # as scored (zero counts as 100m)
    milli: int
    num_gpu: int
    spec: str


@dataclass(frozen=True, slots=True)
class TypicalWorkload:
    shapes: tuple[Shape, ...]
    freq: npt.NDArray[np.float64]  # sums to 1

    def __len__(self) -> int:
        return len(self.shapes)


def typical_workload(pods: PodList, threshold: float = TYPICAL_THRESHOLD) -> TypicalWorkload:
    counts: Counter[Shape] = Counter(
        Shape(scoring_cpu(int(c)), int(m), int(n), s)
        for c, m, n, s in zip(pods.cpu, pods.milli, pods.num_gpu, pods.spec, strict=True)
    )
    total = sum(counts.values())
    # Most frequent first; equal counts: the larger shape first (the study's reverse order).
    ranked = sorted(
        counts.items(),
        key=lambda kv: (kv[1], kv[0].cpu, kv[0].milli, kv[0].num_gpu, kv[0].spec),
        reverse=True,
    )
    chosen: list[tuple[Shape, int]] = []
    covered = 0
    for shape, count in ranked:
        if covered >= threshold * total:
            break
        chosen.append((shape, count))
        covered += count
    freq = np.array([c / covered for _, c in chosen], dtype=np.float64)
    return TypicalWorkload(shapes=tuple(s for s, _ in chosen), freq=freq)
