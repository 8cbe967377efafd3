"""common.fragmentation: the FGD study's measure, the gradient, and the scores built on it;
common.scoring's `fragaware` node policy over published node states."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharepack.common import fragmentation as fr
from sharepack.common import podrequests as pr
from sharepack.common import scoring
from sharepack.common.errors import ConfigError
from sharepack.common.policies import MigStrategy, NodePolicy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState

SHARED = "nvidia.com/gpu.shared"
# Two shapes, equal weight: a half GPU, and two whole GPUs.
HALF_AND_TWO = fr.TypicalWorkload((fr.Shape(1, 500, 1), fr.Shape(2, 1000, 1)))


@pytest.mark.parametrize(
    ("free", "admitted", "expected"),
    [
        pytest.param([1000, 1000], fr.ALL_ADMITTED, 0.0, id="an idle node that fits every shape has no fragment"),
        pytest.param([1000, 400], fr.ALL_ADMITTED, (400 + 1400) / 2,
                     id="a GPU below the share is fragment; too few whole GPUs makes everything fragment"),
        pytest.param([600, 600], fr.ALL_ADMITTED, (0 + 1200) / 2, id="two 0.6 GPUs fit the half, not the pair"),
        pytest.param([1000, 1000, 300], fr.ALL_ADMITTED, (300 + 300) / 2,
                     id="with the pair fitting, only the small GPU counts for it"),
        pytest.param([1000, 1000], 0b01, (0 + 2000) / 2, id="a shape the node does not admit counts all idle share"),
        pytest.param([], fr.ALL_ADMITTED, 0.0, id="a node without GPUs has nothing to fragment"),
    ],
)
def test_node_fragmentation(free: list[int], admitted: int, expected: float) -> None:
    assert fr.Fragmentation(HALF_AND_TWO).amount(free, admitted) == pytest.approx(expected)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([0, 1, 1, 2]), st.sampled_from([160, 250, 500, 1000]), st.integers(1, 2000)),
             min_size=1, max_size=12),
    st.lists(st.lists(st.sampled_from([0, 100, 250, 333, 500, 999, 1000]), max_size=8), min_size=1, max_size=5),
    st.integers(-1, (1 << 12) - 1),
)  # fmt: skip
def test_integer_weights_sum_shapes_of_one_share_once_and_exactly(
    shapes: list[tuple[int, int, int]], nodes: list[list[int]], admitted: int
) -> None:
    # With integer weights `weighted` counts each (share, GPU count) once with the summed
    # weight; the same workload in float weights takes the shape-by-shape sum: both exact.
    ints = fr.Fragmentation(fr.TypicalWorkload(tuple(fr.Shape(g, m if g else 0, w) for g, m, w in shapes)))
    floats = fr.Fragmentation(fr.TypicalWorkload(tuple(fr.Shape(g, m if g else 0, float(w)) for g, m, w in shapes)))
    assert ints._groups is not None and floats._groups is None
    for free in nodes:
        assert ints.weighted(free, admitted) == floats.weighted(free, admitted)


def test_the_measure_ignores_gpu_order_and_memoises() -> None:
    m = fr.Fragmentation(HALF_AND_TWO)
    assert m.amount([300, 1000, 1000]) == m.amount([1000, 300, 1000])
    assert len(m._memo) == 1


def test_cpu_only_shapes_count_all_idle_share() -> None:
    m = fr.Fragmentation(fr.TypicalWorkload((fr.Shape(0, 0, 3), fr.Shape(1, 1000, 1))))
    assert m.amount([1000, 200]) == pytest.approx((3 * 1200 + 200) / 4)


@pytest.mark.parametrize(
    ("before", "after", "sign"),
    [
        pytest.param([500, 1000], [0, 1000], 1, id="closing a half-free GPU lowers fragmentation"),
        pytest.param([1000, 1000], [500, 1000], -1, id="halving an idle GPU raises it"),
        pytest.param([1000, 1000, 1000], [1000, 1000, 0], 0, id="a whole GPU from three changes nothing"),
    ],
)
def test_gradient_sign(before: list[int], after: list[int], sign: int) -> None:
    g = fr.Fragmentation(HALF_AND_TWO).gradient(before, after)
    assert (g > 0) - (g < 0) == sign


@pytest.mark.parametrize(
    ("gradient", "fgd", "extender"),
    [
        pytest.param(0.0, 50, 5, id="no change is the middle of both scales"),
        pytest.param(1e-9, 50, 5, id="float noise is no change"),
        pytest.param(-1.0, 49, 5, id="FGD truncates a tiny growth below 50"),
        pytest.param(400.0, 59, 10, id="closing 0.4 GPU saturates the extender scale"),
        pytest.param(-400.0, 40, 0, id="opening 0.4 GPU is the bottom of it"),
        pytest.param(-1e9, 0, 0, id="huge values do not overflow"),
        pytest.param(1e9, 100, 10, id="nor in the other direction"),
    ],
)
def test_scales(gradient: float, fgd: int, extender: int) -> None:
    assert fr.gradient_score(gradient) == fgd
    assert fr.extender_score(gradient) == extender


@pytest.mark.parametrize(
    ("free", "milli", "gpu"),
    [
        pytest.param([1000, 500, 700], 500, 1, id="the share goes where it closes a GPU"),
        pytest.param([1000, 1000, 700, 600], 500, 3, id="the share goes to the GPU it leaves tightest"),
        pytest.param([1000, 1000], 500, 0, id="ties go to the lower GPU index"),
        pytest.param([400, 300], 500, None, id="no GPU with room"),
    ],
)
def test_best_share_gpu(free: list[int], milli: int, gpu: int | None) -> None:
    best = fr.Fragmentation(HALF_AND_TWO).best_share_gpu(free, milli)
    assert (best[1] if best else None) == gpu


def test_placement_rank_puts_fgd_score_before_leftover() -> None:
    assert fr.placement_rank(300.0, 900) > fr.placement_rank(-50.0, 0)
    assert fr.placement_rank(10.0, 30) > fr.placement_rank(12.0, 400)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("shapes: [{gpus: 1, share: 1.5, weight: 1}]", "shapes[0].share: invalid value 1.5", id="share above 1"),
        pytest.param("shapes: [{share: 0.5, weight: 0}]", "shapes[0].weight: invalid value 0", id="zero weight"),
        pytest.param("shapes: [{share: 0.5, weight: 1, gpu: 2}]", "shapes[0]: invalid value", id="an unknown key"),
        pytest.param("shapes: [{share: 0.5, weight: 1, cpu: 2x}]", "invalid quantity at shapes[0].cpu", id="bad cpu"),
        pytest.param("shapes: []", "shapes: empty", id="no shapes"),
        pytest.param("[1, 2]", "shapes: missing", id="not a mapping"),
        pytest.param("shapes: [{share: x, weight: 1}]", "shapes[0].share: invalid value 'x'", id="share not a number"),
    ],
)
def test_load_typical_workload_names_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match="wl.yaml") as e:
        fr.load_typical_workload(text, "wl.yaml")
    assert any(p.startswith(problem) for p in e.value.problems), e.value.problems


def test_load_typical_workload() -> None:
    w = fr.load_typical_workload("shapes:\n- {share: 0.25, weight: 3}\n- {gpus: 2, share: 1, weight: 1}\n", "f")
    assert w.shapes == (fr.Shape(1, 250, 3), fr.Shape(2, 1000, 1))


# --- fragaware in common.scoring --------------------------------------------------------------

# GPU pods only (the default trace's GPU shapes): no CPU-only shape counts every idle GPU.
GPU_PODS = fr.TypicalWorkload(
    tuple(fr.Shape(s.gpus, s.milli, s.weight) for s in fr.DEFAULT_TYPICAL_WORKLOAD.shapes if s.needs_gpu), "GPU pods"
)


def node(allocated: list[int], total: int = 10, policy: Policy = Policy.PACKED) -> NodeState:
    gpus = tuple(GpuState(f"GPU-{i}", str(i), "NVIDIA A100-SXM4-40GB", total, a, 0) for i, a in enumerate(allocated))
    return NodeState("", "", policy, MigStrategy.NONE, (ResourceState(SHARED, Sharing.TIME_SLICING, False, gpus),))


def request(n: int) -> pr.PodRequest:
    return pr.pod_request(pr.Pod("u", "ns", "p", containers=(pr.Container("c", {SHARED: n}),)))


@pytest.mark.parametrize(
    ("allocated", "replicas", "score"),
    [
        pytest.param([5, 0, 0, 0], 5, 10, id="half a GPU on a half-used GPU closes a fragment"),
        pytest.param([0, 0, 0, 0], 5, 0, id="half of an idle GPU opens one"),
        pytest.param([0, 0, 0, 0], 10, 5, id="a whole GPU's worth on an idle GPU changes nothing"),
        pytest.param([8, 0, 0, 0], 5, 0, id="split over a nearly full GPU and an idle one"),
    ],
)
def test_fragaware_scores_the_predicted_placement(allocated: list[int], replicas: int, score: int) -> None:
    s = scoring.score_node(node(allocated), request(replicas), NodePolicy.FRAGAWARE, workload=GPU_PODS)
    assert s.feasible and s.score == score
    assert s.placement == scoring.score_node(node(allocated), request(replicas), Policy.PACKED).placement


def test_fragaware_keeps_the_filter_of_score_node() -> None:
    s = scoring.score_node(node([10, 10]), request(1), NodePolicy.FRAGAWARE)
    assert not s.feasible and "not enough free devices" in s.reason


def test_fragaware_uses_the_given_workload() -> None:
    # Only quarter-GPU pods: 0.5 GPU left on a GPU is no fragment any more.
    quarters = fr.TypicalWorkload((fr.Shape(1, 250, 1),))
    default = scoring.score_node(node([0, 0]), request(5), NodePolicy.FRAGAWARE)
    custom = scoring.score_node(node([0, 0]), request(5), NodePolicy.FRAGAWARE, workload=quarters)
    assert default.score < custom.score == 5


def test_templates_and_scorers_pass_the_workload() -> None:
    quarters = fr.TypicalWorkload((fr.Shape(1, 250, 1),))
    templates = scoring.ScoreTemplates(NodePolicy.FRAGAWARE, workload=quarters)
    shared = scoring.NodeScorer(node([0, 0]), NodePolicy.FRAGAWARE, templates=templates).score(request(5))
    assert shared == scoring.score_node(node([0, 0]), request(5), NodePolicy.FRAGAWARE, workload=quarters)


def test_free_shares_take_the_least_free_resource_and_floor() -> None:
    gpus3 = (GpuState("GPU-0", "0", "x", 3, 1, 0),)
    full = (GpuState("GPU-0", "0", "x", 1, 0, 0),)
    state = NodeState("", "", Policy.PACKED, MigStrategy.NONE, (
        ResourceState(SHARED, Sharing.TIME_SLICING, False, gpus3),
        ResourceState("nvidia.com/gpu", Sharing.NONE, False, full),
    ))  # fmt: skip
    assert scoring.free_shares(state) == {"GPU-0": 666}
    assert scoring.free_shares(state, {SHARED: ("GPU-0",)}) == {"GPU-0": 333}
