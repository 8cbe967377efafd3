"""Resources from inventory + config: MIG strategies, time-slicing / MPS replicas, per-GPU counts,
device nodes, and upstream's validation errors."""

from __future__ import annotations

import dataclasses
import textwrap
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharepack.common import config as config_mod
from sharepack.common import devices as device_ids
from sharepack.common import resources
from sharepack.common.config import Config
from sharepack.common.errors import ResourceError
from sharepack.common.inventory import Gpu, Inventory, MigDevice
from sharepack.common.policies import Sharing
from sharepack.common.resources import Device, Resource, build_resources
from sharepack.sandbox.kubelet.validation import is_extended_resource_name

A100 = "NVIDIA A100-SXM4-40GB"
PROFILES = {"1g.5gb": (1, 4864), "1g.5gb+me": (1, 4864), "2g.10gb": (2, 9984),
            "3g.20gb": (4, 19968), "7g.40gb": (8, 40192)}


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-4222-8333-444444444444"


def mig_uuid(i: int, j: int) -> str:
    return f"MIG-{i:04x}{j:04x}-aaaa-4bbb-8ccc-dddddddddddd"


def gpu(i: int, *migs: str, mig_enabled: bool | None = None, numa: int | None = 0,
        minor: int | None = None) -> Gpu:
    """GPU i; `migs` lists MIG profiles (one GPU instance each, compute instance 0)."""
    mig_devices = []
    start = 0
    for j, profile in enumerate(migs):
        size, memory = PROFILES[profile]
        mig_devices.append(MigDevice(uuid=mig_uuid(i, j), parent_uuid=gpu_uuid(i), parent_index=i,
                                     gi_id=j + 1, ci_id=0, profile=profile,
                                     placement_start=start, placement_size=size,
                                     memory_mib=memory, index=j))
        start += size
    return Gpu(index=i, uuid=gpu_uuid(i), name=A100, memory_mib=40960,
               minor=i if minor is None else minor, pci_bus_id=f"00000000:{i + 7:02x}:00.0",
               numa_node=numa, compute_capability=(8, 0),
               mig_enabled=bool(migs) if mig_enabled is None else mig_enabled,
               mig_devices=tuple(mig_devices))


def inventory(*gpus: Gpu) -> Inventory:
    return Inventory(gpus=tuple(gpus))


def cfg(text: str = "", **env: str) -> Config:
    return config_mod.load_config(file_text=textwrap.dedent(text), file_source="t.yaml",
                                  env=env, flags={})


def ts(resource: str, *, rename: bool = False, fail: bool = False) -> str:
    return (f"sharing:\n  timeSlicing:\n    renameByDefault: {str(rename).lower()}\n"
            f"    failRequestsGreaterThanOne: {str(fail).lower()}\n"
            f"    resources:\n    - {resource}\n")


def build(inv: Inventory, c: Config | None = None) -> dict[str, Resource]:
    built = build_resources(inv, c or cfg())
    return {r.name: r for r in built}


def ids(r: Resource) -> list[str]:
    return [d.id for d in r.devices]


def error(inv: Inventory, c: Config) -> str:
    with pytest.raises(ResourceError) as info:
        build_resources(inv, c)
    return str(info.value)


FOUR = inventory(gpu(0), gpu(1), gpu(2, numa=1), gpu(3, numa=1))


# --- full GPUs and MIG strategies ---------------------------------------------------------------

def test_full_gpus_become_one_nvidia_com_gpu_resource() -> None:
    got = build(FOUR)
    assert list(got) == ["nvidia.com/gpu"]
    r = got["nvidia.com/gpu"]
    assert (r.sharing, r.replicas, r.fail_requests_greater_than_one, r.replicated,
            r.full_gpu) == (Sharing.NONE, 1, False, False, True)
    assert r.devices[2] == Device(id=gpu_uuid(2), physical_key=gpu_uuid(2), uuid=gpu_uuid(2),
                                  index="2", gpu_index=2, replica=None,
                                  paths=("/dev/nvidia2",), numa_node=1, product=A100)


def test_device_nodes_follow_the_minor_number_not_the_index() -> None:
    r = build(inventory(gpu(0, minor=3)))["nvidia.com/gpu"]
    assert r.devices[0].paths == ("/dev/nvidia3",)


def test_devices_are_ordered_by_gpu_index_whatever_the_inventory_order() -> None:
    r = build(inventory(gpu(2), gpu(0), gpu(1)))["nvidia.com/gpu"]
    assert [d.index for d in r.devices] == ["0", "1", "2"]


