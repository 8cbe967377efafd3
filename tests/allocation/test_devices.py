from __future__ import annotations

import pytest

from sharepack.common import devices


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        pytest.param("GPU-abc::3", ("GPU-abc", 3), id="a replica id splits into base and number"),
        pytest.param("GPU-abc", ("GPU-abc", None), id="a plain id has no replica number"),
        pytest.param("MIG-1::12", ("MIG-1", 12), id="a replicated MIG id splits the same way"),
    ],
)
def test_split_replica(device_id: str, expected: tuple[str, int | None]) -> None:
    assert devices.split_replica(device_id) == expected


@pytest.mark.parametrize(
    "device_id",
    [
        pytest.param("GPU-abc::", id="an empty replica number is rejected"),
        pytest.param("GPU-abc::x", id="a non-numeric replica number is rejected"),
        pytest.param("::3", id="an empty base is rejected"),
        pytest.param("GPU-abc::-1", id="a negative replica number is rejected"),
    ],
)
def test_split_replica_rejects_malformed_ids(device_id: str) -> None:
    with pytest.raises(ValueError, match="invalid replica id"):
        devices.split_replica(device_id)


def test_replica_id_round_trips_through_split() -> None:
    for n in (0, 1, 9, 10, 123):
        assert devices.split_replica(devices.replica_id("GPU-x", n)) == ("GPU-x", n)


@pytest.mark.parametrize(("base", "n"), [("", 0), ("GPU-x::1", 0), ("GPU-x", -1)])
def test_replica_id_rejects_bad_parts(base: str, n: int) -> None:
    with pytest.raises(ValueError):
        devices.replica_id(base, n)


@pytest.mark.parametrize(
    ("device_id", "key"),
    [("GPU-a::7", "GPU-a"), ("GPU-a", "GPU-a"), ("MIG-b::0", "MIG-b")],
)
def test_physical_key_is_the_part_before_the_separator(device_id: str, key: str) -> None:
    assert devices.physical_key(device_id) == key


def test_device_order_sorts_replicas_numerically_not_as_text() -> None:
    ids = ["g::10", "g::2", "f::1", "g", "g::0"]
    assert sorted(ids, key=devices.device_order) == ["f::1", "g", "g::0", "g::2", "g::10"]
