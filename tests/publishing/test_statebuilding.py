"""common.statebuilding: the published counts, grouped exactly as the allocation core groups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest

from sharepack.common import state as schema
from sharepack.common.config import load_config
from sharepack.common.inventory import Gpu, Inventory, MigDevice
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.resources import Resource, build_resources
from sharepack.common.state import NodeState
from sharepack.common.statebuilding import (
    PodDevices,
    app_allocations,
    build_node_state,
    group_pod_devices,
    same_content,
    status_document,
    with_init_container_devices,
)


def _uuid(i: int) -> str:
    return f"GPU-{i:08x}-2222-4000-8000-000000000000"


def _mig(gpu: int, k: int) -> str:
    return f"MIG-{gpu:04x}{k:04x}-2222-4000-8000-000000000000"


def _inventory(n: int, *, mig: bool = False) -> Inventory:
    gpus = []
    for i in range(n):
        migs = tuple(
            MigDevice(uuid=_mig(i, k), parent_uuid=_uuid(i), parent_index=i, gi_id=k + 1, ci_id=0,
                      profile="1g.5gb", placement_start=k, placement_size=1, memory_mib=4864, index=k)
            for k in range(3)
        ) if mig else ()
        gpus.append(Gpu(index=i, uuid=_uuid(i), name="NVIDIA A100-SXM4-40GB", memory_mib=40960, minor=i,
                        pci_bus_id=f"00000000:{i + 7:02X}:00.0", numa_node=0, compute_capability=(8, 0),
                        mig_enabled=mig, mig_devices=migs))
    return Inventory(gpus=tuple(gpus))


def _resources(text: str, inventory: Inventory, **flags: str) -> tuple[Resource, ...]:
    return build_resources(inventory, load_config(file_text=text, file_source="t", env={}, flags=flags))


SLICED = """
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def _build(
    resources: Sequence[Resource],
    pods: Sequence[PodDevices] = (),
    *,
    unhealthy: Sequence[str] = (),
    uids: Mapping[tuple[str, str], str] | None = None,
    recent: Mapping[str, Sequence[str]] | None = None,
) -> NodeState:
    return build_node_state(
        resources=resources, unhealthy=unhealthy, pods=pods,
        pod_uids=uids if uids is not None else {("default", p.name): f"uid-{p.name}" for p in pods},
        allocation_policy=Policy.PACKED, mig_strategy=MigStrategy.NONE, agent_version="t",
        observed_at="2026-11-30T00:00:00Z", recently_allocated=recent,
    )


def _counts(state: NodeState, resource: str) -> list[tuple[int, int, int]]:
    res = state.resource(resource)
    assert res is not None
    return [(g.total, g.allocated, g.unhealthy) for g in res.gpus]


def _pod(name: str, resource: str, *ids: str) -> PodDevices:
    return PodDevices("default", name, {resource: frozenset(ids)})


G0, G1 = _uuid(0), _uuid(1)


@pytest.mark.parametrize(
    ("pods", "unhealthy", "expected"),
    [
        ([], [], [(4, 0, 0), (4, 0, 0)]),
        ([_pod("a", "nvidia.com/gpu", f"{G0}::0", f"{G0}::1")], [], [(4, 2, 0), (4, 0, 0)]),
        ([_pod("a", "nvidia.com/gpu", f"{G0}::0"), _pod("b", "nvidia.com/gpu", f"{G1}::3")], [],
         [(4, 1, 0), (4, 1, 0)]),
        ([], [f"{G1}::0", f"{G1}::1", f"{G1}::2", f"{G1}::3"], [(4, 0, 0), (4, 0, 4)]),
        ([_pod("a", "nvidia.com/gpu", f"{G1}::0")], [f"{G1}::0", f"{G1}::1"], [(4, 0, 0), (4, 1, 1)]),
        ([_pod("a", "nvidia.com/gpu", f"{G0}::0", "GPU-gone::0")], [], [(4, 1, 0), (4, 0, 0)]),
        ([_pod("a", "nvidia.com/other", f"{G0}::0")], [], [(4, 0, 0), (4, 0, 0)]),
    ],
    ids=[
        "nothing held",
        "replicas of one GPU count on that GPU",
        "two pods on two GPUs",
        "an unhealthy GPU counts every replica unhealthy",
        "a held device that turns unhealthy counts once, as allocated",
        "device IDs the resources do not know are ignored",
        "another resource's devices do not count",
    ],
)
def test_replicas_are_counted_per_physical_gpu(
    pods: list[PodDevices], unhealthy: list[str], expected: list[tuple[int, int, int]]
) -> None:
    state = _build(_resources(SLICED, _inventory(2)), pods, unhealthy=unhealthy)
    assert _counts(state, "nvidia.com/gpu") == expected
    res = state.resource("nvidia.com/gpu")
    assert res is not None and res.sharing is Sharing.TIME_SLICING
    assert [g.key for g in res.gpus] == [G0, G1]
    assert [g.free for g in res.gpus] == [t - a - u for t, a, u in expected]


