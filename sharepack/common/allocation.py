"""Which devices a container gets: the shared-device greedy loop and the full-GPU entry point.

Shared devices (replicas, MIG instances) go through one greedy loop with the semantics of
upstream NVIDIA k8s-device-plugin v0.20 `greedyAlloc`; the policies differ only in the
comparator kept in `COMPARATORS`. Per physical GPU the loop tracks

* `total`      devices of the resource on that GPU,
* `available`  candidates still on offer (available, not must-include, not yet picked),
* `allocated`  `total - available`: held by other pods, unhealthy, must-include, or picked by
               this very call, so every pick makes its GPU look fuller,
* `picked_from` picks this call took from the GPU. For `distributed` and `packed` it starts at
               zero, as upstream's `pickedFrom` does (must-include devices count only in
               `allocated`); `spread`, ours alone, seeds it with the must-include devices, so
               a request that already holds a GPU goes to others first.

Each step takes one device from the GPU the comparator ranks first. Ties the comparator leaves
open are broken deterministically (upstream breaks them by Go map order, i.e. randomly): first
the physical key (string order), then, within a GPU, replica number order
(`common.devices.device_order`: base ID, then ID length, then text, so `x::2` comes before
`x::10`). The order in which the kubelet lists the devices never matters. A heap keyed by the
rank makes the cost O(n log m) for n picks over m physical GPUs (upstream #1826).

`pick_gpus` runs the same loop over counts (`GpuLoad`), for the extender's scoring and the trace
simulator: without must-include it gives exactly the per-GPU counts `shared_allocation` gives.

Where we differ from upstream on purpose:

* MIG instances are grouped by their parent GPU through `group_of` (upstream keys a MIG device
  by its own UUID, so `packed` cannot pack plain MIG there).
* Must-include IDs are de-duplicated (first occurrence kept) before `size` is compared with
  them; upstream counts and returns a repeated must-include ID once per occurrence, so
  `["a::0", "a::0"]` with size 3 gets one pick there and two here. The kubelet sends a set.
* An unknown policy name raises `ValueError`; upstream's `comparatorForPolicy` falls back to
  `distributed`. Config validation rejects unknown names at startup, so the fallback only hides
  caller bugs at this entry point.
"""

from __future__ import annotations

import heapq
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from sharepack.common import topology
from sharepack.common.devices import REPLICA_SEPARATOR, device_order
from sharepack.common.errors import AllocationError
from sharepack.common.policies import Policy

__all__ = [
    "COMPARATORS",
    "NOT_ENOUGH_DEVICES",
    "AllocationError",
    "Comparator",
    "GpuLoad",
    "aligned_allocation",
    "comparator_for",
    "pick_gpus",
    "preferred",
    "shared_allocation",
    "takes_aligned_path",
]

NOT_ENOUGH_DEVICES = "not enough available devices to satisfy allocation"
WSL_DEVICE_NODE = "/dev/dxg"

Comparator = Callable[[int, int], tuple[int, int]]
"""Rank of one physical GPU from `(allocated, picked_from)`; the lowest rank is picked next.

A rank (sort key) rather than upstream's two-argument `less(i, j)`: the heap then compares
native tuples, and `preferred` recovers the pairwise form (`rank(i) < rank(j)`). A comparator
must look only at these two counts; the tie-break after them is the loop's, not the policy's.
"""


def _distributed(allocated: int, picked_from: int) -> tuple[int, int]:
    # Fewest allocated first; among equals the GPU this call has used least, so a request
    # keeps rotating over equally loaded GPUs instead of draining the first one (#1788).
    return allocated, picked_from


def _packed(allocated: int, picked_from: int) -> tuple[int, int]:
    # Most allocated first, so replicas land on GPUs already in use and whole GPUs stay free.
    return -allocated, picked_from


def _spread(allocated: int, picked_from: int) -> tuple[int, int]:
    # Least touched by this request first (most distinct GPUs), then fewest allocated.
    return picked_from, allocated


COMPARATORS: Mapping[Policy, Comparator] = MappingProxyType(
    {Policy.DISTRIBUTED: _distributed, Policy.PACKED: _packed, Policy.SPREAD: _spread}
)

