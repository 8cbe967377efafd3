"""The extender knows each node's GPU model (its `nvidia.com/gpu.product` label, else its agent's
NVML product) and ranks with it: a share goes where it breaks no GPU that pods allowing only
another model need, and a model change rescores the node."""

from __future__ import annotations

from typing import Any

from sharepack.common import fragmentation as fr
from sharepack.common import gpumodels
from sharepack.common import podrequests as pr
from sharepack.common.policies import NodePolicy
from sharepack.extender.caches import ClusterView
from sharepack.extender.noderesources import NodeResources, node_handler
from tests.extender.test_caches import SHARED, state_obj

# Whole GPUs that only V100s serve (often); half GPUs any model serves. The states' agents
# publish "A100" (test_caches.state_obj), the labels say otherwise where they exist.
WORKLOAD = fr.TypicalWorkload((fr.Shape(1, 1000, 10, models=frozenset({"V100"})), fr.Shape(1, 500, 1)), "test")


def node_obj(name: str, model: str | None) -> dict[str, Any]:
    labels = {gpumodels.PRODUCT_LABEL: model} if model else {}
    allocatable = {"cpu": "64", "memory": "64Gi", "pods": "110", SHARED: "10"}
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": allocatable}}


def half() -> pr.PodRequest:
    return pr.decode_pod_request({
        "metadata": {"name": "p", "namespace": "default", "uid": "new"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}, "limits": {SHARED: "5"}}}]},
    })  # fmt: skip


def cluster(models: dict[str, str | None]) -> tuple[ClusterView, NodeResources]:
    resources = NodeResources()
    view = ClusterView(NodePolicy.FRAGAWARE, workload=WORKLOAD, tier_width=1, resources=resources)
    view.replace_states([state_obj(n, [(10, 0, ())]) for n in models])
    resources.replace_nodes([node_obj(n, m) for n, m in models.items()])
    return view, resources


def test_the_tier_keeps_the_v100_whole_for_the_pods_that_need_one() -> None:
    # node-a comes first by `scoring.tie_key`: without the models the tie would go to it.
    view, _ = cluster({"node-a": "V100", "node-b": "T4"})
    survivors, failed, _ = view.filter_nodes(["node-a", "node-b"], half())
    assert survivors == [1] and "outside the best 1" in failed["node-a"]
    assert view.scorers["node-b"].model == "T4"


def test_without_a_label_the_agents_product_is_the_model() -> None:
    view, resources = cluster({"node-a": None, "node-b": "V100"})
    assert resources.gpu_model("node-a") is None and view.scorers["node-a"].model == "A100"
    survivors, _, _ = view.filter_nodes(["node-a", "node-b"], half())
    assert survivors == [0]  # an A100 serves no V100-only pod either


def test_a_label_change_rescores_the_node_and_heartbeats_do_not() -> None:
    view, resources = cluster({"node-a": "T4", "node-b": "T4"})
    on_node = node_handler(resources)
    before = view.scorers["node-a"]
    on_node("MODIFIED", node_obj("node-a", "T4"))
    assert view.scorers["node-a"] is before
    on_node("MODIFIED", node_obj("node-a", "V100"))
    assert view.scorers["node-a"].model == "V100"
    survivors, _, _ = view.filter_nodes(["node-a", "node-b"], half())
    assert survivors == [1]
    on_node("DELETED", node_obj("node-a", "V100"))
    assert resources.gpu_model("node-a") is None