def test_mig_instances_group_under_their_parent_gpu() -> None:
    resources = _resources("version: v1\n", _inventory(2, mig=True), **{"mig-strategy": "mixed"})
    state = _build(resources, [_pod("a", "nvidia.com/mig-1g.5gb", _mig(1, 0), _mig(1, 2))])
    res = state.resource("nvidia.com/mig-1g.5gb")
    assert res is not None
    assert [(g.key, g.index, g.total, g.allocated) for g in res.gpus] == [(G0, "0", 3, 0), (G1, "1", 3, 2)]


def test_pods_are_listed_by_uid_on_the_gpus_they_hold() -> None:
    pods = [_pod("a", "nvidia.com/gpu", f"{G0}::0", f"{G1}::0"), _pod("b", "nvidia.com/gpu", f"{G0}::1"),
            _pod("c", "nvidia.com/gpu", f"{G1}::1")]
    uids = {("default", "a"): "uid-a", ("default", "b"): "uid-b"}  # c's UID not known yet
    state = _build(_resources(SLICED, _inventory(2)), pods, uids=uids)
    res = state.resource("nvidia.com/gpu")
    assert res is not None
    assert [g.pods for g in res.gpus] == [("uid-a", "uid-b"), ("uid-a",)]
    assert _counts(state, "nvidia.com/gpu") == [(4, 2, 0), (4, 2, 0)], "c holds its device all the same"


def test_recent_allocations_count_until_pod_resources_shows_them() -> None:
    pods = [_pod("a", "nvidia.com/gpu", f"{G0}::0")]
    recent = {"nvidia.com/gpu": [f"{G0}::0", f"{G1}::2"]}
    state = _build(_resources(SLICED, _inventory(2)), pods, recent=recent)
    assert _counts(state, "nvidia.com/gpu") == [(4, 1, 0), (4, 1, 0)]


def test_pod_resources_entries_per_numa_node_and_container_are_folded() -> None:
    entries = [
        ("nvidia.com/gpu", [f"{G0}::0"]),  # NUMA node 0
        ("nvidia.com/gpu", [f"{G0}::0"]),  # the same device again, NUMA node 1
        ("nvidia.com/gpu", [f"{G1}::1"]),  # second container
        ("nvidia.com/mig-1g.5gb", [_mig(0, 0)]),
    ]
    pod = group_pod_devices("ns", "p", entries)
    assert dict(pod.devices) == {
        "nvidia.com/gpu": frozenset({f"{G0}::0", f"{G1}::1"}),
        "nvidia.com/mig-1g.5gb": frozenset({_mig(0, 0)}),
    }


def test_the_status_document_round_trips_and_carries_a_summary() -> None:
    pods = [_pod("a", "nvidia.com/gpu", f"{G0}::0", f"{G0}::1")]
    state = _build(_resources(SLICED, _inventory(3)), pods, unhealthy=[f"{_uuid(2)}::0"])
    doc = status_document(state)
    assert doc["summary"] == {"freeGpus": 1, "gpus": 3, "replicasUsed": 2, "replicasTotal": 12, "replicas": "2/12"}
    assert schema.from_status(doc) == state


def test_same_content_ignores_only_the_observation_time() -> None:
    resources = _resources(SLICED, _inventory(1))
    a = _build(resources)
    later = build_node_state(
        resources=resources, unhealthy=(), pods=(), pod_uids={}, allocation_policy=Policy.PACKED,
        mig_strategy=MigStrategy.NONE, agent_version="t", observed_at="2026-12-01T00:00:00Z",
    )
    assert same_content(a, later)
    assert not same_content(a, _build(resources, [_pod("a", "nvidia.com/gpu", f"{G0}::0")]))
    assert not same_content(a, None) and same_content(None, None)


@dataclass(frozen=True)
class Alloc:
    resource: str
    device_ids: tuple[str, ...]
    at: float


R = "nvidia.com/gpu"


def _a(at: float, *ids: str) -> Alloc:
    return Alloc(R, ids, at)