def test_an_empty_node_serves_nothing() -> None:
    assert build_resources(inventory(), cfg()) == ()


def test_mig_strategy_none_serves_mig_enabled_gpus_as_full_gpus() -> None:
    got = build(inventory(gpu(0, "1g.5gb", "1g.5gb"), gpu(1)), cfg(MIG_STRATEGY="none"))
    assert list(got) == ["nvidia.com/gpu"]
    assert ids(got["nvidia.com/gpu"]) == [gpu_uuid(0), gpu_uuid(1)]


SINGLE_NODE = inventory(gpu(0, "1g.5gb", "1g.5gb"), gpu(1, "1g.5gb"))


def test_mig_strategy_single_serves_mig_instances_as_nvidia_com_gpu() -> None:
    r = build(SINGLE_NODE, cfg(MIG_STRATEGY="single"))["nvidia.com/gpu"]
    assert ids(r) == [mig_uuid(0, 0), mig_uuid(0, 1), mig_uuid(1, 0)]
    assert r.devices[1] == Device(
        id=mig_uuid(0, 1), physical_key=gpu_uuid(0), uuid=mig_uuid(0, 1), index="0:1",
        gpu_index=0, replica=None,
        paths=("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"),
        numa_node=0, product=f"{A100} MIG 1g.5gb")
    assert not r.full_gpu and not r.replicated
    assert dict(r.group_of()) == {mig_uuid(0, 0): gpu_uuid(0), mig_uuid(0, 1): gpu_uuid(0),
                                  mig_uuid(1, 0): gpu_uuid(1)}


def test_mig_strategy_single_without_mig_serves_full_gpus() -> None:
    r = build(FOUR, cfg(MIG_STRATEGY="single"))["nvidia.com/gpu"]
    assert r.full_gpu and len(r.devices) == 4


def test_mig_strategy_mixed_serves_one_resource_per_profile_and_full_gpus() -> None:
    inv = inventory(gpu(0, "1g.5gb", "1g.5gb", "3g.20gb"), gpu(1), gpu(2, "1g.5gb"))
    got = build(inv, cfg(MIG_STRATEGY="mixed"))
    assert list(got) == ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.20gb"]
    assert ids(got["nvidia.com/gpu"]) == [gpu_uuid(1)]
    assert ids(got["nvidia.com/mig-1g.5gb"]) == [mig_uuid(0, 0), mig_uuid(0, 1), mig_uuid(2, 0)]
    assert [d.physical_key for d in got["nvidia.com/mig-1g.5gb"].devices] == [
        gpu_uuid(0), gpu_uuid(0), gpu_uuid(2)]
    assert [d.index for d in got["nvidia.com/mig-3g.20gb"].devices] == ["0:2"]
    assert got["nvidia.com/gpu"].full_gpu and not got["nvidia.com/mig-1g.5gb"].full_gpu


@pytest.mark.parametrize(
    ("inv", "strategy", "want"),
    [
        pytest.param(inventory(gpu(0, "1g.5gb"), gpu(1)), "single",
                     "all devices on the node must be configured with the same migEnabled "
                     "value (mig strategy single): MIG enabled on GPU 0 and disabled on GPU 1",
                     id="single rejects a node with MIG on some GPUs only"),
        pytest.param(inventory(gpu(0, "1g.5gb"), gpu(1, "3g.20gb")), "single",
                     "invalid MIG configuration: mig strategy single needs one MIG profile on "
                     "the node, found 1g.5gb, 3g.20gb",
                     id="single rejects more than one MIG profile"),
        pytest.param(inventory(gpu(0, mig_enabled=True)), "single",
                     f"invalid MIG configuration: GPU 0 ({gpu_uuid(0)}) has MIG enabled but no "
                     "MIG devices", id="single rejects a MIG-enabled GPU without instances"),
        pytest.param(inventory(gpu(0, "1g.5gb"), gpu(1, mig_enabled=True)), "mixed",
                     f"invalid MIG configuration: GPU 1 ({gpu_uuid(1)}) has MIG enabled but no "
                     "MIG devices", id="mixed rejects a MIG-enabled GPU without instances"),
        pytest.param(inventory(gpu(0, "1g.5gb"), gpu(1, "3g.20gb"), gpu(2)), "single",
                     "all devices on the node must be configured with the same migEnabled value "
                     "(mig strategy single): MIG enabled on GPU 0,1 and disabled on GPU 2; invalid "
                     "MIG configuration: mig strategy single needs "
                     "one MIG profile on the node, found 1g.5gb, 3g.20gb",
                     id="single reports every MIG problem at once"),
    ],
)
def test_a_mig_layout_the_strategy_cannot_serve_is_rejected(inv: Inventory, strategy: str,
                                                            want: str) -> None:
    assert error(inv, cfg(MIG_STRATEGY=strategy)) == want


