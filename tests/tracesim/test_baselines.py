"""The study's policies on a four-node cluster: a (T4 x4), b (T4 x4), c (V100M32 x8), d (P100 x2)."""

from __future__ import annotations

import numpy as np
import pytest

from sharepack.tracesim import baselines
from sharepack.tracesim.clusters import Cluster, Request

A, B, C, D = 0, 1, 2, 3


def req(milli: int = 500, num: int = 1, cpu: int = 4000, spec: str = "", memory: int = 1024) -> Request:
    return Request(index=0, cpu=cpu, cpu_score=cpu, memory=memory, num_gpu=num if milli else 0, milli=milli, spec=spec)


def choose(policy: str, cluster: Cluster, r: Request) -> baselines.Choice:
    idx = cluster.feasible(r)
    return baselines.BASELINES[policy](cluster, r, idx, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("r", "expected"),
    [
        pytest.param(req(spec="V100M32"), [C], id="a model constraint admits only matching nodes"),
        pytest.param(req(cpu=40000), [C], id="CPU requests filter nodes"),
        pytest.param(req(memory=200000), [C], id="memory requests filter nodes"),
        pytest.param(req(milli=1000, num=8), [C], id="multi-GPU pods need that many free GPUs"),
        pytest.param(req(milli=0, cpu=1000), [A, B, C, D], id="CPU pods fit anywhere with CPU"),
    ],
)
def test_feasibility_follows_the_studys_filters(small_cluster: Cluster, r: Request, expected: list[int]) -> None:
    assert small_cluster.feasible(r).tolist() == expected


def test_a_share_needs_one_gpu_with_room_for_all_of_it(small_cluster: Cluster) -> None:
    for node in (A, B, C, D):
        for g in range(small_cluster.num_gpu[node]):
            small_cluster.place(node, req(milli=600), [g])
    assert small_cluster.feasible(req(milli=500)).tolist() == []
    assert small_cluster.feasible(req(milli=400)).tolist() == [A, B, C, D]


def test_bestfit_takes_the_fullest_node_and_the_tightest_gpu(small_cluster: Cluster) -> None:
    small_cluster.place(B, req(milli=300), [2])
    small_cluster.place(B, req(milli=1000, num=2), [0, 1])
    small_cluster.place(B, req(milli=1000), [3])
    choice = choose("bestfit", small_cluster, req(milli=500))
    assert (choice.node, choice.gpus) == (B, [2])


def test_packing_prefers_a_shared_gpu_then_a_used_node(small_cluster: Cluster) -> None:
    small_cluster.place(C, req(milli=400), [5])
    assert choose("packing", small_cluster, req(milli=500)) == baselines.Choice(C, [5])
    small_cluster.place(A, req(milli=1000), [0])
    whole = choose("packing", small_cluster, req(milli=1000, num=2))
    assert whole.node in (A, C), "a used node's free GPUs before an idle node's"


def test_clustering_keeps_pods_of_one_kind_together(small_cluster: Cluster) -> None:
    small_cluster.place(A, req(milli=1000), [0])
    small_cluster.place(D, req(milli=300), [0])
    assert choose("clustering", small_cluster, req(milli=200)).node == D
    assert choose("clustering", small_cluster, req(milli=1000)).node == A


def test_dotprod_prefers_the_node_whose_free_vector_is_shortest_along_the_request(small_cluster: Cluster) -> None:
    small_cluster.place(A, req(milli=1000, num=3, cpu=20000), [0, 1, 2])
    assert choose("dotprod", small_cluster, req(milli=500)).node == A


def test_fgd_closes_a_gpu_rather_than_opening_one(small_cluster: Cluster) -> None:
    small_cluster.place(C, req(milli=500), [3])
    small_cluster.place(A, req(milli=250), [1])
    assert choose("fgd", small_cluster, req(milli=500)) == baselines.Choice(C, [3])


def test_equal_scores_go_to_the_first_node_in_the_cluster_order(small: tuple) -> None:  # type: ignore[type-arg]
    from sharepack.tracesim.fragmentation import FragModel
    from sharepack.tracesim.workloads import typical_workload

    pods, nodes = small
    fm = FragModel.build(typical_workload(pods, threshold=1.0), nodes)
    for first in (A, B):
        rank = np.array([1, 0, 2, 3]) if first == B else np.arange(4)
        cluster = Cluster(nodes, fm, rank=rank)
        assert choose("bestfit", cluster, req(milli=500, cpu=4000, spec="T4")).node == first


def test_random_places_only_on_feasible_nodes_and_fitting_gpus(small_cluster: Cluster) -> None:
    small_cluster.place(A, req(milli=800), [0])
    rng = np.random.default_rng(3)
    r = req(milli=500, spec="T4")
    seen = set()
    for _ in range(40):
        choice = baselines.score_random(small_cluster, r, small_cluster.feasible(r), rng)
        assert choice.node in (A, B)
        assert isinstance(choice.gpus, list)
        assert small_cluster.gpu_left[choice.node, choice.gpus[0]] >= 500
        seen.add(choice.node)
    assert seen == {A, B}


def test_placing_keeps_the_books(small_cluster: Cluster) -> None:
    frag_before = small_cluster.frag_total
    small_cluster.place(C, req(milli=1000, num=2), [0, 1])
    small_cluster.place(C, req(milli=250), [2])
    assert small_cluster.used_milli == 2250
    assert small_cluster.free_gpus == 18 - 3
    assert small_cluster.gpu_total_left[C] == 8000 - 2250
    assert small_cluster.frag_total == pytest.approx(float(small_cluster.frag.sum()))
    assert small_cluster.frag_total != frag_before
    with pytest.raises(AssertionError, match="over capacity"):
        small_cluster.place(C, req(milli=800), [2])
