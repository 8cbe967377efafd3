"""Directed GPUs in the core: the per-container split of a prediction, the annotation format,
and which devices answer a request for directed GPUs (common.directions, common.scoring)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharepack.common import directions, scoring
from sharepack.common.directions import ContainerDirections, Directions
from sharepack.common.errors import DirectionsError
from tests.scoring.test_scoring import DISTRIBUTED, PACKED, SHARED, node, request

# --- the per-container split ------------------------------------------------------------------


def test_an_app_container_that_reuses_an_init_containers_devices_is_directed_only_its_new_ones() -> None:
    # Packed: the init container's 2 land on the used GPU 0 (2 free); the app needs 3, reuses 2,
    # and its third goes to GPU 1, the fuller of the others.
    split = scoring.container_placements(node([(4, 2), (4, 1), (4, 0)]), request(3, init=[2]))
    assert split == (("i0", {SHARED: ("GPU-0", "GPU-0")}), ("c0", {SHARED: ("GPU-1",)}))


def test_a_container_that_takes_nothing_new_is_left_out() -> None:
    split = scoring.container_placements(node([(4, 0), (4, 0)]), request(1, init=[2]))
    assert [name for name, _ in split] == ["i0"]


def test_a_pod_that_does_not_fit_has_no_split() -> None:
    assert scoring.container_placements(node([(4, 4)]), request(1)) is None


@settings(max_examples=60, deadline=None)
@given(
    allocated=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    apps=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    init=st.lists(st.integers(0, 3), max_size=2),
    packed=st.booleans(),
)
def test_the_split_adds_up_to_the_predicted_placement(
    allocated: list[int], apps: list[int], init: list[int], packed: bool
) -> None:
    state = node([(4, a) for a in allocated], policy=PACKED if packed else DISTRIBUTED)
    req = request(*apps, init=init)
    predicted = scoring.score_node(state, req, PACKED)
    split = scoring.container_placements(state, req)
    if not predicted.feasible:
        return
    assert split is not None
    held = Counter(k for _, gpus in split for k in gpus.get(SHARED, ()))
    assert held == Counter(predicted.placement.get(SHARED, ()))
    # What the extender writes always fits the pod it was written for (readers check, 24.1).
    assert directions.mismatch(directions.from_placements("n", split), req) is None


@pytest.mark.parametrize(
    ("containers", "why"),
    [
        ((("ghost", ("GPU-0",)),), "container 'ghost' is not one of the pod's containers"),
        ((("c0", ("GPU-0", "GPU-0")),), "container 'c0' is directed to 2 nvidia.com/gpu.shared device(s) but requests 1"),
        ((("c0", ("GPU-0",)), ("c0", ("GPU-1",))), "container 'c0' is named twice or out of the pod's order"),
        ((("c0", ("GPU-0",)), ("i0", ("GPU-1",))), "container 'i0' is named twice or out of the pod's order"),
    ],
)
def test_directions_that_do_not_fit_the_pod_say_why(containers: tuple[tuple[str, tuple[str, ...]], ...], why: str) -> None:
    d = Directions("n", tuple(ContainerDirections(name, {SHARED: keys}) for name, keys in containers))
    assert directions.mismatch(d, request(1, init=[1])) == why


# --- the annotation ---------------------------------------------------------------------------


def test_directions_survive_a_round_trip_through_the_annotation() -> None:
    d = directions.from_placements("node-7", (("init", {SHARED: ["GPU-b", "GPU-a"]}), ("main", {SHARED: []})))
    assert d == Directions("node-7", (ContainerDirections("init", {SHARED: ("GPU-a", "GPU-b")}),))
    text = directions.encode(d)
    assert text == '{"v":1,"node":"node-7","containers":[{"name":"init","gpus":{"nvidia.com/gpu.shared":["GPU-a","GPU-b"]}}]}'
    assert directions.decode(text, where="pod ns/p") == d


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{oops", "not JSON"),
        ("[]", "want an object, got list"),
        ('{"v": 2, "node": "n", "containers": []}', "unknown version 2 (this build reads 1)"),
        ('{"v": 1, "node": "", "containers": []}', "node must be a non-empty string, got ''"),
        ('{"v": 1, "node": "n", "containers": {}}', "containers must be a list, got dict"),
        ('{"v": 1, "node": "n", "containers": [{"name": "c"}]}', "containers[0] must have a string name and a gpus object"),
        ('{"v": 1, "node": "n", "containers": [{"name": "c", "gpus": {"r": "GPU-a"}}]}',
         "containers[0].gpus['r'] must be a list of GPU keys"),
    ],
    ids=["not json", "not an object", "a newer version", "no node", "containers not a list",
         "a container without gpus", "gpus not a list"],
)  # fmt: skip
def test_a_bad_annotation_is_refused_naming_the_pod_and_the_fault(text: str, why: str) -> None:
    with pytest.raises(DirectionsError) as e:
        directions.decode(text, where="pod ns/p")
    assert str(e.value).startswith(f"invalid {directions.ANNOTATION} annotation of pod ns/p: {why}")


# --- the devices answered ---------------------------------------------------------------------

GROUP = {f"GPU-{g}::{n}": f"GPU-{g}" for g in "ab" for n in range(12)}


@pytest.mark.parametrize(
    ("keys", "available", "must", "size", "expected"),
    [
        (["GPU-b", "GPU-b"], ["GPU-a::0", "GPU-b::10", "GPU-b::2", "GPU-b::3"], [], 2, ["GPU-b::2", "GPU-b::3"]),
        (["GPU-b"], ["GPU-a::0", "GPU-a::1", "GPU-b::0"], ["GPU-a::0"], 2, ["GPU-a::0", "GPU-b::0"]),
        (["GPU-a", "GPU-b"], ["GPU-a::5", "GPU-b::1"], [], 2, ["GPU-a::5", "GPU-b::1"]),
        (["GPU-b", "GPU-b"], ["GPU-a::0", "GPU-b::1"], [], 2, "GPU GPU-b has 1 of the 2 directed device(s) available"),
        (["GPU-b"], ["GPU-b::1"], [], 2, "directions name 1 new device(s) but the request is for 2 with 0 already chosen"),
    ],
    ids=["replica order, not text order", "must-include first, then the new ones", "two GPUs",
         "too few on a directed GPU", "a request of another size"],
)  # fmt: skip
def test_the_devices_answered_for_directed_gpus(
    keys: list[str], available: list[str], must: list[str], size: int, expected: list[str] | str
) -> None:
    assert directions.choose_devices(keys, available, must, size, GROUP) == expected
