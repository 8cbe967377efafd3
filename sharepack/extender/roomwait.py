"""At bind, give the view a moment to catch up before judging a node full.

kube-scheduler binds pods asynchronously and counts a deleted pod as gone the moment its watch
delivers the deletion; ours may deliver it, or the agent's next NodeGpuState may free its
devices, a few tens of milliseconds later. A bind that arrives in that gap finds the node full
in our view although kube-scheduler, rightly, found room. Refused (the guard) or bound without
directions (the directing binder), the pod then lands where the agent's own policy puts it,
often on a GPU the extender directed the next pod to, which then misses its directions too: the
chaos soak's misses on the real control plane came in such cascades (one view 60 ms behind, five
pods off their predicted GPUs).

So where the node fails the filter for capacity, the bind waits up to `CATCH_UP_S` for a change
of the view to make room, polling the view (no I/O: it is a dict lookup and a cached verdict).
A node truly full still fails, CATCH_UP_S later; kube-scheduler gives a bind `httpTimeout` (2 s
as shipped), so the wait stays well inside it. 1 s covers an agent's republish (PodResources
polled every 0.25 s, at most one write per 0.5 s) and the watch behind it; 0.3 s, as first
shipped, did not in bursts after a fault (the 10-minute soak's misses). kube-scheduler binds in a
goroutine of its own, so the wait delays that pod only, never the scheduling of the next. A node whose verdict can never change
(`unresolvable`) fails at once.
"""

from __future__ import annotations

import asyncio

from sharepack.common.podrequests import PodRequest
from sharepack.extender.caches import ClusterView

CATCH_UP_S = 1.0
POLL_S = 0.01


async def wait_for_room(view: ClusterView, node: str, request: PodRequest, wait_s: float = CATCH_UP_S) -> str | None:
    """None once `node` passes the filter for `request`; else why it does not, after `wait_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        survivors, failed, unresolvable = view.filter_nodes((node,), request)
        if survivors:
            return None
        if node in unresolvable or loop.time() >= deadline:
            return failed.get(node) or unresolvable.get(node, "")
        await asyncio.sleep(POLL_S)
