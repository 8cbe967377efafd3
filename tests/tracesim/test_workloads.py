"""Arrival order (seeded shuffle + tuning to 130 %) and the typical workload."""

from __future__ import annotations

import numpy as np
import pytest

from sharepack.tracesim import traces, workloads


@pytest.fixture(scope="module")
def default() -> tuple[traces.PodList, traces.NodeList]:
    return traces.load_pods(), traces.load_nodes()


def test_the_order_is_a_seeded_shuffle_of_all_pods_then_samples(default: tuple[traces.PodList, traces.NodeList]) -> None:
    pods, nodes = default
    a = workloads.arrival_order(pods, nodes, 42)
    assert np.array_equal(a, workloads.arrival_order(pods, nodes, 42))
    assert not np.array_equal(a[: len(pods)], workloads.arrival_order(pods, nodes, 43)[: len(pods)])
    assert sorted(a[: len(pods)].tolist()) == list(range(len(pods)))


@pytest.mark.parametrize("seed", [42, 47])
def test_tuning_up_stops_just_below_130_percent_of_capacity(default: tuple[traces.PodList, traces.NodeList], seed: int) -> None:
    pods, nodes = default
    order = workloads.arrival_order(pods, nodes, seed)
    total = int(pods.total_milli[order].sum())
    target = 1.3 * nodes.total_gpus * 1000
    assert target - 8000 < total <= target


def test_tuning_down_drops_pods_until_the_total_fits(default: tuple[traces.PodList, traces.NodeList]) -> None:
    pods, nodes = default
    order = workloads.arrival_order(pods, nodes, 42, ratio=0.5)
    assert int(pods.total_milli[order].sum()) <= 0.5 * nodes.total_gpus * 1000
    assert len(set(order.tolist())) == len(order)


def test_typical_workload_covers_95_percent_of_pods_with_frequent_shapes_first(
    default: tuple[traces.PodList, traces.NodeList],
) -> None:
    pods, _ = default
    typical = workloads.typical_workload(pods)
    assert len(typical) == 35
    assert typical.freq.sum() == pytest.approx(1.0)
    assert list(typical.freq) == sorted(typical.freq, reverse=True)
    first = typical.shapes[0]
    assert (first.cpu, first.milli, first.num_gpu) == (3152, 810, 1)
    assert any(s.milli == 0 for s in typical.shapes), "CPU-only shapes are part of the typical workload"


def test_equal_counts_rank_the_larger_shape_first(small: tuple[traces.PodList, traces.NodeList]) -> None:
    pods, _ = small
    typical = workloads.typical_workload(pods, threshold=1.0)
    assert typical.shapes[0].milli == 500  # two pods of 4000m x 500
    singles = [(s.cpu, s.milli) for s in typical.shapes[1:]]
    assert singles == sorted(singles, reverse=True)
