"""Text bars of published GPU states, one cell per device slot (a time-sliced replica, a MIG
instance, a whole GPU): held, unhealthy or free. `sharepack-demo` and `sharepack status` draw
the same bars from the same `NodeState`s."""

from __future__ import annotations

from collections.abc import Sequence

from sharepack.common.state import GpuState, ResourceState

HELD = "\u2588"
FREE = "\u2591"
UNHEALTHY = "x"


def bar(allocated: int, total: int, unhealthy: int = 0) -> str:
    """`████░░ 4/6`; unhealthy slots that are not held show as `x` after the held ones."""
    allocated = min(max(allocated, 0), total)
    unhealthy = min(max(unhealthy, 0), total - allocated)
    free = total - allocated - unhealthy
    return HELD * allocated + UNHEALTHY * unhealthy + FREE * free + f" {allocated}/{total}"


def gpu_cells(gpus: Sequence[GpuState]) -> str:
    """Every GPU of a resource, in index order: `GPU0 ████ 4/4   GPU1 ░░░░ 0/4`."""
    ordered = sorted(gpus, key=lambda g: (len(g.index), g.index))
    return "   ".join(f"GPU{g.index} {bar(g.allocated, g.total, g.unhealthy)}" for g in ordered)


def node_line(name: str, resource: ResourceState | None, *, width: int = 8) -> str:
    """One node's line for one resource: its name padded to `width`, then its GPUs."""
    cells = gpu_cells(resource.gpus) if resource is not None else ""
    return f"{name:<{width}} {cells}".rstrip()
