"""`python -m sharepack.agent.gpucheck` and `scripts/gpu-check`: the prepared check of the real-driver path.

Without a GPU, the report is checked on a simulated machine through the same adapter, and the
script's refusal without a driver is checked for real.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sharepack.agent import gpucheck, nvml
from tests.nvml.driver import driver_present

REPO = Path(__file__).resolve().parents[2]


def test_the_report_lists_gpus_mig_devices_pairs_resources_and_the_xid_watch() -> None:
    lib = nvml.load_library("dgx-a100-mig")
    try:
        inventory = nvml.read_inventory(lib)
        lines = gpucheck.check(lib)
    finally:
        nvml.shutdown(lib)
    assert lines[0] == f"driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version}, 8 GPUs"
    assert [line.split()[:3] for line in lines if line.startswith("GPU ")] == [
        ["GPU", str(g.index), g.uuid] for g in inventory.gpus
    ]
    migs = [m.uuid for g in inventory.gpus for m in g.mig_devices]
    assert migs and [line.split()[2] for line in lines if line.startswith("  MIG ")] == migs
    assert sum(line.startswith("pair ") for line in lines) == len(inventory.pair_scores)
    assert "resource nvidia.com/gpu: 8 devices" in lines  # the default config: mig-strategy none
    assert lines[-1] == "xid events: watching 8 GPUs, none within 100 ms"


@pytest.mark.skipif(driver_present(), reason="an NVIDIA driver is present")
def test_the_script_refuses_a_machine_without_a_driver_and_says_so() -> None:
    result = subprocess.run(
        [str(REPO / "scripts" / "gpu-check")], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("gpu-check: no NVIDIA driver to check: cannot initialise"), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
