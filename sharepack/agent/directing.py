"""Directed GPUs on the node: answer `GetPreferredAllocation` with the GPUs the extender chose.

The extender writes, at bind, the physical GPUs each container of a pod was counted on into the
pod's `sharepack.io/gpus` annotation (format and device choice: `common.directions`). The
kubelet's request carries no pod identity, only the resource, the available and must-include
device IDs and the size, so the `Director` works out which pod it is for:

* The kubelet admits one pod at a time, container by container, and asks only for pods bound to
  this node. The pod watch the publisher keeps (pods with `spec.nodeName` = this node) holds
  them, annotations included.
* A pod is *pending* while its phase is Pending (or not set yet), it is not being deleted, and
  it still has containers the Director has not been asked for. A pod PodResources already lists
  with devices that the Director never answered for (allocated before an agent restart, say)
  is not pending.
* Per pending pod, the container the request may be for: with directions, the first directed
  container not answered yet for this resource (the kubelet's order), which matches when
  `len(must_include) + len(its GPUs) == size`; without usable directions, any container not
  answered yet that requests exactly `size` of the resource.
* Directions are believed only where they fit the pod (`directions.mismatch`): its own
  containers, each directed to no more devices than it requests. Others (a pod's author naming
  containers it does not have, to answer for other pods' requests) count as no directions.
* Exactly one match: that pod and container. With directions, the answer is `must_include` plus
  available devices on the directed GPUs (`honoured`) when there are enough of them; otherwise,
  and for a pod without usable directions, the node's own policy answers (a fallback, counted
  and logged with its reason). The container counts as answered either way, so the next
  request of the same pod moves on to its next container.
* Several matches (a burst bound several pods with the same request to this node): a pod
  some of whose containers were answered already is the one (the kubelet finishes a pod before
  the next); else the one the kubelet learnt of first. The kubelet's pod source hands it each
  pod its watch brings as an addition of its own, so it admits pods bound while it runs in the
  order they were bound (`HandlePodAdditions` sorts by creation time only within one batch,
  which is one pod then). The agent's watch brings the same bindings in the same order (one API
  server, ordered by `resourceVersion`), so the pod this Director saw first is taken, and of
  pods first seen together, the one bound first (lowest `resourceVersion`: a pending pod is not
  written between its binding and its admission). Creation time is no guide: a pod created
  earlier whose first attempts failed is bound later, and ordering by it swapped look-alike pods'
  GPUs. Only when that order cannot tell (equal keys) does the node's policy answer
  (`ambiguous`). No match: wait up to `wait_s` for the pod watch to catch up with the kubelet
  (it sees the binding through its own watch), then fall back.

Never an error for the kubelet: a bad annotation, an unknown pod or a missing GPU is a fallback
to the node's policy, which is what the agent did before directions existed.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sharepack.agent.metrics import HONOURED, AgentMetrics
from sharepack.common import devices, directions, podrequests
from sharepack.common.directions import Directions
from sharepack.common.errors import DirectionsError, RequestError
from sharepack.common.resources import Resource

log = logging.getLogger(__name__)

PENDING_PHASES = frozenset({"", "Pending"})
DEFAULT_WAIT_S = 2.0  # a loaded node's pod watch can trail the kubelet by a second
POLL_S = 0.02
HOLDERS_KEPT = 4096


class Fallback(StrEnum):
    """Why the node's own policy answered instead of the directions (a metric label)."""

    NO_DIRECTIONS = "no-directions"  # the pod carries no annotation (directions off, other scheduler)
    MALFORMED = "malformed"  # an annotation this agent cannot read
    OTHER_NODE = "other-node"  # directions computed for another node
    MISMATCHED = "mismatched"  # directions naming containers or devices the pod does not request
    UNAVAILABLE = "unavailable"  # a directed GPU lacks available devices
    AMBIGUOUS = "ambiguous"  # several pending pods match the request
    NO_POD = "no-pod"  # no pending pod on this node matches the request


@dataclass(slots=True)
class DirectedCounters:
    """Honoured and fallen-back directed allocations since the agent started (a metrics port
    reads these: `honoured`, and `fallbacks` per `Fallback` reason)."""

    honoured: int = 0
    fallbacks: dict[Fallback, int] = field(default_factory=lambda: {r: 0 for r in Fallback})

    def fallback(self, reason: Fallback) -> None:
        self.fallbacks[reason] += 1


@dataclass(frozen=True, slots=True)
class _Match:
    uid: str
    pod: str  # namespace/name, for the log
    container: str
    keys: tuple[str, ...] | None  # directed GPUs; None: no usable directions
    why_not: Fallback | None = None  # with keys None
    detail: str = ""
    started: bool = False  # some of the pod's containers were answered already
    order: tuple[int, int] = (0, 0)  # (first seen, resourceVersion): the kubelet's order


