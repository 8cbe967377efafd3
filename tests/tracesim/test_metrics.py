"""Binning per-event rows on the 0..130 % grid, as the study's merge scripts do."""

from __future__ import annotations

import math

import numpy as np

from sharepack.tracesim.metrics import bin_run
from sharepack.tracesim.replaying import RunResult


def run(arrived: list[int], used: list[int], total_gpus: int = 10) -> RunResult:
    return RunResult(
        policy="x",
        seed=1,
        total_gpus=total_gpus,
        arrived_milli=np.array(arrived, dtype=np.int64),
        used_milli=np.array(used, dtype=np.int64),
        frag_milli=np.zeros(len(arrived)),
        free_gpus=np.zeros(len(arrived), dtype=np.int64),
    )


def test_rows_at_a_grid_point_are_averaged() -> None:
    b = bin_run(run([0, 100, 100, 1000], [0, 100, 50, 1000]))  # 10 GPUs: 100 milli = 1 %
    assert b.allocation[1] == 0.75
    assert b.allocation[10] == 10.0
    assert b.unallocated(10) == 90.0


def test_a_point_without_rows_takes_its_neighbours() -> None:
    b = bin_run(run([0, 100, 300], [0, 100, 300]))
    assert b.allocation[2] == 2.0  # rows at 1 % and 3 %
    assert math.isnan(b.allocation[50])


def test_arrived_shares_round_half_to_even() -> None:
    b = bin_run(run([0, 250, 350], [0, 250, 350]))  # 2.5 % -> 2, 3.5 % -> 4
    assert b.allocation[2] == 2.5
    assert b.allocation[4] == 3.5
