"""Which /bind requests the extender honours: only bindings of GPU pods it has just scored, to a
node where its filter passes them now.

The extender holds cluster-wide `pods/binding`, and a Binding skips every check the scheduler
made (NoSchedule taints, node selectors: the kubelet re-checks neither). kube-scheduler sends
/bind only for a pod it has just run through this extender's filter or prioritize, with a node
that passed them; so that is all the guard lets through. The pod is read from the API, never
taken from the request; and since a /filter or /prioritize body is the caller's word too (one
forged /filter naming a victim's UID and a node would otherwise vouch for that bind), the filter
runs again at bind, for the chosen node, on the pod the API returned. Rules, in the order
checked; the first that fails names the refusal:

1. `incomplete-request`: PodName, PodNamespace, PodUID and Node are all given.
2. `pod-unreadable`: the pod can be read from the API (from the extender's pod watch where it
   holds the pod with that UID, `extender.pendingpods`, which says why that is the API's word).
3. `pod-gone`: the pod read has the UID asked for and is not being deleted.
4. `scheduler-not-served`: its `spec.schedulerName` is one this extender serves.
5. `already-bound`: it has no `spec.nodeName` yet.
6. `no-gpu-request`: it requests a resource some agent publishes. The extender ranks every
   pod (as shipped, the CPU-aware `packed` places CPU-only pods too) but binds only GPU pods:
   the shipped configuration names it twice, a ranking entry with no `managedResources` and a
   bind-only entry whose `managedResources` are the GPU resources, so kube-scheduler binds
   every other pod itself and never sends it here. A /bind for one is forged (security issue
   24.2: a forged /filter must not let a holder of the scheduler's client certificate bind a
   CPU-only pod to a node the scheduler's own filters would reject).
7. `not-scored`: this extender filtered or prioritized that UID in the last `ttl_s` seconds.
8. `node-not-feasible`: the node was among those that filter kept (after a prioritize alone:
   among the nodes offered), and the filter passes the pod's real request on it now.

Each record serves one bind: whatever the outcome, a second /bind needs a new scheduling cycle.

Several replicas behind one Service (`UnscoredBinds.RECHECK`): a bind that reaches a replica
which did not score the pod is re-checked against that replica's own caches instead of rule 7:
the node must have a fresh published state on which the filter passes the pod. The scheduler's
own filters (taints, selectors, affinity) cannot be re-checked here; see docs/security.md.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sharepack.common import podrequests
from sharepack.common.errors import RequestError
from sharepack.common.podrequests import PodRequest
from sharepack.extender.binding import BindError
from sharepack.extender.caches import ClusterView
from sharepack.extender.pendingpods import PendingPods
from sharepack.extender.protocol import BindingArgs
from sharepack.extender.roomwait import wait_for_room

log = logging.getLogger(__name__)

# kube-scheduler binds asynchronously, after Permit and PreBind; volume binding alone may wait up
# to its default bindTimeoutSeconds (600 s) in between.
DEFAULT_SCORED_TTL_S = 660.0
# Records live from a filter to its bind; only pods that never get bound linger until the TTL.
SCORED_CAPACITY = 1024

# (namespace, name) -> the Pod's JSON from the API; raises BindError when it cannot.
PodReader = Callable[[str, str], Awaitable[Any]]


class Rule(StrEnum):
    INCOMPLETE = "incomplete-request"
    POD_UNREADABLE = "pod-unreadable"
    POD_GONE = "pod-gone"
    SCHEDULER = "scheduler-not-served"
    ALREADY_BOUND = "already-bound"
    NO_GPU = "no-gpu-request"
    NOT_SCORED = "not-scored"
    NODE = "node-not-feasible"


class UnscoredBinds(StrEnum):
    """What a replica does with a bind for a pod it did not score."""

    REFUSE = "refuse"
    RECHECK = "recheck"  # re-run the filter for that pod and node on its own caches


@dataclass(frozen=True, slots=True)
class Refusal:
    rule: Rule
    message: str


@dataclass(frozen=True, slots=True)
class Admitted:
    request: PodRequest  # from the pod as the API has it; what the assumption counts


@dataclass(frozen=True, slots=True)
class _Scored:
    # The request's own node list and survivor indexes, kept by reference: recording costs
    # nothing on the request path, and the one bind that follows searches them once.
    names: Sequence[str]
    survivors: Sequence[int] | None  # None: seen by prioritize only, feasibility not computed
    expires: float  # monotonic

    def offered(self, node: str) -> bool:
        names = self.names
        if self.survivors is None:
            return node in names
        return any(names[i] == node for i in self.survivors)


class BindGuard:
    def __init__(
        self,
        view: ClusterView,
        *,
        scheduler_names: Collection[str] = (podrequests.DEFAULT_SCHEDULER_NAME,),
        unscored: UnscoredBinds = UnscoredBinds.REFUSE,
        ttl_s: float = DEFAULT_SCORED_TTL_S,
        capacity: int = SCORED_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
        managed: podrequests.Managed | None = None,
        pending: PendingPods | None = None,
    ) -> None:
        self.view = view
        self.pending = pending
        self.scheduler_names = frozenset(scheduler_names)
        self.unscored = unscored
        self.ttl_s = ttl_s
        self.capacity = capacity
        self.clock = clock
        self.managed = managed
        self._scored: OrderedDict[str, _Scored] = OrderedDict()  # pod UID -> oldest first

    # -- recording (filter and prioritize) -------------------------------------------------

    def filtered(self, uid: str, names: Sequence[str], survivors: Sequence[int]) -> None:
        if not uid:
            return
        if not survivors:
            self._scored.pop(uid, None)  # nothing to bind to
            return
        self._put(uid, _Scored(names, survivors, self.clock() + self.ttl_s))

    def prioritized(self, uid: str, names: Sequence[str]) -> None:
        if not uid or not names:
            return
        now = self.clock()
        known = self._scored.get(uid)
        if known is not None and known.survivors is not None and known.expires > now:
            # Filtered here first (kube-scheduler's order): the filter's verdict stands.
            self._put(uid, _Scored(known.names, known.survivors, now + self.ttl_s))
        else:
            self._put(uid, _Scored(names, None, now + self.ttl_s))

    def _put(self, uid: str, record: _Scored) -> None:
        scored = self._scored
        scored[uid] = record
        scored.move_to_end(uid)
        now = self.clock()
        while scored:
            oldest = next(iter(scored.values()))
            if len(scored) <= self.capacity and oldest.expires > now:
                break
            scored.popitem(last=False)

    @property
    def recorded(self) -> int:
        """Scorings waiting for their bind (a property, not __len__: an empty guard is no
        less a guard)."""
        return len(self._scored)

    # -- the bind check ----------------------------------------------------------------------

    async def admit(self, args: BindingArgs, read_pod: PodReader) -> Admitted | Refusal:
        given = (("PodName", args.pod_name), ("PodNamespace", args.pod_namespace),
                 ("PodUID", args.pod_uid), ("Node", args.node))  # fmt: skip
        missing = [label for label, value in given if not value]
        if missing:
            return Refusal(Rule.INCOMPLETE, f"{', '.join(missing)} missing, got {args.pod_namespace!r}/"
                                            f"{args.pod_name!r} (UID {args.pod_uid!r}) -> {args.node!r}")  # fmt: skip
        # One bind per scoring: the record goes whatever the outcome below.
        record = self._scored.pop(args.pod_uid, None)
        if record is not None and record.expires <= self.clock():
            record = None
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        try:
            doc = self.pending.get(args.pod_namespace, args.pod_name, args.pod_uid) if self.pending is not None else None
            if doc is None:
                doc = await read_pod(args.pod_namespace, args.pod_name)
            pod = podrequests.decode_pod(doc, self.managed)
        except BindError as e:  # the reader's message names the pod and the API's answer
            return Refusal(Rule.POD_UNREADABLE, str(e))
        except RequestError as e:
            return Refusal(Rule.POD_UNREADABLE, f"{where}: {e}")
        if pod.uid != args.pod_uid:
            return Refusal(Rule.POD_GONE, f"{where} has UID {pod.uid}, not {args.pod_uid}: it was "
                                          "deleted and created again")  # fmt: skip
        if pod.deleting:
            return Refusal(Rule.POD_GONE, f"{where} is being deleted")
        if pod.scheduler_name not in self.scheduler_names:
            return Refusal(Rule.SCHEDULER, f"{where} names schedulerName {pod.scheduler_name!r}; this "
                                           f"extender serves {sorted(self.scheduler_names)}")  # fmt: skip
        if pod.node_name:
            return Refusal(Rule.ALREADY_BOUND, f"{where} is already bound to node {pod.node_name}")
        request = self.view.relevant(podrequests.pod_request(pod, self.managed))
        if request.empty:
            return Refusal(Rule.NO_GPU, f"{where} requests no resource an agent publishes: it is not this "
                                        "extender's to bind")  # fmt: skip
        if record is not None:
            return await self._check_scored(record, request, args.node, where)
        if self.unscored is UnscoredBinds.RECHECK:
            return await self._recheck(request, args.node, where)
        return Refusal(Rule.NOT_SCORED, f"this extender did not filter or prioritize {where} (UID "
                                        f"{args.pod_uid}) in the last {self.ttl_s:.0f} s")  # fmt: skip

    async def _check_scored(self, record: _Scored, request: PodRequest, node: str, where: str) -> Admitted | Refusal:
        if not record.offered(node):
            found = "found feasible" if record.survivors is not None else "was offered"
            return Refusal(Rule.NODE, f"node {node} is not among the nodes this extender {found} for {where}")
        # The recorded verdict was for the pod the /filter body described; judge the real one.
        return await self._filter_passes(request, node, where)

    async def _recheck(self, request: PodRequest, node: str, where: str) -> Admitted | Refusal:
        if self.view.fresh_scorer(node) is None:
            return Refusal(Rule.NODE, f"node {node} has no fresh published state here: {where} cannot "
                                      "be re-checked on it")  # fmt: skip
        return await self._filter_passes(request, node, where)

    async def _filter_passes(self, request: PodRequest, node: str, where: str) -> Admitted | Refusal:
        why = await wait_for_room(self.view, node, request)  # our view may trail kube-scheduler's
        if why is not None:
            return Refusal(Rule.NODE, f"node {node} does not pass the filter for {where}: {why}")
        return Admitted(request)
