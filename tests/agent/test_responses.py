"""Allocate answers and preferred allocations as plain values (no sockets)."""

from __future__ import annotations

import pytest

from sharepack.agent.responses import ResponseOptions, container_response, preferred_allocation
from sharepack.common.errors import AllocationError
from sharepack.common.policies import Policy
from sharepack.common.resources import build_resources
from tests.agent.harness import config, gpu_uuid, mig_gpus, plain_gpus, time_slicing

U0, U1 = gpu_uuid(0), gpu_uuid(1)


def _shared():
    (resource,) = build_resources(plain_gpus(2), config(time_slicing(4)))
    return resource


@pytest.mark.parametrize(
    ("options", "requested", "envs"),
    [
        pytest.param(ResponseOptions(), [f"{U0}::0", f"{U0}::3"], {"NVIDIA_VISIBLE_DEVICES": U0}, id="replicas of one gpu name it once"),
        pytest.param(ResponseOptions(), [f"{U1}::1", f"{U0}::0"], {"NVIDIA_VISIBLE_DEVICES": f"{U1},{U0}"}, id="request order is kept"),
        pytest.param(ResponseOptions(device_id_strategy="index"), [f"{U1}::1", f"{U0}::2"], {"NVIDIA_VISIBLE_DEVICES": "1,0"}, id="index ids"),
        pytest.param(ResponseOptions(device_list_strategy=("cdi-cri",)), [f"{U0}::0"], {}, id="cdi only adds no env"),
    ],
)
def test_envvar(options: ResponseOptions, requested: list[str], envs: dict[str, str]) -> None:
    assert dict(container_response(_shared(), requested, options, response_id="r").envs) == envs


def test_device_specs_include_existing_control_nodes_under_the_driver_root() -> None:
    options = ResponseOptions(pass_device_specs=True, dev_root="/run/nvidia/driver", node_exists=lambda p: p == "/dev/nvidiactl")
    response = container_response(_shared(), [f"{U1}::0", f"{U1}::1"], options, response_id="r")
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
        ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
        ("/dev/nvidia1", "/run/nvidia/driver/dev/nvidia1", "rw"),
    ]


def test_mig_device_specs_carry_the_caps_nodes() -> None:
    (resource,) = build_resources(mig_gpus(1, (("1g.5gb", 0),)), config(**{"mig-strategy": "mixed"}))
    options = ResponseOptions(pass_device_specs=True, node_exists=lambda p: False)
    response = container_response(resource, [resource.devices[0].id], options, response_id="r")
    # The parent GPU's node, then its GPU instance's and compute instance's capability nodes
    # (gpu0/gi1/access and gpu0/gi1/ci0/access in the driver's numbering).
    assert [d.container_path for d in response.devices] == [
        "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13",
    ]


def test_cdi_annotation_uses_the_configured_prefix_and_response_id() -> None:
    options = ResponseOptions(device_list_strategy=("cdi-annotations",), cdi_annotation_prefix="nvidia.cdi.k8s.io/")
    response = container_response(_shared(), [f"{U0}::0"], options, response_id="abc")
    assert dict(response.annotations) == {"nvidia.cdi.k8s.io/nvidia-device-plugin_abc": f"nvidia.com/gpu={U0}"}


def test_full_gpus_take_the_topology_path_and_shared_the_policy() -> None:
    inventory = plain_gpus(4)
    (full,) = build_resources(inventory, config())
    scores = {(gpu_uuid(0), gpu_uuid(3)): 200, (gpu_uuid(0), gpu_uuid(1)): 10}
    chosen = preferred_allocation(full, Policy.PACKED, scores, full.device_ids(), [], 2)
    assert sorted(chosen) == sorted([gpu_uuid(0), gpu_uuid(3)])
    with pytest.raises(AllocationError):
        preferred_allocation(full, Policy.PACKED, scores, [gpu_uuid(0)], [], 2)
    shared = _shared()
    held = [f"{U1}::0"]
    available = [d for d in shared.device_ids() if d not in held]
    assert preferred_allocation(shared, Policy.PACKED, {}, available, [], 1)[0].startswith(U1)
    assert preferred_allocation(shared, Policy.DISTRIBUTED, {}, available, [], 1)[0].startswith(U0)


@pytest.mark.parametrize(
    ("available", "required", "size", "message"),
    [
        pytest.param(
            [U0, "GPU-unknown"], [], 2,
            "unable to retrieve list of available devices: no device with uuid: GPU-unknown",
            id="an offered id that is no gpu of the resource is refused as upstream refuses it",
        ),
        pytest.param(
            [U0, U1], ["GPU-unknown"], 2,
            "unable to retrieve list of required devices: no device with uuid: GPU-unknown",
            id="a required id that is no gpu of the resource is refused as upstream refuses it",
        ),
        pytest.param(
            [U0], [], 2, "not enough available devices to satisfy allocation: nvidia.com/gpu wants 2 of 1 available",
            id="too few offered gpus is an error where upstream answers an empty list",
        ),
        pytest.param(
            [U0, U1], [gpu_uuid(2)], 1,
            "not enough available devices to satisfy allocation: nvidia.com/gpu wants 1 of 2 available",
            id="a required gpu that is not offered is an error where upstream answers an empty list",
        ),
    ],
)
def test_topology_path_refusals(available: list[str], required: list[str], size: int, message: str) -> None:
    (full,) = build_resources(plain_gpus(4), config())
    with pytest.raises(AllocationError) as caught:
        preferred_allocation(full, Policy.PACKED, {}, available, required, size)
    assert str(caught.value) == message


def test_topology_path_size_zero_gets_nothing_like_upstream() -> None:
    (full,) = build_resources(plain_gpus(2), config())
    assert preferred_allocation(full, Policy.PACKED, {}, [U0, U1], [], 0) == []
