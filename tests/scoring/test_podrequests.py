"""A pod's GPU request, counted as the kubelet counts it, from typed values and from Pod JSON."""

from __future__ import annotations

from typing import Any

import pytest

from sharepack.common import podrequests as pr
from sharepack.common.errors import RequestError

SHARED = "nvidia.com/gpu.shared"
GPU = "nvidia.com/gpu"


def container(name: str, res: dict[str, Any] | None = None, *, limits: dict[str, Any] | None = None,
              restart: str | None = None) -> dict[str, Any]:  # fmt: skip
    c: dict[str, Any] = {"name": name, "image": "busybox"}
    resources: dict[str, Any] = {}
    if res is not None:
        resources["requests"] = res
    if limits is not None:
        resources["limits"] = limits
    if resources:
        c["resources"] = resources
    if restart:
        c["restartPolicy"] = restart
    return c


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
        "spec": spec,
    }


TOTALS = [
    pytest.param(pod([container("a", {SHARED: "1"})]), {SHARED: 1}, id="one container asks one replica"),
    pytest.param(pod([container("a", {SHARED: "1"}), container("b", {SHARED: "2"})]), {SHARED: 3},
                 id="app containers add up"),
    pytest.param(pod([container("a", {SHARED: "1"})], init=[container("i", {SHARED: "3"})]), {SHARED: 3},
                 id="a bigger init container sets the count"),
    pytest.param(pod([container("a", {SHARED: "2"})], init=[container("i", {SHARED: "1"})]), {SHARED: 2},
                 id="a smaller init container changes nothing"),
    pytest.param(pod([container("a", limits={GPU: "2"})]), {GPU: 2}, id="limits alone count as requests"),
    pytest.param(pod([container("a", {GPU: 1}, limits={GPU: 1})]), {GPU: 1}, id="numbers are accepted"),
    pytest.param(pod([container("a", {"cpu": "500m", "memory": "1Gi", "example.com/foo": "3"})]), {},
                 id="unmanaged resources are ignored"),
    pytest.param(pod([container("a", {SHARED: "0"})]), {}, id="a zero request is no request"),
    pytest.param(pod([container("a", {SHARED: "1"})],
                     init=[container("side", {SHARED: "1"}, restart="Always"), container("i", {SHARED: "2"})]),
                 {SHARED: 3}, id="a sidecar keeps its devices while later init containers run"),
    pytest.param(pod([container("a", {SHARED: "1", GPU: "1"})]), {SHARED: 1, GPU: 1},
                 id="two resources in one container"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "expected"), TOTALS)
def test_the_pod_counts_as_the_kubelet_counts_it(doc: dict[str, Any], expected: dict[str, int]) -> None:
    request = pr.decode_pod_request(doc)
    assert dict(request.totals) == expected
    assert request.empty == (not expected)


BAD = [
    pytest.param("not a pod", "invalid pod: not an object", id="a string"),
    pytest.param({"metadata": 5}, "invalid pod metadata: not an object", id="metadata not an object"),
    pytest.param({"spec": []}, "invalid pod spec: not an object", id="spec not an object"),
    pytest.param({"spec": {"containers": "x"}}, "spec.containers: not a list", id="containers not a list"),
    pytest.param({"spec": {"containers": [1]}}, "spec.containers[0]: not an object", id="a container not an object"),
    pytest.param(pod([container("a", {SHARED: "0.5"})]), "0.5", id="a fractional quantity"),
    pytest.param(pod([container("a", {SHARED: "-1"})]), "-1", id="a negative quantity"),
    pytest.param(pod([container("a", {SHARED: True})]), "True", id="a boolean quantity"),
    pytest.param(pod([container("a", {SHARED: [1]})]), "[1]", id="a list quantity"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "needle"), BAD)
def test_a_bad_pod_is_refused_naming_the_field(doc: Any, needle: str) -> None:
    with pytest.raises(RequestError, match="invalid") as info:
        pr.decode_pod_request(doc)
    assert needle in str(info.value)


def test_quantities_with_suffixes_are_whole_numbers() -> None:
    assert pr.parse_count("2k", where="x") == 2000
    assert pr.parse_count("1Ki", where="x") == 1024
    assert pr.parse_count(3.0, where="x") == 3


def test_typed_and_json_paths_agree() -> None:
    typed = pr.Pod(
        "uid-1", "ns", "p",
        containers=(pr.Container("a", {SHARED: 1}),),
        init_containers=(pr.Container("i", {SHARED: 2}, kind=pr.ContainerKind.INIT),),
    )  # fmt: skip
    from_json = pr.decode_pod_request(
        pod([container("a", {SHARED: "1"})], init=[container("i", {SHARED: "2"})])
    )
    assert pr.pod_request(typed) == from_json


def test_shape_names_the_container_structure_not_the_pod() -> None:
    one = pr.decode_pod_request(pod([container("a", {SHARED: "1"}), container("b", {SHARED: "1"})]))
    other = pr.decode_pod_request(pod([container("x", {SHARED: "1"}), container("y", {SHARED: "1"})]))
    merged = pr.decode_pod_request(pod([container("a", {SHARED: "2"})]))
    assert one.shape == other.shape
    assert one.totals == merged.totals
    assert one.shape != merged.shape  # two 1-replica containers place differently from one 2


def test_managed_resources_can_be_named_explicitly() -> None:
    doc = pod([container("a", {SHARED: "1", "example.com/fpga": "1"})])
    request = pr.decode_pod_request(doc, managed={"example.com/fpga"})
    assert dict(request.totals) == {"example.com/fpga": 1}


def test_binding_and_phase_are_read() -> None:
    doc = pod([container("a", {SHARED: "1"})])
    doc["spec"]["nodeName"] = "node-3"
    doc["status"] = {"phase": "Running"}
    p = pr.decode_pod(doc)
    assert (p.node_name, p.phase, p.uid) == ("node-3", "Running", "uid-1")


def test_restrict_drops_resources_and_keeps_the_rest() -> None:
    request = pr.decode_pod_request(pod([container("a", {SHARED: "1", "nvidia.com/gds": "1"})]))
    kept = pr.restrict(request, {SHARED}.__contains__)
    assert dict(kept.totals) == {SHARED: 1}
    assert pr.restrict(kept, {SHARED}.__contains__) is kept
