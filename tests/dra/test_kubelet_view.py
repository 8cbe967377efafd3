"""The sandbox kubelet leaves a pod's DRA-backed extended resources to DRA, as the kubelet's
device manager (isDRAExtendedResource) and admission predicate (removeMissingExtendedResources) do."""

from __future__ import annotations

from typing import Any

from sharepack.sandbox.kubelet.nodes import pod_spec_from_api


def pod(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"uid": "u-1", "name": "p", "namespace": "default"},
        "spec": {"containers": [
            {"name": "main", "resources": {"limits": {"nvidia.com/gpu.shared": "2", "nvidia.com/gpu": "1"}}},
            {"name": "side", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}},
        ]},
        "status": status,
    }  # fmt: skip


def test_requests_the_extended_resource_claim_serves_are_not_the_device_managers() -> None:
    mapped = {"extendedResourceClaimStatus": {
        "resourceClaimName": "p-extended-resources-x",
        "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu.shared", "requestName": "container-0-request-0"}],
    }}  # fmt: skip
    spec = pod_spec_from_api(pod(mapped))
    assert dict(spec.containers[0].requests) == {"nvidia.com/gpu": 1}
    assert dict(spec.containers[1].requests) == {"nvidia.com/gpu.shared": 1}  # not mapped: still the device manager's


def test_without_a_mapping_every_request_stays_the_device_managers() -> None:
    spec = pod_spec_from_api(pod({}))
    assert dict(spec.containers[0].requests) == {"nvidia.com/gpu.shared": 2, "nvidia.com/gpu": 1}
