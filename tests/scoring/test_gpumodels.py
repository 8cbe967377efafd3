"""GPU models in the fragmentation measure (FGD's rule: a shape that allows other models sees a
node's GPUs as fragment), in typical-workload files, and a pod's own GPU-model constraint."""

from __future__ import annotations

from typing import Any

import pytest

from sharepack.common import fragmentation as fr
from sharepack.common import gpumodels
from sharepack.common import podrequests as pr
from sharepack.common.errors import ConfigError
from sharepack.common.policies import MigStrategy, NodePolicy, Policy, Sharing
from sharepack.common.scoring import NodeScorer
from sharepack.common.state import GpuState, NodeState, ResourceState

SHARED = "nvidia.com/gpu.shared"
# A whole GPU that only a V100 serves (often), and a half GPU any model serves.
V100_WHOLE = fr.TypicalWorkload((fr.Shape(1, 1000, 10, models=frozenset({"V100"})), fr.Shape(1, 500, 1)), "test")
ROOM = (64_000, 65_536)


def one_gpu_node(product: str = "") -> NodeState:
    gpu = GpuState("GPU-0", "0", product, 10, 0, 0)
    return NodeState("2026-12-02T00:00:00Z", "0.1.0", Policy.PACKED, MigStrategy.NONE,
                     (ResourceState(SHARED, Sharing.TIME_SLICING, False, (gpu,)),))  # fmt: skip


def half_gpu_pod() -> pr.PodRequest:
    return pr.decode_pod_request({
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}, "limits": {SHARED: "5"}}}]},
    })  # fmt: skip


def test_access_admits_shapes_that_allow_the_nodes_model_or_any() -> None:
    m = fr.Fragmentation(V100_WHOLE)
    assert m.access(None) == fr.ALL_ADMITTED  # unknown model: as before models were known
    assert m.access("V100") & 0b11 == 0b11
    assert m.access("T4") & 0b11 == 0b10
    # A T4's idle GPU is all fragment for the V100-only shape (10 x 1000) and none for the half.
    assert m.amount([1000], m.access("T4")) == pytest.approx(10 * 1000 / 11)
    assert m.amount([1000], m.access("V100")) == 0


def test_fragaware_sends_a_share_to_the_model_that_no_one_else_needs() -> None:
    """Half a GPU on a T4 strands nothing the V100-only pods could use; on the V100 it breaks
    their whole GPU. Without the models both nodes rank the same."""
    pod = half_gpu_pod()

    def rank(model: str | None, room: tuple[int, int] | None = ROOM) -> float:
        return NodeScorer(one_gpu_node(), NodePolicy.FRAGAWARE, workload=V100_WHOLE, room=room, model=model).score(pod).rank

    assert rank("T4") > rank("V100")
    assert rank(None) == rank("V100")  # unknown: every shape counts, as on the V100
    assert rank("T4", room=None) == rank("V100", room=None)  # no Node object: nothing known


def test_typical_workload_files_name_models() -> None:
    w = fr.load_typical_workload("shapes: [{gpus: 1, share: 1, weight: 3, models: [T4, P100]}, {share: 0.5, weight: 1}]", "t")
    assert w.shapes[0].models == frozenset({"T4", "P100"}) and w.shapes[1].models == frozenset()
    with pytest.raises(ConfigError, match=r"shapes\[0\]\.models: invalid value 'T4'"):
        fr.load_typical_workload("shapes: [{share: 1, weight: 1, models: T4}]", "t")


def node(labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "n", "labels": labels}}


def test_a_nodes_model_is_its_product_label_else_its_agents_product() -> None:
    assert gpumodels.node_model(node({gpumodels.PRODUCT_LABEL: "Tesla-T4"})) == "Tesla-T4"
    assert gpumodels.node_model(node({})) is None and gpumodels.node_model({}) is None
    assert gpumodels.published_model(one_gpu_node("Tesla T4")) == "Tesla-T4"  # as feature discovery writes it
    assert gpumodels.published_model(one_gpu_node("")) is None


def pod(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": spec}


def term(*values: str, key: str = gpumodels.PRODUCT_LABEL, op: str = "In") -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}}


def test_a_pods_models_from_its_node_selector_and_required_affinity() -> None:
    assert gpumodels.pod_models(pod({})) is None
    assert gpumodels.pod_models(pod({"nodeSelector": {gpumodels.PRODUCT_LABEL: "T4"}})) == {"T4"}
    assert gpumodels.pod_models(pod(required(term("T4", "P100")))) == {"T4", "P100"}
    assert gpumodels.pod_models(pod(required(term("T4"), term("G2")))) == {"T4", "G2"}  # terms are ORed
    # One term that does not name the model admits any model.
    assert gpumodels.pod_models(pod(required(term("T4"), term("x", key="zone")))) is None
    assert gpumodels.pod_models(pod(required(term("T4", op="NotIn")))) is None
    both = {"nodeSelector": {gpumodels.PRODUCT_LABEL: "T4"}, **required(term("T4", "P100"))}
    assert gpumodels.pod_models(pod(both)) == {"T4"}
