"""Per-event rows binned on the 0..130 % arrived-workload grid, as the study's analysis does.

For grid point k: the mean over the rows whose arrived GPU share, rounded to a whole percent
(half to even), equals k; when no row does, the rows within k +/- 1. Allocation is rounded to
two decimals per row first. A point with no rows at all stays empty (NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharepack.tracesim.fragmentation import FloatArray
from sharepack.tracesim.replaying import RunResult

GRID = tuple(range(0, 131))


@dataclass(frozen=True, slots=True)
class Binned:
    allocation: FloatArray  # [131] GPU allocation ratio, % of all GPUs
    frag_amount: FloatArray  # [131] fragmentation, % of all GPUs
    frag_ratio: FloatArray  # [131] fragmentation, % of idle GPU milli
    free_gpus: FloatArray  # [131] fully free GPUs, % of all GPUs

    def unallocated(self, point: int) -> float:
        return float(100.0 - self.allocation[point])


def _bin(arrive: FloatArray, values: FloatArray) -> FloatArray:
    out = np.full(len(GRID), np.nan)
    for k in GRID:
        rows = values[arrive == k]
        if len(rows) == 0:
            rows = values[(arrive >= k - 1) & (arrive <= k + 1)]
        if len(rows):
            out[k] = float(rows.mean())
    return out


def bin_run(run: RunResult) -> Binned:
    total = float(run.total_gpus)
    arrive = np.round(run.arrived_milli / total / 10.0)
    alloc = np.round(run.used_milli / total / 10.0, 2)
    idle = run.idle_milli.astype(np.float64)
    ratio = np.round(100.0 * run.frag_milli / np.where(idle > 0, idle, 1.0), 2)
    amount = np.round(run.frag_milli, 2)
    return Binned(
        allocation=np.round(_bin(arrive, alloc), 2),
        frag_amount=np.round(100.0 * _bin(arrive, amount) / 1000.0 / total, 2),
        frag_ratio=_bin(arrive, ratio),
        free_gpus=np.round(100.0 * _bin(arrive, run.free_gpus.astype(np.float64)) / total, 2),
    )
