"""`packed` / `distributed` through common.scoring, in the study's (milli) and the replica model."""

from __future__ import annotations

import numpy as np
import pytest

from sharepack.common.policies import Policy
from sharepack.tracesim import sharing
from sharepack.tracesim.clusters import Cluster, Request
from sharepack.tracesim.errors import PolicyError
from sharepack.tracesim.sharing import FULL, SHARED, ShareModel

A, B, C, D = 0, 1, 2, 3


def req(milli: int = 500, num: int = 1, cpu: int = 4000, spec: str = "") -> Request:
    return Request(index=7, cpu=cpu, cpu_score=cpu, memory=1024, num_gpu=num if milli else 0, milli=milli, spec=spec)


@pytest.mark.parametrize(
    ("milli", "replicas", "expected"),
    [(810, 10, 9), (470, 10, 5), (1000, 10, 10), (160, 4, 1), (250, 4, 1), (251, 4, 2)],
)
def test_a_share_needs_whole_replicas_rounded_up(milli: int, replicas: int, expected: int) -> None:
    assert sharing.replicas_for(milli, replicas) == expected


@pytest.mark.parametrize("replicas", [0, 3, 1000])
def test_replica_counts_must_divide_a_gpu(replicas: int) -> None:
    with pytest.raises(PolicyError, match=f"invalid --replicas {replicas}"):
        sharing.check_replicas(replicas)


@pytest.mark.parametrize(
    ("r", "model", "expected"),
    [
        pytest.param(req(milli=470), ShareModel.MILLI, ((SHARED, 5),), id="milli: a share asks replicas"),
        pytest.param(req(milli=1000, num=2), ShareModel.MILLI, ((FULL, 2),), id="milli: whole GPUs ask full GPUs"),
        pytest.param(req(milli=1000, num=2), ShareModel.REPLICAS, ((SHARED, 20),), id="replicas: whole GPUs ask R each"),
        pytest.param(req(milli=0), ShareModel.REPLICAS, (), id="CPU pods ask nothing"),
    ],
)
def test_pods_become_the_requests_the_extender_decodes(
    r: Request, model: ShareModel, expected: tuple[tuple[str, int], ...]
) -> None:
    request = sharing.pod_request(r, model, 10)
    assert request.totals == expected


def test_the_milli_view_offers_only_untouched_gpus_as_full_gpus() -> None:
    state = sharing.node_view([0, 3, 10], ShareModel.MILLI, 10, Policy.PACKED)
    full = state.resource(FULL)
    shared = state.resource(SHARED)
    assert full is not None and shared is not None
    assert [g.free for g in full.gpus] == [1, 0, 0]
    assert [g.free for g in shared.gpus] == [10, 7, 0]
    assert sharing.node_view([0], ShareModel.REPLICAS, 4, Policy.PACKED).resource(FULL) is None


def choose(cluster: Cluster, policy: str, model: ShareModel, r: Request, replicas: int = 10) -> sharing.Choice:
    scorer = sharing.shared_scorer(policy, model, replicas)
    rep = replicas if model is ShareModel.REPLICAS else None
    return scorer(cluster, r, cluster.feasible(r, replicas=rep), np.random.default_rng(0))


def test_packed_joins_a_used_gpu_and_distributed_avoids_it(small_cluster: Cluster) -> None:
    small_cluster.place(C, req(milli=400), [5])
    packed = choose(small_cluster, "packed", ShareModel.MILLI, req(milli=500))
    distributed = choose(small_cluster, "distributed", ShareModel.MILLI, req(milli=500))
    assert packed == sharing.Choice(C, [5])
    # distributed ranks as the reverse of packed: an idle GPU (here on node D, `gpu_use` counting
    # GPUs in use since issue 19), never the used GPU 5 of node C.
    assert distributed == sharing.Choice(D, [0])


def test_distributed_takes_the_emptiest_gpu_on_its_node(small_cluster: Cluster) -> None:
    for node in (A, B, D):
        small_cluster.place(node, req(milli=1000, num=2), [0, 1])
    small_cluster.place(C, req(milli=300), [0])
    for g in range(1, 8):
        small_cluster.place(C, req(milli=100), [g])
    small_cluster.place(C, req(milli=500), [4])
    choice = choose(small_cluster, "distributed", ShareModel.MILLI, req(milli=300, spec="V100M32"))
    assert choice.node == C
    assert choice.gpus != [4] and choice.gpus != [0]


def test_the_replica_model_lets_the_node_loop_split_a_pod_and_charges_what_it_asked(small_cluster: Cluster) -> None:
    small_cluster.place(D, req(milli=500), [0])
    small_cluster.place(D, req(milli=500), [1])
    r = req(milli=1000, spec="P100")
    assert small_cluster.feasible(r).tolist() == []
    assert small_cluster.feasible(r, replicas=10).tolist() == [D]
    choice = choose(small_cluster, "packed", ShareModel.REPLICAS, r)
    assert choice == sharing.Choice(D, {0: 500, 1: 500})
    used = small_cluster.used_milli
    small_cluster.place(A, req(milli=810), {0: 900}, charged=810)
    assert small_cluster.used_milli == used + 810
    assert small_cluster.gpu_left[A, 0] == 100


def test_spread_is_not_a_cluster_policy() -> None:
    with pytest.raises(PolicyError, match="spread"):
        sharing.shared_scorer("spread", ShareModel.MILLI, 10)


def test_scores_are_memoised_per_node_state(small_cluster: Cluster) -> None:
    scorer = sharing.SharedScorer(Policy.PACKED, ShareModel.MILLI, 10)
    r = req(milli=500)
    scorer(small_cluster, r, small_cluster.feasible(r), np.random.default_rng(0))
    first = scorer.calls
    scorer(small_cluster, r, small_cluster.feasible(r), np.random.default_rng(0))
    assert first == 3  # a and b are the same empty 4-GPU state
    assert scorer.calls == first
