"""Topology-aware allocation beyond the upstream vectors: our fixes, the inputs' edges, the
over-budget heuristic, and optimality against brute force on generated score tables."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharepack.common import allocation, topology

BruteForce = Callable[
    [dict[tuple[str, str], int], list[str], list[str], int], tuple[int, set[frozenset[str]]]
]

# Two NVLink islands of four (a0..a3, b0..b3), joined only over PCIe.
ISLANDS = {
    (x, y): 100 if x[0] == y[0] else 10
    for x, y in itertools.combinations([f"{c}{i}" for c in "ab" for i in range(4)], 2)
}
ALL_ISLAND_GPUS = sorted({g for pair in ISLANDS for g in pair})


def test_the_padded_remainder_group_is_never_returned() -> None:
    # Five GPUs in groups of three: the best partition is {a,b,c} + remainder {d,e}. Upstream's
    # last filter keeps the padded {d,e} and returns it (two GPUs for a request of three).
    scores = {("d", "e"): 100, ("a", "b"): 10, ("a", "c"): 10, ("b", "c"): 10}
    assert sorted(allocation.aligned_allocation(scores, list("abcde"), [], 3)) == ["a", "b", "c"]


def test_best_partition_beats_the_single_best_group() -> None:
    # The single best pair is b-c, but taking it leaves a-d with nothing; a-b + c-d totals more.
    scores = {("a", "b"): 90, ("b", "c"): 100, ("c", "d"): 90, ("a", "d"): 0}
    result = allocation.aligned_allocation(scores, list("abcd"), [], 2)
    assert sorted(result) in (["a", "b"], ["c", "d"])


def test_pair_scores_are_looked_up_in_either_order() -> None:
    scores = {("b", "a"): 50, ("c", "a"): 10}
    assert sorted(allocation.aligned_allocation(scores, list("abc"), ["a"], 2)) == ["a", "b"]


@pytest.mark.parametrize(
    ("available", "required", "size"),
    [
        pytest.param(["a0", "a1"], [], 0, id="size zero gets nothing"),
        pytest.param(["a0", "a1"], [], 3, id="fewer gpus than asked gets nothing"),
        pytest.param(
            ALL_ISLAND_GPUS, ["a0", "a1", "a2"], 2, id="more required than the size gets nothing"
        ),
        pytest.param(
            ["a0", "a1", "a2"], ["b0"], 2, id="a required gpu that is not available gets nothing"
        ),
    ],
)
def test_impossible_requests_get_an_empty_answer(
    available: list[str], required: list[str], size: int
) -> None:
    assert allocation.aligned_allocation(ISLANDS, available, required, size) == []


def test_required_gpus_come_first_and_duplicates_are_ignored() -> None:
    result = allocation.aligned_allocation(ISLANDS, ALL_ISLAND_GPUS * 2, ["b2", "b2"], 4)
    assert result[0] == "b2"
    assert sorted(result) == ["b0", "b1", "b2", "b3"]


@pytest.mark.parametrize("budget", [0, topology.EXACT_WORK_BUDGET], ids=["heuristic", "exact"])
@pytest.mark.parametrize("size", [2, 3, 4, 5])
def test_islands_are_kept_whole_by_both_searches(budget: int, size: int) -> None:
    result = topology.best_effort(ISLANDS, ALL_ISLAND_GPUS, [], size, work_budget=budget)
    assert len(result) == size
    if size <= 4:
        assert len({gpu[0] for gpu in result}) == 1


def _hierarchical_16() -> dict[tuple[str, str], int]:
    """16 GPUs: NVLink pairs, PCIe switches of four, two CPU sockets of eight."""
    gpus = [f"GPU-{i:02d}" for i in range(16)]
    scores = {}
    for i, j in itertools.combinations(range(16), 2):
        level = 50 if i // 4 == j // 4 else 20 if i // 8 == j // 8 else 10
        scores[(gpus[i], gpus[j])] = level + (200 if i // 2 == j // 2 else 0)
    return scores


@pytest.mark.parametrize("size", range(1, 17))
def test_sixteen_gpus_get_a_full_valid_answer_at_every_size(size: int) -> None:
    scores = _hierarchical_16()
    gpus = sorted({g for pair in scores for g in pair})
    result = allocation.aligned_allocation(scores, gpus, ["GPU-05"], size)
    assert len(result) == len(set(result)) == size
    assert result[0] == "GPU-05"
    if size == 2:
        assert sorted(result) == ["GPU-04", "GPU-05"]  # its NVLink partner
    if size == 4:
        assert sorted(result) == ["GPU-04", "GPU-05", "GPU-06", "GPU-07"]  # its PCIe switch


def test_over_budget_heuristic_matches_the_exact_search_on_a_hierarchical_node() -> None:
    scores = _hierarchical_16()
    gpus = sorted({g for pair in scores for g in pair})
    for size in (2, 4, 8):
        exact = topology.best_effort(scores, gpus, [], size, work_budget=10**9)
        heuristic = topology.best_effort(scores, gpus, [], size, work_budget=0)
        assert topology.group_score(scores, heuristic) == topology.group_score(scores, exact)


@st.composite
def score_tables(draw: st.DrawFn) -> tuple[dict[tuple[str, str], int], list[str], list[str], int]:
    n = draw(st.integers(1, 7))
    gpus = [f"g{i}" for i in range(n)]
    level = st.sampled_from([0, 10, 20, 30, 40, 50, 60, 100, 110, 150, 200, 260])
    scores = {pair: draw(level) for pair in itertools.combinations(gpus, 2)}
    size = draw(st.integers(1, n))
    required = draw(st.lists(st.sampled_from(gpus), unique=True, max_size=size))
    return scores, gpus, required, size


@settings(max_examples=150, deadline=None)
@given(table=score_tables(), budget=st.sampled_from([0, topology.EXACT_WORK_BUDGET]))
def test_answers_are_valid_and_the_exact_search_is_optimal(
    table: tuple[dict[tuple[str, str], int], list[str], list[str], int],
    budget: int,
    best_effort_answers: BruteForce,
) -> None:
    scores, gpus, required, size = table
    result = topology.best_effort(scores, gpus, required, size, work_budget=budget)
    assert len(result) == len(set(result)) == size
    assert result[: len(required)] == required
    assert set(result) <= set(gpus)
    if budget:
        _, answers = best_effort_answers(scores, gpus, required, size)
        assert frozenset(result) in answers


@pytest.mark.parametrize("n", [5, 8, 10])
def test_exact_work_is_counted_exactly_before_the_search_runs(n: int) -> None:
    # The up-front count decides exact vs heuristic; if it were low, a call could overrun.
    scores = [[1] * n for _ in range(n)]
    for size in range(1, n + 1):
        for n_req in (0, 1):
            work = topology.exact_work(n, size, n_req)
            topology._exact(scores, n, size, n_req, work)  # within the count: never over budget
            if n_req == 0:
                with pytest.raises(topology._OverBudget):
                    topology._exact(scores, n, size, n_req, work - 1)


@settings(max_examples=150, deadline=None)
@given(
    table=score_tables(),
    budget=st.sampled_from([0, topology.EXACT_WORK_BUDGET]),
    data=st.data(),
)
def test_the_order_of_the_available_gpus_never_changes_the_answer(
    table: tuple[dict[tuple[str, str], int], list[str], list[str], int],
    budget: int,
    data: st.DataObject,
) -> None:
    # The kubelet lists the available IDs from a Go set, in any order: only the GPU index may
    # break ties. Small score levels make ties common, which is where order used to leak in.
    scores, gpus, required, size = table
    index_of = dict(zip(data.draw(st.permutations(gpus), label="index order"), range(len(gpus))))
    shuffled = data.draw(st.permutations(gpus), label="kubelet order")
    by_index = topology.best_effort(scores, gpus, required, size, index_of=index_of, work_budget=budget)
    assert topology.best_effort(
        scores, shuffled, required, size, index_of=index_of, work_budget=budget
    ) == by_index


@pytest.mark.parametrize("budget", [0, topology.EXACT_WORK_BUDGET], ids=["heuristic", "exact"])
def test_ties_go_to_the_lowest_gpu_index_not_the_id_text(budget: int) -> None:
    # Every pair scores the same: any two GPUs are a best answer, so the index alone decides.
    gpus = ["GPU-d", "GPU-c", "GPU-b", "GPU-a"]
    scores = {pair: 50 for pair in itertools.combinations(gpus, 2)}
    index_of = {gpu: i for i, gpu in enumerate(gpus)}  # GPU-d is index 0
    for available in (gpus, sorted(gpus)):
        result = topology.best_effort(scores, available, [], 2, index_of=index_of, work_budget=budget)
        assert result == ["GPU-d", "GPU-c"]
    # Without indices, the ID text decides.
    assert topology.best_effort(scores, gpus, [], 2, work_budget=budget) == ["GPU-a", "GPU-b"]


def test_the_dgx1_volta_pair_is_the_documented_one_in_every_kubelet_order() -> None:
    # docs/policies.md: GPUs 0 and 3 (230), the best partition's pick, not the best pair 2-3.
    vectors = json.loads((Path(__file__).parent / "vectors" / "aligned_allocation_cases.json").read_text())
    links = vectors["topologies"]["dgx1_volta"]["links"]
    scores = {(str(link["gpus"][0]), str(link["gpus"][1])): link["score"] for link in links}
    gpus = [str(i) for i in range(8)]
    index_of = {gpu: int(gpu) for gpu in gpus}
    rng = random.Random(16)
    for _ in range(50):
        rng.shuffle(gpus)
        assert sorted(allocation.aligned_allocation(scores, gpus, [], 2, index_of=index_of)) == ["0", "3"]
