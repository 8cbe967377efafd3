"""GPUs stranded by CPU and memory: what `packed` subtracts so that it never takes the CPU (or
memory) a node's free GPUs need.

`packed` fills used GPUs first and keeps whole GPUs free, but by GPUs alone: on a node whose
GPUs are partly used it piles pods until the node's CPU runs out, and the node's free GPUs are
then idle for good. The FGD study's measure (`common.fragmentation`) already counts a GPU that a
shape cannot use for lack of CPU or memory as fragment, so the share a pod strands that way is
the node's fragmentation after the pod, under the shapes its CPU and memory admit after the pod,
minus the same GPUs under the shapes they admitted before: only what the pod's CPU and memory
take away, never what its GPUs do (`packed`'s own terms judge those).

In GPUs (the weighted mean over the typical workload, per GPU of share): 0 when the pod's CPU
and memory leave every shape admitted that was, up to the node's free GPU share when the pod
takes the last CPU a GPU shape needed.
"""

from __future__ import annotations

from collections.abc import Sequence

from sharepack.common import fragmentation

# `packed`'s rank is in 0..1 (its three terms); one GPU stranded costs more than all of them
# together, so that a placement that strands nothing always ranks first.
STRAND_WEIGHT = 1.0


def stranded_gpus(
    measure: fragmentation.Fragmentation, free_after: Sequence[int], admitted: tuple[int, int]
) -> float:
    """GPUs (weighted mean over the workload's shapes) idle for lack of the CPU and memory the
    pod takes: the fragment of the node after the pod under the shapes admitted after minus
    under those admitted before. `admitted`: (before, after) masks, `Fragmentation.admitted`."""
    before, after = admitted
    if before == after:
        return 0.0
    lost = measure.weighted(free_after, after) - measure.weighted(free_after, before)
    return max(lost, 0.0) / measure.total_weight / fragmentation.MILLI
