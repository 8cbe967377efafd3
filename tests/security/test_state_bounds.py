"""One agent's published state cannot hang or exhaust the extender (issue 24, item 4): the CRD
bounds every count, readers refuse counts no honest agent writes (more than the bound, or
`allocated + unhealthy > total`) with an error naming the node, the GPU and the values, the
extender treats such a node as unknown, and releasing a pod counts devices instead of listing
one entry per device the state claims."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from sharepack.common import config, podrequests, scoring
from sharepack.common import state as published
from sharepack.common.errors import ConfigError, StateSchemaError
from sharepack.common.podrequests import PodRequest
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.extender.caches import ClusterView

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "deploy" / "base" / "crds" / "nodegpustates.yaml"
SHARED = "nvidia.com/gpu.shared"
HUGE = 10**8  # the figure: 800 MB of list entries when enumerated


def status(total: int, allocated: int, unhealthy: int = 0, pods: tuple[str, ...] = ("p",)) -> dict[str, Any]:
    state = NodeState(
        "2026-12-01T03:00:00Z", "0.1.0", Policy.PACKED, MigStrategy.NONE,
        (ResourceState(SHARED, Sharing.TIME_SLICING, False,
                       (GpuState("GPU-a", "0", "A100", total, allocated, unhealthy, pods),)),),
    )  # fmt: skip
    return published.to_status(state)


@pytest.mark.parametrize(("counts", "message"), [
    pytest.param((4, 5, 0), "allocated 5 + unhealthy 0 > total 4", id="more allocated than the GPU has"),
    pytest.param((4, 3, 2), "allocated 3 + unhealthy 2 > total 4", id="allocated and unhealthy together over total"),
    pytest.param((4, HUGE, 0), f"allocated {HUGE} is outside 0..1024", id="the issue's 10^8 allocated"),
    pytest.param((HUGE, HUGE, 0), f"total {HUGE} is outside 0..1024", id="a total past the bound"),
])  # fmt: skip
def test_a_reader_refuses_counts_no_agent_writes_naming_node_gpu_and_values(
    counts: tuple[int, int, int], message: str
) -> None:
    with pytest.raises(StateSchemaError) as e:
        published.from_status(status(*counts), source="NodeGpuState node-7 status")
    assert str(e.value) == f"invalid NodeGpuState NodeGpuState node-7 status.resources[0].gpus[0] (GPU GPU-a): {message}"


def test_a_reader_accepts_a_full_gpu() -> None:
    got = published.from_status(status(1024, 1000, 24))
    assert got.resources[0].gpus[0].free == 0


def test_the_extender_treats_a_node_with_impossible_counts_as_unknown_and_keeps_serving() -> None:
    view = ClusterView(Policy.PACKED)
    view.replace_states([
        {"metadata": {"name": "node-liar", "resourceVersion": "1"}, "status": status(4, HUGE)},
        {"metadata": {"name": "node-honest", "resourceVersion": "1"}, "status": status(4, 1)},
    ])  # fmt: skip
    assert set(view.scorers) == {"node-honest"}
    assert "node-liar" in view.invalid["node-liar"] and f"allocated {HUGE}" in view.invalid["node-liar"]
    # A pod bound on the unknown node, then gone: nothing to release there, nothing enumerated.
    view.upsert_pod({
        "metadata": {"name": "p", "namespace": "default", "uid": "p"},
        "spec": {"nodeName": "node-liar", "containers": [{"name": "c", "resources": {"limits": {SHARED: "1"}}}]},
        "status": {"phase": "Running"},
    })  # fmt: skip
    view.delete_pod({"metadata": {"name": "p", "namespace": "default", "uid": "p"}, "spec": {"nodeName": "node-liar"}})
    survivors, _, _ = view.filter_nodes(("node-liar", "node-honest"), request(1))
    assert survivors == [0, 1]  # unknown passes; the honest node has room


def request(n: int) -> PodRequest:
    return podrequests.decode_pod_request({
        "metadata": {"name": "p", "namespace": "default", "uid": "p"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {SHARED: str(n)}}}]},
    })  # fmt: skip


def state_in_memory(gpus: tuple[GpuState, ...]) -> NodeState:
    """A state past the reader's checks (built in memory): what the counting must survive even
    if a bound ever slips."""
    return NodeState("", "", Policy.PACKED, MigStrategy.NONE, (ResourceState(SHARED, Sharing.TIME_SLICING, False, gpus),))


def test_releasing_counts_a_gpu_held_alone_instead_of_listing_every_device_it_claims() -> None:
    # 10^6 here, not 10^8: the old code listed them all, and this test must be cheap to fail.
    state = state_in_memory((GpuState("GPU-a", "0", "A100", 10**6, 10**6, 0, ("p",)),))
    assert scoring.held_placement(state, "p", request(2)) is None  # the pod asked for 2: the counts cannot tell
    small = state_in_memory((GpuState("GPU-a", "0", "A100", 4, 2, 0, ("p",)),))
    assert scoring.held_placement(small, "p", request(2)) == {SHARED: ("GPU-a", "GPU-a")}


def test_releasing_on_a_shared_gpu_lists_no_more_than_the_gpu_holds() -> None:
    state = state_in_memory((GpuState("GPU-a", "0", "A100", 4, 3, 0, ("p", "q")),))
    assert scoring.held_placement(state, "p", request(10**6)) is None  # a spec asking for more than is held
    assert scoring.held_placement(state, "p", request(2)) == {SHARED: ("GPU-a", "GPU-a")}


def test_the_crd_bounds_every_count_as_the_readers_do() -> None:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    status_schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    gpu = status_schema["properties"]["resources"]["items"]["properties"]["gpus"]["items"]["properties"]
    for name in ("total", "allocated", "unhealthy"):
        assert (gpu[name]["minimum"], gpu[name]["maximum"]) == (0, published.MAX_DEVICES_PER_GPU), name
    assert gpu["pods"]["maxItems"] == published.MAX_DEVICES_PER_GPU
    # The chart ships the same file.
    assert (ROOT / "deploy" / "helm" / "sharepack" / "crds" / "nodegpustates.yaml").resolve() == CRD.resolve()


def test_the_agent_config_refuses_more_replicas_than_a_state_can_publish() -> None:
    text = yaml.safe_dump({"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": published.MAX_DEVICES_PER_GPU + 1}]}}})  # fmt: skip
    with pytest.raises(ConfigError) as e:
        config.load_config(file_text=text, file_source="cfg.yaml", env={}, flags={})
    assert f"number of replicas must be <= {published.MAX_DEVICES_PER_GPU}, got 1025" in str(e.value)


def test_the_real_api_server_refuses_a_count_past_the_bound(real_control_plane: Any) -> None:
    """The CRD as deploy/base applies it, on the real kube-apiserver: the status subresource
    refuses `allocated` past the maximum, so an agent cannot even store it."""
    api = kubernetes.config.new_client_from_config(config_file=str(real_control_plane.kubeconfig))  # type: ignore[no-untyped-call]
    custom: Any = kubernetes.client.CustomObjectsApi(api)
    name = "node-bounds"
    try:
        custom.create_cluster_custom_object(published.GROUP, published.VERSION, published.PLURAL,
                                            {"apiVersion": f"{published.GROUP}/{published.VERSION}",
                                             "kind": published.KIND, "metadata": {"name": name}})  # fmt: skip
        body = {"status": status(4, HUGE)}
        with pytest.raises(kubernetes.client.ApiException) as e:
            custom.patch_cluster_custom_object_status(published.GROUP, published.VERSION, published.PLURAL, name, body)
        assert e.value.status == 422
        assert "allocated" in str(e.value.body) and "1024" in str(e.value.body)
        custom.patch_cluster_custom_object_status(published.GROUP, published.VERSION, published.PLURAL, name,
                                                  {"status": status(4, 4)})  # fmt: skip
    finally:
        custom.delete_cluster_custom_object(published.GROUP, published.VERSION, published.PLURAL, name)
        api.close()
