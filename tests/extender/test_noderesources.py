"""The extender's view of nodes' CPU and memory (a Node watch and every bound pod), and the
CPU-aware `packed` rank it feeds: a node whose free GPUs would lose the CPU they need loses the
tier, CPU-only pods are ranked too, and nodes without GPUs come first for them."""

from __future__ import annotations

from typing import Any

from sharepack.common import fragmentation as fr
from sharepack.common import podrequests as pr
from sharepack.common.policies import NodePolicy
from sharepack.extender.caches import ClusterView
from sharepack.extender.noderesources import NodeResources, node_handler, pod_handler
from tests.extender.test_caches import SHARED, state_obj

# One shape: a whole GPU with 8 CPUs.
WORKLOAD = fr.TypicalWorkload((fr.Shape(1, 1000, 1, cpu=8000),), "test")


def node_obj(name: str, cpu: str, *, gpus: int = 2) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": "64Gi", "pods": "110"}
    if gpus:
        allocatable[SHARED] = str(gpus * 10)
    return {"metadata": {"name": name}, "status": {"allocatable": allocatable}}


def pod_obj(uid: str, node: str, cpu: str, replicas: int = 0, phase: str = "Running") -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": cpu, "memory": "1Gi"}
    limits = {SHARED: str(replicas)} if replicas else {}
    return {
        "metadata": {"name": f"pod-{uid}", "namespace": "default", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": requests, "limits": limits}}]},
        "status": {"phase": phase},
    }


def request(cpu: str, replicas: int = 0) -> pr.PodRequest:
    return pr.decode_pod_request(pod_obj("new", "", cpu, replicas))


def cluster() -> tuple[ClusterView, NodeResources]:
    resources = NodeResources()
    view = ClusterView(NodePolicy.PACKED, workload=WORKLOAD, tier_width=1, resources=resources)
    view.replace_states([state_obj(n, [(10, 5, ()), (10, 0, ())]) for n in ("node-a", "node-b")])
    resources.replace_nodes([node_obj("node-a", "10"), node_obj("node-b", "20"), node_obj("node-cpu", "64", gpus=0)])
    return view, resources


def test_the_tier_goes_to_the_node_whose_free_gpu_keeps_its_cpu() -> None:
    view, _ = cluster()
    half = request("4", 5)  # on node-a, 6 CPUs stay: GPU 1 can no longer take a whole-GPU pod
    survivors, failed, _ = view.filter_nodes(["node-a", "node-b"], half)
    assert survivors == [1] and "outside the best 1" in failed["node-a"]
    assert view.scorers["node-a"].verdict(half).rank < view.scorers["node-b"].verdict(half).rank


def test_bound_pods_of_any_kind_take_room_and_rescore_the_node() -> None:
    view, resources = cluster()
    on_pod = pod_handler(resources, lambda kind, obj: None)
    on_pod("ADDED", pod_obj("cpu-hog", "node-b", "12"))  # a CPU-only pod: 8 CPUs left on node-b
    assert resources.room("node-b") == (8000, 65536 - 1024)
    assert view.scorers["node-b"].room == (8000, 65536 - 1024)
    half = request("4", 5)
    assert view.scorers["node-b"].verdict(half).rank == view.scorers["node-a"].verdict(half).rank
    on_pod("MODIFIED", pod_obj("cpu-hog", "node-b", "12", phase="Succeeded"))
    assert resources.room("node-b") == (20000, 65536)
    on_pod("ADDED", pod_obj("cpu-hog-2", "node-b", "2"))
    on_pod("DELETED", pod_obj("cpu-hog-2", "node-b", "2"))
    assert resources.room("node-b") == (20000, 65536) and not resources.requested


def test_a_cpu_only_pod_goes_to_a_node_without_gpus_first() -> None:
    view, _ = cluster()
    cpu_only = request("4")
    assert view.ranks_every_pod
    survivors, _, _ = view.filter_nodes(["node-a", "node-b", "node-cpu"], cpu_only)
    assert survivors == [2]
    # Without it, the GPU node where its CPU strands nothing (node-b keeps 16 CPUs).
    survivors, _, _ = view.filter_nodes(["node-a", "node-b"], cpu_only)
    assert survivors == [1]


def test_a_bind_counts_the_pods_cpu_before_the_watch_shows_it() -> None:
    view, resources = cluster()
    view.count_resources("u1", "node-b", request("12"))
    assert view.scorers["node-b"].room == (8000, 65536 - 1024)
    view.uncount_resources("u1", "node-a")  # counted elsewhere: left alone
    assert resources.room("node-b") == (8000, 65536 - 1024)
    view.uncount_resources("u1", "node-b")  # the bind failed
    assert resources.room("node-b") == (20000, 65536)


def test_node_events_update_allocatable_and_heartbeats_rescore_nothing() -> None:
    view, resources = cluster()
    on_node = node_handler(resources)
    before = view.scorers["node-a"]
    on_node("MODIFIED", node_obj("node-a", "10"))  # a status heartbeat
    assert view.scorers["node-a"] is before
    on_node("MODIFIED", node_obj("node-a", "32"))
    assert view.scorers["node-a"].room == (32000, 65536)
    on_node("DELETED", node_obj("node-a", "32"))
    assert resources.room("node-a") is None and view.scorers["node-a"].room is None
    assert resources.gpu_free("node-cpu") and not resources.gpu_free("node-b") and not resources.gpu_free("gone")


def test_without_the_node_watch_cpu_only_pods_are_not_ranked() -> None:
    view = ClusterView(NodePolicy.PACKED, workload=WORKLOAD, tier_width=1)
    assert not view.ranks_every_pod


def test_fragaware_directs_the_gpu_it_chose_not_the_agents() -> None:
    """With directed GPUs `fragaware` picks a share's GPU itself (as FGD does); `direct` must
    hand the agent that GPU, the one the pod is counted on."""
    from tests.extender.test_fragaware import GPU_PODS

    view = ClusterView(NodePolicy.FRAGAWARE, workload=GPU_PODS, directed=True)
    view.replace_states([state_obj("node-a", [(10, 0, ()), (10, 2, ())])])
    share = request("1", 9)  # the agent's packed loop would split it over both GPUs
    split = view.direct("u1", "node-a", share)
    assert split == (("c", {SHARED: ("GPU-0",) * 9}),)
    assert view.assumed["u1"].placement == {SHARED: ("GPU-0",) * 9}


async def test_a_directed_bind_takes_the_gpus_its_filter_ranked_and_rebuilds_its_node_once(monkeypatch: Any) -> None:
    """The bind counts the pod's CPU (`count_resources`) before its Binding is written, and
    directs its GPUs: chosen with the node's room *before* the pod, as the filter ranked the
    node. With the pod's CPU counted first, its choice saw the CPU taken twice: here 1 CPU of
    16 left GPU-2 where the filter's model had GPU-1. One rebuild of the node serves both."""
    import orjson

    from sharepack.common import directions
    from sharepack.extender.bindguard import BindGuard
    from sharepack.extender.directing import DirectingBinder
    from sharepack.extender.server import Extender
    from tests.extender.test_binding_lists import RecordingApi

    resources = NodeResources()
    view = ClusterView(NodePolicy.FRAGAWARE, workload=fr.DEFAULT_TYPICAL_WORKLOAD, directed=True,
                       resources=resources, tier_width=1)  # fmt: skip
    view.replace_states([state_obj("node-a", [(10, 0, ()), (10, 2, ()), (10, 4, ())])])
    resources.replace_nodes([node_obj("node-a", "16", gpus=3)])
    api = RecordingApi()
    extender = Extender(view, binder=DirectingBinder(api, view), guard=BindGuard(view))
    doc = pod_obj("u1", "", "1", replicas=3, phase="Pending")
    api.pods[doc["metadata"]["name"]] = doc
    share = pr.decode_pod_request(doc)
    ranked = dict(view.scorers["node-a"].score(share).placement)
    assert ranked == {SHARED: ("GPU-1",) * 3}
    await extender.filter_reply(orjson.dumps({"Pod": doc, "NodeNames": ["node-a"], "Nodes": None}))
    rebuilt: list[str] = []
    rebuild = view._rebuild
    monkeypatch.setattr(view, "_rebuild", lambda name, state=None: (rebuilt.append(name), rebuild(name, state))[1])
    bind = {"PodName": "pod-u1", "PodNamespace": "default", "PodUID": "u1", "Node": "node-a"}
    assert orjson.loads((await extender.bind_reply(orjson.dumps(bind))).body) == {"Error": ""}
    assert dict(view.assumed["u1"].placement) == ranked
    told = directions.decode(api.bound[0][1][directions.ANNOTATION], where="the Binding")
    assert directions.placement(told) == ranked  # what the agent is told to take
    assert view.scorers["node-a"].room == (15000, 65536 - 1024)
    assert rebuilt == ["node-a"]


def test_a_pod_event_rebuilds_its_node_once(monkeypatch: Any) -> None:
    """A pod event changes its node's room here and its GPUs in the view: one rebuild, which
    has both (`NodeResources.deferred`); before, the room's and the GPUs' each made one."""
    from sharepack.extender import caches

    view, resources = cluster()
    on_pod = pod_handler(resources, caches.pod_handler(view))
    rebuilt: list[str] = []
    rebuild = view._rebuild
    monkeypatch.setattr(view, "_rebuild", lambda name, state=None: (rebuilt.append(name), rebuild(name, state))[1])
    on_pod("ADDED", pod_obj("g1", "node-b", "4", replicas=5))  # a GPU pod another binder bound
    assert "g1" in view.assumed and view.scorers["node-b"].room == (16000, 65536 - 1024)
    assert rebuilt == ["node-b"]
    on_pod("DELETED", pod_obj("g1", "node-b", "4", replicas=5))
    assert "g1" not in view.assumed and view.scorers["node-b"].room == (20000, 65536)
    assert rebuilt == ["node-b"] * 2
    on_pod("ADDED", pod_obj("c1", "node-b", "2"))  # CPU-only: the room alone changes
    assert view.scorers["node-b"].room == (18000, 65536 - 1024) and rebuilt == ["node-b"] * 3
    on_pod("MODIFIED", pod_obj("c1", "node-b", "2"))  # a status update: nothing changes
    assert rebuilt == ["node-b"] * 3
