"""Allocation figures (a benchmark, not a test): `.venv/bin/python benchmarks/bench_allocation.py`.

Prints
* per-call time of `shared_allocation` at 8 GPUs x 10 replicas (size 4) and at
  64 GPUs x 64 replicas (size 2048), every policy;
* at the large size, the ratio against two re-sort-every-pick baselines with the same semantics
  (checked to return the same devices): `naive_devices` re-sorts every remaining candidate
  device per pick, the shape of upstream's loop before the #1826 heap; `naive_gpus` re-sorts
  only the per-GPU states per pick, a stronger baseline;
* `aligned_allocation` time at 8 GPUs (DGX-1 Volta fixture) and 16 GPUs (a hierarchical node and
  random score tables), every size, with and without a required GPU.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sharepack.common import allocation, topology  # noqa: E402
from sharepack.common.devices import device_order, physical_key, replica_id  # noqa: E402
from sharepack.common.errors import AllocationError  # noqa: E402
from sharepack.common.policies import Policy  # noqa: E402


def per_call(fn: Callable[[], object], *, min_time: float = 0.5, max_calls: int = 100_000) -> float:
    """Seconds per call: the best of 5 rounds, each long enough to time."""
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time / 5 or calls >= max_calls:
            break
        calls *= 2
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls)
    return min(rounds)


Counts = tuple[list[str], dict[str, int], dict[str, int], dict[str, int]]


def _counts(devices: Sequence[str], available: Sequence[str], must: Sequence[str]) -> Counts:
    """Candidates, and per GPU: total, offered, picked (seeded by must-include)."""
    known, skip = set(devices), set(must)
    candidates = [d for d in dict.fromkeys(available) if d in known and d not in skip]
    total: dict[str, int] = {}
    for d in devices:
        total[physical_key(d)] = total.get(physical_key(d), 0) + 1
    offered: dict[str, int] = {}
    for d in candidates:
        offered[physical_key(d)] = offered.get(physical_key(d), 0) + 1
    picked = dict.fromkeys(total, 0)
    for d in must:
        picked[physical_key(d)] += 1
    return candidates, total, offered, picked


def naive_devices(
    policy: Policy, devices: Sequence[str], available: Sequence[str], must: Sequence[str], size: int
) -> list[str]:
    """Re-sort every remaining candidate device before each pick (upstream before #1826)."""
    rank = allocation.comparator_for(policy)
    candidates, total, offered, picked = _counts(devices, available, must)
    needed = size - len(must)
    if len(candidates) < needed:
        raise AllocationError(allocation.NOT_ENOUGH_DEVICES)
    result = list(must)
    for _ in range(needed):
        candidates.sort(
            key=lambda d: (
                rank(total[physical_key(d)] - offered[physical_key(d)], picked[physical_key(d)]),
                physical_key(d),
                device_order(d),
            )
        )
        pick = candidates.pop(0)
        offered[physical_key(pick)] -= 1
        picked[physical_key(pick)] += 1
        result.append(pick)
    return result


def naive_gpus(
    policy: Policy, devices: Sequence[str], available: Sequence[str], must: Sequence[str], size: int
) -> list[str]:
    """Re-sort the per-GPU states before each pick; candidates pre-sorted per GPU."""
    rank = allocation.comparator_for(policy)
    candidates, total, offered, picked = _counts(devices, available, must)
    needed = size - len(must)
    if len(candidates) < needed:
        raise AllocationError(allocation.NOT_ENOUGH_DEVICES)
    queues: dict[str, list[str]] = {}
    for d in sorted(candidates, key=device_order, reverse=True):
        queues.setdefault(physical_key(d), []).append(d)
    result = list(must)
    for _ in range(needed):
        key = sorted(
            (k for k in queues if queues[k]),
            key=lambda k: (rank(total[k] - offered[k], picked[k]), k),
        )[0]
        offered[key] -= 1
        picked[key] += 1
        result.append(queues[key].pop())
    return result


def node(gpus: int, replicas: int, held: float, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    devices = [replica_id(f"GPU-{g:04d}", n) for g in range(gpus) for n in range(replicas)]
    available = [d for d in devices if rng.random() >= held]
    rng.shuffle(available)  # the kubelet offers a set; order carries nothing
    return devices, available


def bench_shared() -> None:
    print("shared_allocation, per call (best of 5 rounds)")
    small = node(8, 10, held=0.3, seed=1)
    for policy in Policy:
        t = per_call(lambda: allocation.shared_allocation(policy, *small, [], 4))
        print(f"  8 GPUs x 10 replicas, size 4     {policy.value:<12} {t * 1e6:8.1f} us")
    large = node(64, 64, held=0.25, seed=2)
    print(f"  (64 x 64: {len(large[1])} of {len(large[0])} replicas available; heap and baseline")
    print("   timed in alternating rounds, best round of each, so load on the machine hits both)")
    for policy in Policy:
        expected = allocation.shared_allocation(policy, *large, [], 2048)
        assert naive_gpus(policy, *large, [], 2048) == expected
        heap, gpus = interleaved(
            lambda: allocation.shared_allocation(policy, *large, [], 2048),
            lambda: naive_gpus(policy, *large, [], 2048),
        )
        print(
            f"  64 GPUs x 64 replicas, size 2048 {policy.value:<12} {heap * 1e3:8.2f} ms"
            f"   naive_gpus {gpus * 1e3:8.1f} ms ({gpus / heap:5.1f}x)"
        )
    # The device-level baseline takes seconds per call: three rounds, one policy.
    policy = Policy.PACKED
    assert naive_devices(policy, *large, [], 2048) == allocation.shared_allocation(
        policy, *large, [], 2048
    )
    heap, devices_time = interleaved(
        lambda: allocation.shared_allocation(policy, *large, [], 2048),
        lambda: naive_devices(policy, *large, [], 2048),
        rounds=3,
    )
    print(
        f"  64 GPUs x 64 replicas, size 2048 {policy.value:<12} {heap * 1e3:8.2f} ms"
        f"   naive_devices {devices_time * 1e3:8.0f} ms ({devices_time / heap:6.0f}x)"
    )


def interleaved(
    fast: Callable[[], object], slow: Callable[[], object], *, rounds: int = 9
) -> tuple[float, float]:
    """Seconds per call of each, best round, rounds alternating between the two."""
    best_fast = best_slow = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(10):
            fast()
        best_fast = min(best_fast, (time.perf_counter() - start) / 10)
        start = time.perf_counter()
        slow()
        best_slow = min(best_slow, time.perf_counter() - start)
    return best_fast, best_slow


def _fixture(name: str) -> tuple[dict[tuple[str, str], int], list[str]]:
    data = json.loads((ROOT / "tests/allocation/vectors/aligned_allocation_cases.json").read_text())
    topo = data["topologies"][name]
    scores = {(str(l["gpus"][0]), str(l["gpus"][1])): l["score"] for l in topo["links"]}
    return scores, [str(g["index"]) for g in topo["gpus"]]


def _hierarchical_16() -> tuple[dict[tuple[str, str], int], list[str]]:
    gpus = [f"GPU-{i:02d}" for i in range(16)]
    scores = {}
    for i, j in itertools.combinations(range(16), 2):
        level = 50 if i // 4 == j // 4 else 20 if i // 8 == j // 8 else 10
        scores[(gpus[i], gpus[j])] = level + (200 if i // 2 == j // 2 else 0)
    return scores, gpus


def _random_16(seed: int) -> tuple[dict[tuple[str, str], int], list[str]]:
    rng = random.Random(seed)
    gpus = [f"GPU-{i:02d}" for i in range(16)]
    levels = [0, 10, 20, 30, 40, 50, 60, 110, 130, 150, 210, 230, 250]
    return {pair: rng.choice(levels) for pair in itertools.combinations(gpus, 2)}, gpus


def bench_aligned() -> None:
    print("aligned_allocation, per call, over sizes 1..n x (no required, one required)")
    nodes = [("8 GPUs  dgx1_volta", _fixture("dgx1_volta"))]
    nodes += [("16 GPUs hierarchical", _hierarchical_16())]
    nodes += [(f"16 GPUs random #{s}", _random_16(s)) for s in range(3)]
    for label, (scores, gpus) in nodes:
        times, exact = [], 0
        for size in range(1, len(gpus) + 1):
            for required in ([], [gpus[3]]):
                work = topology.exact_work(len(gpus), size, len(required))
                exact += work <= topology.EXACT_WORK_BUDGET
                times.append(
                    per_call(
                        lambda: allocation.aligned_allocation(scores, gpus, required, size),
                        min_time=0.05,
                        max_calls=50,
                    )
                )
        print(
            f"  {label:<22} median {statistics.median(times) * 1e3:6.2f} ms"
            f"   max {max(times) * 1e3:6.2f} ms   ({exact}/{len(times)} shapes exact)"
        )
    print(f"  (exact search budget {topology.EXACT_WORK_BUDGET} work units; beyond: heuristic)")


if __name__ == "__main__":
    bench_shared()
    bench_aligned()
