"""What a node's NodeGpuState must say after pods were admitted in a given order, computed from
`common.allocation.shared_allocation` directly (not through the fleet's code path), and the
published state read back from the API as the same shape."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sharepack.common import allocation, devices
from sharepack.common.policies import Policy

Counts = dict[str, tuple[int, frozenset[str]]]  # GPU key -> (allocated, pod UIDs)


def replayed(node: str, gpus: int, replicas: int, policy: Policy, admitted: Sequence[tuple[str, int]]) -> Counts:
    """Per GPU of `node`, the replicas taken and by whom, after `admitted` (uid, replicas) in order."""
    ids = [devices.replica_id(f"GPU-{node}-{g}", r) for g in range(gpus) for r in range(replicas)]
    free = set(ids)
    taken: dict[str, int] = {f"GPU-{node}-{g}": 0 for g in range(gpus)}
    holders: dict[str, set[str]] = {key: set() for key in taken}
    for uid, size in admitted:
        picked = allocation.shared_allocation(policy, ids, sorted(free), [], size)
        free.difference_update(picked)
        for device_id in picked:
            key = devices.physical_key(device_id)
            taken[key] += 1
            holders[key].add(uid)
    return {key: (taken[key], frozenset(holders[key])) for key in taken}


def published(obj: Mapping[str, Any], resource: str = "nvidia.com/gpu.shared") -> Counts:
    """The same view of a NodeGpuState object as the API returns it."""
    (res,) = [r for r in obj["status"]["resources"] if r["name"] == resource]
    return {g["key"]: (g["allocated"], frozenset(g["pods"])) for g in res["gpus"]}
