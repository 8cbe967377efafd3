"""read_inventory, the adapter the agent runs, over every built-in simulated machine."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sharepack.agent import nvml
from sharepack.agent.nvmlsim import builtin_names
from sharepack.common.inventory import Inventory

VECTORS = Path(__file__).parent / "vectors"

# PITFALLS: placements in memory slices, `start: size`, per profile.
A100_40GB_PLACEMENTS = {
    "1g.5gb": ((0, 1, 2, 3, 4, 5, 6), 1),
    "1g.5gb+me": ((0, 1, 2, 3, 4, 5, 6), 1),
    "1g.10gb": ((0, 2, 4, 6), 2),
    "2g.10gb": ((0, 2, 4), 2),
    "3g.20gb": ((0, 4), 4),
    "4g.20gb": ((0,), 4),
    "7g.40gb": ((0,), 8),
}
H100_80GB_PLACEMENTS = {
    "1g.10gb": ((0, 1, 2, 3, 4, 5, 6), 1),
    "1g.10gb+me": ((0, 1, 2, 3, 4, 5, 6), 1),
    "1g.20gb": ((0, 2, 4, 6), 2),
    "2g.20gb": ((0, 2, 4), 2),
    "3g.40gb": ((0, 4), 4),
    "4g.40gb": ((0,), 4),
    "7g.80gb": ((0,), 8),
}
PLACEMENTS = {"NVIDIA A100-SXM4-40GB": A100_40GB_PLACEMENTS,
              "NVIDIA H100 80GB HBM3": H100_80GB_PLACEMENTS}


def read(machine: str) -> Inventory:
    lib = nvml.load_library(machine)
    try:
        return nvml.read_inventory(lib)
    finally:
        nvml.shutdown(lib)


def by_index(inventory: Inventory) -> dict[tuple[int, int], int]:
    """Pair scores keyed by GPU indices (low, high)."""
    index = {g.uuid: g.index for g in inventory.gpus}
    return {
        (min(index[a], index[b]), max(index[a], index[b])): score
        for (a, b), score in inventory.pair_scores.items()
    }


@pytest.mark.parametrize(
    "machine, count, product, memory_mib, capability, mig_gpus, mig_devices",
    [
        ("dgx-a100", 8, "NVIDIA A100-SXM4-40GB", 40960, (8, 0), 0, 0),
        ("dgx-a100-mig", 8, "NVIDIA A100-SXM4-40GB", 40960, (8, 0), 7, 24),
        ("dgx-h100", 8, "NVIDIA H100 80GB HBM3", 81559, (9, 0), 0, 0),
        ("dgx1-volta", 8, "Tesla V100-SXM2-16GB", 16160, (7, 0), 0, 0),
        ("t4-pcie", 4, "Tesla T4", 15360, (7, 5), 0, 0),
    ],
)
def test_a_builtin_machine_reads_as_its_description_says(
    machine: str, count: int, product: str, memory_mib: int, capability: tuple[int, int],
    mig_gpus: int, mig_devices: int,
) -> None:
    inventory = read(machine)
    assert [g.index for g in inventory.gpus] == list(range(count))
    assert {g.name for g in inventory.gpus} == {product}
    assert {g.memory_mib for g in inventory.gpus} == {memory_mib}
    assert {g.compute_capability for g in inventory.gpus} == {capability}
    assert sum(g.mig_enabled for g in inventory.gpus) == mig_gpus
    assert sum(len(g.mig_devices) for g in inventory.gpus) == mig_devices
    assert [g.minor for g in inventory.gpus] == list(range(count))
    assert inventory.driver_version and inventory.cuda_driver_version > 0


def test_every_builtin_machine_is_tested() -> None:
    assert set(builtin_names()) == {"dgx-a100", "dgx-a100-mig", "dgx-h100", "dgx1-volta",
                                    "t4-pcie"}


@pytest.mark.parametrize("machine", builtin_names())
def test_identities_are_unique_and_well_formed(machine: str) -> None:
    inventory = read(machine)
    uuids = [g.uuid for g in inventory.gpus] + [
        m.uuid for g in inventory.gpus for m in g.mig_devices
    ]
    assert len(set(uuids)) == len(uuids)
    assert all(re.fullmatch(r"GPU-[0-9a-f-]{36}", g.uuid) for g in inventory.gpus)
    assert all(re.fullmatch(r"MIG-[0-9a-f-]{36}", m.uuid)
               for g in inventory.gpus for m in g.mig_devices)
    buses = [g.pci_bus_id for g in inventory.gpus]
    assert len(set(buses)) == len(buses)
    assert all(re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.0", b) for b in buses)
    assert all(a < b for a, b in inventory.pair_scores)


def test_the_same_machine_reads_the_same_twice() -> None:
    assert read("dgx-a100-mig") == read("dgx-a100-mig")


def test_numa_nodes_come_from_memory_affinity() -> None:
    assert [g.numa_node for g in read("dgx-a100").gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert [g.numa_node for g in read("t4-pcie").gpus] == [0, 0, 1, 1]


@pytest.mark.parametrize("machine", [m for m in builtin_names() if "mig" in m])
def test_mig_placements_are_valid_and_disjoint(machine: str) -> None:
    for gpu in read(machine).gpus:
        table = PLACEMENTS[gpu.name]
        used: set[int] = set()
        gis = [m.gi_id for m in gpu.mig_devices]
        assert len(set(gis)) == len(gis), f"GPU {gpu.index}: duplicate GPU instance IDs"
        for mig in gpu.mig_devices:
            starts, size = table[mig.profile]
            assert mig.placement_start in starts, (gpu.index, mig)
            assert mig.placement_size == size, (gpu.index, mig)
            span = set(range(mig.placement_start, mig.placement_start + size))
            assert not span & used, f"GPU {gpu.index}: {mig.profile} overlaps"
            used |= span
            assert mig.parent_uuid == gpu.uuid and mig.parent_index == gpu.index
        assert sum(int(m.profile.split("g.")[0]) for m in gpu.mig_devices) <= 7
        assert [m.index for m in gpu.mig_devices] == list(range(len(gpu.mig_devices)))


def test_dgx_a100_mig_has_the_documented_mixed_layout() -> None:
    layout = [sorted((m.placement_start, m.profile) for m in g.mig_devices)
              for g in read("dgx-a100-mig").gpus]
    assert layout == [
        [(s, "1g.5gb") for s in range(7)],
        [(0, "2g.10gb"), (2, "1g.5gb"), (3, "1g.5gb"), (4, "3g.20gb")],
        [(0, "4g.20gb"), (4, "3g.20gb")],
        [(0, "7g.40gb")],
        [(0, "2g.10gb"), (2, "2g.10gb"), (4, "2g.10gb"), (6, "1g.5gb")],
        [(0, "1g.10gb"), (2, "1g.10gb"), (4, "1g.10gb"), (6, "1g.10gb")],
        [(0, "3g.20gb"), (4, "3g.20gb")],
        [],
    ]
    memory = {m.profile: m.memory_mib for g in read("dgx-a100-mig").gpus for m in g.mig_devices}
    assert memory == {"1g.5gb": 4864, "1g.10gb": 9856, "2g.10gb": 9856, "3g.20gb": 19968,
                      "4g.20gb": 19968, "7g.40gb": 40192}


def test_dgx1_volta_pair_scores_are_the_vectors() -> None:
    vectors = json.loads((VECTORS / "dgx1_volta_topology.json").read_text())
    type_scores = {t["name"]: t["score"] for t in vectors["link_types"]}
    expected = {}
    for link in vectors["dgx1_volta"]["links"]:
        a, b = link["gpus"]
        assert link["score"] == sum(type_scores[t] for t in link["types"])
        expected[(a, b)] = link["score"]
    assert by_index(read("dgx1-volta")) == expected


def test_nvswitch_machines_score_by_pcie_level_only() -> None:
    # Every NVLink of a DGX A100/H100 ends at an NVSwitch, never at the peer GPU.
    a100 = by_index(read("dgx-a100"))
    assert a100[(0, 1)] == 40  # same PCIe switch complex: MultiSwitch
    assert a100[(0, 2)] == 10  # another NUMA node: CrossCPU
    assert max(a100.values()) < 100
    h100 = by_index(read("dgx-h100"))
    assert h100[(0, 3)] == 20 and h100[(3, 4)] == 10  # same socket; across sockets
    assert len(h100) == 28


def test_pcie_only_machine_scores_switch_pairs_highest() -> None:
    assert by_index(read("t4-pcie")) == {
        (0, 1): 50, (2, 3): 50, (0, 2): 10, (0, 3): 10, (1, 2): 10, (1, 3): 10,
    }


@pytest.mark.parametrize(
    "gi, ci, memory_mb, total_mib, media, name",
    [
        (1, 1, 4864, 40960, False, "1g.5gb"),
        (1, 1, 4864, 40960, True, "1g.5gb+me"),
        (1, 1, 9856, 40960, False, "1g.10gb"),
        (3, 3, 19968, 40960, False, "3g.20gb"),
        (3, 1, 19968, 40960, False, "1c.3g.20gb"),
        (7, 7, 40192, 40960, False, "7g.40gb"),
        (1, 1, 9984, 81559, False, "1g.10gb"),
        (2, 2, 20096, 81559, False, "2g.20gb"),
        (7, 7, 81152, 81559, False, "7g.80gb"),
        # A mock H100 1g instance of exactly 10 GiB is over an eighth: named like a 2-slice one.
        (1, 1, 10240, 81559, False, "1g.20gb"),
        # H200 (143771 MiB, 141 GiB rounded up): an instance just under half of the memory is
        # named after 4/8 x 141 = 70.5 GiB, which Go rounds half away from zero.
        (3, 3, 71000, 143771, False, "3g.71gb"),
        (1, 1, 17000, 143771, False, "1g.18gb"),
        (2, 2, 35000, 143771, False, "2g.35gb"),
    ],
)
def test_mig_profiles_are_named_from_memory_like_go_nvlib(
    gi: int, ci: int, memory_mb: int, total_mib: int, media: bool, name: str
) -> None:
    assert nvml.mig_profile_name(gi, ci, memory_mb, total_mib << 20,
                                 media_extensions=media) == name


@pytest.fixture
def h100_mig_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "h100-mig.yaml"
    path.write_text(
        """