# --- MIG device nodes -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("gpu_minor", "gi", "ci", "want"),
    [
        (0, 0, None, 3),
        (0, 0, 0, 4),
        (0, 0, 7, 11),
        (0, 1, None, 12),
        (0, 14, 7, 137),
        (1, 0, None, 138),
        (2, 3, 1, 3 + 2 * 135 + 3 * 9 + 2),
    ],
    ids=lambda v: str(v),
)
def test_mig_minor_follows_the_drivers_numbering(gpu_minor: int, gi: int, ci: int | None,
                                                 want: int) -> None:
    assert resources.mig_minor(gpu_minor, gi, ci) == want


@pytest.mark.parametrize(("gi", "ci", "name"),
                         [(15, None, "gpu0/gi15/access"), (0, 8, "gpu0/gi0/ci8/access"),
                          (-1, None, "gpu0/gi-1/access")],
                         ids=["gi past 14", "ci past 7", "negative gi"])
def test_mig_minor_rejects_ids_outside_the_drivers_table(gi: int, ci: int | None,
                                                         name: str) -> None:
    with pytest.raises(ValueError) as info:
        resources.mig_minor(0, gi, ci)
    assert str(info.value) == (f"no nvidia-caps minor for {name}: GPU instance IDs run 0..14 "
                               "and compute instance IDs 0..7")


MIG_MINORS = """\
config 1
monitor 2
gpu0/gi1/access 50
gpu0/gi1/ci0/access 51
gpu0/gi2/access 60
gpu0/gi2/ci0/access 61
"""


def test_parse_mig_minors_reads_the_drivers_file() -> None:
    minors = resources.parse_mig_minors(MIG_MINORS + "\n")
    assert minors["gpu0/gi2/ci0/access"] == 61 and minors["config"] == 1 and len(minors) == 6


def test_parse_mig_minors_rejects_a_malformed_line() -> None:
    with pytest.raises(ValueError, match=r"mig-minors line 2: want '<name> <minor>', got 'x'"):
        resources.parse_mig_minors("config 1\nx\n")


def test_a_given_mig_minors_table_decides_the_caps_paths() -> None:
    inv = inventory(gpu(0, "1g.5gb", "1g.5gb"))
    built = build_resources(inv, cfg(MIG_STRATEGY="mixed"),
                            mig_minors=resources.parse_mig_minors(MIG_MINORS))
    assert [d.paths for d in built[0].devices] == [
        ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap50", "/dev/nvidia-caps/nvidia-cap51"),
        ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap60", "/dev/nvidia-caps/nvidia-cap61"),
    ]


def test_a_mig_minors_table_without_the_instance_is_an_error() -> None:
    inv = inventory(gpu(0, "1g.5gb", "1g.5gb", "1g.5gb"))
    with pytest.raises(ResourceError) as info:
        build_resources(inv, cfg(MIG_STRATEGY="mixed"),
                        mig_minors=resources.parse_mig_minors(MIG_MINORS))
    assert str(info.value) == (f"MIG device {mig_uuid(0, 2)}: no nvidia-caps minor for "
                               "gpu0/gi3/access, gpu0/gi3/ci0/access in mig-minors")


# --- time-slicing and MPS -------------------------------------------------------------------------

def test_time_slicing_replaces_each_gpu_by_its_replicas() -> None:
    got = build(inventory(gpu(0), gpu(1)), cfg(ts("{name: nvidia.com/gpu, replicas: 3}",
                                                  fail=True)))
    assert list(got) == ["nvidia.com/gpu"]
    r = got["nvidia.com/gpu"]
    assert (r.sharing, r.replicas, r.fail_requests_greater_than_one, r.replicated,
            r.full_gpu) == (Sharing.TIME_SLICING, 3, True, True, False)
    assert ids(r) == [device_ids.replica_id(gpu_uuid(g), n) for g in (0, 1) for n in range(3)]
    assert ids(r)[0] == f"{gpu_uuid(0)}::0"
    d = r.devices[4]
    assert (d.replica, d.uuid, d.physical_key, d.index, d.paths) == (
        1, gpu_uuid(1), gpu_uuid(1), "1", ("/dev/nvidia1",))
    assert set(r.group_of().values()) == {gpu_uuid(0), gpu_uuid(1)}
    assert r.by_id()[f"{gpu_uuid(1)}::2"].replica == 2
    assert r.device_ids() == tuple(ids(r))


