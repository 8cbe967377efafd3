"""CPU and memory as kube-scheduler counts them: pod requests and node allocatable."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sharepack.common import noderoom
from sharepack.common import podrequests as pr


@pytest.mark.parametrize(
    ("raw", "value"),
    [("500m", Decimal("0.5")), ("1.5", Decimal("1.5")), (2, Decimal(2)), ("1Gi", Decimal(2**30)),
     ("1e3", Decimal(1000)), ("128974848", Decimal(128974848)), ("1k", Decimal(1000)), ("2E", Decimal(2 * 10**18))],
)  # fmt: skip
def test_quantities(raw: object, value: Decimal) -> None:
    assert noderoom.quantity(raw, "x") == value


@pytest.mark.parametrize("raw", ["", "1.5.2", "m", "12Q", True, None, [1]])
def test_a_bad_quantity_names_where(raw: object) -> None:
    with pytest.raises(noderoom.QuantityError, match="at spec.x"):
        noderoom.quantity(raw, "spec.x")


def container(name: str, cpu: str, memory: str, **extra: object) -> dict[str, object]:
    return {"name": name, "resources": {"requests": {"cpu": cpu, "memory": memory}}, **extra}


def test_pod_requests_count_as_kube_scheduler_counts_them() -> None:
    # apps 1.5 + sidecar 0.25 CPUs; the init container (3 CPUs, after the sidecar: 3.25) is larger.
    doc = {"spec": {
        "containers": [container("a", "1", "1Gi"), container("b", "500m", "512Mi")],
        "initContainers": [container("side", "250m", "1Mi", restartPolicy="Always"), container("init", "3", "100Mi")],
        "overhead": {"cpu": "100m", "memory": "10Mi"},
    }}  # fmt: skip
    assert noderoom.pod_requests(doc) == (3250 + 100, 1536 + 1 + 10)
    request = pr.decode_pod_request({"metadata": {"uid": "u"}, **doc})
    assert (request.cpu, request.memory) == (3350, 1547) and request.empty
    assert "cpu=3350" in request.shape


def test_unreadable_pods_and_quantities_count_nothing() -> None:
    assert noderoom.pod_requests(None) == (0, 0)
    assert noderoom.pod_requests({"spec": {"containers": [container("a", "lots", "1Gi")]}}) == (0, 1024)


def test_node_allocatable_rounds_down() -> None:
    node = {"status": {"allocatable": {"cpu": "7999m", "memory": "16Gi", "nvidia.com/gpu": "8"}}}
    assert noderoom.node_allocatable(node) == (7999, 16384)
    assert noderoom.node_allocatable({"status": {"allocatable": {"pods": "110"}}}) is None
    assert noderoom.node_allocatable({"status": {"allocatable": {"memory": "1500000"}}}) == (0, 1)