name: h100-mig
product: NVIDIA H100 80GB HBM3
gpus:
- pci_bus_id: "00000000:18:00.0"
  mig: {instances: [{profile: 3g.40gb, start: 4}, {profile: 2g.20gb, start: 0},
                    {profile: 1g.10gb+me, start: 2}, {profile: 1g.10gb, start: 3}]}
- pci_bus_id: "00000000:2A:00.0"
  mig: {instances: [{profile: 4g.40gb, start: 0}, {profile: 1g.20gb, start: 4},
                    {profile: 1g.20gb, start: 6}]}
- pci_bus_id: "00000000:3A:00.0"
  mig: {instances: [{profile: 7g.80gb, start: 0}]}
- pci_bus_id: "00000000:5D:00.0"
  mig: {enabled: true}
"""
    )
    yield path


def test_h100_mig_profiles_read_with_their_real_names(h100_mig_file: Path) -> None:
    inventory = read(str(h100_mig_file))
    layout = [sorted((m.placement_start, m.profile, m.memory_mib) for m in g.mig_devices)
              for g in inventory.gpus]
    assert layout == [
        [(0, "2g.20gb", 20096), (2, "1g.10gb+me", 9984), (3, "1g.10gb", 9984),
         (4, "3g.40gb", 40448)],
        [(0, "4g.40gb", 40448), (4, "1g.20gb", 20096), (6, "1g.20gb", 20096)],
        [(0, "7g.80gb", 81152)],
        [],
    ]
    assert [g.mig_enabled for g in inventory.gpus] == [True, True, True, True]
    assert [m.gi_id for m in inventory.gpus[2].mig_devices] == [0]


def test_reading_an_uninitialised_library_names_the_step() -> None:
    lib = nvml.load_library("t4-pcie")
    nvml.shutdown(lib)
    with pytest.raises(nvml.NvmlError, match="nvml: reading the driver version: Uninitialized"):
        nvml.read_inventory(lib)
