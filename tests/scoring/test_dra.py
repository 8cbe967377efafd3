"""The DRA mode's core: ResourceSlices and ResourceClaims decoded into the per-GPU view
(common.draslices), the scheduler's first-fit allocation of an extended-resource claim
(common.draallocation), and node scores over that placement (common.drascoring)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharepack.common import draallocation, draslices, drascoring, scoring
from sharepack.common.draslices import DRIVER
from sharepack.common.errors import DraSchemaError
from sharepack.common.podrequests import ContainerKind, ContainerRequest, PodRequest
from sharepack.common.policies import NodePolicy, Policy
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.common.policies import MigStrategy, Sharing

SHARED = draslices.SHARED_RESOURCE
WHOLE = draslices.WHOLE_RESOURCE
NODE = "gpu-node-1"


def _attrs(gpu: int, dtype: str, replica: int | None = None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "uuid": {"string": f"GPU-{gpu}"},
        "index": {"int": gpu},
        "productName": {"string": "NVIDIA A100-SXM4-40GB"},
        "type": {"string": dtype},
    }
    if replica is not None:
        attrs["replica"] = {"int": replica}
    return attrs


def replica_devices(gpus: int, replicas: int, *, gpu_major: bool = True) -> list[dict[str, Any]]:
    """One device per replica; GPU-major (all of GPU 0 first) or replica-major order."""
    pairs = [(g, r) for g in range(gpus) for r in range(replicas)]
    if not gpu_major:
        pairs.sort(key=lambda p: (p[1], p[0]))
    return [{"name": f"gpu-{g}-replica-{r}", "attributes": _attrs(g, "shared", r)} for g, r in pairs]


def capacity_devices(gpus: int, replicas: int, default: int | None = 1) -> list[dict[str, Any]]:
    """One multi-allocatable device per GPU with `replicas` capacity."""
    policy = {} if default is None else {"requestPolicy": {"default": str(default), "validRange": {"min": "1"}}}
    return [
        {
            "name": f"gpu-{g}-shared",
            "attributes": _attrs(g, "shared"),
            "allowMultipleAllocations": True,
            "capacity": {"replicas": {"value": str(replicas), **policy}},
        }
        for g in range(gpus)
    ]


def whole_devices(gpus: int) -> list[dict[str, Any]]:
    return [{"name": f"gpu-{g}", "attributes": _attrs(g, "gpu")} for g in range(gpus)]


def rslice(
    devices: list[dict[str, Any]], *, name: str = "s0", pool: str = NODE, generation: int = 1, count: int = 1
) -> dict[str, Any]:
    return {
        "kind": "ResourceSlice",
        "metadata": {"name": f"{pool}-{name}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": pool,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def claim(*devices: str, pool: str = NODE, pod: str = "pod-a", consumed: int | None = None) -> dict[str, Any]:
    results = []
    for i, d in enumerate(devices):
        r: dict[str, Any] = {"request": f"container-1-request-{i}", "driver": DRIVER, "pool": pool, "device": d}
        if consumed is not None:
            r["consumedCapacity"] = {"replicas": str(consumed)}
            r["shareID"] = f"share-{i}"
        results.append(r)
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": f"{pod}-extended-resources-x", "namespace": "default"},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}],
        },
    }


def node_of(slices: list[dict[str, Any]], claims: list[dict[str, Any]] = ()) -> draslices.DraNode:  # type: ignore[assignment]
    devices = draslices.pool_devices(slices, NODE)
    assert devices is not None
    holdings = [h for c in claims for h in draslices.claim_holdings(c)]
    return draslices.dra_node(NODE, devices, holdings)


def request(*amounts: int, resource: str = SHARED, init: tuple[int, ...] = ()) -> PodRequest:
    containers = [
        ContainerRequest(f"i{i}", ContainerKind.INIT, ((resource, n),) if n else ()) for i, n in enumerate(init)
    ] + [ContainerRequest(f"c{i}", ContainerKind.APP, ((resource, n),) if n else ()) for i, n in enumerate(amounts)]
    return PodRequest("uid-new", "default", "new", tuple(containers))


def per_gpu(state: NodeState, resource: str = SHARED) -> list[tuple[str, int, int]]:
    res = state.resource(resource)
    assert res is not None
    return [(g.key, g.total, g.allocated) for g in res.gpus]


# --- decoding: both shared representations give the same per-GPU view ----------------------


def test_replica_devices_and_capacity_devices_publish_the_same_per_gpu_counts() -> None:
    by_replica = node_of(
        [rslice(replica_devices(2, 4))],
        [claim("gpu-0-replica-0", "gpu-0-replica-1"), claim("gpu-1-replica-0", pod="b")],
    )
    by_capacity = node_of(
        [rslice(capacity_devices(2, 4))],
        [claim("gpu-0-shared", consumed=2), claim("gpu-1-shared", pod="b", consumed=1)],
    )
    want = [("GPU-0", 4, 2), ("GPU-1", 4, 1)]
    assert per_gpu(draslices.node_state(by_replica)) == want
    assert per_gpu(draslices.node_state(by_capacity)) == want


def test_a_shared_allocation_without_recorded_consumed_capacity_counts_the_request_policy_default() -> None:
    n = node_of([rslice(capacity_devices(1, 4, default=1))], [claim("gpu-0-shared"), claim("gpu-0-shared", pod="b")])
    assert per_gpu(draslices.node_state(n)) == [("GPU-0", 4, 2)]


def test_a_capacity_without_a_default_is_consumed_whole_as_the_allocator_does() -> None:
    n = node_of([rslice(capacity_devices(1, 4, default=None))])
    assert n.devices[0].use == 4


def test_the_pods_holding_a_gpu_are_the_claims_reserved_pods() -> None:
    n = node_of([rslice(replica_devices(1, 4))], [claim("gpu-0-replica-0"), claim("gpu-0-replica-1", pod="b")])
    res = draslices.node_state(n).resource(SHARED)
    assert res is not None and res.gpus[0].pods == ("uid-pod-a", "uid-b")


def test_a_gpu_taken_whole_has_no_free_replicas_and_a_gpu_with_a_replica_taken_is_not_free_whole() -> None:
    devices = whole_devices(2) + replica_devices(2, 4)
    n = node_of([rslice(devices)], [claim("gpu-0"), claim("gpu-1-replica-3", pod="b")])
    state = draslices.node_state(n)
    assert per_gpu(state, WHOLE) == [("GPU-0", 1, 1), ("GPU-1", 1, 1)]
    assert per_gpu(state, SHARED) == [("GPU-0", 4, 4), ("GPU-1", 4, 1)]


def test_ranked_in_replicas_a_gpu_held_whole_is_taken_and_one_with_a_replica_taken_keeps_the_rest() -> None:
    devices = whole_devices(3) + replica_devices(3, 4)
    state = draslices.node_state(node_of([rslice(devices)], [claim("gpu-0"), claim("gpu-1-replica-3", pod="b")]))
    whole_of = (WHOLE, SHARED)
    assert scoring.free_shares(state) == {"GPU-0": 0, "GPU-1": 0, "GPU-2": 1000}  # the two-resource view
    merged, placement = scoring.whole_as_shares(state, {WHOLE: ("GPU-2",)}, whole_of)
    assert [r.name for r in merged.resources] == [SHARED]
    assert scoring.free_shares(merged) == {"GPU-0": 0, "GPU-1": 750, "GPU-2": 1000}
    assert placement == {SHARED: ("GPU-2",) * 4}  # a whole GPU taken is all its replicas
    assert scoring.free_shares(merged, placement)["GPU-2"] == 0
    # A whole GPU held while its replicas show none taken (a pod the extender assumed on it
    # before the claim shows up) is taken in replicas too.
    assumed = scoring.apply_placement(state, "assumed", {WHOLE: ("GPU-2",)})
    assert scoring.free_shares(scoring.whole_as_shares(assumed, {}, whole_of)[0])["GPU-2"] == 0


def test_claims_of_other_drivers_and_pools_are_ignored() -> None:
    other = claim("gpu-0-replica-0", pool="gpu-node-2")
    foreign = claim("gpu-0-replica-1")
    foreign["status"]["allocation"]["devices"]["results"][0]["driver"] = "gpu.nvidia.com"
    n = node_of([rslice(replica_devices(1, 4))], [other, foreign])
    assert per_gpu(draslices.node_state(n)) == [("GPU-0", 4, 0)]


def test_slices_are_met_by_name_and_only_the_newest_generation_counts() -> None:
    old = rslice(replica_devices(1, 2), name="a", generation=1)
    b = rslice([{"name": "late", "attributes": _attrs(1, "shared", 0)}], name="b", generation=2, count=2)
    a = rslice([{"name": "early", "attributes": _attrs(0, "shared", 0)}], name="a", generation=2, count=2)
    devices = draslices.pool_devices([old, b, a], NODE)
    assert devices is not None and [d.name for d in devices] == ["early", "late"]


def test_an_incomplete_pool_offers_nothing() -> None:
    assert draslices.pool_devices([rslice(replica_devices(1, 2), count=2)], NODE) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["attributes"].pop("uuid"), "attribute 'uuid' missing"),
        (lambda d: d["attributes"].update(type={"string": "mig"}), "attribute type 'mig'"),
        (lambda d: d["attributes"].update(index={"int": "two"}), "attribute index"),
        (lambda d: d.update(allowMultipleAllocations=True), "must offer capacity 'replicas'"),
    ],
    ids=["a device without uuid", "an unknown type", "a non-integer index", "a shared device without capacity"],
)
def test_a_malformed_device_is_rejected_naming_the_slice_and_device(change: Any, message: str) -> None:
    devices = replica_devices(1, 1)
    change(devices[0])
    with pytest.raises(DraSchemaError, match=message) as e:
        draslices.pool_devices([rslice(devices)], NODE)
    assert f"ResourceSlice {NODE}-s0 spec.devices[0] (gpu-0-replica-0)" in str(e.value)


def test_qualified_attribute_names_are_read_too() -> None:
    devices = replica_devices(1, 1)
    devices[0]["attributes"] = {f"{DRIVER}/{k}": v for k, v in devices[0]["attributes"].items()}
    got = draslices.pool_devices([rslice(devices)], NODE)
    assert got is not None and got[0].gpu == "GPU-0"


# --- the extended-resource claim ----------------------------------------------------------


def test_each_app_container_gets_a_request_and_init_containers_reuse_the_apps_devices() -> None:
    reqs = draallocation.claim_requests(request(2, 1, init=(4,)))
    # Init container 0 asks 4, the apps after it hold 3: one more device for it.
    assert [(r.name, r.count) for r in reqs] == [
        ("container-0-request-0", 1),
        ("container-1-request-0", 2),
        ("container-2-request-0", 1),
    ]


def test_an_init_container_covered_by_the_apps_adds_no_request() -> None:
    assert [r.count for r in draallocation.claim_requests(request(3, init=(2,)))] == [3]


def test_resources_no_device_class_maps_are_left_out_of_the_claim() -> None:
    assert draallocation.claim_requests(request(1, resource="nvidia.com/mig-1g.5gb")) == []


# --- first fit ------------------------------------------------------------------------------


def test_first_fit_over_gpu_major_replicas_fills_the_first_gpu_before_the_next() -> None:
    n = node_of([rslice(replica_devices(2, 4))], [claim("gpu-0-replica-0")])
    assert draallocation.allocate(n, draallocation.claim_requests(request(4))) == {
        SHARED: ("GPU-0", "GPU-0", "GPU-0", "GPU-1")
    }


def test_first_fit_over_replica_major_replicas_spreads_a_request_over_gpus() -> None:
    n = node_of([rslice(replica_devices(2, 4, gpu_major=False))])
    assert draallocation.allocate(n, draallocation.claim_requests(request(2))) == {SHARED: ("GPU-0", "GPU-1")}


def test_a_request_never_takes_one_shareable_device_twice() -> None:
    # The allocator resumes after the device it took: N devices are N distinct GPUs here.
    n = node_of([rslice(capacity_devices(2, 4))])
    assert draallocation.allocate(n, draallocation.claim_requests(request(2))) == {SHARED: ("GPU-0", "GPU-1")}
    assert draallocation.allocate(n, draallocation.claim_requests(request(3))) is None


def test_two_containers_may_share_one_shareable_device() -> None:
    n = node_of([rslice(capacity_devices(1, 4))])
    assert draallocation.allocate(n, draallocation.claim_requests(request(1, 1))) == {SHARED: ("GPU-0", "GPU-0")}


def test_a_whole_gpu_skips_gpus_with_replicas_taken() -> None:
    n = node_of([rslice(whole_devices(2) + replica_devices(2, 4))], [claim("gpu-0-replica-2")])
    assert draallocation.allocate(n, draallocation.claim_requests(request(1, resource=WHOLE))) == {WHOLE: ("GPU-1",)}


def test_tainted_devices_are_skipped() -> None:
    devices = replica_devices(2, 1)
    devices[0]["taints"] = [{"key": "sharepack.io/unhealthy", "effect": "NoSchedule"}]
    n = node_of([rslice(devices)])
    assert draallocation.allocate(n, draallocation.claim_requests(request(1))) == {SHARED: ("GPU-1",)}
    assert per_gpu(draslices.node_state(n)) == [("GPU-0", 1, 0), ("GPU-1", 1, 0)]
    res = draslices.node_state(n).resource(SHARED)
    assert res is not None and res.gpus[0].unhealthy == 1


@settings(max_examples=80, deadline=None)
@given(
    allocated=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    size=st.integers(1, 12),
)
def test_first_fit_over_gpus_ordered_fullest_first_is_the_agents_packed_loop(allocated: list[int], size: int) -> None:
    # An agent that republishes its slice with the fullest GPU first makes the scheduler's
    # first fit the device-plugin mode's `packed` loop: the same prediction either way.
    order = sorted(range(len(allocated)), key=lambda g: (-allocated[g], f"GPU-{g}"))
    devices = [{"name": f"gpu-{g}-replica-{r}", "attributes": _attrs(g, "shared", r)} for g in order for r in range(4)]
    held = [f"gpu-{g}-replica-{r}" for g in range(len(allocated)) for r in range(allocated[g])]
    n = node_of([rslice(devices)], [claim(*held)] if held else [])
    got = draallocation.allocate(n, draallocation.claim_requests(request(size)))
    state = draslices.node_state(n)
    want = scoring.score_node(state, request(size), Policy.PACKED)
    if not want.feasible:
        assert got is None
    else:
        assert got == dict(want.placement)


# --- scoring --------------------------------------------------------------------------------


def test_a_dra_node_scores_its_first_fit_with_the_device_plugin_modes_terms() -> None:
    n = node_of([rslice(replica_devices(2, 4))], [claim("gpu-1-replica-0")])
    got = drascoring.score_node(n, request(1), Policy.PACKED)
    # First fit puts the replica on the free GPU 0 (the agent's packed loop would pick GPU 1).
    assert got.feasible and got.placement == {SHARED: ("GPU-0",)}
    assert got == scoring.score_placement(draslices.node_state(n), {SHARED: ("GPU-0",)}, Policy.PACKED)
    fuller = node_of([rslice(replica_devices(2, 4))], [claim("gpu-0-replica-0")])
    assert drascoring.score_node(fuller, request(1), Policy.PACKED).rank > got.rank


def test_fragaware_ranks_dra_nodes_too() -> None:
    empty = node_of([rslice(replica_devices(2, 4))])
    used = node_of([rslice(replica_devices(2, 4))], [claim("gpu-0-replica-0")])
    a = drascoring.score_node(empty, request(1), NodePolicy.FRAGAWARE)
    b = drascoring.score_node(used, request(1), NodePolicy.FRAGAWARE)
    assert a.feasible and b.feasible and b.rank > a.rank


def test_with_whole_gpu_devices_too_a_gpu_with_replicas_taken_still_counts_its_free_replicas() -> None:
    # Both kinds on the node: fragaware must see GPU 0's free replicas as room for shares (the
    # two-resource view alone would call a GPU with one replica taken fully used).
    devices = whole_devices(2) + replica_devices(2, 4)
    both = node_of([rslice(devices)], [claim("gpu-0-replica-0")])
    shares_only = node_of([rslice(replica_devices(2, 4))], [claim("gpu-0-replica-0")])
    a = drascoring.score_node(both, request(1), NodePolicy.FRAGAWARE)
    b = drascoring.score_node(shares_only, request(1), NodePolicy.FRAGAWARE)
    assert (a.score, a.rank, a.reason) == (b.score, b.rank, b.reason)
    whole = drascoring.score_node(both, request(1, resource=WHOLE), NodePolicy.FRAGAWARE)
    assert whole.placement == {WHOLE: ("GPU-1",)}


def test_a_node_without_room_or_without_the_device_type_is_infeasible() -> None:
    n = node_of([rslice(replica_devices(1, 2))], [claim("gpu-0-replica-0")])
    full = drascoring.score_node(n, request(2), Policy.PACKED)
    assert not full.feasible and not full.unresolvable and "first fit finds no room" in full.reason
    none = drascoring.score_node(n, request(1, resource=WHOLE), Policy.PACKED)
    assert not none.feasible and none.unresolvable


def test_a_claim_of_more_than_32_devices_is_never_allocated() -> None:
    n = node_of([rslice(replica_devices(5, 8))])
    assert draallocation.allocate(n, draallocation.claim_requests(request(32))) is not None
    assert draallocation.allocate(n, draallocation.claim_requests(request(33))) is None
    over = drascoring.score_node(n, request(20, 13), Policy.PACKED)
    assert not over.feasible and over.unresolvable and "33 devices" in over.reason


def test_score_placement_gives_score_nodes_verdict_for_score_nodes_placement() -> None:
    gpus = tuple(GpuState(f"GPU-{i}", str(i), "x", 4, a, 0) for i, a in enumerate((3, 1, 0)))
    state = NodeState(
        "", "t", Policy.PACKED, MigStrategy.NONE, (ResourceState(SHARED, Sharing.TIME_SLICING, False, gpus),)
    )
    for policy in (Policy.PACKED, Policy.DISTRIBUTED, NodePolicy.FRAGAWARE):
        whole = scoring.score_node(state, request(2), policy)
        assert scoring.score_placement(state, whole.placement, policy) == whole
