"""The extender's DRA mode: ResourceSlices and allocated ResourceClaims feed the same cluster
view as NodeGpuState does (extender.draview), and predictions are counted against the devices
the scheduler allocated."""

from __future__ import annotations

from typing import Any

from sharepack.common import draslices, drascoring, fragmentation, scoring
from sharepack.common.policies import NodePolicy, Policy
from sharepack.common.podrequests import ContainerKind, ContainerRequest, PodRequest
from sharepack.extender import __main__ as extender_main
from sharepack.extender.caches import ClusterView
from sharepack.extender.draview import WHOLE_OF, DraStates, claim_handler, slice_handler
from sharepack.extender.noderesources import NodeResources
from tests.extender.test_caches import SHARED, Clock, pod_obj, predictions
from tests.scoring.test_dra import WHOLE, claim, replica_devices, rslice, whole_devices


def make() -> tuple[ClusterView, DraStates]:
    view = ClusterView(Policy.PACKED, assume_ttl=60.0, clock=Clock())
    states = DraStates(view, now=lambda: "2026-12-02T00:00:00Z")
    return view, states


def fullest_first(allocated: list[int], replicas: int = 4) -> list[dict[str, Any]]:
    """Replica devices with the fullest GPU first, as the agent's `packed` DRA policy orders them."""
    order = sorted(range(len(allocated)), key=lambda g: (-allocated[g], g))
    devices = replica_devices(len(allocated), replicas)
    return [d for g in order for d in devices if d["attributes"]["index"]["int"] == g]


def allocated(view: ClusterView, node: str) -> list[int]:
    res = view.scorers[node].state.resource(SHARED)
    assert res is not None
    return [g.allocated for g in res.gpus]


def one(n: int) -> PodRequest:
    return PodRequest("new", "default", "new", (ContainerRequest("c", ContainerKind.APP, ((SHARED, n),)),))


def test_slices_and_claims_become_the_per_gpu_state_the_scorers_read() -> None:
    view, states = make()
    states.replace_slices([rslice(replica_devices(2, 4), pool="node-a"), rslice(replica_devices(2, 4), pool="node-b")])
    states.replace_claims([claim("gpu-0-replica-0", "gpu-0-replica-1", pool="node-a")])
    assert allocated(view, "node-a") == [2, 0]
    assert allocated(view, "node-b") == [0, 0]
    # Packed ranks the node whose used GPU takes the pod above the empty node.
    prio = dict(zip(["node-a", "node-b"], view.host_priorities(["node-a", "node-b"], one(1)), strict=True))
    assert b'"Score":' in prio["node-a"]
    assert view.scorers["node-a"].score(one(1)).rank > view.scorers["node-b"].score(one(1)).rank


def test_a_node_without_room_fails_the_filter_and_an_unknown_node_passes() -> None:
    view, states = make()
    states.replace_slices([rslice(replica_devices(1, 2), pool="node-a")])
    states.replace_claims([claim("gpu-0-replica-0", "gpu-0-replica-1", pool="node-a")])
    survivors, failed, _ = view.filter_nodes(["node-a", "node-x"], one(1))
    assert survivors == [1] and "node-a" in failed


def test_a_prediction_is_counted_against_the_claim_the_scheduler_allocated() -> None:
    view, states = make()
    on_slice, on_claim = slice_handler(states), claim_handler(states)
    on_slice("ADDED", rslice(fullest_first([1, 0]), pool="node-a"))
    on_claim("ADDED", claim("gpu-0-replica-0", pool="node-a", pod="old"))
    view.upsert_pod(pod_obj("p1", "node-a"))
    assert view.assumed["p1"].placement == {SHARED: ("GPU-0",)}
    # The scheduler's first fit over the fullest-first slice took GPU 0's next replica.
    allocated_claim = claim("gpu-0-replica-1", pool="node-a", pod="p1")
    allocated_claim["status"]["reservedFor"][0]["uid"] = "p1"
    on_claim("MODIFIED", allocated_claim)
    assert view.assumed == {}
    assert predictions(view) == {"match": 1, "mismatch": 0}


