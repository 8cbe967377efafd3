"""Reading a ResourceClaim's allocation as the node's DRA driver does."""

from __future__ import annotations

from typing import Any

import pytest

from sharepack.common import draclaims
from sharepack.common.errors import ClaimError

REF = draclaims.ClaimRef("default", "pod-a-gpu", "uid-1")


def claim(*results: dict[str, Any], uid: str = "uid-1", allocated: bool = True) -> dict[str, Any]:
    doc: dict[str, Any] = {"metadata": {"name": "pod-a-gpu", "namespace": "default", "uid": uid}, "status": {}}
    if allocated:
        doc["status"]["allocation"] = {"devices": {"results": list(results)}}
    return doc


def result(device: str, *, driver: str = "gpu.sharepack.io", pool: str = "node-a", request: str = "r0") -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


def test_the_devices_of_this_driver_in_allocation_order() -> None:
    doc = claim(result("gpu-1-replica-0"), result("nic-0", driver="other.example.com"), result("gpu-0-replica-3"))
    got = draclaims.allocated_devices(doc, REF, driver="gpu.sharepack.io", pool="node-a")
    assert [d.device for d in got] == ["gpu-1-replica-0", "gpu-0-replica-3"]
    assert got[0] == draclaims.AllocatedDevice("r0", "node-a", "gpu-1-replica-0", None)


def test_a_share_id_is_kept() -> None:
    doc = claim({**result("gpu-0"), "shareID": "s-1"})
    (got,) = draclaims.allocated_devices(doc, REF, driver="gpu.sharepack.io", pool="node-a")
    assert got.share_id == "s-1"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (claim(allocated=False), "not allocated"),
        (claim(result("gpu-0"), uid="uid-2"), "uid 'uid-2'"),
        (claim(result("gpu-0", pool="node-b")), "pool 'node-b'"),
        (claim({"driver": "gpu.sharepack.io", "pool": "node-a", "request": "r0"}), "no device"),
        (claim("not an object"), "not an object"),  # type: ignore[arg-type]
    ],
    ids=["unallocated", "re-created under another uid", "another node's pool", "no device name", "junk result"],
)
def test_a_claim_that_cannot_be_prepared_says_why_and_names_the_claim(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=message) as info:
        draclaims.allocated_devices(doc, REF, driver="gpu.sharepack.io", pool="node-a")
    assert "default/pod-a-gpu" in str(info.value)


def test_a_pod_uses_its_direct_template_and_extended_resource_claims() -> None:
    pod = {
        "spec": {"resourceClaims": [
            {"name": "direct", "resourceClaimName": "shared-claim"},
            {"name": "templated", "resourceClaimTemplateName": "t"},
            {"name": "not-made-yet", "resourceClaimTemplateName": "t"},
        ]},
        "status": {
            "resourceClaimStatuses": [{"name": "templated", "resourceClaimName": "pod-templated-x1"}],
            "extendedResourceClaimStatus": {
                "resourceClaimName": "pod-extended-resources-abc",
                "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu.shared",
                                     "requestName": "container-0-request-0"}],
            },
        },
    }  # fmt: skip
    assert draclaims.pod_claim_names(pod) == ("shared-claim", "pod-templated-x1", "pod-extended-resources-abc")
    assert draclaims.dra_backed_requests(pod) == {("main", "nvidia.com/gpu.shared")}


def test_a_pod_without_claims_uses_none() -> None:
    assert draclaims.pod_claim_names({"spec": {}, "status": {}}) == ()
    assert draclaims.dra_backed_requests({}) == frozenset()