# Policies whose `picked_from` starts with the must-include devices (see the module docstring).
SEEDS_PICKED_FROM = frozenset({Policy.SPREAD})


def comparator_for(policy: Policy | str) -> Comparator:
    try:
        return COMPARATORS[Policy(policy)]
    except (ValueError, KeyError):
        names = ", ".join(p.value for p in Policy)
        raise ValueError(f"unknown allocation policy: {policy!r} (want one of {names})") from None


def preferred(
    policy: Policy | str,
    i: tuple[int, int, int],
    j: tuple[int, int, int],
) -> bool:
    """Upstream's pairwise form: is GPU `i` picked before GPU `j`? Each is
    `(total, available, picked_from)`. False both ways means a tie the loop breaks by key."""
    rank = comparator_for(policy)
    return rank(i[0] - i[1], i[2]) < rank(j[0] - j[1], j[2])


def _greedy_picks(
    rank: Comparator,
    allocated: list[int],
    available: list[int],
    picked_from: list[int],
    needed: int,
) -> list[int]:
    """The one greedy loop. Returns, per pick, the index of the GPU it came from.

    The lists are per physical GPU, already in tie-break order (index = physical-key order), and
    are updated in place. Only the popped GPU's counts change per step, so every other heap entry
    keeps a valid rank; the caller guarantees `needed <= sum(available)`.
    """
    heap = [(rank(allocated[g], picked_from[g]), g) for g in range(len(available)) if available[g]]
    heapq.heapify(heap)
    order: list[int] = []
    append, replace, pop = order.append, heapq.heapreplace, heapq.heappop
    for _ in range(needed):
        g = heap[0][1]
        allocated[g] += 1
        picked_from[g] += 1
        available[g] -= 1
        append(g)
        if available[g]:
            replace(heap, (rank(allocated[g], picked_from[g]), g))
        else:
            pop(heap)
    return order


_KEY_PART = operator.itemgetter(0)
_SPLIT = operator.methodcaller("partition", REPLICA_SEPARATOR)


def _default_keys(device_ids: Iterable[str]) -> Iterator[str]:
    # map() over C callables: no Python frame per device, which matters at 4096 devices.
    return map(_KEY_PART, map(_SPLIT, device_ids))


def _key_mapper(
    group_of: Callable[[str], str] | Mapping[str, str] | None,
) -> Callable[[Iterable[str]], Iterator[str]] | None:
    """Physical keys of many IDs at once; None for the default (`::` prefix) grouping."""
    if group_of is None:
        return None
    if isinstance(group_of, Mapping):
        mapping = group_of

        def lookup(device_id: str) -> str:
            # An ID the mapping lacks falls back to its `::` prefix rather than failing the
            # request: the kubelet only offers IDs we advertised, which the mapping covers.
            return mapping.get(device_id) or device_id.partition(REPLICA_SEPARATOR)[0]

        return lambda device_ids: map(lookup, device_ids)
    function = group_of
    return lambda device_ids: map(function, device_ids)


