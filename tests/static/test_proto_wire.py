"""The wire contract with the kubelet: method paths, field names and numbers as Kubernetes
defines them (k8s.io/kubelet deviceplugin/v1beta1, podresources/v1, dra/v1 and
pluginregistration/v1 `api.proto`).

`test_generated_protobuf_modules_are_fresh` only proves the modules match our `.proto` files;
this pins the `.proto` files to the kubelet's, so an edit that renames or renumbers a field
(which would still compile and pass our own round trips) fails here.
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FileDescriptor

from sharepack.proto.deviceplugin.v1beta1 import api_pb2 as dp
from sharepack.proto.dra.v1 import api_pb2 as dra
from sharepack.proto.pluginregistration.v1 import api_pb2 as reg
from sharepack.proto.podresources.v1 import api_pb2 as pr

DEVICE_PLUGIN: dict[str, dict[str, int]] = {
    "DevicePluginOptions": {"pre_start_required": 1, "get_preferred_allocation_available": 2},
    "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
    "ListAndWatchResponse": {"devices": 1},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "Device": {"ID": 1, "health": 2, "topology": 3},
    "PreStartContainerRequest": {"devices_ids": 1},
    "PreferredAllocationRequest": {"container_requests": 1},
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3,
    },
    "PreferredAllocationResponse": {"container_responses": 1},
    "ContainerPreferredAllocationResponse": {"deviceIDs": 1},
    "AllocateRequest": {"container_requests": 1},
    "ContainerAllocateRequest": {"devices_ids": 1},
    "CDIDevice": {"name": 1},
    "AllocateResponse": {"container_responses": 1},
    "ContainerAllocateResponse": {
        "envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5,
    },
    "Mount": {"container_path": 1, "host_path": 2, "read_only": 3},
    "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
}

POD_RESOURCES: dict[str, dict[str, int]] = {
    "AllocatableResourcesResponse": {"devices": 1, "cpu_ids": 2, "memory": 3},
    "ListPodResourcesResponse": {"pod_resources": 1},
    "PodResources": {"name": 1, "namespace": 2, "containers": 3},
    "ContainerResources": {
        "name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5,
    },
    "ContainerMemory": {"memory_type": 1, "size": 2, "topology": 3},
    "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "GetPodResourcesRequest": {"pod_name": 1, "pod_namespace": 2},
    "GetPodResourcesResponse": {"pod_resources": 1},
}

METHODS = [
    pytest.param(dp.DESCRIPTOR, "v1beta1", {
        "Registration": ["Register"],
        "DevicePlugin": [
            "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate",
            "PreStartContainer",
        ],
    }, id="device plugin"),
    pytest.param(pr.DESCRIPTOR, "v1", {
        "PodResourcesLister": ["List", "GetAllocatableResources", "Get"],
    }, id="pod resources"),
    pytest.param(dra.DESCRIPTOR, "k8s.io.kubelet.pkg.apis.dra.v1", {
        "DRAPlugin": ["NodePrepareResources", "NodeUnprepareResources"],
    }, id="dra"),
    pytest.param(reg.DESCRIPTOR, "pluginregistration", {
        "Registration": ["GetInfo", "NotifyRegistrationStatus"],
    }, id="plugin registration"),
]

# k8s.io/kubelet v0.37.2 pkg/apis/dra/v1/api.proto and pkg/apis/pluginregistration/v1/api.proto.
DRA: dict[str, dict[str, int]] = {
    "NodePrepareResourcesRequest": {"claims": 1},
    "NodePrepareResourcesResponse": {"claims": 1},
    "NodePrepareResourceResponse": {"devices": 1, "error": 2},
    "Device": {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4, "share_id": 5},
    "NodeUnprepareResourcesRequest": {"claims": 1},
    "NodeUnprepareResourcesResponse": {"claims": 1},
    "NodeUnprepareResourceResponse": {"error": 1},
    "Claim": {"namespace": 1, "uid": 2, "name": 3},
}
REGISTRATION: dict[str, dict[str, int]] = {
    "PluginInfo": {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4},
    "RegistrationStatus": {"plugin_registered": 1, "error": 2},
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}


def _cases() -> list[object]:
    return [
        pytest.param(file, message, fields, id=f"{file.package}.{message}")
        for file, table in (
            (dp.DESCRIPTOR, DEVICE_PLUGIN), (pr.DESCRIPTOR, POD_RESOURCES), (dra.DESCRIPTOR, DRA), (reg.DESCRIPTOR, REGISTRATION),
        )
        for message, fields in table.items()
    ]


@pytest.mark.parametrize(("file", "message", "fields"), _cases())
def test_fields_have_the_kubelets_names_and_numbers(
    file: FileDescriptor, message: str, fields: dict[str, int]
) -> None:
    got = {f.name: f.number for f in file.message_types_by_name[message].fields}
    assert got == fields


@pytest.mark.parametrize(("file", "package", "services"), METHODS)
def test_method_paths_carry_the_kubelets_package_names(
    file: FileDescriptor, package: str, services: dict[str, list[str]]
) -> None:
    # The package is part of every gRPC method path the kubelet calls or serves.
    got = {
        name: [f"/{file.package}.{name}/{m.name}" for m in service.methods]
        for name, service in file.services_by_name.items()
    }
    want = {name: [f"/{package}.{name}/{m}" for m in methods] for name, methods in services.items()}
    assert got == want
