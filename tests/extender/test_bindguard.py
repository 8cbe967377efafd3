"""extender.bindguard: /bind binds only a pod this extender scored, to a node it found feasible,
of a scheduler it serves, still unbound; the pod is read from the API, never taken from the
request. Each rule is checked on its own (the pod passes every other rule), then the /bind
handler over HTTP with a recording binder: a refusal creates no Binding and is counted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from sharepack.common import state as published
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.extender.binding import BindError
from sharepack.extender.bindguard import Admitted, BindGuard, PodReader, Refusal, Rule, UnscoredBinds
from sharepack.extender.caches import ClusterView
from sharepack.extender.metrics import parse_text
from sharepack.extender.pendingpods import PendingPods
from sharepack.extender.protocol import BindingArgs
from sharepack.extender.server import Extender

SHARED = "nvidia.com/gpu.shared"
UID = "0b5e7c44-0000-4000-8000-00000000b1d0"
# node-used: one GPU half taken; node-full: nothing free; node-unknown publishes nothing.
NODES = ("node-used", "node-full", "node-unknown")


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def state_obj(name: str, gpus: list[tuple[int, int]]) -> dict[str, Any]:
    state = NodeState(
        "2026-11-30T03:00:00Z", "0.1.0", Policy.PACKED, MigStrategy.NONE,
        (ResourceState(SHARED, Sharing.TIME_SLICING, False,
                       tuple(GpuState(f"GPU-{name}-{i}", str(i), "A100", t, a, 0) for i, (t, a) in enumerate(gpus))),),
    )  # fmt: skip
    return {"metadata": {"name": name, "resourceVersion": "1"}, "status": published.to_status(state)}


def make_view() -> ClusterView:
    view = ClusterView(Policy.PACKED)
    view.replace_states([state_obj("node-used", [(4, 2), (4, 0)]), state_obj("node-full", [(4, 4), (4, 4)])])
    return view


def pod_doc(*, uid: str = UID, replicas: int = 2, scheduler: str | None = "default-scheduler",
            node: str = "", deleting: bool = False) -> dict[str, Any]:  # fmt: skip
    limits = {SHARED: str(replicas)} if replicas else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": "trainer", "namespace": "default", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def reader(doc: dict[str, Any] | Exception) -> PodReader:
    async def read(namespace: str, name: str) -> Any:
        if isinstance(doc, Exception):
            raise doc
        return doc

    return read


def binding(node: str = "node-used", *, uid: str = UID, name: str = "trainer") -> BindingArgs:
    return BindingArgs(name, "default", uid, node)


def filtered(guard: BindGuard, doc: dict[str, Any], names: tuple[str, ...] = NODES) -> list[int]:
    """What /filter does: the view's verdict, recorded for the pod's UID."""
    from sharepack.common import podrequests

    request = guard.view.relevant(podrequests.decode_pod_request(doc))
    survivors, _, _ = guard.view.filter_nodes(names, request)
    guard.filtered(doc["metadata"]["uid"], names, survivors)
    return survivors


async def refusal(guard: BindGuard, args: BindingArgs, doc: dict[str, Any] | Exception) -> Refusal:
    verdict = await guard.admit(args, reader(doc))
    assert isinstance(verdict, Refusal), f"admitted: {verdict}"
    return verdict


# --- each rule on its own ---------------------------------------------------------------------


async def test_a_scored_pod_is_admitted_to_a_node_its_filter_kept_with_its_request_from_the_api() -> None:
    guard = BindGuard(make_view())
    assert filtered(guard, pod_doc()) == [0, 2]  # node-used and (unknown, passed) node-unknown
    verdict = await guard.admit(binding("node-used"), reader(pod_doc()))
    assert isinstance(verdict, Admitted)
    assert verdict.request.totals == ((SHARED, 2),)


async def test_a_scored_pod_may_go_to_an_unknown_node_the_filter_passed() -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc())
    assert isinstance(await guard.admit(binding("node-unknown"), reader(pod_doc())), Admitted)


@pytest.mark.parametrize(("args", "missing"), [
    pytest.param(BindingArgs("trainer", "default", "", "node-used"), "PodUID", id="no PodUID"),
    pytest.param(BindingArgs("", "default", UID, "node-used"), "PodName", id="no PodName"),
    pytest.param(BindingArgs("trainer", "", UID, ""), "PodNamespace, Node", id="no namespace and no node"),
])  # fmt: skip
async def test_an_incomplete_request_is_refused_naming_what_is_missing(args: BindingArgs, missing: str) -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc())
    r = await refusal(guard, args, pod_doc())
    assert r.rule is Rule.INCOMPLETE and r.message.startswith(f"{missing} missing")


async def test_a_pod_the_api_cannot_return_is_refused_with_the_api_answer() -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc())
    r = await refusal(guard, binding(), BindError("reading pod default/trainer failed: API answered 404"))
    assert (r.rule, r.message) == (Rule.POD_UNREADABLE, "reading pod default/trainer failed: API answered 404")


async def test_a_pod_created_again_under_the_same_name_is_not_the_pod_that_was_scored() -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc())
    r = await refusal(guard, binding(), pod_doc(uid="another-uid"))
    assert r.rule is Rule.POD_GONE
    assert r.message == f"pod default/trainer has UID another-uid, not {UID}: it was deleted and created again"


async def test_a_pod_being_deleted_is_refused() -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc())
    r = await refusal(guard, binding(), pod_doc(deleting=True))
    assert (r.rule, r.message) == (Rule.POD_GONE, "pod default/trainer is being deleted")


async def test_a_pod_of_another_scheduler_is_refused_even_when_scored() -> None:
    guard = BindGuard(make_view(), scheduler_names=("default-scheduler", "gpu-scheduler"))
    filtered(guard, pod_doc(scheduler="other-scheduler"))
    r = await refusal(guard, binding(), pod_doc(scheduler="other-scheduler"))
    assert r.rule is Rule.SCHEDULER
    assert r.message == ("pod default/trainer names schedulerName 'other-scheduler'; this extender serves "
                         "['default-scheduler', 'gpu-scheduler']")  # fmt: skip


async def test_a_pod_without_a_scheduler_name_is_the_default_schedulers() -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc(scheduler=None))
    assert isinstance(await guard.admit(binding(), reader(pod_doc(scheduler=None))), Admitted)
    only_other = BindGuard(make_view(), scheduler_names=("gpu-scheduler",))
    filtered(only_other, pod_doc(scheduler=None))
    assert (await refusal(only_other, binding(), pod_doc(scheduler=None))).rule is Rule.SCHEDULER


async def test_an_already_bound_pod_is_refused_even_when_scored() -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc())
    r = await refusal(guard, binding(), pod_doc(node="node-full"))
    assert (r.rule, r.message) == (Rule.ALREADY_BOUND, "pod default/trainer is already bound to node node-full")


async def test_a_pod_never_scored_is_refused() -> None:
    guard = BindGuard(make_view())
    r = await refusal(guard, binding(), pod_doc())
    assert r.rule is Rule.NOT_SCORED
    assert r.message == f"this extender did not filter or prioritize pod default/trainer (UID {UID}) in the last 660 s"


async def test_a_node_the_filter_rejected_is_refused() -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc())
    r = await refusal(guard, binding("node-full"), pod_doc())
    assert r.rule is Rule.NODE
    assert r.message == "node node-full is not among the nodes this extender found feasible for pod default/trainer"


async def test_a_node_never_offered_is_refused() -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc(), names=("node-used",))
    assert (await refusal(guard, binding("node-unknown"), pod_doc())).rule is Rule.NODE


async def test_a_filter_that_kept_no_node_records_nothing() -> None:
    guard = BindGuard(make_view())
    assert filtered(guard, pod_doc(replicas=7), names=("node-used", "node-full")) == []
    assert guard.recorded == 0
    assert (await refusal(guard, binding(), pod_doc(replicas=7))).rule is Rule.NOT_SCORED


async def test_scoring_older_than_the_ttl_no_longer_counts() -> None:
    clock = Clock()
    guard = BindGuard(make_view(), ttl_s=60.0, clock=clock)
    filtered(guard, pod_doc())
    clock.now += 60.0
    r = await refusal(guard, binding(), pod_doc())
    assert r.rule is Rule.NOT_SCORED and r.message.endswith("in the last 60 s")


async def test_one_scoring_admits_one_bind() -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc())
    assert isinstance(await guard.admit(binding(), reader(pod_doc())), Admitted)
    assert (await refusal(guard, binding(), pod_doc())).rule is Rule.NOT_SCORED


async def test_a_refused_bind_also_uses_up_the_scoring() -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc())
    assert (await refusal(guard, binding("node-full"), pod_doc())).rule is Rule.NODE
    assert (await refusal(guard, binding("node-used"), pod_doc())).rule is Rule.NOT_SCORED


async def test_the_oldest_scoring_goes_first_past_the_capacity() -> None:
    guard = BindGuard(make_view(), capacity=2)
    for uid in ("a", "b", "c"):
        filtered(guard, pod_doc(uid=uid))
    assert guard.recorded == 2
    assert (await refusal(guard, binding(uid="a"), pod_doc(uid="a"))).rule is Rule.NOT_SCORED
    assert isinstance(await guard.admit(binding(uid="c"), reader(pod_doc(uid="c"))), Admitted)


# --- prioritize without filter (the filter went to another replica) ----------------------------


async def test_after_prioritize_alone_an_offered_node_is_admitted_when_the_filter_passes_it_now() -> None:
    guard = BindGuard(make_view())
    guard.prioritized(UID, NODES)
    assert isinstance(await guard.admit(binding("node-used"), reader(pod_doc())), Admitted)


async def test_after_prioritize_alone_an_offered_node_the_filter_rejects_is_refused_with_why() -> None:
    guard = BindGuard(make_view())
    guard.prioritized(UID, NODES)
    r = await refusal(guard, binding("node-full"), pod_doc())
    assert r.rule is Rule.NODE
    assert r.message.startswith("node node-full does not pass the filter for pod default/trainer: ")
    assert "not enough free devices" in r.message


async def test_after_prioritize_alone_a_node_not_offered_is_refused() -> None:
    guard = BindGuard(make_view())
    guard.prioritized(UID, ("node-full",))
    r = await refusal(guard, binding("node-used"), pod_doc())
    assert (r.rule, r.message) == (Rule.NODE, "node node-used is not among the nodes this extender was offered "
                                              "for pod default/trainer")  # fmt: skip


async def test_prioritize_after_filter_keeps_the_filters_verdict() -> None:
    guard = BindGuard(make_view())
    filtered(guard, pod_doc())
    guard.prioritized(UID, NODES)  # node-full offered to prioritize, but the filter rejected it
    assert (await refusal(guard, binding("node-full"), pod_doc())).rule is Rule.NODE


# --- a replica that did not score the pod: recheck --------------------------------------------


async def test_recheck_admits_a_gpu_pod_on_a_known_node_where_it_fits() -> None:
    guard = BindGuard(make_view(), unscored=UnscoredBinds.RECHECK)
    verdict = await guard.admit(binding("node-used"), reader(pod_doc()))
    assert isinstance(verdict, Admitted) and verdict.request.totals == ((SHARED, 2),)


@pytest.mark.parametrize("unscored", list(UnscoredBinds), ids=lambda u: f"unscored binds {u}")
async def test_a_pod_that_requests_no_gpu_is_refused_even_when_scored(unscored: UnscoredBinds) -> None:
    guard = BindGuard(make_view(), unscored=unscored)
    filtered(guard, pod_doc(replicas=0))  # the filter passes such a pod everywhere
    r = await refusal(guard, binding("node-used"), pod_doc(replicas=0))
    assert r.rule is Rule.NO_GPU
    assert r.message == "pod default/trainer requests no resource an agent publishes: it is not this extender's to bind"
    assert (await refusal(guard, binding("node-used"), pod_doc(replicas=0))).rule is Rule.NO_GPU  # unscored too


async def test_a_forged_filter_for_a_pod_that_requests_no_gpu_admits_no_bind() -> None:
    """The issue's attack: a /filter body that names the victim's UID and claims a GPU request
    the victim does not make; the pod the API returns at bind requests none."""
    guard = BindGuard(make_view())
    assert filtered(guard, pod_doc(replicas=1)) == [0, 2]
    assert (await refusal(guard, binding("node-used"), pod_doc(replicas=0))).rule is Rule.NO_GPU


async def test_a_forged_filter_claiming_a_smaller_request_admits_no_bind_where_the_real_one_does_not_fit() -> None:
    """Scored as 1 replica (node-used has 2 free on GPU 0 and 4 on GPU 1, so it fits); the pod
    the API returns asks for 7, which fits nowhere: the filter runs again on the real request."""
    guard = BindGuard(make_view())
    assert filtered(guard, pod_doc(replicas=1)) == [0, 2]
    r = await refusal(guard, binding("node-used"), pod_doc(replicas=7))
    assert r.rule is Rule.NODE
    assert r.message.startswith("node node-used does not pass the filter for pod default/trainer: ")


async def test_recheck_refuses_a_node_where_the_pod_does_not_fit() -> None:
    guard = BindGuard(make_view(), unscored=UnscoredBinds.RECHECK)
    r = await refusal(guard, binding("node-full"), pod_doc())
    assert r.rule is Rule.NODE and "not enough free devices" in r.message


async def test_recheck_refuses_a_node_it_knows_nothing_about() -> None:
    guard = BindGuard(make_view(), unscored=UnscoredBinds.RECHECK)
    r = await refusal(guard, binding("node-unknown"), pod_doc())
    assert r.rule is Rule.NODE
    assert r.message == ("node node-unknown has no fresh published state here: pod default/trainer cannot be "
                         "re-checked on it")  # fmt: skip


async def test_recheck_still_applies_the_pod_rules() -> None:
    guard = BindGuard(make_view(), unscored=UnscoredBinds.RECHECK)
    assert (await refusal(guard, binding(), pod_doc(node="node-used"))).rule is Rule.ALREADY_BOUND
    assert (await refusal(guard, binding(), pod_doc(scheduler="x"))).rule is Rule.SCHEDULER


# --- the /bind handler -------------------------------------------------------------------------


class RecordingBinder:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.bound: list[BindingArgs] = []

    async def bind(self, args: BindingArgs, annotations: Any = None) -> None:
        self.bound.append(args)

    async def get_pod(self, namespace: str, name: str) -> Any:
        return self.doc


@pytest.fixture
async def served() -> AsyncIterator[tuple[TestClient[Any, Any], Extender, RecordingBinder]]:
    binder = RecordingBinder(pod_doc())
    extender = Extender(make_view(), binder=binder)
    async with TestClient(TestServer(extender.app())) as client:
        yield client, extender, binder


async def post(client: TestClient[Any, Any], verb: str, body: Any) -> Any:
    resp = await client.post(f"/{verb}", data=orjson.dumps(body))
    assert resp.status == 200, await resp.text()
    return orjson.loads(await resp.read())


async def metrics(client: TestClient[Any, Any]) -> dict[str, float]:
    return parse_text(await (await client.get("/metrics")).text())


BIND = {"PodName": "trainer", "PodNamespace": "default", "PodUID": UID}


async def test_bind_after_filter_creates_the_binding_and_assumes_the_pod(served: Any) -> None:
    client, extender, binder = served
    reply = await post(client, "filter", {"Pod": pod_doc(), "NodeNames": list(NODES), "Nodes": None})
    assert reply["NodeNames"] == ["node-used", "node-unknown"]
    assert await post(client, "bind", {**BIND, "Node": "node-used"}) == {"Error": ""}
    assert binder.bound == [binding("node-used")]
    assert extender.view.assumed[UID].node == "node-used"
    assert (await metrics(client))['sharepack_extender_binds_total{result="success"}'] == 1


async def test_bind_after_prioritize_alone_checks_the_node_with_the_filter(served: Any) -> None:
    client, _, binder = served
    await post(client, "prioritize", {"Pod": pod_doc(), "NodeNames": list(NODES), "Nodes": None})
    reply = await post(client, "bind", {**BIND, "Node": "node-full"})
    assert reply["Error"].startswith("sharepack: bind refused (node-not-feasible): node node-full does not pass")
    assert binder.bound == []


async def test_a_refused_bind_creates_no_binding_and_is_counted_by_rule(served: Any) -> None:
    client, extender, binder = served
    reply = await post(client, "bind", {**BIND, "Node": "node-used"})
    assert reply["Error"] == (f"sharepack: bind refused (not-scored): this extender did not filter or prioritize "
                              f"pod default/trainer (UID {UID}) in the last 660 s")  # fmt: skip
    await post(client, "filter", {"Pod": pod_doc(), "NodeNames": list(NODES), "Nodes": None})
    reply = await post(client, "bind", {**BIND, "Node": "node-full"})
    assert reply["Error"].startswith("sharepack: bind refused (node-not-feasible): ")
    assert binder.bound == [] and extender.view.assumed == {}
    samples = await metrics(client)
    assert samples['sharepack_extender_bind_refusals_total{rule="not-scored"}'] == 1
    assert samples['sharepack_extender_bind_refusals_total{rule="node-not-feasible"}'] == 1
    assert samples['sharepack_extender_binds_total{result="success"}'] == 0


# --- the pod from the pod watch (extender.pendingpods) ----------------------------------------


def unreadable() -> PodReader:
    return reader(AssertionError("the guard asked the API for a pod the pod watch holds"))


async def test_a_pod_the_watch_holds_pending_is_judged_without_asking_the_api() -> None:
    pending = PendingPods()
    guard = BindGuard(make_view(), pending=pending)
    pending.upsert(pod_doc())
    filtered(guard, pod_doc())
    verdict = await guard.admit(binding("node-used"), unreadable())
    assert isinstance(verdict, Admitted) and verdict.request.totals == ((SHARED, 2),)
    assert (pending.hits, pending.misses) == (1, 0)


async def test_the_watch_is_the_apis_word_not_the_requests() -> None:
    """A forged /filter claiming one replica does not shrink the request the watch holds."""
    pending = PendingPods()
    guard = BindGuard(make_view(), pending=pending)
    pending.upsert(pod_doc(replicas=8))
    filtered(guard, pod_doc(replicas=1))  # the forged body: fits node-used
    verdict = await guard.admit(binding("node-used"), unreadable())
    assert isinstance(verdict, Refusal) and verdict.rule is Rule.NODE


@pytest.mark.parametrize(
    "held",
    [
        pytest.param(pod_doc(uid="an-older-pod-of-that-name"), id="another UID"),
        pytest.param(pod_doc(node="node-used"), id="bound since"),
        pytest.param(pod_doc(deleting=True), id="being deleted"),
        pytest.param(pod_doc(scheduler="another-scheduler"), id="another scheduler's"),
    ],
)
async def test_a_pod_the_watch_does_not_hold_pending_with_that_uid_is_read_from_the_api(held: dict[str, Any]) -> None:
    pending = PendingPods()
    guard = BindGuard(make_view(), pending=pending)
    pending.upsert(held)
    assert pending.count == (1 if held["metadata"]["uid"] != UID else 0)
    filtered(guard, pod_doc())
    asked: list[str] = []

    async def read(namespace: str, name: str) -> Any:
        asked.append(name)
        return pod_doc()

    assert isinstance(await guard.admit(binding("node-used"), read), Admitted)
    assert asked == ["trainer"] and pending.misses == 1


async def test_a_deleted_or_bound_pod_leaves_the_watchs_pending_pods() -> None:
    pending = PendingPods()
    pending.upsert(pod_doc())
    pending.upsert(pod_doc(node="node-used"))  # the binding's event
    assert pending.get("default", "trainer", UID) is None
    pending.upsert(pod_doc())
    pending.delete(pod_doc())
    assert pending.count == 0
    pending.replace([pod_doc(), pod_doc(node="node-used") | {"metadata": {"name": "other", "namespace": "default"}}])
    assert pending.count == 1 and pending.get("default", "trainer", UID) is not None
