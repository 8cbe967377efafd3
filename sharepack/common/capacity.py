"""What a node's published state leaves free, counted per physical GPU across its resources.

One definition for everyone who reports it (the `kubectl get nodegpustates` summary, the
extender's gauges, the dashboard): a physical GPU is *whole-free* when no device of it, in any
resource, is held or unhealthy; its devices that are still free while others of the same GPU
are held (or unhealthy) are *stranded*: they can serve shares, never a whole-GPU request.
"""

from __future__ import annotations

from dataclasses import dataclass

from sharepack.common.state import NodeState


@dataclass(frozen=True, slots=True)
class Capacity:
    gpus: int  # physical GPUs the node publishes
    whole_gpus_free: int
    stranded: int  # free devices (replicas, MIG instances) on GPUs that are partly taken
    used: int  # devices held by pods, all resources
    total: int  # devices served, all resources


def capacity(state: NodeState) -> Capacity:
    busy: set[str] = set()
    free_on: dict[str, int] = {}
    used = total = 0
    for res in state.resources:
        for g in res.gpus:
            free_on[g.key] = free_on.get(g.key, 0) + g.free
            used += g.allocated
            total += g.total
            if g.allocated or g.unhealthy:
                busy.add(g.key)
    return Capacity(
        gpus=len(free_on),
        whole_gpus_free=len(free_on.keys() - busy),
        stranded=sum(free_on[k] for k in busy),
        used=used,
        total=total,
    )
