"""Shared helpers for the allocation tests: a brute-force reference for best-effort allocation."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from sharepack.common import topology


def _partitions(items: list[str], size: int, remainder: int) -> Iterator[list[tuple[str, ...]]]:
    """Every split into groups of `size` plus one group of `remainder` (brute force)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    sizes = {size} | ({remainder} if remainder else set())
    for group_size in sizes:
        for others in itertools.combinations(rest, group_size - 1):
            left = [i for i in rest if i not in others]
            if group_size == remainder and remainder:
                for tail in _partitions(left, size, 0):
                    yield [(first, *others), *tail]
            elif len(left) >= remainder:
                for tail in _partitions(left, size, remainder):
                    yield [(first, *others), *tail]


def acceptable_answers(
    scores: dict[tuple[str, str], int], available: list[str], required: list[str], size: int
) -> tuple[int, set[frozenset[str]]]:
    """Best partition total and every group upstream's objective allows us to return."""
    remainder = len(available) % size
    best, answers = -1, set()
    for partition in _partitions(available, size, remainder):
        full = [g for g in partition if len(g) == size and set(required) <= set(g)]
        if not full:
            continue
        total = sum(topology.group_score(scores, g) for g in partition)
        top = max(topology.group_score(scores, g) for g in full)
        picks = {frozenset(g) for g in full if topology.group_score(scores, g) == top}
        if total > best:
            best, answers = total, picks
        elif total == best:
            answers |= picks
    return best, answers


@pytest.fixture(scope="session")
def best_effort_answers() -> Callable[
    [dict[tuple[str, str], int], list[str], list[str], int], tuple[int, set[frozenset[str]]]
]:
    return acceptable_answers