@dataclass(frozen=True, slots=True)
class _Pending:
    obj: Mapping[str, Any]
    uid: str
    pod: str  # namespace/name
    answered: set[tuple[str, str]]  # (container, resource) the Director answered for
    order: tuple[int, int]  # (first seen, resourceVersion): the kubelet's order


PodSource = Callable[[], Iterable[Mapping[str, Any]]]
ListedSource = Callable[[], Collection[tuple[str, str]]]


class Director:
    def __init__(self, node_name: str, *, wait_s: float = DEFAULT_WAIT_S, metrics: AgentMetrics | None = None) -> None:
        self.node_name = node_name
        self.wait_s = wait_s
        self.counters = DirectedCounters()
        self._metrics = metrics
        self._pods: PodSource | None = None
        self._listed: ListedSource = frozenset
        self._answered: dict[str, set[tuple[str, str]]] = {}  # pod UID -> (container, resource)
        self._seen: dict[str, int] = {}  # pod UID -> the look at the pods that first showed it
        self._looks = 0
        # device ID -> UID of the pod it was directed to, newest last (for the publisher).
        self._holders: collections.OrderedDict[str, str] = collections.OrderedDict()

    def feed(self, pods: PodSource, listed: ListedSource) -> None:
        """Where the pods bound to this node (raw API objects) and the pods PodResources lists
        with devices ((namespace, name)) come from; until fed, the Director answers nothing."""
        self._pods = pods
        self._listed = listed

    async def choose(
        self, resource: Resource, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str] | None:
        """The devices the directions name for this request, or None: the caller's policy answers."""
        if self._pods is None:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while True:
            matches = self._matches(resource.name, len(must_include), size)
            if matches or loop.time() >= deadline:
                break
            await asyncio.sleep(POLL_S)
        what = f"{resource.name} x{size}"
        if not matches:
            self._fall_back(Fallback.NO_POD, f"no pending pod on node {self.node_name} asks for {what}")
            return None
        m = _first_admitted(matches)
        if m is None:
            named = ", ".join(sorted(f"{m.pod}/{m.container}" for m in matches))
            self._fall_back(Fallback.AMBIGUOUS, f"{what}: several pending pods match ({named})")
            return None
        self._answered.setdefault(m.uid, set()).add((m.container, resource.name))
        where = f"pod {m.pod} container {m.container} ({what})"
        if m.keys is None:
            assert m.why_not is not None
            self._fall_back(m.why_not, f"{where}: {m.detail}")
            return None
        chosen = directions.choose_devices(m.keys, available, must_include, size, resource.group_of())
        if isinstance(chosen, str):
            self._fall_back(Fallback.UNAVAILABLE, f"{where}: {chosen}")
            return None
        self.counters.honoured += 1
        if self._metrics is not None:
            self._metrics.directed.labels(HONOURED).inc()
        for device in chosen:
            self._holders[device] = m.uid
            self._holders.move_to_end(device)
        while len(self._holders) > HOLDERS_KEPT:
            self._holders.popitem(last=False)
        log.info("directed allocation honoured: %s on %s", where, ", ".join(m.keys),
                 extra={"pod": m.pod, "container": m.container, "resource": resource.name})  # fmt: skip
        return chosen

    def holders(self) -> dict[str, str]:
        """Device ID -> UID of the pod the device was last directed to. The publisher names
        that pod on a just-allocated device before PodResources lists it, so the extender does
        not count the pod twice (once assumed, once as an anonymous allocation)."""
        return dict(self._holders)

    def _fall_back(self, reason: Fallback, why: str) -> None:
        self.counters.fallback(reason)
        if self._metrics is not None:
            self._metrics.directed.labels(str(reason)).inc()
        log.info("directed allocation not used (%s): %s; the node's policy chooses", reason, why,
                 extra={"fallback": str(reason)})  # fmt: skip

    def _pending(self) -> list[_Pending]:
        """The pods bound here that the kubelet has still to ask for (see the module)."""
        assert self._pods is not None
        listed = self._listed()
        present: set[str] = set()
        out: list[_Pending] = []
        self._looks += 1
        for obj in self._pods():
            meta = obj.get("metadata") or {}
            uid = str(meta.get("uid") or "")
            present.add(uid)
            seen = self._seen.setdefault(uid, self._looks)
            phase = str((obj.get("status") or {}).get("phase") or "")
            if not uid or phase not in PENDING_PHASES or meta.get("deletionTimestamp"):
                continue
            ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
            answered = self._answered.get(uid)
            if answered is None and (ns, name) in listed:
                continue  # allocated before we could answer for it
            rv = str(meta.get("resourceVersion") or "")
            out.append(_Pending(obj, uid, f"{ns}/{name}", answered or set(), (seen, int(rv) if rv.isdigit() else 0)))
        for gone in self._answered.keys() - present:
            del self._answered[gone]
        for gone in self._seen.keys() - present:
            del self._seen[gone]
        return out

    def _matches(self, resource: str, reused: int, size: int) -> list[_Match]:
        out: list[_Match] = []
        for p in self._pending():
            m = self._match(p.obj, p.uid, p.pod, p.answered, resource, reused, size)
            if m is not None:
                out.append(dataclasses.replace(m, started=bool(p.answered), order=p.order))
        return out

    def spoken_for(self, resource: Resource, available: Sequence[str]) -> set[str]:
        """Available devices the directions of pods still to be admitted here will ask for:
        per directed GPU, as many as they name (any of its devices: the devices are alike).
        When the node's policy answers for a pod without usable directions, it leaves these
        alone where it can, so one undirected pod does not take the GPUs the extender directed
        the next ones to (their predictions would miss in turn)."""
        if self._pods is None:
            return set()
        wanted: collections.Counter[str] = collections.Counter()
        for p in self._pending():
            d = _usable_directions(p.obj, self.node_name)
            for c in d.containers if d is not None else ():
                if (c.name, resource.name) not in p.answered:
                    wanted.update(c.gpus.get(resource.name, ()))
        if not wanted:
            return set()
        group_of = resource.group_of()
        out: set[str] = set()
        for device in sorted(available, key=devices.device_order, reverse=True):
            key = group_of.get(device)
            if key is not None and wanted[key] > 0:
                wanted[key] -= 1
                out.add(device)
        return out

    def _match(
        self, obj: Mapping[str, Any], uid: str, pod: str, answered: set[tuple[str, str]],
        resource: str, reused: int, size: int,
    ) -> _Match | None:  # fmt: skip
        raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(directions.ANNOTATION)
        why_not, detail = Fallback.NO_DIRECTIONS, f"no {directions.ANNOTATION} annotation"
        if isinstance(raw, str):
            try:
                d = directions.decode(raw, where=f"pod {pod}")
            except DirectionsError as e:
                why_not, detail = Fallback.MALFORMED, str(e)
            else:
                wrong = _mismatch(obj, d) if d.node == self.node_name else None
                if d.node == self.node_name and wrong is None:
                    return _directed_match(d, uid, pod, answered, resource, reused, size)
                why_not, detail = Fallback.OTHER_NODE, f"directions are for node {d.node}"
                if wrong is not None:
                    why_not, detail = Fallback.MISMATCHED, f"directions do not fit the pod: {wrong}"
        try:
            request = podrequests.decode_pod_request(obj, (resource,))
        except RequestError:
            return None
        for c in request.containers:  # the kubelet's order
            if c.amount(resource) == size and (c.name, resource) not in answered:
                return _Match(uid, pod, c.name, None, why_not, detail)
        return None


