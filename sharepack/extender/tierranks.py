"""The tier filter's ranking kept per GPU shape, so that choosing the best node costs a few heap
steps per request instead of a look at every node.

The tier filter (`ClusterView.filter_nodes`, `scoring.best_tier`) passes only the `width` best
survivors by the node policy's fine rank, ties by `scoring.tie_key`. Ranking every node per
request is ~1,000 dictionary lookups and a heap at 1,000 nodes, and a request shape seen for
the first time (the trace's CPU and memory requests vary, so most pods bring one) scores every
node besides. What a node's verdict depends on (`scoring.NodeScorer.verdict`) is its state, the
request's GPU shape and the typical shapes its CPU and memory admit before and after the pod:

* Feasibility, its reason and unresolvability come from the GPUs alone: the same for every
  request of one GPU shape, whatever its CPU and memory.
* The rank can only fall as the pod's CPU and memory grow: fewer typical shapes admitted after
  the pod means more of the node's free GPU share counts as fragment (`fragmentation.weighted`
  is antitone in the admitted mask, so `fragaware`'s gradient, and the best of its directed
  choices, fall), or more GPUs stranded (`packed`: `stranding.stranded_gpus` >= 0, 0 when
  nothing is lost). So the rank of the GPU shape with no CPU and memory, the *bound request*,
  bounds the rank of every request of that GPU shape from above, node by node.

`BoundRanks` keeps, per GPU shape, the failing nodes (with their verdicts) and a lazy heap of
the feasible known nodes by (-bound rank, tie key). A node change patches its entries (the old
heap entry goes stale and is skipped when it surfaces; the heap is rebuilt when stale entries
outnumber live ones). A request walks the heap from the top, scores exactly only the request's
candidates it meets (memoised per node state, `WireScorer.filter_verdict`), and stops when the
next bound is worse than the `width`-th best exact key found: no node below can beat it. The
answer is the node-by-node ranking's, exactly (`tests/extender/test_tierranks.py` holds the two
to each other through random clusters and changes).

Only where the bound is proven: the caller leaves the DRA mode's whole-and-shared view
(`whole_of`) to the node-by-node loop, whose directed choice is made on a different view than
its rank.
"""

from __future__ import annotations

import heapq
import math
from bisect import insort
from collections.abc import Callable, Collection

from sharepack.common import scoring
from sharepack.common.podrequests import PodRequest
from sharepack.common.scoring import NodeScore

# Stale heap entries tolerated beyond the live ones before the heap is rebuilt.
SLACK = 64

Entry = tuple[float, bytes, str]  # (-rank, tie key, node): heap order is the tier's order


class BoundRanks:
    """One GPU shape's failing nodes and its feasible known nodes ranked by the bound request."""

    __slots__ = ("bound", "failing", "bounds", "odd", "dirty", "_heap")

    def __init__(self, bound: PodRequest) -> None:
        self.bound = bound  # the GPU shape with no CPU and memory: its verdicts are kept here
        self.failing: dict[str, NodeScore] = {}  # node -> its infeasible verdict
        self.bounds: dict[str, float] = {}  # feasible known node -> -(its bound rank)
        # Feasible nodes whose bound rank is not a finite number: the heap cannot order them as
        # `best_tier` does (NaN), or they tie with unknown nodes (infinite); the caller then
        # ranks node by node.
        self.odd: set[str] = set()
        # Nodes changed since this shape was last asked for: re-scored (`put` or `drop`) before
        # the next answer, so a node that changes many times between two requests, or while
        # its shape is not asked for, is scored once.
        self.dirty: set[str] = set()
        self._heap: list[Entry] = []

    def put(self, name: str, verdict: NodeScore) -> None:
        """The node's verdict for the bound request."""
        if not verdict.feasible:
            self.failing[name] = verdict
            self.bounds.pop(name, None)
            self.odd.discard(name)
            return
        self.failing.pop(name, None)
        if not math.isfinite(verdict.rank):
            self.odd.add(name)
            self.bounds.pop(name, None)
            return
        self.odd.discard(name)
        neg = -verdict.rank
        if self.bounds.get(name) != neg:
            self.bounds[name] = neg
            heapq.heappush(self._heap, (neg, scoring.tie_key(name), name))
            if len(self._heap) > 2 * len(self.bounds) + SLACK:
                self._compact()

    def drop(self, name: str) -> None:
        """The node is unknown or stale from now on: it passes, ranked below every known one."""
        self.failing.pop(name, None)
        self.bounds.pop(name, None)
        self.odd.discard(name)
        self.dirty.discard(name)

    def heapify(self) -> None:
        """Order what `put` gathered (call after a bulk of puts: cheaper than a push each)."""
        heapq.heapify(self._heap)

    def _compact(self) -> None:
        self._heap = [(neg, scoring.tie_key(name), name) for name, neg in self.bounds.items()]
        heapq.heapify(self._heap)

    def best(
        self, candidates: Collection[str], width: int, exact: Callable[[str], float]
    ) -> list[Entry] | None:
        """The `width` best of `candidates` among the feasible known nodes, by (-exact rank,
        tie key), best first (fewer when fewer are candidates). `exact(node)`: the request's
        own rank on a node, at most the node's bound. None when an exact rank is not a finite
        number or beats its bound (the caller then ranks node by node: never a wrong answer)."""
        heap = self._heap
        bounds = self.bounds
        found: list[Entry] = []
        popped: list[Entry] = []
        seen: set[str] = set()
        try:
            while heap:
                entry = heap[0]
                neg, tie, name = entry
                if bounds.get(name) != neg or name in seen:
                    heapq.heappop(heap)  # stale (the node changed since) or a repeat: gone for good
                    continue
                if len(found) >= width and (neg, tie) > found[width - 1][:2]:
                    break  # every node below ranks at most its bound: none beats what we have
                heapq.heappop(heap)
                popped.append(entry)
                seen.add(name)
                if name in candidates:
                    rank = exact(name)
                    if not math.isfinite(rank) or -rank < neg:
                        return None
                    insort(found, (-rank, tie, name))
        finally:
            for entry in popped:
                heapq.heappush(heap, entry)
        return found[:width]
