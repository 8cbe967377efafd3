"""The fine rank behind the tier filter, the tier rule itself, CPU/memory-stranded GPUs as
fragment, and the placement a directed `fragaware` chooses."""

from __future__ import annotations

import pytest

from sharepack.common import fragmentation as fr
from sharepack.common import scoring
from sharepack.common.policies import NodePolicy, Policy
from tests.scoring.test_scoring import node, request

SHARED = "nvidia.com/gpu.shared"


@pytest.mark.parametrize(
    ("entries", "width", "kept"),
    [
        pytest.param([(0.5, 3), (0.9, 2), (0.9, 1), (0.1, 0)], 1, [2], id="the best rank, ties to the lower order"),
        pytest.param([(0.5, 3), (0.9, 2), (0.9, 1), (0.1, 0)], 2, [1, 2], id="a tier of two keeps both best"),
        pytest.param([(0.5, 3), (0.9, 2), (0.9, 1), (0.1, 0)], 3, [0, 1, 2], id="then the next rank"),
        pytest.param([(0.5, 3), (0.9, 2)], 0, [0, 1], id="width 0 keeps every node"),
        pytest.param([(0.5, "b"), (0.5, "a")], 1, [1], id="names order ties too"),
    ],
)
def test_best_tier_keeps_exactly_the_best(entries: list[tuple[float, int]], width: int, kept: list[int]) -> None:
    assert scoring.best_tier(entries, width) == kept


def test_the_rank_is_the_score_before_rounding() -> None:
    # One replica on the used GPU of a half-used 2-GPU node: reuse 1, gpu_use 1 GPU of 8, fit 3/4.
    half_used = node([(4, 2), (4, 0)])
    assert scoring.score_node(half_used, request(1), Policy.PACKED).rank == pytest.approx(0.7125)
    assert scoring.score_node(half_used, request(1), Policy.DISTRIBUTED).rank == pytest.approx(0.2875)
    # Two nodes the 0..10 score cannot tell apart; the rank can.
    looser = node([(8, 4), (8, 0)])  # fit 5/8: rank 0.7
    a, b = (scoring.score_node(n, request(1), Policy.PACKED) for n in (half_used, looser))
    assert a.score == b.score == 7
    assert a.rank > b.rank


# A half GPU that needs 4 CPUs, and a whole GPU that needs none.
HALF_WITH_CPU = fr.TypicalWorkload((fr.Shape(1, 500, 1, cpu=4000), fr.Shape(1, 1000, 1)))


def test_a_shape_whose_cpu_the_node_lacks_is_not_admitted() -> None:
    m = fr.Fragmentation(HALF_WITH_CPU)
    assert m.admitted(4000, 0) & 0b11 == 0b11
    assert m.admitted(3999, 0) & 0b11 == 0b10
    assert fr.Fragmentation(fr.TypicalWorkload((fr.Shape(1, 500, 1, memory=100),))).admitted(10**6, 99) & 1 == 0


def test_gpus_stranded_by_cpu_count_as_fragment_in_the_score() -> None:
    idle = node([(10, 0), (10, 0)])
    m = fr.Fragmentation(HALF_WITH_CPU)
    ample = scoring.score_node(idle, request(5), NodePolicy.FRAGAWARE, workload=HALF_WITH_CPU)
    short = scoring.score_node(
        idle, request(5), NodePolicy.FRAGAWARE, workload=HALF_WITH_CPU,
        admitted=(m.admitted(6000, 0), m.admitted(2000, 0)),  # the pod leaves 2 CPUs
    )  # fmt: skip
    # After: GPU-0 half free. With CPU: the half fits (0), the whole GPU not on GPU-0 (500).
    # Without CPU for the half: all 1500 idle milli count for it.
    assert ample.rank == pytest.approx(fr.placement_rank(-(0 + 500) / 2, 500))
    assert short.rank == pytest.approx(fr.placement_rank(-(1500 + 500) / 2, 500))
    assert short.score < ample.score


def test_directed_fragaware_keeps_a_share_on_one_gpu_where_the_agent_splits_it() -> None:
    half = fr.TypicalWorkload((fr.Shape(1, 500, 1),))
    n = node([(10, 7), (10, 5)])
    own = scoring.score_node(n, request(5), NodePolicy.FRAGAWARE, workload=half)
    directed = scoring.score_node(n, request(5), NodePolicy.FRAGAWARE, workload=half, directed=True)
    assert own.placement == {SHARED: ("GPU-0",) * 3 + ("GPU-1",) * 2}  # the agent's packed loop
    assert directed.placement == {SHARED: ("GPU-1",) * 5}
    assert directed.rank == pytest.approx(fr.placement_rank(0.0, 0))
    # Nothing fits on one GPU: the agent's own placement stands.
    assert scoring.score_node(n, request(6), NodePolicy.FRAGAWARE, workload=half, directed=True).placement == {
        SHARED: ("GPU-0",) * 3 + ("GPU-1",) * 3
    }