@pytest.mark.parametrize(
    ("log", "listed", "ever_listed", "expected"),
    [
        ([_a(0.0, "d0", "d1", "d2"), _a(0.01, "d0")], {"d0"}, [], {"d0", "d1", "d2"}),
        ([_a(0.0, "d0", "d1"), _a(0.01, "d0", "d3"), _a(0.02, "d3")], {"d3"}, [], {"d0", "d1", "d3"}),
        ([_a(0.0, "d0"), _a(0.01, "d0", "d1")], {"d0", "d1"}, [], {"d0", "d1"}),
        ([_a(0.0, "d0", "d1", "d2"), _a(0.01, "d0")], {"d0"}, [_a(0.0, "d0", "d1", "d2")], {"d0"}),
        ([_a(0.0, "d0", "d1", "d2"), _a(5.0, "d0")], {"d0"}, [], {"d0"}),
        ([_a(0.0, "d1", "d2"), _a(0.01, "d0")], {"d0"}, [], {"d0"}),
        ([_a(0.0, "d1", "d2"), Alloc("nvidia.com/other", ("d1",), 0.01)], set(), [], set()),
    ],
    ids=[
        "an init container's unreused devices stay with its pod",
        "several init containers chain back",
        "an init container whose devices the app reuses adds nothing",
        "an allocation PodResources once listed (an ended pod) is never an init container's",
        "an allocation long before the pod's is not its init container's",
        "an allocation sharing no device with the next is not its init container's",
        "allocations of another resource do not chain",
    ],
)
def test_init_container_devices_are_recovered_from_the_allocation_log(
    log: list[Alloc], listed: set[str], ever_listed: list[Alloc], expected: set[str]
) -> None:
    pods = [_pod("p", R, *listed)] if listed else []
    out = with_init_container_devices(pods, log, ever_listed=set(ever_listed))
    held = set(out[0].devices.get(R, ())) if out else set()
    assert held == expected


def test_app_allocations_are_those_one_listed_pod_holds_entirely() -> None:
    pods = [_pod("p", R, "d0", "d1"), _pod("q", R, "d2")]
    log = [_a(0.0, "d0", "d1"), _a(0.1, "d1", "d2"), _a(0.2, "d2"), _a(0.3, "d9")]
    assert app_allocations(log, pods) == {log[0], log[2]}


def _normalized(state: NodeState) -> NodeState:
    """What `same_use` compares, built the slow way: no observation time, pods sorted."""
    from dataclasses import replace

    return replace(state, observed_at="", resources=tuple(
        replace(r, gpus=tuple(replace(g, pods=tuple(sorted(g.pods))) for g in r.gpus)) for r in state.resources))  # fmt: skip


def test_same_use_compares_every_field_but_the_time_and_the_order_of_pods() -> None:
    """`same_use` compares field by field (tests/scoring/test_scoring.py pins the fields, so a
    new one fails there until it is compared here too); every field it knows makes a difference."""
    from dataclasses import replace

    from sharepack.common.state import ResourceState
    from sharepack.common.statebuilding import same_use

    g = schema.GpuState("GPU-a", "0", "A100", 10, 3, 0, ("p2", "p1"))
    r = ResourceState("nvidia.com/gpu.shared", Sharing.TIME_SLICING, False, (g, replace(g, key="GPU-b", index="1")))
    a = NodeState("2026-12-06T00:00:00Z", "1.0", Policy.PACKED, MigStrategy.NONE, (r,))
    later_sorted = replace(a, observed_at="2026-12-06T00:01:00Z", resources=(
        replace(r, gpus=(replace(g, pods=("p1", "p2")), r.gpus[1])),))  # fmt: skip
    assert same_use(a, later_sorted) and _normalized(a) == _normalized(later_sorted)
    changes = [
        replace(a, agent_version="1.1"), replace(a, allocation_policy=Policy.DISTRIBUTED),
        replace(a, mig_strategy=MigStrategy.MIXED), replace(a, schema_version=a.schema_version + 1),
        replace(a, resources=()), replace(a, resources=(r, r)),
        *(replace(a, resources=(replace(r, **{k: v}),)) for k, v in (
            ("name", "nvidia.com/gpu"), ("sharing", Sharing.MPS), ("fail_requests_greater_than_one", True),
            ("gpus", (g,)))),
        *(replace(a, resources=(replace(r, gpus=(replace(g, **{k: v}), r.gpus[1])),)) for k, v in (
            ("key", "GPU-z"), ("index", "7"), ("product", "H100"), ("total", 9), ("allocated", 4), ("unhealthy", 1),
            ("pods", ("p1",)), ("pods", ("p1", "p3")))),
    ]  # fmt: skip
    for changed in changes:
        assert not same_use(a, changed) and _normalized(a) != _normalized(changed), changed