def test_a_claim_allocated_elsewhere_is_a_mismatch() -> None:
    view, states = make()
    states.replace_slices([rslice(fullest_first([1, 0]), pool="node-a")])
    states.replace_claims([claim("gpu-0-replica-0", pool="node-a", pod="old")])
    view.upsert_pod(pod_obj("p1", "node-a"))
    elsewhere = claim("gpu-1-replica-0", pool="node-a", pod="p1")
    elsewhere["status"]["reservedFor"][0]["uid"] = "p1"
    states.upsert_claim(elsewhere)
    assert predictions(view) == {"match": 0, "mismatch": 1}


def test_a_deleted_claim_frees_its_devices_and_a_deleted_pool_makes_the_node_unknown() -> None:
    view, states = make()
    s = rslice(replica_devices(1, 4), pool="node-a")
    c = claim("gpu-0-replica-0", pool="node-a")
    states.replace_slices([s])
    states.upsert_claim(c)
    assert allocated(view, "node-a") == [1]
    states.delete_claim(c)
    assert allocated(view, "node-a") == [0]
    states.delete_slice(s)
    assert "node-a" not in view.scorers and "node-a" not in view.published


def test_an_unreadable_slice_makes_its_node_unknown_and_leaves_the_others() -> None:
    view, states = make()
    bad = replica_devices(1, 1)
    del bad[0]["attributes"]["uuid"]
    states.replace_slices([rslice(bad, pool="node-a"), rslice(replica_devices(1, 1), pool="node-b")])
    assert "node-a" not in view.scorers and "node-b" in view.scorers
    assert "uuid" in states.invalid["node-a"]
    survivors, _, _ = view.filter_nodes(["node-a"], one(1))
    assert survivors == [0]


def test_slices_of_other_drivers_are_ignored() -> None:
    view, states = make()
    other = rslice(replica_devices(1, 1), pool="node-a")
    other["spec"]["driver"] = "gpu.nvidia.com"
    states.replace_slices([other])
    assert view.published == {}


def test_a_claim_allocated_before_its_pod_is_seen_bound_is_judged_once_against_the_prediction() -> None:
    # The scheduler writes the claim in PreBind, before the bind: its event may come first.
    view, states = make()
    states.replace_slices([rslice(fullest_first([1, 0]), pool="node-a")])
    states.replace_claims([claim("gpu-0-replica-0", pool="node-a", pod="old")])
    request = PodRequest("p1", "default", "pod-p1", (ContainerRequest("c", ContainerKind.APP, ((SHARED, 1),)),))
    view.remember(request)  # filter and prioritize saw it
    allocated_claim = claim("gpu-0-replica-1", pool="node-a", pod="p1")
    allocated_claim["status"]["reservedFor"][0]["uid"] = "p1"
    states.upsert_claim(allocated_claim)
    assert predictions(view) == {"match": 1, "mismatch": 0}
    states.upsert_claim(allocated_claim)  # a later update of the same claim
    view.upsert_pod(pod_obj("p1", "node-a"))  # the bind, seen after: already counted
    assert predictions(view) == {"match": 1, "mismatch": 0}
    assert view.assumed == {}


def test_a_claim_allocated_before_its_pod_on_another_gpu_is_a_mismatch() -> None:
    view, states = make()
    states.replace_slices([rslice(replica_devices(2, 4), pool="node-a")])
    states.replace_claims([claim("gpu-0-replica-0", pool="node-a", pod="old")])
    view.remember(PodRequest("p1", "default", "pod-p1", (ContainerRequest("c", ContainerKind.APP, ((SHARED, 1),)),)))
    # First fit over the slice gives GPU 0's next replica; a claim on GPU 1 is not what was predicted.
    allocated_claim = claim("gpu-1-replica-0", pool="node-a", pod="p1")
    allocated_claim["status"]["reservedFor"][0]["uid"] = "p1"
    states.upsert_claim(allocated_claim)
    assert predictions(view) == {"match": 0, "mismatch": 1}


