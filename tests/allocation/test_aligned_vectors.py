"""vectors/aligned_allocation_cases.json: go-gpuallocator's best-effort cases, plus a brute-force
check of optimality on every fixture topology."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from sharepack.common import allocation

DATA: dict[str, Any] = json.loads(
    (Path(__file__).parent / "vectors" / "aligned_allocation_cases.json").read_text()
)
# go-gpuallocator's other policies (first-N, static DGX tables) are not ours to implement: the
# architecture names best-effort as the full-GPU semantics.
NOT_OURS = {"simple", "staticdgx1pascal", "staticdgx1volta", "staticdgx2volta"}
BruteForce = Callable[
    [dict[tuple[str, str], int], list[str], list[str], int], tuple[int, set[frozenset[str]]]
]
BEST_EFFORT = [case for case in DATA["cases"] if case["policy"] == "besteffort"]


def _scores(topology_name: str) -> dict[tuple[str, str], int]:
    links = DATA["topologies"][topology_name]["links"]
    return {(str(link["gpus"][0]), str(link["gpus"][1])): link["score"] for link in links}


def _ids(indices: Sequence[int]) -> list[str]:
    return [str(i) for i in indices]


def test_only_policies_we_do_not_implement_are_left_out() -> None:
    assert {case["policy"] for case in DATA["cases"]} - {"besteffort"} <= NOT_OURS
    assert BEST_EFFORT


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=f"{c['topology']}: {c['name']}") for c in BEST_EFFORT]
)
def test_best_effort_returns_an_upstream_answer(case: dict[str, Any]) -> None:
    result = allocation.aligned_allocation(
        _scores(case["topology"]), _ids(case["available"]), _ids(case["required"]), case["size"]
    )
    if not case["expected"]:
        assert result == []
        return
    assert sorted(int(i) for i in result) in [sorted(a) for a in case["optimal_alternatives"]]
    assert result[: len(case["required"])] == _ids(case["required"])


TOPOLOGY_SAMPLES = [
    pytest.param(name, size, required, id=f"{name} size {size} required {required}")
    for name in DATA["topologies"]
    for size in range(1, len(DATA["topologies"][name]["gpus"]) + 1)
    for required in ([], [1], [0, 3])
    if len(required) <= size
]


@pytest.mark.parametrize(("name", "size", "required"), TOPOLOGY_SAMPLES)
def test_best_effort_is_optimal_on_every_fixture_topology(
    name: str, size: int, required: list[int], best_effort_answers: BruteForce
) -> None:
    scores = _scores(name)
    available = _ids([g["index"] for g in DATA["topologies"][name]["gpus"]])
    result = allocation.aligned_allocation(scores, available, _ids(required), size)
    _, answers = best_effort_answers(scores, available, _ids(required), size)
    assert frozenset(result) in answers
    assert len(result) == size