def shared_allocation(
    policy: Policy | str,
    devices: Sequence[str],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    group_of: Callable[[str], str] | Mapping[str, str] | None = None,
) -> list[str]:
    """Choose `size` shared devices: must-include first (in the order given), then the picks.

    `devices` is every device ID of the resource (it gives each GPU's `total`); `available` IDs
    that are not in `devices` are ignored, as upstream's `Subset` does. When must-include alone
    reaches `size`, it is returned as is (upstream does the same; the kubelet never asks that).
    Raises `AllocationError(NOT_ENOUGH_DEVICES)` when the candidates cannot fill the request.
    """
    rank = comparator_for(policy)
    custom_keys = _key_mapper(group_of)
    keys_of = custom_keys or _default_keys
    must = list(dict.fromkeys(must_include))
    needed = size - len(must)
    if needed <= 0:
        return must

    known = set(devices)
    skip = set(must)
    candidates = [d for d in dict.fromkeys(available) if d in known and d not in skip]
    if len(candidates) < needed:
        raise AllocationError(NOT_ENOUGH_DEVICES)
    by_key: dict[str, list[str]] = {}
    for device_id, key in zip(candidates, keys_of(candidates)):
        bucket = by_key.get(key)
        if bucket is None:
            by_key[key] = [device_id]
        else:
            bucket.append(device_id)
    # allocated = total - available: the resource's devices on that GPU that are not on offer
    # (held by others, unhealthy, or must-include), counted without touching the offered ones.
    held = Counter(keys_of(known.difference(candidates)))

    keys = sorted(by_key)
    position = {key: g for g, key in enumerate(keys)}
    offered = [len(by_key[key]) for key in keys]
    allocated = [held[key] for key in keys]
    picked_from = [0] * len(keys)
    if Policy(policy) in SEEDS_PICKED_FROM:
        for key in keys_of(must):
            g = position.get(key)
            if g is not None:
                picked_from[g] += 1

    order = _greedy_picks(rank, allocated, offered, picked_from, needed)

    # Hand out each GPU's candidates in device order; only GPUs that gave something are sorted.
    queues: dict[int, list[str]] = {}
    cursor = [0] * len(keys)
    result = must
    for g in order:
        queue = queues.get(g)
        if queue is None:
            queue = queues[g] = by_key[keys[g]]
            if custom_keys is None:
                # One physical key = one base ID, so device order is (length, text): two C
                # sorts, the second stable, instead of a Python key per device.
                queue.sort()
                queue.sort(key=len)
            else:
                queue.sort(key=device_order)
        result.append(queue[cursor[g]])
        cursor[g] += 1
    return result


@dataclass(frozen=True, slots=True)
class GpuLoad:
    """Count-level view of one physical GPU, for scoring and trace simulation."""

    key: str
    total: int  # devices of the resource on this GPU
    available: int  # offered now (total - held by others - unhealthy)

    def __post_init__(self) -> None:
        if not 0 <= self.available <= self.total:
            raise ValueError(
                f"invalid load for gpu {self.key}: available {self.available} "
                f"not within 0..total {self.total}"
            )


def pick_gpus(policy: Policy | str, loads: Sequence[GpuLoad], size: int) -> dict[str, int]:
    """How many devices each GPU gives to a request of `size`, by the same loop as
    `shared_allocation` (no must-include). Keys of GPUs that give nothing are left out."""
    rank = comparator_for(policy)
    if size <= 0:
        return {}
    ordered = sorted(loads, key=lambda load: load.key)
    for a, b in zip(ordered, ordered[1:]):
        if a.key == b.key:
            raise ValueError(f"duplicate gpu key in loads: {a.key}")
    offered = [load.available for load in ordered]
    if sum(offered) < size:
        raise AllocationError(NOT_ENOUGH_DEVICES)
    allocated = [load.total - load.available for load in ordered]
    order = _greedy_picks(rank, allocated, offered, [0] * len(ordered), size)
    counts: dict[str, int] = {}
    for g in order:
        key = ordered[g].key
        counts[key] = counts.get(key, 0) + 1
    return counts


def aligned_allocation(
    pair_scores: Mapping[tuple[str, str], int],
    available: Sequence[str],
    required: Sequence[str],
    size: int,
    *,
    index_of: Mapping[str, int] | None = None,
) -> list[str]:
    """Topology-aware choice of `size` full GPUs (go-gpuallocator best-effort semantics);
    `[]` when no allocation is possible. Ties go to the lowest GPU index (`index_of`, ID text
    for GPUs it lacks), whatever order `available` comes in. See `common.topology`."""
    return topology.best_effort(pair_scores, available, required, size, index_of=index_of)


def takes_aligned_path(
    indices: Iterable[str], paths: Iterable[str], available: Iterable[str]
) -> bool:
    """Whether a request goes to `aligned_allocation` rather than the shared greedy loop.

    As upstream: every device of the resource is a full GPU (its index has no `gpu:mig` colon,
    no path that is exactly the WSL node `/dev/dxg`) and no offered ID is a replica; the shared
    policy is then ignored.
    """
    return (
        all(":" not in index for index in indices)
        and not any(path == WSL_DEVICE_NODE for path in paths)
        and not any(REPLICA_SEPARATOR in device_id for device_id in available)
    )
