"""`python -m sharepack.agent.gpucheck`: the agent's NVML adapter against this machine's real driver.

CI has no GPU, so the real-pynvml path (driver version, device handles, MIG instances, NVLink and
PCIe topology, XID event registration) runs nowhere but on a GPU machine; this is the prepared
one-command check for such a machine (`scripts/gpu-check` runs it, then the suite's real-driver
test). It loads NVML as the agent does, reads the inventory, lists the resources the agent would
advertise with the default config, and waits briefly for XID events.

Read-only: only NVML queries and event registration, never a call that changes a GPU setting
(MIG mode, clocks, persistence, ECC, compute mode).

Exit status: 0 when every step works; 1 when a step fails, with the error; 2 when there is no
NVIDIA driver to check.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from sharepack.agent import nvml
from sharepack.common.config import load_config
from sharepack.common.inventory import Inventory
from sharepack.common.resources import build_resources

XID_WAIT_MS = 100


def inventory_lines(inventory: Inventory) -> list[str]:
    """GPUs, MIG devices and pair scores, one per line (also `python -m sharepack.agent.nvmlsim show`)."""
    index = {g.uuid: g.index for g in inventory.gpus}
    lines: list[str] = []
    for gpu in inventory.gpus:
        lines.append(f"GPU {gpu.index} {gpu.uuid} {gpu.name} {gpu.memory_mib} MiB "
                     f"bus {gpu.pci_bus_id} numa {gpu.numa_node} mig {gpu.mig_enabled}")  # fmt: skip
        for mig in gpu.mig_devices:
            lines.append(f"  MIG {mig.index} {mig.uuid} {mig.profile} gi {mig.gi_id} ci {mig.ci_id} "
                         f"placement {mig.placement_start}:{mig.placement_size} {mig.memory_mib} MiB")  # fmt: skip
    pairs = sorted((*sorted((index[a], index[b])), score) for (a, b), score in inventory.pair_scores.items())
    lines += [f"pair {i}-{j}: {score}" for i, j, score in pairs]
    return lines


def check(lib: nvml.NvmlLibrary) -> list[str]:
    """The report for an initialised library; raises what the adapter raises."""
    inventory = nvml.read_inventory(lib)
    if not inventory.gpus:
        raise nvml.NvmlError("nvml: the driver reports no GPU")
    lines = [f"driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version}, "
             f"{len(inventory.gpus)} GPUs"]  # fmt: skip
    lines += inventory_lines(inventory)
    config = load_config(file_text=None, env={}, flags={})
    for resource in build_resources(inventory, config):
        lines.append(f"resource {resource.name}: {len(resource.devices)} devices")
    with nvml.XidWatcher(lib) as watcher:
        event = watcher.wait(XID_WAIT_MS)
        unwatched = dict(watcher.unwatched)
    lines.append(f"xid events: watching {len(inventory.gpus) - len(unwatched)} GPUs, "
                 f"{'none' if event is None else event} within {XID_WAIT_MS} ms")  # fmt: skip
    lines += [f"  not watched: {uuid}: {why}" for uuid, why in sorted(unwatched.items())]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    if argv:
        print(f"usage: python -m sharepack.agent.gpucheck (no arguments; got {' '.join(argv)})", file=sys.stderr)
        return 2
    try:
        lib = nvml.load_library(None)
    except nvml.NvmlUnavailable as e:
        print(f"gpu-check: no NVIDIA driver to check: {e}", file=sys.stderr)
        return 2
    try:
        print("\n".join(check(lib)))
    except Exception as e:  # noqa: BLE001 - the point is to report whatever the adapter hits
        print(f"gpu-check: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        nvml.shutdown(lib)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
