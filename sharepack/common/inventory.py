"""What a node has: GPUs, their MIG instances, and how they are linked.

Built by the agent's NVML adapter (real driver or simulator); consumed, purely, by resource
building and topology-aware allocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class MigDevice:
    uuid: str  # "MIG-..."
    parent_uuid: str  # the physical GPU: MIG instances group by it
    parent_index: int
    gi_id: int  # GPU instance ID
    ci_id: int  # compute instance ID
    profile: str  # e.g. "1g.5gb", "3g.20gb"
    placement_start: int  # memory slice offset (0..7)
    placement_size: int
    memory_mib: int
    index: int = 0  # the MIG device's index under its parent


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str  # "GPU-..."
    name: str  # product name, e.g. "NVIDIA A100-SXM4-40GB"
    memory_mib: int
    minor: int  # /dev/nvidia<minor>
    pci_bus_id: str  # "00000000:07:00.0"
    numa_node: int | None
    compute_capability: tuple[int, int]
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class Inventory:
    """A node's GPUs plus the pair link scores topology-aware allocation uses.

    `pair_scores` is keyed by (uuid_a, uuid_b) with uuid_a < uuid_b; a missing pair scores 0.
    Scores follow go-gpuallocator: PCIe common-ancestor level (10..60) plus 100 per NVLink.
    """

    gpus: tuple[Gpu, ...]
    pair_scores: Mapping[tuple[str, str], int] = field(default_factory=dict)
    driver_version: str = ""
    cuda_driver_version: int = 0
