"""`ours` runs common.fragmentation: the measure agrees with the simulator's numpy one, the
policy ranks FGD's integer score first, then the tightest GPU, never the other way round (checked
step by step against a from-scratch ranking), and on the default trace it keeps the rank order
the README reports against the baselines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from sharepack.common import fragmentation as fr
from sharepack.tracesim import fragaware, policies, replaying, running, traces, workloads
from sharepack.tracesim.baselines import Choice
from sharepack.tracesim.clusters import Cluster, Request
from sharepack.tracesim.fragmentation import FragModel
from sharepack.tracesim.traces import MILLI
from sharepack.tracesim.workloads import Shape, TypicalWorkload

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
        # The extender's rule (the node's model label against the shapes' models) is the study's.
        extenders = measure.access(str(model[i])) & measure.admitted(int(cpu[i]), 0)
        assert measure.amount(left[i, : num_gpu[i]].tolist(), extenders) == got


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


def every_eighth_node() -> traces.NodeList:
    """The default trace's node list, thinned: the arrival order scales the pods to it, so a run
    goes through the same filling and fragmenting regime at an eighth of the cost."""
    nodes = traces.load_nodes()
    keep = np.arange(0, len(nodes), 8)
    return traces.NodeList(
        nodes.source, tuple(nodes.names[i] for i in keep), nodes.cpu[keep], nodes.memory[keep],
        nodes.num_gpu[keep], tuple(nodes.model[i] for i in keep),
    )  # fmt: skip


class FromScratch:
    """`ours` as its docstring states it, recomputed for every node and GPU at every pod: the
    placement with the highest (FGD's truncated score, least share left on the GPU), compared
    as a pair; ties to the scheduler's node order, then the lowest GPU index."""

    def __init__(self, cluster: Cluster) -> None:
        m = cluster.model
        self.measure = fr.Fragmentation(fragaware.common_workload(m))
        self.shape_cpu = [int(c) for c in m.cpu]
        self.access = [sum(1 << s for s, ok in enumerate(row) if ok) for row in m.access.tolist()]

    def _admitted(self, node: int, cpu_left: int) -> int:
        return self.access[node] & sum(1 << s for s, need in enumerate(self.shape_cpu) if cpu_left >= need)

    def choice(self, cluster: Cluster, req: Request, idx: npt.NDArray[np.int64]) -> tuple[int, list[int]]:
        best: tuple[tuple[int, int], int, int, list[int]] | None = None  # key, node rank, node, gpus
        for node in idx.tolist():
            free = cluster.gpu_left[node, : cluster.num_gpu[node]].tolist()
            cpu = int(cluster.cpu_left[node])
            before, after = self._admitted(node, cpu), self._admitted(node, cpu - req.cpu_score)
            if req.shared:
                options = [(g, left) for g, left in enumerate(free) if left >= req.milli]
            else:
                whole = [g for g, left in enumerate(free) if left == MILLI][: req.num_gpu]
                options = [(-1, 0)] if len(whole) == req.num_gpu else []
            for g, left in options:
                taken = list(free)
                if g >= 0:
                    taken[g] -= req.milli
                else:
                    for w in whole:
                        taken[w] = 0
                score = fr.gradient_score(self.measure.gradient(free, taken, before, after))
                key = (score, -(left - req.milli) if g >= 0 else 0)
                candidate = (key, int(cluster.rank[node]), node, [g] if g >= 0 else whole)
                if best is None or key > best[0] or (key == best[0] and candidate[1] < best[1]):
                    best = candidate
        assert best is not None
        return best[2], best[3]


def test_ours_takes_the_best_fgd_score_then_the_tightest_gpu_at_every_step() -> None:
    # Any drift between the incremental per-kind ranks and a fresh ranking, or a leftover
    # weight large enough to outvote one point of FGD's score, shows as a different choice.
    experiment = running.Experiment.build(traces.load_pods(), every_eighth_node())
    ours = fragaware.FragAwareScorer()
    checked = {"share": 0, "whole": 0}
    oracle: FromScratch | None = None

    def checking(cluster: Cluster, req: Request, idx: npt.NDArray[np.int64], rng: np.random.Generator) -> Choice:
        nonlocal oracle
        oracle = oracle or FromScratch(cluster)
        got = ours(cluster, req, idx, rng)
        if req.num_gpu:
            assert (got.node, list(got.gpus)) == oracle.choice(cluster, req, idx), req
            checked["share" if req.shared else "whole"] += 1
        return got

    spec = policies.PolicySpec(fragaware.NAME, checking)
    run = experiment.run(spec, running.FIRST_SEED)
    assert run.binned.unallocated(100) < 10  # the run got far enough to fragment
    assert checked["share"] > 300 and checked["whole"] > 300, checked


def test_ours_keeps_its_rank_order_against_the_baselines_on_the_default_trace() -> None:
    # The README's table (study scheduler model, full node list, ten seeds): ours 4.72 %
    # unallocated at 100 % arrived, FGD 4.78, packed 8.26, Random 13.7, distributed 17.60. Here
    # three seeds on an eighth of the nodes, every policy in the study model (packed and
    # distributed default to the kube model now): the same order, and ours within noise of FGD
    # (measured 5.41 vs 5.33; distributed 17.4). packed was 7.86 before its CPU term (issue 19,
    # common.stranding); with it 5.28, level with ours.
    experiment = running.Experiment.build(traces.load_pods(), every_eighth_node())
    seeds = range(running.FIRST_SEED, running.FIRST_SEED + 3)

    def unallocated(name: str, seed: int) -> float:
        spec = policies.resolve(name, scheduler=policies.SchedulerModel.STUDY)
        return float(experiment.run(spec, seed).binned.unallocated(100))

    mean = {
        name: float(np.mean([unallocated(name, seed) for seed in seeds]))
        for name in ("ours", "fgd", "packed", "random", "distributed")
    }
    assert max(mean["ours"], mean["packed"]) < mean["random"] < mean["distributed"], mean
    assert abs(mean["ours"] - mean["fgd"]) < 0.5, mean
    assert mean["packed"] < 6.5, mean  # the CPU term: 7.86 without it