def test_the_prediction_is_the_first_fit_over_the_published_order_not_the_agents_packed_loop() -> None:
    """The agent's `fresh-first` order lists a GPU in no use before the used one: the scheduler's
    first fit takes the free GPU, where the packed loop (fullest first) would top up the used one."""
    view, states = make()
    devices = replica_devices(2, 4)
    fresh_first = [d for d in devices if d["name"].startswith("gpu-1-")] + [d for d in devices if d["name"].startswith("gpu-0-")]
    states.replace_slices([rslice(fresh_first, pool="node-a")])
    states.replace_claims([claim("gpu-0-replica-0", pool="node-a", pod="old")])
    request = one(2)
    node = draslices.dra_node("node-a", states.devices["node-a"], states.holdings[next(iter(states.holdings))])
    first_fit = drascoring.score_node(node, request, Policy.PACKED)
    assert dict(first_fit.placement) == {SHARED: ("GPU-1", "GPU-1")}
    assert view.scorers["node-a"].score(request) == first_fit
    assert dict(scoring.score_node(view.scorers["node-a"].state, request, Policy.PACKED).placement) == {SHARED: ("GPU-0", "GPU-0")}
    view.remember(PodRequest("p1", "default", "pod-p1", request.containers))
    allocated_claim = claim("gpu-1-replica-0", "gpu-1-replica-1", pool="node-a", pod="p1")
    allocated_claim["status"]["reservedFor"][0]["uid"] = "p1"
    states.upsert_claim(allocated_claim)
    assert predictions(view) == {"match": 1, "mismatch": 0}
    # The pod's claim is counted: the next first fit continues on GPU 1.
    assert dict(view.scorers["node-a"].score(one(1)).placement) == {SHARED: ("GPU-1",)}


def test_fragaware_counts_a_gpu_with_replicas_taken_by_its_free_replicas_not_as_a_taken_whole_gpu() -> None:
    """A node publishing whole-GPU devices next to the replica devices: a GPU with one of its 4
    replicas taken is 750 milli free for the next share (its whole-GPU device is not free, and
    the filter still says so), and the extender's `fragaware` ranks the node as the simulator's
    DRA scorer does (`common.drascoring`)."""
    opts = extender_main.parse_args(["--insecure-http", "--mode=dra", "--node-policy=fragaware"])
    view = extender_main.Service(opts).view  # as the extender's composition root builds it
    states = DraStates(view, now=lambda: "2026-12-02T00:00:00Z")
    devices = whole_devices(2) + replica_devices(2, 4)
    states.replace_slices([rslice(devices, pool="node-a")])
    states.replace_claims([claim("gpu-0-replica-0", pool="node-a", pod="old")])
    scorer = view.scorers["node-a"]
    # Ranked as a node whose GPU 0 has 3 of 4 replicas free (750 milli-GPU), GPU 1 all.
    assert scoring.free_shares(scoring.whole_as_shares(scorer.state, {}, WHOLE_OF)[0]) == {"GPU-0": 750, "GPU-1": 1000}
    whole = PodRequest("w", "default", "w", (ContainerRequest("c", ContainerKind.APP, ((WHOLE, 2),)),))
    assert not scorer.verdict(whole).feasible  # GPU 0's whole device is not free
    node = draslices.dra_node("node-a", draslices.pool_devices([rslice(devices, pool="node-a")], "node-a") or (),
                              draslices.claim_holdings(claim("gpu-0-replica-0", pool="node-a", pod="old")))  # fmt: skip
    for n in (1, 3, 4):
        ours, simulated = scorer.score(one(n)), drascoring.score_node(node, one(n), NodePolicy.FRAGAWARE)
        assert (ours.score, ours.rank, dict(ours.placement)) == (simulated.score, simulated.rank, dict(simulated.placement)), n


def test_the_first_fit_scorer_knows_the_shapes_of_the_typical_workload_the_extender_was_given() -> None:
    # The node has 6 CPUs left: the one shape of this workload (8 CPUs) no longer fits there,
    # which the built-in workload's shapes would say otherwise.
    workload = fragmentation.TypicalWorkload((fragmentation.Shape(1, 500, 1, cpu=8000),))
    resources = NodeResources()
    view = ClusterView(NodePolicy.FRAGAWARE, workload=workload, resources=resources, tier_width=1, whole_of=WHOLE_OF)
    states = DraStates(view, now=lambda: "2026-12-02T00:00:00Z")
    resources.upsert_node({"metadata": {"name": "node-a"}, "status": {"allocatable": {"cpu": "6", "memory": "1Gi"}}})
    states.replace_slices([rslice(replica_devices(2, 4), pool="node-a")])
    request = PodRequest("new", "default", "new", one(1).containers, cpu=1000)
    measure = fragmentation.measure_for(workload)
    assert view.scorers["node-a"].admitted(request) == (measure.admitted(6000, 1024), measure.admitted(5000, 1024))
    assert view.scorers["node-a"].admitted(request) == (~1, ~1)  # the one shape, not admitted