def test_rename_by_default_serves_replicas_as_name_dot_shared() -> None:
    got = build(FOUR, cfg(ts("{name: nvidia.com/gpu, replicas: 2}", rename=True)))
    assert list(got) == ["nvidia.com/gpu.shared"]
    assert len(got["nvidia.com/gpu.shared"].devices) == 8


def test_sharing_some_gpus_with_rename_keeps_the_rest_as_full_gpus() -> None:
    got = build(FOUR, cfg(ts(f"{{name: nvidia.com/gpu, replicas: 2, devices: [1, {gpu_uuid(3)}]}}",
                             rename=True)))
    assert list(got) == ["nvidia.com/gpu", "nvidia.com/gpu.shared"]
    assert ids(got["nvidia.com/gpu"]) == [gpu_uuid(0), gpu_uuid(2)]
    assert got["nvidia.com/gpu"].full_gpu
    assert {d.physical_key for d in got["nvidia.com/gpu.shared"].devices} == {gpu_uuid(1),
                                                                              gpu_uuid(3)}


def test_a_device_count_shares_the_first_gpus() -> None:
    got = build(FOUR, cfg(ts("{name: nvidia.com/gpu, replicas: 2, devices: 3}", rename=True)))
    assert ids(got["nvidia.com/gpu"]) == [gpu_uuid(3)]
    assert len(got["nvidia.com/gpu.shared"].devices) == 6


def test_mps_replicas_carry_the_mps_sharing_mode() -> None:
    c = cfg("sharing: {mps: {renameByDefault: true, resources: [{name: gpu, replicas: 2}]}}")
    r = build(FOUR, c)["nvidia.com/gpu.shared"]
    assert r.sharing is Sharing.MPS and len(r.devices) == 8


def test_time_slicing_mig_instances_groups_replicas_by_parent_gpu() -> None:
    inv = inventory(gpu(0, "1g.5gb", "1g.5gb"), gpu(1))
    c = cfg(ts("{name: mig-1g.5gb, replicas: 2}", rename=True), MIG_STRATEGY="mixed")
    got = build(inv, c)
    assert list(got) == ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb.shared"]
    r = got["nvidia.com/mig-1g.5gb.shared"]
    assert ids(r) == [f"{mig_uuid(0, 0)}::0", f"{mig_uuid(0, 0)}::1",
                      f"{mig_uuid(0, 1)}::0", f"{mig_uuid(0, 1)}::1"]
    assert set(r.group_of().values()) == {gpu_uuid(0)}
    assert r.devices[3].index == "0:1" and r.devices[3].uuid == mig_uuid(0, 1)


def test_a_shared_resource_this_node_does_not_serve_is_skipped() -> None:
    c = cfg(ts("{name: mig-2g.10gb, replicas: 2}"))
    assert list(build(FOUR, c)) == ["nvidia.com/gpu"]


def test_sharing_only_some_gpus_without_rename_is_rejected() -> None:
    c = cfg(ts("{name: nvidia.com/gpu, replicas: 2, devices: [0]}"))
    assert error(FOUR, c) == (
        "sharing.timeSlicing.resources[0] (nvidia.com/gpu): sharing only some of its devices "
        "needs renameByDefault: the 3 unshared ones would be served under the same name")


WHERE = "sharing.timeSlicing.resources[0] (nvidia.com/gpu): unable to get IDs of devices to " \
        "replicate for 'nvidia.com/gpu' resource: "


