"""The ResourceSlice devices a node publishes in DRA mode, and their order (the policy)."""

from __future__ import annotations

import textwrap

import pytest

from sharepack.common import config as config_mod
from sharepack.common import dradevices
from sharepack.common.config import Config
from sharepack.common.inventory import Gpu, Inventory
from sharepack.common.policies import Policy
from sharepack.common.resources import Resource, build_resources


def gpu(i: int) -> Gpu:
    return Gpu(index=i, uuid=f"GPU-{i:08x}-1111-4222-8333-444444444444", name="Tesla T4", memory_mib=15360,
               minor=i, pci_bus_id=f"00000000:{i + 7:02x}:00.0", numa_node=0, compute_capability=(7, 5))  # fmt: skip


def time_sliced(replicas: int, policy: Policy = Policy.PACKED) -> Config:
    text = f"""
        version: v1
        flags:
          plugin:
            sharedDevicesAllocationPolicy: {policy}
        sharing:
          timeSlicing:
            renameByDefault: true
            resources:
            - name: nvidia.com/gpu
              replicas: {replicas}
    """
    return config_mod.load_config(file_text=textwrap.dedent(text), file_source="t.yaml", env={}, flags={})


def resources(gpus: int, replicas: int) -> tuple[Resource, ...]:
    return build_resources(Inventory(gpus=tuple(gpu(i) for i in range(gpus))), time_sliced(replicas))


def names(policy: Policy, gpus: int = 3, replicas: int = 2) -> list[str]:
    return [d.name for d in dradevices.slice_devices(resources(gpus, replicas), policy)]


def test_packed_lists_every_replica_of_a_gpu_before_the_next_gpu() -> None:
    assert names(Policy.PACKED) == [
        "gpu-0-replica-0", "gpu-0-replica-1", "gpu-1-replica-0", "gpu-1-replica-1", "gpu-2-replica-0", "gpu-2-replica-1",
    ]  # fmt: skip


@pytest.mark.parametrize("policy", [Policy.DISTRIBUTED, Policy.SPREAD])
def test_distributed_and_spread_go_round_robin_over_gpus(policy: Policy) -> None:
    assert names(policy) == [
        "gpu-0-replica-0", "gpu-1-replica-0", "gpu-2-replica-0", "gpu-0-replica-1", "gpu-1-replica-1", "gpu-2-replica-1",
    ]  # fmt: skip


def test_a_replica_carries_the_shared_contract_attributes() -> None:
    device = dradevices.slice_devices(resources(2, 4), Policy.PACKED)[5]
    assert dradevices.api_device(device) == {
        "name": "gpu-1-replica-1",
        "attributes": {
            "uuid": {"string": gpu(1).uuid}, "index": {"int": 1}, "productName": {"string": "Tesla T4"},
            "type": {"string": "shared"}, "resource": {"string": "nvidia.com/gpu.shared"}, "replica": {"int": 1},
        },
    }  # fmt: skip


def test_a_whole_gpu_is_type_gpu_without_a_replica() -> None:
    plain = build_resources(Inventory(gpus=(gpu(0),)), Config())
    (device,) = dradevices.slice_devices(plain, Policy.PACKED)
    doc = dradevices.api_device(device)
    assert doc["name"] == "gpu-0"
    assert doc["attributes"]["type"] == {"string": "gpu"}
    assert doc["attributes"]["resource"] == {"string": "nvidia.com/gpu"}
    assert "replica" not in doc["attributes"]


def test_a_pool_over_the_slice_limit_spans_slices_whose_names_sort_in_device_order() -> None:
    devices = dradevices.slice_devices(resources(9, 16), Policy.PACKED)  # 144 devices
    bodies = dradevices.slice_bodies("node-a", devices, generation=3, owner={"name": "node-a", "uid": "u-1"})
    assert [len(b["spec"]["devices"]) for b in bodies] == [64, 64, 16]
    assert [b["metadata"]["name"] for b in bodies] == sorted(b["metadata"]["name"] for b in bodies)
    flat = [d["name"] for b in bodies for d in b["spec"]["devices"]]
    assert flat == [d.name for d in devices]
    for body in bodies:
        assert body["spec"]["nodeName"] == "node-a"
        assert body["spec"]["driver"] == "gpu.sharepack.io"
        assert body["spec"]["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 3}
        assert body["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_an_empty_node_still_publishes_one_empty_slice() -> None:
    (body,) = dradevices.slice_bodies("node-a", (), generation=1)
    assert body["spec"]["devices"] == []
    assert body["spec"]["pool"]["resourceSliceCount"] == 1


def test_the_devices_of_an_unhealthy_gpu_are_tainted_and_keep_their_place() -> None:
    devices = dradevices.slice_devices(resources(2, 2), Policy.PACKED)
    (body,) = dradevices.slice_bodies("node-a", devices, generation=1, unhealthy={gpu(1).uuid})
    tainted = [d["name"] for d in body["spec"]["devices"] if d.get("taints")]
    assert tainted == ["gpu-1-replica-0", "gpu-1-replica-1"]
    assert [d["name"] for d in body["spec"]["devices"]] == [d.name for d in devices]
    assert body["spec"]["devices"][2]["taints"] == [{"key": "gpu.sharepack.io/unhealthy", "value": "xid", "effect": "NoSchedule"}]


def test_fresh_first_lists_gpus_in_no_use_first_then_the_fullest_each_gpu_together() -> None:
    static = dradevices.slice_devices(resources(4, 2), Policy.PACKED)
    keys = [gpu(i).uuid for i in range(4)]
    assert dradevices.fresh_first(keys, {}) == keys
    # GPU 1 holds 1 replica, GPU 3 both: free GPUs 0 and 2 first, then GPU 3, then GPU 1.
    held = dradevices.held_per_gpu(dradevices.by_name(static), ["gpu-1-replica-0", "gpu-3-replica-1", "gpu-3-replica-0"])
    assert held == {keys[1]: 1, keys[3]: 2}
    assert [d.name for d in dradevices.republished(static, held)] == [
        "gpu-0-replica-0", "gpu-0-replica-1", "gpu-2-replica-0", "gpu-2-replica-1",
        "gpu-3-replica-0", "gpu-3-replica-1", "gpu-1-replica-0", "gpu-1-replica-1",
    ]  # fmt: skip
    assert sorted(dradevices.republished(static, held), key=lambda d: d.name) == sorted(static, key=lambda d: d.name)


def test_fresh_first_groups_a_replica_major_order_by_gpu() -> None:
    static = dradevices.slice_devices(resources(2, 2), Policy.DISTRIBUTED)
    assert [d.name for d in dradevices.republished(static, {})] == [
        "gpu-0-replica-0", "gpu-0-replica-1", "gpu-1-replica-0", "gpu-1-replica-1",
    ]  # fmt: skip
