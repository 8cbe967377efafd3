"""GPU products the simulator knows: what NVML reports for each, and their MIG profiles.

Figures are the ones real drivers report (`nvidia-smi -q`, `nvidia-smi mig -lgip`), because
the adapter names MIG profiles from memory sizes the way go-nvlib does: a total or a profile
size that is merely "close" names profiles wrongly (PITFALLS: real memory totals).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pynvml


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str  # "1g.5gb", "1g.5gb+me"
    enum: int  # NVML_GPU_INSTANCE_PROFILE_* (what nvmlDeviceGetGpuInstanceProfileInfo takes)
    profile_id: int  # the profile's ID as NVML reports it in .id / GpuInstanceInfo.profileId
    slices: int  # GPU (compute) slices: the "Ng" in the name
    memory_mb: int  # memorySizeMB of the profile
    multiprocessors: int
    starts: tuple[int, ...]  # valid placement starts, in memory slices (0..7)
    size: int  # placement size, in memory slices
    instance_count: int  # how many fit on one GPU

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")


@dataclass(frozen=True, slots=True)
class Product:
    name: str  # nvmlDeviceGetName
    memory_mib: int  # nvmlDeviceGetMemoryInfo().total / MiB
    compute_capability: tuple[int, int]
    architecture: int  # NVML_DEVICE_ARCH_*
    multiprocessors: int
    nvlinks: int  # NVLink ports on the chip (0: none, nvmlDeviceGetNvLinkState not supported)
    mig_profiles: tuple[MigProfile, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def mig_profile(self, name: str) -> MigProfile | None:
        for profile in self.mig_profiles:
            if profile.name == name:
                return profile
        return None


def _mig_table(
    rows: tuple[tuple[str, int, int, int, int, int, tuple[int, ...], int, int], ...],
) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(*row) for row in rows)


_P = pynvml
_ALL_1 = (0, 1, 2, 3, 4, 5, 6)

# (name, enum, id, slices, memory MB, SMs, starts, size, instances). Placements per PITFALLS.
A100_40GB_MIG = _mig_table(
    (
        ("1g.5gb", _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 4864, 14, _ALL_1, 1, 7),
        ("1g.5gb+me", _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 4864, 14, _ALL_1, 1, 1),
        ("1g.10gb", _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 9856, 14, (0, 2, 4, 6), 2, 4),
        ("2g.10gb", _P.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 9856, 28, (0, 2, 4), 2, 3),
        ("3g.20gb", _P.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 19968, 42, (0, 4), 4, 2),
        ("4g.20gb", _P.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 19968, 56, (0,), 4, 1),
        ("7g.40gb", _P.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 40192, 98, (0,), 8, 1),
    )
)

H100_80GB_MIG = _mig_table(
    (
        ("1g.10gb", _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 9984, 16, _ALL_1, 1, 7),
        ("1g.10gb+me", _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 9984, 16, _ALL_1, 1, 1),
        ("1g.20gb", _P.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 20096, 26, (0, 2, 4, 6), 2, 4),
        ("2g.20gb", _P.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 20096, 32, (0, 2, 4), 2, 3),
        ("3g.40gb", _P.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 40448, 60, (0, 4), 4, 2),
        ("4g.40gb", _P.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 40448, 64, (0,), 4, 1),
        ("7g.80gb", _P.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 81152, 132, (0,), 8, 1),
    )
)

PRODUCTS: Mapping[str, Product] = {
    p.name: p
    for p in (
        Product("NVIDIA A100-SXM4-40GB", 40960, (8, 0), _P.NVML_DEVICE_ARCH_AMPERE, 108, 12,
                A100_40GB_MIG),
        Product("NVIDIA H100 80GB HBM3", 81559, (9, 0), _P.NVML_DEVICE_ARCH_HOPPER, 132, 18,
                H100_80GB_MIG),
        Product("Tesla V100-SXM2-16GB", 16160, (7, 0), _P.NVML_DEVICE_ARCH_VOLTA, 80, 6),
        Product("Tesla T4", 15360, (7, 5), _P.NVML_DEVICE_ARCH_TURING, 40, 0),
    )
}

MEMORY_SLICES = 8  # MIG placements are counted in eighths of the GPU's memory
COMPUTE_SLICES = 7
