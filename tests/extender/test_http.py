"""The extender verbs over real HTTP, with the JSON kube-scheduler's HTTPExtender sends.

kube-scheduler marshals `extenderv1.ExtenderArgs{Pod, Nodes, NodeNames}` with Go's encoding/json:
the extender types have no json tags (PascalCase keys), the embedded Pod and NodeList use their
camelCase tags, and the unused one of `Nodes`/`NodeNames` is `null`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from sharepack.common import state as published
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.extender import protocol
from sharepack.extender.caches import ClusterView
from sharepack.extender.metrics import parse_text
from sharepack.extender.server import EXTENDER, Extender

SHARED = "nvidia.com/gpu.shared"


def pod_json(requests: dict[str, str], *, uid: str = "8f0c6a1e-0000-4000-8000-000000000001",
             name: str = "trainer-0", containers: int = 1) -> dict[str, Any]:  # fmt: skip
    """A pending Pod as kube-scheduler marshals it (trimmed of fields nobody reads)."""
    return {
        "metadata": {
            "name": name, "namespace": "default", "uid": uid, "resourceVersion": "4711",
            "creationTimestamp": "2026-11-30T03:00:00Z", "labels": {"app": "trainer"},
        },
        "spec": {
            "containers": [
                {
                    "name": f"main-{i}", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                    "resources": {"limits": dict(requests), "requests": dict(requests)},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
                }
                for i in range(containers)
            ],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "securityContext": {}, "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }  # fmt: skip


def node_json(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "100",
                     "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true"}},
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", SHARED: "8", "pods": "110"},
            "allocatable": {"cpu": "63", "memory": "500Gi", SHARED: "8", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.34.0"},
        },
    }  # fmt: skip


def args_body(pod: Any, names: list[str], *, cache_capable: bool = True) -> bytes:
    if cache_capable:
        return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
    return orjson.dumps(
        {"Pod": pod, "Nodes": {"metadata": {}, "items": [node_json(n) for n in names]}, "NodeNames": None}
    )


def state_obj(name: str, gpus: list[tuple[int, int]], *, fail_gt_one: bool = False,
              policy: Policy = Policy.PACKED, rv: str = "1") -> dict[str, Any]:  # fmt: skip
    state = NodeState(
        "2026-11-30T03:00:00Z", "0.1.0", policy, MigStrategy.NONE,
        (ResourceState(SHARED, Sharing.TIME_SLICING, fail_gt_one,
                       tuple(GpuState(f"GPU-{name}-{i}", str(i), "NVIDIA A100-SXM4-40GB", t, a, 0)
                             for i, (t, a) in enumerate(gpus))),),
    )  # fmt: skip
    return {
        "apiVersion": f"{published.GROUP}/{published.VERSION}", "kind": published.KIND,
        "metadata": {"name": name, "resourceVersion": rv}, "status": published.to_status(state),
    }  # fmt: skip


# node-used: a GPU half used; node-empty: all free; node-full: no free replica;
# node-strict: failRequestsGreaterThanOne; node-unknown: publishes nothing.
NODES = ["node-used", "node-empty", "node-full", "node-strict", "node-unknown"]


def make_view() -> ClusterView:
    view = ClusterView(Policy.PACKED)
    view.replace_states([
        state_obj("node-used", [(4, 2), (4, 0)]),
        state_obj("node-empty", [(4, 0), (4, 0)]),
        state_obj("node-full", [(4, 4), (4, 4)]),
        state_obj("node-strict", [(4, 0), (4, 0)], fail_gt_one=True),
    ])  # fmt: skip
    return view


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    extender = Extender(make_view())
    async with TestClient(TestServer(extender.app(max_body_bytes=256 * 1024))) as c:
        yield c


async def post(client: TestClient[Any, Any], verb: str, body: bytes) -> tuple[int, Any]:
    resp = await client.post(f"/{verb}", data=body, headers={"Content-Type": "application/json"})
    raw = await resp.read()
    try:
        return resp.status, orjson.loads(raw)
    except orjson.JSONDecodeError:
        return resp.status, raw.decode()


# --- filter -----------------------------------------------------------------------------------


async def test_filter_with_node_names_echoes_survivors_and_names_no_failure_while_one_passes(client: Any) -> None:
    status, reply = await post(client, "filter", args_body(pod_json({SHARED: "2"}), NODES))
    assert status == 200
    assert reply["NodeNames"] == ["node-used", "node-empty", "node-unknown"]
    assert reply["Nodes"] is None
    assert reply["Error"] == ""
    # kube-scheduler reads the reasons only when no node passes (sharepack/extender/server.py).
    assert reply["FailedNodes"] == {} and reply["FailedAndUnresolvableNodes"] == {}


async def test_filter_says_why_each_node_fails_when_none_passes(client: Any) -> None:
    status, reply = await post(client, "filter", args_body(pod_json({SHARED: "2"}), ["node-full", "node-strict"]))
    assert status == 200
    assert reply["NodeNames"] == []
    assert set(reply["FailedNodes"]) == {"node-full"}
    assert "not enough free devices" in reply["FailedNodes"]["node-full"]
    assert set(reply["FailedAndUnresolvableNodes"]) == {"node-strict"}
    assert "failRequestsGreaterThanOne" in reply["FailedAndUnresolvableNodes"]["node-strict"]


async def test_filter_with_full_node_objects_echoes_the_surviving_objects(client: Any) -> None:
    status, reply = await post(client, "filter", args_body(pod_json({SHARED: "1"}), NODES, cache_capable=False))
    assert status == 200
    assert reply["NodeNames"] is None
    assert reply["Nodes"]["items"] == [node_json(n) for n in ["node-used", "node-empty", "node-strict", "node-unknown"]]
    status, reply = await post(client, "filter", args_body(pod_json({SHARED: "1"}), ["node-full"], cache_capable=False))
    assert reply["Nodes"]["items"] == [] and set(reply["FailedNodes"]) == {"node-full"}


async def test_any_key_case_is_accepted(client: Any) -> None:
    body = orjson.dumps({"pod": pod_json({SHARED: "1"}), "NODENAMES": ["node-full", "node-empty"]})
    status, reply = await post(client, "filter", body)
    assert (status, reply["NodeNames"]) == (200, ["node-empty"])


@pytest.mark.parametrize("nodes", [
    pytest.param({"Nodes": None, "NodeNames": None}, id="both null"),
    pytest.param({}, id="both missing"),
    pytest.param({"Nodes": {"metadata": {}, "items": None}}, id="a NodeList without items"),
])  # fmt: skip
async def test_no_candidate_nodes_is_an_empty_answer_not_an_error(client: Any, nodes: dict[str, Any]) -> None:
    body = orjson.dumps({"Pod": pod_json({SHARED: "1"}), **nodes})
    status, reply = await post(client, "filter", body)
    assert status == 200
    assert (reply["NodeNames"] or []) == [] and (reply["Nodes"] or {"items": []})["items"] == []
    status, reply = await post(client, "prioritize", body)
    assert (status, reply) == (200, [])


async def test_a_pod_without_gpu_requests_passes_everywhere(client: Any) -> None:
    status, reply = await post(client, "filter", args_body(pod_json({"cpu": "1", "example.com/fpga": "1"}), NODES))
    assert (status, reply["NodeNames"], reply["FailedNodes"]) == (200, NODES, {})
    status, reply = await post(client, "prioritize", args_body(pod_json({"cpu": "1"}), NODES))
    assert (status, reply) == (200, [])  # every node 0: kube-scheduler adds nothing for hosts not named


async def test_a_resource_no_node_publishes_is_not_ours_to_judge(client: Any) -> None:
    status, reply = await post(client, "filter", args_body(pod_json({"nvidia.com/gds": "1"}), NODES))
    assert (status, reply["NodeNames"], reply["FailedNodes"]) == (200, NODES, {})


async def test_a_resource_some_nodes_publish_fails_the_nodes_without_it() -> None:
    view = make_view()
    mig = state_obj("node-mig", [(7, 0)])
    mig["status"]["resources"][0]["name"] = "nvidia.com/mig-1g.5gb"
    view.upsert_state(mig)
    async with TestClient(TestServer(Extender(view).app())) as c:
        status, reply = await post(c, "filter", args_body(pod_json({"nvidia.com/mig-1g.5gb": "1"}), [*NODES, "node-mig"]))
    assert status == 200
    assert reply["NodeNames"] == ["node-unknown", "node-mig"]
    without = [n for n in NODES if n != "node-unknown"]
    async with TestClient(TestServer(Extender(view).app())) as c:
        status, reply = await post(c, "filter", args_body(pod_json({"nvidia.com/mig-1g.5gb": "1"}), without))
    assert reply["NodeNames"] == [] and set(reply["FailedAndUnresolvableNodes"]) == set(without)
    assert "publishes no such resource" in reply["FailedAndUnresolvableNodes"]["node-used"]


async def test_an_unreadable_pod_is_an_error_in_the_reply_not_an_http_error(client: Any) -> None:
    status, reply = await post(client, "filter", args_body(pod_json({SHARED: "0.5"}), NODES))
    assert status == 200
    assert "0.5" in reply["Error"]
    assert reply["NodeNames"] == NODES
    status, reply = await post(client, "filter", orjson.dumps({"NodeNames": NODES}))
    assert status == 200 and "Pod is missing" in reply["Error"]
    status, reply = await post(client, "prioritize", args_body(pod_json({SHARED: "0.5"}), NODES))
    assert (status, reply) == (200, [])


# --- prioritize -------------------------------------------------------------------------------


@pytest.mark.parametrize("cache_capable", [True, False], ids=["node names", "node objects"])
async def test_prioritize_ranks_the_used_node_first_under_packed(client: Any, cache_capable: bool) -> None:
    names = ["node-used", "node-empty", "node-unknown"]
    status, reply = await post(client, "prioritize", args_body(pod_json({SHARED: "1"}), names, cache_capable=cache_capable))
    assert status == 200
    assert [p["Host"] for p in reply] == ["node-used", "node-empty"]  # in the order asked; zeros left out
    scores = {p["Host"]: p["Score"] for p in reply}
    assert scores["node-used"] > scores["node-empty"] > 0 and "node-unknown" not in scores
    assert all(0 < s <= 10 for s in scores.values())


async def test_prioritize_follows_the_extender_policy() -> None:
    view = ClusterView(Policy.DISTRIBUTED)
    view.replace_states([state_obj("node-used", [(4, 2), (4, 0)]), state_obj("node-empty", [(4, 0), (4, 0)])])
    async with TestClient(TestServer(Extender(view).app())) as c:
        _, reply = await post(c, "prioritize", args_body(pod_json({SHARED: "1"}), ["node-used", "node-empty"]))
    scores = {p["Host"]: p["Score"] for p in reply}
    assert scores["node-empty"] > scores.get("node-used", 0)


# --- bind without API access ----------------------------------------------------------------


async def test_bind_without_api_access_answers_with_an_error(client: Any) -> None:
    body = orjson.dumps({"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "node-used"})
    status, reply = await post(client, "bind", body)
    assert status == 200 and "without Kubernetes API access" in reply["Error"]


# --- malformed and huge bodies --------------------------------------------------------------

MALFORMED = [
    pytest.param(b"", id="empty body"),
    pytest.param(b"{", id="truncated JSON"),
    pytest.param(b"\xff\xfe", id="not UTF-8"),
    pytest.param(b"[]", id="a JSON array"),
    pytest.param(b"null", id="JSON null"),
    pytest.param(b'{"NodeNames": "node-0"}', id="NodeNames not a list"),
    pytest.param(b'{"NodeNames": [1, 2]}', id="NodeNames not strings"),
    pytest.param(b'{"Nodes": []}', id="Nodes not a NodeList"),
    pytest.param(b'{"Nodes": {"items": [{"metadata": {}}]}}', id="a Node without a name"),
    pytest.param(b'{"Nodes": {"items": "x"}}', id="items not a list"),
]  # fmt: skip


@pytest.mark.parametrize("body", MALFORMED)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_an_undecodable_body_is_a_400(client: Any, verb: str, body: bytes) -> None:
    status, reply = await post(client, verb, body)
    assert status == 400
    assert "invalid ExtenderArgs" in reply


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"PodName": 3}'], ids=["truncated", "array", "name not a string"])
async def test_an_undecodable_binding_is_a_400(client: Any, body: bytes) -> None:
    status, _ = await post(client, "bind", body)
    assert status == 400


async def test_a_body_over_the_limit_is_refused_and_the_server_keeps_serving(client: Any) -> None:
    huge = args_body(pod_json({SHARED: "1"}), [f"node-{i:06d}" for i in range(40_000)])
    assert len(huge) > 256 * 1024
    status, _ = await post(client, "prioritize", huge)
    assert status == 413
    status, reply = await post(client, "prioritize", args_body(pod_json({SHARED: "1"}), ["node-used"]))
    assert status == 200 and reply[0]["Host"] == "node-used"


WEIRD = [
    {"Pod": 1, "NodeNames": ["node-used"]},
    {"Pod": {"spec": None}, "NodeNames": ["node-used"]},
    {"Pod": {"spec": {"containers": [{"resources": {"requests": {SHARED: None}}}]}}, "NodeNames": ["node-used"]},
    {"Pod": {"spec": {"containers": [{"resources": {"requests": {SHARED: "1"}}}], "initContainers": {}}},
     "NodeNames": ["node-used"]},
    {"Pod": pod_json({SHARED: "1"}), "NodeNames": ["node-used"] * 3},
    {"Pod": pod_json({SHARED: "100000000000000000000"}), "NodeNames": NODES},
    {"Pod": pod_json({SHARED: "1"}), "Nodes": {"items": [node_json("node-used")]}, "NodeNames": ["node-empty"]},
    {"pod": pod_json({SHARED: "1"}), "nodes": None, "nodeNames": [], "Extra": {"x": [1, 2]}},
]  # fmt: skip


@pytest.mark.parametrize("doc", WEIRD, ids=[f"weird-{i}" for i in range(len(WEIRD))])
async def test_odd_but_decodable_bodies_never_crash(client: Any, doc: Any) -> None:
    for verb in ("filter", "prioritize"):
        status, reply = await post(client, verb, orjson.dumps(doc))
        assert status == 200, reply


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["Pod", "Nodes", "NodeNames", "items", "metadata", "name", "spec", "containers",
                         "initContainers", "resources", "requests", "limits", SHARED, "x"]), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_the_decoder_either_decodes_or_says_400(doc: Any) -> None:
    try:
        args = protocol.decode_args(orjson.dumps(doc))
    except protocol.DecodeError:
        return
    # Whatever it decoded, the replies encode.
    protocol.encode_filter(args, range(len(args.node_names)), {}, {})
    protocol.encode_priorities(args.node_names, [0] * len(args.node_names))


# --- health, metrics, prefix ------------------------------------------------------------------


async def test_health_readiness_and_metrics() -> None:
    ready = False
    extender = Extender(make_view(), ready=lambda: ready, url_prefix="/sharepack/")
    async with TestClient(TestServer(extender.app())) as c:
        assert c.server.app[EXTENDER] is extender
        assert (await c.get("/healthz")).status == 200
        assert (await c.get("/readyz")).status == 503
        ready = True
        assert (await c.get("/readyz")).status == 200
        assert (await c.post("/prioritize", data=b"{}")).status == 404  # only under the prefix
        for verb in ("filter", "prioritize"):
            resp = await c.post(f"/sharepack/{verb}", data=args_body(pod_json({SHARED: "1"}), NODES))
            assert resp.status == 200
        assert (await c.post("/sharepack/filter", data=b"{")).status == 400
        resp = await c.get("/metrics")
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        samples = parse_text(await resp.text())
    assert samples['sharepack_extender_requests_total{code="200",verb="filter"}'] == 1
    assert samples['sharepack_extender_requests_total{code="400",verb="filter"}'] == 1
    assert samples['sharepack_extender_request_duration_seconds_count{verb="prioritize"}'] == 1
    assert samples['sharepack_extender_request_duration_seconds_bucket{le="+Inf",verb="prioritize"}'] == 1
    assert samples["sharepack_extender_cache_nodes"] == 4
    assert samples['sharepack_extender_predictions_total{outcome="match"}'] == 0


async def test_each_reply_echoes_the_node_objects_of_its_own_request() -> None:
    # With nodeCacheCapable false the survivors go back as the objects this request sent. Two
    # requests name the same nodes with different contents: an echo cached or shared by node
    # name, or one rebuilt from anything but this body, would hand the second the first's.
    extender = Extender(make_view())
    pod = pod_json({SHARED: "1"})
    async with TestClient(TestServer(extender.app())) as c:
        for round_ in ("first", "second"):
            items = [node_json(n) for n in ("node-used", "node-full", "node-empty")]
            for item in items:
                item["metadata"]["resourceVersion"] = f"{round_}-rv"
                item["metadata"]["labels"]["round"] = round_
                item["status"]["unknownField"] = {"round": round_}  # kept verbatim, not decoded
            body = orjson.dumps({"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None})
            status, reply = await post(c, "filter", body)
            assert status == 200
            assert reply["Nodes"]["items"] == [items[0], items[2]], round_
            assert reply["NodeNames"] is None and reply["FailedNodes"] == {}


@pytest.mark.parametrize("name", ["node-0", 'we"ird\\name', "ünïcode-节点"])
def test_the_hand_built_host_priority_is_the_json_of_a_host_priority(name: str) -> None:
    for score in (-3, 0, 7, 10, 42):
        assert orjson.loads(protocol.host_priority(name, score)) == {"Host": name, "Score": min(max(score, 0), 10)}
    parts = [protocol.host_priority(protocol.host_prefix(name), 5)] * 2
    assert orjson.loads(protocol.join_priorities(parts)) == [{"Host": name, "Score": 5}] * 2
    assert orjson.loads(protocol.join_priorities([])) == []
