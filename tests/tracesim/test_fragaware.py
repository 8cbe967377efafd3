"""`ours` runs common.fragmentation: the measure agrees with the simulator's numpy one, and the
policy ranks FGD's integer score first, then the tightest GPU, never the other way round."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from common import fragmentation as fr
from tracesim import fragaware, policies, replaying, traces, workloads
from tracesim.fragmentation import FragModel
from tracesim.workloads import Shape, TypicalWorkload

# A typical workload with CPU-only, share, whole and multi-GPU shapes, and model constraints.
TYPICAL = TypicalWorkload(
    shapes=(
        Shape(cpu=4000, milli=810, num_gpu=1, spec=""),
        Shape(cpu=8000, milli=1000, num_gpu=1, spec=""),
        Shape(cpu=2000, milli=0, num_gpu=0, spec=""),
        Shape(cpu=3000, milli=470, num_gpu=1, spec="V100M32|P100"),
        Shape(cpu=32000, milli=1000, num_gpu=8, spec=""),
        Shape(cpu=1000, milli=230, num_gpu=1, spec="T4"),
        Shape(cpu=16000, milli=1000, num_gpu=2, spec=""),
    ),
    freq=np.array([0.3, 0.25, 0.1, 0.12, 0.05, 0.08, 0.1]),
)
MODELS = ["V100M32", "P100", "T4", "A10", ""]


def random_nodes(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    num_gpu = rng.choice([1, 2, 4, 8], size=n)
    # Mostly the values a trace leaves: whole, empty, and leftovers of common shares.
    values = np.array([1000, 0, 190, 530, 770, 500, 90, 1000, 1000, 680])
    left = np.where(np.arange(8)[None, :] < num_gpu[:, None], rng.choice(values, size=(n, 8)), 0)
    left = np.where(rng.random((n, 8)) < 0.2, rng.integers(0, 1001, size=(n, 8)), left) * (left > 0)
    cpu = rng.integers(0, 40_000, size=n)
    model = rng.choice(MODELS, size=n)
    return num_gpu, left.astype(np.int64), cpu.astype(np.int64), model


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_common_measure_agrees_with_the_simulators_on_random_nodes(seed: int) -> None:
    num_gpu, left, cpu, model = random_nodes(seed, 300)
    nodes = traces.NodeList(
        source="random", names=tuple(f"n{i}" for i in range(len(cpu))), cpu=cpu, memory=np.zeros(len(cpu), dtype=np.int64), num_gpu=num_gpu.astype(np.int64),
        model=tuple(str(m) for m in model),
    )
    frag_model = FragModel.build(TYPICAL, nodes)
    fits, small = frag_model.counts(left)
    expected = frag_model.frag(cpu, fits, small, left.sum(axis=1), frag_model.access)
    measure = fr.Fragmentation(fragaware.common_workload(frag_model))
    cpu_shapes = [int(c) for c in frag_model.cpu]
    for i in range(len(cpu)):
        admitted = sum(
            1 << s for s, ok in enumerate(frag_model.access[i]) if ok and cpu[i] >= cpu_shapes[s]
        )
        got = measure.amount(left[i, : num_gpu[i]].tolist(), admitted)
        assert got == pytest.approx(expected[i], rel=1e-12, abs=1e-9), (i, left[i], cpu[i], model[i])


def test_ours_places_a_small_trace_and_is_deterministic(
    write: Callable[[str, str], Path],
    pod_lines: Callable[[list[tuple[str, int, int, int, int, str]]], str],
    node_lines: Callable[[list[tuple[str, int, int, int, str]]], str],
) -> None:
    pods = traces.load_pods(write("pods.csv", pod_lines(
        [(f"p{i:02d}", 1000, 1000, g, m, "") for i, (g, m) in enumerate(
            [(1, 500), (1, 500), (1, 1000), (2, 1000), (1, 250), (0, 0), (1, 750), (1, 250)] * 3)]
    )))  # fmt: skip
    nodes = traces.load_nodes(write("nodes.csv", node_lines(
        [(f"n{i}", 64000, 262144, g, "V100M32") for i, g in enumerate([8, 4, 2, 2])]
    )))  # fmt: skip
    frag_model = FragModel.build(workloads.typical_workload(pods), nodes)
    order = workloads.arrival_order(pods, nodes, 42)
    spec = policies.resolve(fragaware.NAME)
    runs = [replaying.replay(pods, nodes, frag_model, spec, seed=42, order=order) for _ in range(2)]
    assert runs[0].used_milli.tolist() == runs[1].used_milli.tolist()
    assert runs[0].used_milli[-1] > 0
