"""The extender's cluster view: published states, assumed pods, predictions, expiry."""

from __future__ import annotations

from typing import Any

import pytest

from sharepack.common import state as published
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.extender.caches import ClusterView

SHARED = "nvidia.com/gpu.shared"


def state_obj(name: str, gpus: list[tuple[int, int, tuple[str, ...]]], *, rv: str = "1",
              policy: Policy = Policy.PACKED) -> dict[str, Any]:  # fmt: skip
    state = NodeState(
        "2026-11-30T03:00:00Z", "0.1.0", policy, MigStrategy.NONE,
        (ResourceState(SHARED, Sharing.TIME_SLICING, False,
                       tuple(GpuState(f"GPU-{i}", str(i), "A100", t, a, 0, pods)
                             for i, (t, a, pods) in enumerate(gpus))),),
    )  # fmt: skip
    return {"metadata": {"name": name, "resourceVersion": rv}, "status": published.to_status(state)}


def pod_obj(uid: str, node: str, n: int = 1, *, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": f"pod-{uid}", "namespace": "default", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {SHARED: str(n)}}}]},
        "status": {"phase": phase},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def allocated(view: ClusterView, node: str) -> list[int]:
    return [g.allocated for g in view.scorers[node].state.resources[0].gpus]


def predictions(view: ClusterView) -> dict[str, float]:
    name = "sharepack_extender_predictions_total"
    return {o: view.metrics.value(name, outcome=o) for o in ("match", "mismatch")}


def make(clock: Clock | None = None) -> ClusterView:
    view = ClusterView(Policy.PACKED, assume_ttl=60.0, clock=clock or Clock())
    view.replace_states([state_obj("node-a", [(4, 1, ("old",)), (4, 0, ())])])
    return view


def test_a_bound_pod_counts_with_its_predicted_placement_until_its_agent_reports_it() -> None:
    view = make()
    view.upsert_pod(pod_obj("p1", "node-a"))
    assert view.assumed["p1"].placement == {SHARED: ("GPU-0",)}
    assert allocated(view, "node-a") == [2, 0]
    # The agent publishes the pod on the predicted GPU: the assumption settles, and matches.
    view.upsert_state(state_obj("node-a", [(4, 2, ("old", "p1")), (4, 0, ())], rv="2"))
    assert view.assumed == {}
    assert allocated(view, "node-a") == [2, 0]
    assert predictions(view) == {"match": 1, "mismatch": 0}
    # A later event for the same pod does not assume it again.
    view.upsert_pod(pod_obj("p1", "node-a"))
    assert view.assumed == {}


def test_a_placement_the_agent_reports_elsewhere_is_a_mismatch() -> None:
    view = make()
    view.upsert_pod(pod_obj("p1", "node-a"))
    view.upsert_state(state_obj("node-a", [(4, 1, ("old",)), (4, 1, ("p1",))], rv="2"))
    assert predictions(view) == {"match": 0, "mismatch": 1}


def test_the_agent_reporting_a_pod_where_it_was_counted_keeps_the_scorer_and_elsewhere_rebuilds() -> None:
    view = make()
    view.upsert_pod(pod_obj("p1", "node-a"))
    view.upsert_pod(pod_obj("a0", "node-a"))
    counted = view.scorers["node-a"]
    # The agent lists each GPU's pods sorted; the view, in another order.
    assert counted.state.resources[0].gpus[0].pods != ("a0", "old", "p1")
    view.upsert_state(state_obj("node-a", [(4, 3, ("a0", "old", "p1")), (4, 0, ())], rv="2"))
    assert view.assumed == {}
    assert view.scorers["node-a"] is counted, "the same use in another order: the memo stays"
    # Then a pod the view did not count: a new scorer, on the new counts.
    view.upsert_state(state_obj("node-a", [(4, 3, ("a0", "old", "p1")), (4, 1, ("x",))], rv="3"))
    assert view.scorers["node-a"] is not counted
    assert allocated(view, "node-a") == [3, 1]


def test_a_pod_its_agent_already_counts_is_not_assumed() -> None:
    view = make()
    view.upsert_state(state_obj("node-a", [(4, 2, ("old", "p1")), (4, 0, ())], rv="2"))
    view.upsert_pod(pod_obj("p1", "node-a"))
    assert view.assumed == {}
    assert allocated(view, "node-a") == [2, 0]


def test_a_counted_pods_status_updates_are_not_decoded_and_its_end_still_is(monkeypatch: pytest.MonkeyPatch) -> None:
    from sharepack.common import podrequests
    from sharepack.extender import caches

    decoded: list[str] = []
    decode = podrequests.decode_pod

    def counting(obj: Any, *args: Any) -> Any:
        decoded.append(obj["metadata"]["uid"])
        return decode(obj, *args)

    monkeypatch.setattr(caches.podrequests, "decode_pod", counting)
    view = make()
    view.upsert_pod(pod_obj("p1", "node-a", phase="Pending"))  # bound: counted
    assert decoded == ["p1"] and view.assumed["p1"].node == "node-a"
    for phase in ("Pending", "Running", "Running"):  # the kubelet's status writes
        view.upsert_pod(pod_obj("p1", "node-a", phase=phase))
    assert decoded == ["p1"], "a pod counted where it is bound needs no decoding"
    view.upsert_pod(pod_obj("p1", "node-a", phase="Succeeded"))
    assert decoded == ["p1", "p1"] and "p1" not in view.assumed
    assert allocated(view, "node-a") == [1, 0]


def test_the_binding_of_a_pod_this_view_assumed_there_is_not_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The extender's own binds: counted at bind (`assume`), so the pod watch's first sight of
    them bound needs no decoding either, unless they are bound elsewhere or finished."""
    from sharepack.common import podrequests
    from sharepack.extender import caches

    one = podrequests.decode_pod_request(pod_obj("p1", ""))
    decoded: list[str] = []
    decode = podrequests.decode_pod
    monkeypatch.setattr(caches.podrequests, "decode_pod", lambda obj, *a: (decoded.append(obj["metadata"]["uid"]), decode(obj, *a))[1])
    view = make()
    view.assume("p1", "node-a", one)
    view.assume("p2", "node-a", one)
    view.upsert_pod(pod_obj("p1", "node-a", phase="Pending"))
    assert decoded == [] and view.pods["p1"] == "node-a" and view.assumed["p1"].node == "node-a"
    view.upsert_pod(pod_obj("p2", "node-b", phase="Pending"))  # bound elsewhere than assumed: judged
    assert decoded == ["p2"]
    view.upsert_pod(pod_obj("p1", "node-a", phase="Failed"))
    assert decoded == ["p2", "p1"] and "p1" not in view.assumed


def test_an_assumption_expires_after_the_ttl_and_is_not_renewed() -> None:
    clock = Clock()
    view = make(clock)
    view.upsert_pod(pod_obj("p1", "node-a"))
    clock.now += 59
    assert view.expire() == 0
    clock.now += 2
    assert view.expire() == 1
    assert allocated(view, "node-a") == [1, 0]
    view.upsert_pod(pod_obj("p1", "node-a"))
    assert view.assumed == {}


def test_a_deleted_or_finished_pod_stops_counting() -> None:
    view = make()
    view.upsert_pod(pod_obj("p1", "node-a"))
    view.upsert_pod(pod_obj("p2", "node-a"))
    assert allocated(view, "node-a") == [3, 0]
    view.delete_pod(pod_obj("p1", "node-a"))
    view.upsert_pod(pod_obj("p2", "node-a", phase="Succeeded"))
    assert view.assumed == {} and view.pods == {}
    assert allocated(view, "node-a") == [1, 0]


def test_assumed_pods_are_predicted_one_after_another() -> None:
    view = make()
    for uid in ("p1", "p2", "p3", "p4"):
        view.upsert_pod(pod_obj(uid, "node-a"))
    # Packed node: GPU-0 fills up (1 + 3), then the fourth goes to GPU-1.
    assert [view.assumed[u].placement[SHARED] for u in ("p1", "p2", "p3", "p4")] == [
        ("GPU-0",), ("GPU-0",), ("GPU-0",), ("GPU-1",),
    ]  # fmt: skip
    assert allocated(view, "node-a") == [4, 1]


def test_an_unreadable_state_makes_the_node_unknown_not_infeasible() -> None:
    view = make()
    obj = state_obj("node-a", [(4, 0, ())], rv="2")
    obj["status"]["schemaVersion"] = 99
    view.upsert_state(obj)
    assert "node-a" not in view.scorers
    assert "schemaVersion" in view.invalid["node-a"]
    view.upsert_state(state_obj("node-a", [(4, 0, ())], rv="3"))
    assert "node-a" in view.scorers and view.invalid == {}


def test_a_relist_drops_nodes_that_are_gone_and_keeps_assumptions() -> None:
    view = make()
    view.replace_states([state_obj("node-a", [(4, 1, ("old",)), (4, 0, ())]), state_obj("node-b", [(4, 0, ())])])
    view.upsert_pod(pod_obj("p1", "node-a"))
    view.replace_states([state_obj("node-a", [(4, 1, ("old",)), (4, 0, ())], rv="5")])
    assert set(view.scorers) == {"node-a"}
    view.replace_pods([])
    assert "p1" in view.assumed  # a /bind may be newer than the list; the TTL bounds it
    assert allocated(view, "node-a") == [2, 0]


def test_the_scorer_is_rebuilt_only_for_the_node_that_changed() -> None:
    view = make()
    view.upsert_state(state_obj("node-b", [(4, 0, ())]))
    before_b = view.scorers["node-b"]
    view.upsert_pod(pod_obj("p1", "node-a"))
    assert view.scorers["node-b"] is before_b


def test_requests_seen_by_filter_are_remembered_for_bind() -> None:
    from sharepack.common import podrequests

    view = make()
    req = podrequests.decode_pod_request(pod_obj("p9", ""))
    view.remember(req)
    assert view.recalled("p9") == req
    assert view.recalled("nope") is None


def test_a_resync_that_repeats_a_state_keeps_its_scorer_and_memo() -> None:
    view = make()
    before = view.scorers["node-a"]
    view.replace_states([state_obj("node-a", [(4, 1, ("old",)), (4, 0, ())])])  # same resourceVersion
    assert view.scorers["node-a"] is before
    view.replace_states([state_obj("node-a", [(4, 2, ("old", "x")), (4, 0, ())], rv="2")])
    assert view.scorers["node-a"] is not before


def test_a_changed_node_is_scored_ahead_for_recently_seen_pod_shapes() -> None:
    from sharepack.common import podrequests

    view = make()
    req = podrequests.decode_pod_request(pod_obj("p9", ""))
    view.remember(req)
    view.upsert_state(state_obj("node-a", [(4, 2, ("old", "x")), (4, 0, ())], rv="2"))
    assert req.shape in view.scorers["node-a"]._wire  # encoded before anyone asked
    assert view.scorers["node-a"].score(req).placement == {SHARED: ("GPU-0",)}


def test_known_resources_follow_what_nodes_publish() -> None:
    view = make()
    assert view.known_resources == {SHARED}
    mig = state_obj("node-m", [(7, 0, ())])
    mig["status"]["resources"][0]["name"] = "nvidia.com/mig-1g.5gb"
    view.upsert_state(mig)
    assert view.known_resources == {SHARED, "nvidia.com/mig-1g.5gb"}
    view.delete_state(state_obj("node-a", []))
    assert view.known_resources == {"nvidia.com/mig-1g.5gb"}
    view.delete_state(mig)
    assert view.known_resources == frozenset()


# --- churn: a gone pod's devices are free at once -------------------------------------------------


def test_a_deleted_pod_frees_its_published_devices_before_its_agent_republishes() -> None:
    view = make()
    view.upsert_pod(pod_obj("p1", "node-a", 2))
    view.upsert_state(state_obj("node-a", [(4, 3, ("old", "p1")), (4, 0, ())], rv="2"))  # settles, matches
    assert allocated(view, "node-a") == [3, 0]
    view.delete_pod(pod_obj("p1", "node-a", 2))
    assert allocated(view, "node-a") == [1, 0]
    assert view.scorers["node-a"].state.resources[0].gpus[0].pods == ("old",)
    # The agent's next write no longer lists it: the release is done, nothing is freed twice.
    view.upsert_state(state_obj("node-a", [(4, 1, ("old",)), (4, 0, ())], rv="3"))
    assert allocated(view, "node-a") == [1, 0] and view.ledger.released == {}


def test_a_finished_pod_frees_its_devices_too() -> None:
    view = make()
    view.upsert_state(state_obj("node-a", [(4, 1, ("old",)), (4, 4, ("p1",))], rv="2"))
    view.upsert_pod(pod_obj("p1", "node-a", 4))  # counted by its agent before we saw it
    view.upsert_pod(pod_obj("p1", "node-a", 4, phase="Succeeded"))
    assert allocated(view, "node-a") == [1, 0]


@pytest.mark.parametrize(
    ("gpus", "n", "after"),
    [
        pytest.param([(4, 3, ("old", "p1")), (4, 2, ("p1",))], 4, [1, 0], id="one shared GPU: the rest of its total is there"),
        pytest.param([(4, 3, ("old", "p1")), (4, 2, ("x", "p1"))], 2, [3, 2], id="two shared GPUs: unknown split, kept"),
    ],
)
def test_a_pod_never_predicted_is_released_as_far_as_the_published_counts_tell(
    gpus: list[tuple[int, int, tuple[str, ...]]], n: int, after: list[int]
) -> None:
    view = make()
    view.upsert_state(state_obj("node-a", gpus, rv="2"))
    view.upsert_pod(pod_obj("p1", "node-a", n))
    view.delete_pod(pod_obj("p1", "node-a", n))
    assert allocated(view, "node-a") == after


def test_a_deleted_pods_directions_tell_its_split_when_the_counts_cannot() -> None:
    """The second case above, the pod bound with directions (placed before this replica started,
    so no prediction of ours settled it): the GPUs its node lists it on are those its directions
    name, so they tell the split and its devices are free at once (issue 25: a view that kept
    them counted judged the node full at bind)."""
    from sharepack.common import directions

    view = make()
    view.upsert_state(state_obj("node-a", [(4, 3, ("old", "p1")), (4, 2, ("x", "p1"))], rv="2"))
    obj = pod_obj("p1", "node-a", 2)
    d = directions.Directions("node-a", (directions.ContainerDirections("c", {SHARED: ("GPU-0", "GPU-1")}),))
    obj["metadata"]["annotations"] = {directions.ANNOTATION: directions.encode(d)}
    view.upsert_pod(obj)
    view.delete_pod(obj)
    assert allocated(view, "node-a") == [2, 1]


def test_a_release_the_agent_never_catches_up_with_ends_after_the_ttl() -> None:
    clock = Clock()
    view = make(clock)
    view.upsert_state(state_obj("node-a", [(4, 2, ("old", "p1")), (4, 0, ())], rv="2"))
    view.upsert_pod(pod_obj("p1", "node-a"))
    view.delete_pod(pod_obj("p1", "node-a"))
    assert allocated(view, "node-a") == [1, 0]
    clock.now += 61
    view.expire()
    assert allocated(view, "node-a") == [2, 0]


def test_a_pod_missing_from_a_relist_is_released() -> None:
    view = make()
    view.upsert_pod(pod_obj("p1", "node-a"))
    view.upsert_state(state_obj("node-a", [(4, 2, ("old", "p1")), (4, 0, ())], rv="2"))
    view.replace_pods([])
    assert allocated(view, "node-a") == [1, 0]


# --- directed GPUs --------------------------------------------------------------------------------


def test_a_pod_bound_by_another_replica_counts_where_its_directions_say() -> None:
    """Two extender replicas: the other one bound the pod and wrote its GPUs; the agent follows
    them, so this replica counts the pod there, not where it would have predicted it."""
    from sharepack.common import directions

    view = make()
    obj = pod_obj("p1", "node-a")
    d = directions.Directions("node-a", (directions.ContainerDirections("c", {SHARED: ("GPU-1",)}),))
    obj["metadata"]["annotations"] = {directions.ANNOTATION: directions.encode(d)}
    view.upsert_pod(obj)
    assert view.assumed["p1"].placement == {SHARED: ("GPU-1",)}  # packed would predict GPU-0
    assert allocated(view, "node-a") == [1, 1]
    # Directions for another node (a stale annotation) are ignored.
    other = pod_obj("p2", "node-a")
    other["metadata"]["annotations"] = {directions.ANNOTATION: directions.encode(directions.Directions("node-b", d.containers))}
    view.upsert_pod(other)
    assert view.assumed["p2"].placement == {SHARED: ("GPU-0",)}


def test_directions_that_do_not_fit_the_pod_count_nothing_where_they_say() -> None:
    """Issue 24.1: a pod's author names GPUs for containers the pod does not have, or more
    devices than it requests; this replica counts the pod where its own prediction puts it."""
    from sharepack.common import directions

    view = make()
    for name, containers in (
        ("ghost", (directions.ContainerDirections("not-in-the-pod", {SHARED: ("GPU-1",)}),)),
        ("greedy", (directions.ContainerDirections("c", {SHARED: ("GPU-1", "GPU-1", "GPU-1")}),)),
    ):
        obj = pod_obj(name, "node-a")
        obj["metadata"]["annotations"] = {directions.ANNOTATION: directions.encode(directions.Directions("node-a", containers))}
        view.upsert_pod(obj)
        assert view.assumed[name].placement == {SHARED: ("GPU-0",)}, name
