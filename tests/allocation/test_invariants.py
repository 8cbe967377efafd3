"""What the greedy loop promises beyond the upstream vectors: our deliberate differences
(deterministic ties, MIG by parent, spread seeded from must-include) and the count-level twin."""

from __future__ import annotations

from collections import Counter

import pytest

from sharepack.common import allocation
from sharepack.common.allocation import GpuLoad
from sharepack.common.devices import physical_key, replica_id
from sharepack.common.errors import AllocationError
from sharepack.common.policies import Policy


def _replicas(**per_gpu: int) -> list[str]:
    return [replica_id(gpu, n) for gpu, count in per_gpu.items() for n in range(count)]


def test_every_policy_has_exactly_one_comparator() -> None:
    assert set(allocation.COMPARATORS) == set(Policy)


@pytest.mark.parametrize("policy", [Policy.DISTRIBUTED, Policy.PACKED])
def test_distributed_and_packed_order_only_by_allocated(policy: Policy) -> None:
    # Same allocated count, very different totals and availability: a tie both ways.
    assert not allocation.preferred(policy, (8, 6, 0), (4, 2, 0))
    assert not allocation.preferred(policy, (4, 2, 0), (8, 6, 0))


CASES = [
    pytest.param(
        Policy.PACKED, _replicas(b=2, a=2), _replicas(b=2, a=2), [], 2, None, ["a::0", "a::1"],
        id="equal gpus tie-break by physical key, so packed fills a before b",
    ),
    pytest.param(
        Policy.DISTRIBUTED, _replicas(b=2, a=2), _replicas(b=2, a=2), [], 3, None,
        ["a::0", "b::0", "a::1"],
        id="distributed rotates over equal gpus in key order",
    ),
    pytest.param(
        Policy.PACKED, _replicas(g=12), ["g::10", "g::2", "g::11"], [], 2, None, ["g::2", "g::10"],
        id="replicas of one gpu are taken in replica-number order, not text order",
    ),
    pytest.param(
        Policy.DISTRIBUTED, _replicas(a=2, b=2), _replicas(a=2, b=2), ["a::1"], 2, None,
        ["a::1", "b::0"],
        id="distributed counts must-include as allocated and goes to the other gpu",
    ),
    pytest.param(
        Policy.PACKED, _replicas(a=2, b=2), _replicas(a=2, b=2), ["b::1"], 2, None,
        ["b::1", "b::0"],
        id="packed counts must-include as allocated and stays on its gpu",
    ),
    pytest.param(
        Policy.DISTRIBUTED, _replicas(a=4, b=4), _replicas(a=4) + ["b::2", "b::3"], ["a::0"], 2,
        None, ["a::0", "a::1"],
        id="distributed goes back to the must-include gpu when it is still the least allocated",
    ),
    pytest.param(
        Policy.DISTRIBUTED, _replicas(a=2, b=2), ["a::0", "a::1", "b::1"], ["a::0"], 2, None,
        ["a::0", "a::1"],
        id="distributed starts picked-from at zero as upstream so a must-include gpu ties and wins by key",
    ),
    pytest.param(
        Policy.PACKED, _replicas(a=2, b=2), ["a::0", "a::1", "b::1"], ["a::0"], 2, None,
        ["a::0", "a::1"],
        id="packed starts picked-from at zero as upstream so a must-include gpu ties and wins by key",
    ),
    pytest.param(
        Policy.SPREAD, _replicas(a=2, b=2), ["a::0", "a::1", "b::1"], ["a::0"], 2, None,
        ["a::0", "b::1"],
        id="spread on the same node goes to the other gpu because it seeds picked-from",
    ),
    pytest.param(
        Policy.SPREAD, _replicas(a=4, b=4), _replicas(a=4) + ["b::2", "b::3"], ["a::0"], 2,
        None, ["a::0", "b::2"],
        id="spread seeds picked-from with must-include and so goes to a new gpu",
    ),
    pytest.param(
        Policy.SPREAD, _replicas(a=2, b=2, c=2), _replicas(a=2, b=2, c=2), [], 4, None,
        ["a::0", "b::0", "c::0", "a::1"],
        id="spread touches every gpu once before it takes a second device anywhere",
    ),
    pytest.param(
        Policy.PACKED, ["MIG-1", "MIG-2", "MIG-3", "MIG-4"], ["MIG-1", "MIG-2", "MIG-3"], [], 1,
        {"MIG-1": "GPU-A", "MIG-2": "GPU-A", "MIG-3": "GPU-B", "MIG-4": "GPU-B"}, ["MIG-3"],
        id="packed groups mig instances by parent and joins the parent already in use",
    ),
    pytest.param(
        Policy.PACKED, ["MIG-1", "MIG-2", "MIG-3", "MIG-4"], ["MIG-1", "MIG-2", "MIG-3"], [], 1,
        None, ["MIG-1"],
        id="without a grouping every mig instance is its own gpu, as upstream keys them",
    ),
    pytest.param(
        Policy.DISTRIBUTED, _replicas(a=2), ["a::0", "a::0", "zz::0", "a::1"], [], 2, None,
        ["a::0", "a::1"],
        id="duplicate offers and ids outside the resource are ignored",
    ),
    pytest.param(
        Policy.DISTRIBUTED, _replicas(a=2, b=2), _replicas(a=2, b=2), ["b::0", "a::0", "b::1"], 2,
        None, ["b::0", "a::0", "b::1"],
        id="must-include covering the size is returned as is, like upstream",
    ),
    pytest.param(
        Policy.PACKED, _replicas(a=2), _replicas(a=2), [], 0, None, [],
        id="a request of size zero gets nothing",
    ),
    pytest.param(
        Policy.PACKED, _replicas(a=2, b=2), _replicas(a=2, b=2), ["a::0", "a::0"], 2, None,
        ["a::0", "a::1"],
        id="a repeated must-include id counts once so packed still picks one device "
        "where upstream answers a::0 twice",
    ),
    pytest.param(
        Policy.DISTRIBUTED, _replicas(a=2, b=2), _replicas(a=2, b=2), ["a::0", "a::0"], 3, None,
        ["a::0", "b::0", "a::1"],
        id="a repeated must-include id counts once so distributed picks two devices "
        "where upstream picks only b::0 after a::0 twice",
    ),
    pytest.param(
        Policy.PACKED, _replicas(a=2), _replicas(a=2), ["GPU-x::0", "a::0"], 3, None,
        ["GPU-x::0", "a::0", "a::1"],
        id="a must-include id outside the resource is returned as is and counts toward the size "
        "like upstream",
    ),
]


