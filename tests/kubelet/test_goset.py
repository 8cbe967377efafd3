"""The sandbox kubelet lists device IDs in no set order, as the real one's Go set does."""

from __future__ import annotations

from sharepack.sandbox.kubelet import goset

UUIDS = [f"GPU-{i:08x}-1111-4000-8000-000000000000" for i in range(8)]


def test_a_set_comes_unsorted_but_the_same_way_every_time() -> None:
    listed = goset.unsorted_list(UUIDS)
    assert sorted(listed) == UUIDS and listed != UUIDS  # a permutation, not the sorted one
    assert goset.unsorted_list(reversed(UUIDS)) == listed  # replays: depends on the set only


def test_an_empty_set_is_an_empty_list() -> None:
    assert goset.unsorted_list([]) == []