def _usable_directions(obj: Mapping[str, Any], node: str) -> Directions | None:
    """The pod's directions if they are for `node`, decode and fit the pod; else None."""
    try:
        d = directions.of_pod(obj, node)
    except DirectionsError:
        return None
    return d if d is not None and _mismatch(obj, d) is None else None


def _mismatch(obj: Mapping[str, Any], d: Directions) -> str | None:
    """Why directions do not fit the pod's own containers and requests (None: they do)."""
    try:
        request = podrequests.decode_pod_request(obj, {r for c in d.containers for r in c.gpus})
    except RequestError as e:
        return str(e)
    return directions.mismatch(d, request)


def _first_admitted(matches: Sequence[_Match]) -> _Match | None:
    """The match the kubelet is admitting: the only one, the one in progress, or the first in
    the kubelet's order; None when the order cannot tell."""
    if len(matches) == 1:
        return matches[0]
    started = [m for m in matches if m.started]
    if len(started) == 1:
        return started[0]
    ranked = sorted(started or matches, key=lambda m: m.order)
    if ranked[0].order == ranked[1].order:
        return None
    return ranked[0]


def _directed_match(
    d: Directions, uid: str, pod: str, answered: set[tuple[str, str]], resource: str, reused: int, size: int
) -> _Match | None:
    for c in d.containers:
        keys = c.gpus.get(resource)
        if keys and (c.name, resource) not in answered:
            return _Match(uid, pod, c.name, keys) if reused + len(keys) == size else None
    return None