@pytest.mark.parametrize(
    ("resource", "want"),
    [
        pytest.param("{name: gpu, replicas: 2, devices: 5}",
                     WHERE + "requested 5 devices to be replicated, but only 4 devices available",
                     id="a device count beyond the node's GPUs is rejected"),
        pytest.param("{name: gpu, replicas: 2, devices: [0, 9]}",
                     WHERE + "no matching device at index: 9",
                     id="an index the node does not have is rejected"),
        pytest.param(f"{{name: gpu, replicas: 2, devices: [{gpu_uuid(7)}]}}",
                     WHERE + f"no matching device with UUID: {gpu_uuid(7)}",
                     id="a UUID the node does not have is rejected"),
        pytest.param("{name: gpu, replicas: 2, devices: ['0:0']}",
                     WHERE + "no matching device at index: 0:0",
                     id="a MIG index does not match a full GPU"),
        pytest.param("{name: gpu, replicas: 2, devices: [0], perGpu: {1: 4}}",
                     WHERE + "perGpu: no matching device at index: 1 among the devices selected "
                     "for sharing", id="a perGpu entry outside the selected devices is rejected"),
        pytest.param(f"{{name: gpu, replicas: 2, perGpu: {{1: 4, {gpu_uuid(1)}: 3}}}}",
                     WHERE + f"perGpu: device 1 ({gpu_uuid(1)}) is named twice: 1, "
                     f"{gpu_uuid(1)}", id="a GPU named twice in perGpu is rejected"),
        pytest.param("{name: gpu, perGpu: {8: 4}}", WHERE + "no matching device at index: 8",
                     id="a perGpu-only selection of a missing GPU is rejected"),
    ],
)
def test_device_references_the_node_cannot_satisfy_are_rejected(resource: str,
                                                               want: str) -> None:
    assert error(FOUR, cfg(ts(resource, rename=True))) == want


def test_mps_cannot_share_mig_devices() -> None:
    c = cfg("sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}", MIG_STRATEGY="single")
    assert error(SINGLE_NODE, c) == ("sharing.mps.resources[0] (nvidia.com/gpu): sharing MIG "
                                     "devices with MPS is not supported")


def test_every_sharing_problem_is_reported_at_once() -> None:
    inv = inventory(gpu(0, "1g.5gb"), gpu(1, "3g.20gb"))
    c = cfg("sharing:\n  timeSlicing:\n    resources:\n"
            "    - {name: mig-1g.5gb, replicas: 2, devices: [5]}\n"
            "    - {name: mig-3g.20gb, replicas: 2, devices: 3}\n", MIG_STRATEGY="mixed")
    message = error(inv, c)
    assert message.count("unable to get IDs") == 2 and "; " in message


# --- per-GPU replica counts -----------------------------------------------------------------------

def per_gpu_counts(r: Resource) -> dict[str, int]:
    return dict(Counter(d.physical_key for d in r.devices))


def test_per_gpu_counts_give_each_gpu_its_own_replicas() -> None:
    c = cfg(ts(f"{{name: gpu, replicas: 2, perGpu: {{0: 8, {gpu_uuid(3)}: 1}}}}"))
    r = build(FOUR, c)["nvidia.com/gpu"]
    assert per_gpu_counts(r) == {gpu_uuid(0): 8, gpu_uuid(1): 2, gpu_uuid(2): 2, gpu_uuid(3): 1}
    assert r.replicas == 8
    assert ids(r)[-1] == f"{gpu_uuid(3)}::0"


def test_per_gpu_alone_shares_only_the_gpus_it_names() -> None:
    c = cfg(ts("{name: gpu, perGpu: {1: 3, 2: 5}}", rename=True))
    got = build(FOUR, c)
    assert per_gpu_counts(got["nvidia.com/gpu.shared"]) == {gpu_uuid(1): 3, gpu_uuid(2): 5}
    assert got["nvidia.com/gpu.shared"].replicas == 5
    assert ids(got["nvidia.com/gpu"]) == [gpu_uuid(0), gpu_uuid(3)]


def test_a_gpu_reference_covers_its_mig_instances_and_a_mig_reference_wins() -> None:
    inv = inventory(gpu(0, "1g.5gb", "1g.5gb", "1g.5gb"), gpu(1, "1g.5gb"))
    c = cfg(ts(f"{{name: mig-1g.5gb, replicas: 2, perGpu: {{0: 4, '0:2': 7, {gpu_uuid(1)}: 3}}}}"),
            MIG_STRATEGY="mixed")
    r = build(inv, c)["nvidia.com/mig-1g.5gb"]
    assert dict(Counter(d.uuid for d in r.devices)) == {
        mig_uuid(0, 0): 4, mig_uuid(0, 1): 4, mig_uuid(0, 2): 7, mig_uuid(1, 0): 3}
    assert r.replicas == 7


def test_devices_may_select_mig_instances_by_their_parent_gpu() -> None:
    inv = inventory(gpu(0, "1g.5gb", "1g.5gb"), gpu(1, "1g.5gb"))
    c = cfg(ts("{name: mig-1g.5gb, replicas: 2, devices: [1]}", rename=True),
            MIG_STRATEGY="mixed")
    got = build(inv, c)
    assert {d.uuid for d in got["nvidia.com/mig-1g.5gb.shared"].devices} == {mig_uuid(1, 0)}
    assert ids(got["nvidia.com/mig-1g.5gb"]) == [mig_uuid(0, 0), mig_uuid(0, 1)]


