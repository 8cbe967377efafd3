"""POST /explain: the verdicts /filter gives and the scores /prioritize gives, for every node, and
nothing in the extender changes (no remembered pod, no pre-scored shape, no assumption)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from sharepack.common import state as published
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.extender.caches import ClusterView
from sharepack.extender.server import FAILED_PREFIX, Extender

SHARED = "nvidia.com/gpu.shared"
NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC).timestamp()


def state_obj(name: str, gpus: list[tuple[int, int]], *, age_s: float = 0.0, schema: int = 1) -> dict[str, Any]:
    observed = datetime.fromtimestamp(NOW - age_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = published.to_status(NodeState(
        observed, "0.1.0", Policy.PACKED, MigStrategy.NONE,
        (ResourceState(SHARED, Sharing.TIME_SLICING, False,
                       tuple(GpuState(f"{name}-GPU-{i}", str(i), "A100", t, a, 0, tuple(f"p{i}{k}" for k in range(a)))
                             for i, (t, a) in enumerate(gpus))),),
    ))  # fmt: skip
    status["schemaVersion"] = schema
    return {"metadata": {"name": name, "resourceVersion": "1"}, "status": status}


NODES = ["node-empty", "node-half", "node-full", "node-stale", "node-unreadable", "node-unknown"]


@pytest.fixture
def view() -> ClusterView:
    # Staleness is judged by this extender's clock from when it saw a state change: node-stale's
    # state is seen an hour before the others and never changes after.
    now = [NOW - 3600]
    v = ClusterView(Policy.PACKED, max_age_s=180.0, wall_clock=lambda: now[0])
    v.replace_states([state_obj("node-stale", [(4, 4), (4, 4)], age_s=3600)])
    now[0] = NOW
    for obj in (
        state_obj("node-empty", [(4, 0), (4, 0)]),
        state_obj("node-half", [(4, 2), (4, 0)]),
        state_obj("node-full", [(4, 4), (4, 4)]),
        state_obj("node-unreadable", [(4, 0)], schema=99),
    ):
        v.upsert_state(obj)
    return v


def body(n: int, nodes: list[str] = NODES, uid: str = "uid-p") -> bytes:
    pod = {
        "metadata": {"name": "p", "namespace": "team", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {SHARED: str(n), "cpu": "1"}}}]},
    }
    return orjson.dumps({"Pod": pod, "NodeNames": nodes})


async def post(view: ClusterView, verb: str, data: bytes) -> tuple[int, Any]:
    async with TestClient(TestServer(Extender(view).app())) as c:
        resp = await c.post(f"/{verb}", data=data)
        raw = await resp.read()
        return resp.status, (orjson.loads(raw) if resp.status == 200 else raw.decode())


def _snapshot(view: ClusterView) -> Any:
    return (
        dict(view.assumed), dict(view.pods), list(view._recent), list(view._shapes),
        {n: id(s) for n, s in view.scorers.items()},
    )  # fmt: skip


async def test_explain_gives_the_filter_verdicts_and_the_prioritize_scores(view: ClusterView) -> None:
    status, explained = await post(view, "explain", body(3))
    assert status == 200
    _, filtered = await post(view, "filter", body(3))
    _, priorities = await post(view, "prioritize", body(3))
    assert explained["pod"] == {"namespace": "team", "name": "p", "uid": "uid-p"}
    assert explained["request"] == {SHARED: 3}  # cpu is not the extender's to judge
    by_node = {n["node"]: n for n in explained["nodes"]}
    assert [n["node"] for n in explained["nodes"]] == NODES
    assert {n for n, e in by_node.items() if e["filter"] == "pass"} == set(filtered["NodeNames"])
    assert filtered["FailedNodes"] == {}  # a node passes: kube-scheduler would drop the reasons
    failing = [n for n, e in by_node.items() if e["filter"] == "fail"]
    _, none_pass = await post(view, "filter", body(3, failing))  # asked of the failing nodes alone
    assert none_pass["NodeNames"] == []
    assert {n: FAILED_PREFIX + by_node[n]["reason"] for n in failing} == none_pass["FailedNodes"]
    named = {p["Host"]: p["Score"] for p in priorities}  # nodes scoring 0 are left out of the reply
    assert {e["node"]: e["score"] for e in explained["nodes"]} == {n: named.get(n, 0) for n in NODES}
    assert 0 not in named.values()
    assert {n: e["knowledge"] for n, e in by_node.items()} == {
        "node-empty": "published", "node-half": "published", "node-full": "published",
        "node-stale": "stale", "node-unreadable": "unreadable", "node-unknown": "unknown",
    }  # fmt: skip
    assert by_node["node-full"]["filter"] == "fail" and by_node["node-full"]["reason"]
    assert "schemaVersion" in by_node["node-unreadable"]["reason"]
    # Packed prefers the node whose free GPU the pod fills over the empty node.
    assert by_node["node-half"]["score"] > by_node["node-empty"]["score"]


async def test_explain_changes_nothing_the_next_decision_depends_on(view: ClusterView) -> None:
    before = _snapshot(view)
    status, _ = await post(view, "explain", body(2, uid="uid-explained"))
    assert status == 200
    assert _snapshot(view) == before
    assert view.recalled("uid-explained") is None  # /bind would not find it remembered
    # The same request through /filter does remember it: the comparison above can fail.
    await post(view, "filter", body(2, uid="uid-filtered"))
    assert view.recalled("uid-filtered") is not None


async def test_a_pod_without_gpu_requests_gets_no_node_list(view: ClusterView) -> None:
    pod = {"metadata": {"name": "web", "namespace": "team", "uid": "u"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}}  # fmt: skip
    status, explained = await post(view, "explain", orjson.dumps({"Pod": pod, "NodeNames": NODES}))
    assert status == 200
    assert (explained["request"], explained["nodes"], explained["error"]) == ({}, [], "")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[1]", "invalid ExtenderArgs: body is a JSON list, not an object"),
        (b'{"NodeNames": "node-a"}', "invalid ExtenderArgs: NodeNames is not a list of strings"),
    ],
    ids=["a list body is refused", "a string of node names is refused"],
)
async def test_an_undecodable_body_is_400_naming_the_problem(view: ClusterView, data: bytes, message: str) -> None:
    status, text = await post(view, "explain", data)
    assert (status, text) == (400, message + "\n")


async def test_an_unreadable_pod_is_reported_in_the_answer(view: ClusterView) -> None:
    pod = {"metadata": {"name": "p", "namespace": "team", "uid": "u"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {SHARED: "lots"}}}]}}  # fmt: skip
    status, explained = await post(view, "explain", orjson.dumps({"Pod": pod, "NodeNames": NODES}))
    assert status == 200
    assert explained["nodes"] == [] and "lots" in explained["error"]