@pytest.mark.parametrize(
    ("policy", "devices", "available", "must_include", "size", "group_of", "expected"), CASES
)
def test_shared_allocation(
    policy: Policy,
    devices: list[str],
    available: list[str],
    must_include: list[str],
    size: int,
    group_of: dict[str, str] | None,
    expected: list[str],
) -> None:
    result = allocation.shared_allocation(
        policy, devices, available, must_include, size, group_of=group_of
    )
    assert result == expected


def test_group_of_may_be_a_function() -> None:
    parents = {"MIG-1": "GPU-A", "MIG-2": "GPU-A", "MIG-3": "GPU-B", "MIG-4": "GPU-B"}
    result = allocation.shared_allocation(
        "packed", list(parents), ["MIG-1", "MIG-2", "MIG-3"], [], 1, group_of=parents.__getitem__
    )
    assert result == ["MIG-3"]


def test_policy_names_are_accepted_as_plain_strings() -> None:
    devices = _replicas(a=2, b=2)
    for policy in Policy:
        assert allocation.shared_allocation(policy.value, devices, devices, [], 2) == (
            allocation.shared_allocation(policy, devices, devices, [], 2)
        )


@pytest.mark.parametrize("policy", ["", "Packed", "spreadd"])
def test_unknown_policy_is_a_value_error(policy: str) -> None:
    with pytest.raises(ValueError, match=f"unknown allocation policy: '{policy}'"):
        allocation.shared_allocation(policy, ["a::0"], ["a::0"], [], 1)
    with pytest.raises(ValueError, match="unknown allocation policy"):
        allocation.pick_gpus(policy, [GpuLoad("a", 1, 1)], 1)