# --- invariants -----------------------------------------------------------------------------------

@st.composite
def nodes(draw: st.DrawFn) -> tuple[Inventory, dict[int, int], int]:
    n = draw(st.integers(1, 6))
    gpus = [gpu(i) for i in draw(st.permutations(range(n)))]
    default = draw(st.integers(1, 5))
    per_gpu = draw(st.dictionaries(st.integers(0, n - 1), st.integers(1, 9), max_size=n))
    return inventory(*gpus), per_gpu, default


@settings(max_examples=60, deadline=None)
@given(nodes(), st.booleans())
def test_replicas_are_unique_and_each_gpu_gets_exactly_its_count(
    node: tuple[Inventory, dict[int, int], int], rename: bool
) -> None:
    inv, per_gpu, default = node
    entries = ", ".join(f"{i}: {count}" for i, count in per_gpu.items())
    per = f", perGpu: {{{entries}}}" if per_gpu else ""
    built = build_resources(inv, cfg(ts(f"{{name: gpu, replicas: {default}{per}}}",
                                        rename=rename)))
    assert len(built) == 1
    r = built[0]
    all_ids = [d.id for d in r.devices]
    assert len(set(all_ids)) == len(all_ids)
    want = {gpu_uuid(g.index): per_gpu.get(g.index, default) for g in inv.gpus}
    assert per_gpu_counts(r) == want
    assert r.replicas == max(want.values())
    for d in r.devices:
        assert device_ids.split_replica(d.id) == (d.uuid, d.replica)
        assert device_ids.physical_key(d.id) == d.physical_key
    # Replicas of a GPU are numbered 0..count-1 and GPUs come in index order.
    assert [d.gpu_index for d in r.devices] == sorted(d.gpu_index for d in r.devices)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["1g.5gb", "2g.10gb", "3g.20gb"]), max_size=3),
                min_size=1, max_size=4))
def test_mixed_strategy_serves_every_mig_instance_exactly_once_keyed_by_its_parent(
    layouts: list[list[str]]
) -> None:
    inv = inventory(*(gpu(i, *profiles) for i, profiles in enumerate(layouts)))
    built = build_resources(inv, cfg(MIG_STRATEGY="mixed"))
    served = [d for r in built for d in r.devices]
    want = {m.uuid: m.parent_uuid for g in inv.gpus for m in g.mig_devices}
    want |= {g.uuid: g.uuid for g in inv.gpus if not g.mig_enabled}
    assert {d.id: d.physical_key for d in served} == want
    assert len(served) == len(want)
    assert [r.name for r in built] == sorted(r.name for r in built)


def test_a_mig_instance_outside_the_drivers_caps_table_is_an_error() -> None:
    g = gpu(0, "1g.5gb")
    odd = dataclasses.replace(g, mig_devices=(dataclasses.replace(g.mig_devices[0], gi_id=15),))
    assert error(inventory(odd), cfg(MIG_STRATEGY="mixed")) == (
        f"MIG device {mig_uuid(0, 0)}: no nvidia-caps minor for gpu0/gi15/access: GPU instance "
        "IDs run 0..14 and compute instance IDs 0..7")


def test_full_gpu_follows_upstreams_aligned_path_rule_for_wsl_devices() -> None:
    # Upstream sends WSL GPUs (/dev/dxg) through the shared loop, not the topology-aware path;
    # `full_gpu` must apply the same rule as `allocation.takes_aligned_path` (the dispatch vectors).
    r = build(FOUR)["nvidia.com/gpu"]
    wsl = dataclasses.replace(
        r, devices=tuple(dataclasses.replace(d, paths=("/dev/dxg",)) for d in r.devices))
    assert r.full_gpu and not wsl.full_gpu


def test_a_media_extension_profile_gets_upstreams_valid_resource_name() -> None:
    got = build(inventory(gpu(0, "1g.5gb+me", "1g.5gb")), cfg(MIG_STRATEGY="mixed"))
    assert sorted(got) == ["nvidia.com/mig-1g.5gb", "nvidia.com/mig-1g.5gb.me"]
    assert all(is_extended_resource_name(name) for name in got), "the kubelet would refuse '+'"