def test_not_enough_devices_counts_must_include_as_part_of_the_request() -> None:
    devices = _replicas(a=2)
    assert allocation.shared_allocation("packed", devices, devices, ["a::0"], 2) == ["a::0", "a::1"]
    with pytest.raises(AllocationError) as caught:
        allocation.shared_allocation("packed", devices, devices, ["a::0"], 3)
    assert str(caught.value) == allocation.NOT_ENOUGH_DEVICES
    assert allocation.AllocationError is AllocationError


LOADS = [GpuLoad("g0", 4, 4), GpuLoad("g1", 4, 1), GpuLoad("g2", 4, 3), GpuLoad("g3", 2, 2)]


@pytest.mark.parametrize("policy", list(Policy))
@pytest.mark.parametrize("size", [1, 3, 6, 10])
def test_pick_gpus_gives_the_per_gpu_counts_shared_allocation_gives(
    policy: Policy, size: int
) -> None:
    devices = [replica_id(load.key, n) for load in LOADS for n in range(load.total)]
    # The first `total - available` replicas of each GPU are held by other pods.
    available = [
        replica_id(load.key, n)
        for load in LOADS
        for n in range(load.total - load.available, load.total)
    ]
    shared = allocation.shared_allocation(policy, devices, available, [], size)
    assert allocation.pick_gpus(policy, LOADS, size) == dict(Counter(map(physical_key, shared)))


def test_pick_gpus_raises_when_the_gpus_cannot_cover_the_size() -> None:
    with pytest.raises(AllocationError, match=allocation.NOT_ENOUGH_DEVICES):
        allocation.pick_gpus("distributed", LOADS, 11)
    assert allocation.pick_gpus("distributed", LOADS, 0) == {}


def test_pick_gpus_rejects_duplicate_keys_and_impossible_loads() -> None:
    with pytest.raises(ValueError, match="duplicate gpu key"):
        allocation.pick_gpus("packed", [GpuLoad("a", 1, 1), GpuLoad("a", 2, 2)], 1)
    with pytest.raises(ValueError, match="invalid load for gpu a"):
        GpuLoad("a", 1, 2)


def test_packed_and_distributed_differ_on_the_same_input() -> None:
    assert allocation.pick_gpus("packed", LOADS, 3) != allocation.pick_gpus("distributed", LOADS, 3)


@pytest.mark.parametrize(
    ("indices", "paths", "available", "aligned"),
    [
        pytest.param(["0", "1"], ["/dev/nvidia0", "/dev/nvidia1"], ["GPU-0", "GPU-1"], True,
                     id="plain full gpus take the topology-aware path"),
        pytest.param(["0", "1"], ["/dev/dxg"], ["GPU-0", "GPU-1"], False,
                     id="a device with the wsl node /dev/dxg sends the resource to the shared loop"),
        pytest.param(["0", "1"], ["/dev/dxg0"], ["GPU-0", "GPU-1"], True,
                     id="a path that only starts with /dev/dxg is not wsl since upstream compares "
                     "the whole path"),
        pytest.param(["0", "1:0"], ["/dev/nvidia0"], ["GPU-0", "MIG-1"], False,
                     id="a mig index in the resource sends it to the shared loop"),
        pytest.param(["0", "1"], ["/dev/nvidia0"], ["GPU-0::0", "GPU-1"], False,
                     id="one replica among the offered ids sends the request to the shared loop"),
    ],
)
def test_takes_aligned_path(
    indices: list[str], paths: list[str], available: list[str], aligned: bool
) -> None:
    assert allocation.takes_aligned_path(indices, paths, available) is aligned
