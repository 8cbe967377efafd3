"""The extender's per-node bookkeeping as one pure model: what each node's GPUs hold, as far as
the extender can tell ahead of the node's agent.

A node's *effective* state is its published `NodeGpuState` minus the pods *released* on it plus
the pods *assumed* on it:

* assumed: bound (by our /bind, or seen bound by the pod watch) but not yet listed by the node's
  published state; counted with a placement (our prediction, or the GPUs the pod's directions
  name) until the state lists the pod (it *settles*: predicted and reported GPUs are compared)
  or its `expires` passes;
* released: gone (deleted, Succeeded/Failed) while the published state still lists it; its
  devices count as free until the state drops it or its `expires` passes;
* settled: counted by its agent, or expired: never assumed again while the pod lives; `placed`
  keeps the exact placement of those whose prediction matched, so a later release frees
  exactly what they held.

`Ledger` is fed by `extender.caches.ClusterView` (the watches and the verbs) and answers with
what changed: the nodes whose effective state must be re-scored, and the outcomes (settled
predictions, expiries) for the view to count and log. It does no I/O, reads no clock (times are
passed in, monotonic seconds) and logs nothing, so a bind reads in one direction: decode ->
ledger -> effective state -> scorer.

Where later inputs go: a per-node input that changes the effective state (CPU and memory from a
Node watch, for instance) is one more per-node map here, read by `effective`; a per-pod record
(a prediction log) is one more outcome returned by `settle`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sharepack.common import scoring, statebuilding
from sharepack.common.podrequests import PodRequest
from sharepack.common.scoring import Placement
from sharepack.common.state import NodeState


_Pods = tuple[tuple[str, Placement], ...]  # (pod UID, placement), as `effective` applies them


@dataclass(slots=True)
class Assumed:
    uid: str
    node: str
    placement: Placement
    expires: float  # monotonic


@dataclass(slots=True)
class Released:
    placement: Placement  # the devices the gone pod held, freed in the effective state
    expires: float  # monotonic


@dataclass(frozen=True, slots=True)
class Settled:
    """An assumed pod its agent now reports: what we predicted against what it holds."""

    uid: str
    node: str
    predicted: Mapping[str, frozenset[str]]
    reported: Mapping[str, frozenset[str]]

    @property
    def match(self) -> bool:
        return all(self.reported.get(r, frozenset()) == keys for r, keys in self.predicted.items())


@dataclass(frozen=True, slots=True)
class Published:
    """What a new published state did: `changed` is False for a heartbeat (same content, no pod
    settled or released: the effective state is as it was)."""

    changed: bool
    settled: tuple[Settled, ...]


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What forgetting a gone pod did: `node` is where it was counted (None: nowhere);
    `changed`: that node's effective state changed; `untold`: its node still lists it, but the
    published counts do not say how many devices it held, so they count until its agent
    republishes."""

    uid: str
    node: str | None
    changed: bool = False
    untold: bool = False


@dataclass(frozen=True, slots=True)
class Expired:
    assumed: tuple[Assumed, ...]  # no longer counted: their agent never reported them
    released: tuple[tuple[str, str], ...]  # (node, pod UID) still listed after the TTL: counted again
    nodes: frozenset[str]  # whose effective state changed


class Ledger:
    """Published states, assumed, released and settled pods of every node (see the module)."""

    def __init__(self) -> None:
        self.published: dict[str, tuple[str, NodeState]] = {}  # node -> (resourceVersion, state)
        self.assumed: dict[str, Assumed] = {}  # pod UID -> its assumption
        self.assumed_on: dict[str, dict[str, None]] = {}  # node -> assumed pod UIDs, in the order assumed
        self.released: dict[str, dict[str, Released]] = {}  # node -> gone pods still published
        self.settled: set[str] = set()  # counted by the agent, or expired: never assumed again
        self.placed: dict[str, Placement] = {}  # settled pods whose prediction matched: exact
        self.pods: dict[str, str] = {}  # bound pod UID -> node
        self._publishers: dict[str, int] = {}  # resource -> how many nodes publish it
        self._known: frozenset[str] | None = None  # resources some node publishes (lazy)
        # node -> the inputs of its last effective state, and that state (`effective`)
        self._effective: dict[str, tuple[tuple[str, NodeState], _Pods, _Pods, NodeState]] = {}

    # -- derived ---------------------------------------------------------------------------

    @property
    def known_resources(self) -> frozenset[str]:
        if self._known is None:
            self._known = frozenset(self._publishers)
        return self._known

    def effective(self, node: str) -> NodeState | None:
        """The node's published state minus its released pods plus its assumed ones; None
        without a published state.

        From the last one computed where only assumptions were added since (in the order they
        were: each bind adds one, and a node may hold dozens before its agent reports them),
        else from the published state."""
        entry = self.published.get(node)
        if entry is None:
            self._effective.pop(node, None)
            return None
        released = tuple((uid, r.placement) for uid, r in self.released.get(node, {}).items())
        assumed = tuple((uid, self.assumed[uid].placement) for uid in self.assumed_on.get(node, ()))
        last = self._effective.get(node)
        if last is not None and last[0] is entry and last[1] == released and assumed[: len(last[2])] == last[2]:
            state, done = last[3], len(last[2])
        else:
            state, done = entry[1], 0
            for uid, placement in released:
                state = scoring.release_placement(state, uid, placement)
        for uid, placement in assumed[done:]:
            state = scoring.apply_placement(state, uid, placement)
        self._effective[node] = (entry, released, assumed, state)
        return state

    def listed(self, node: str, uid: str) -> bool:
        """The node's published state lists the pod (its agent counts it)."""
        entry = self.published.get(node)
        return entry is not None and bool(scoring.placed_gpus(entry[1], uid))

    # -- published states ------------------------------------------------------------------

    def publish(self, node: str, rv: str, state: NodeState) -> Published:
        """A new published state: settle the assumed pods it lists, end the releases it no
        longer lists."""
        old = self.published.get(node)
        self._set_published(node, (rv, state))
        changed = self._catch_up_releases(node, state)
        settled = []
        for uid in list(self.assumed_on.get(node, ())):
            reported = scoring.placed_gpus(state, uid)
            if reported:
                s = self._settle(uid, reported)
                if s is not None:
                    settled.append(s)
                changed = True
        if not changed and (old is None or not statebuilding.same_content(old[1], state)):
            changed = True
        return Published(changed, tuple(settled))

    def unpublish(self, node: str, *, releases: bool = True) -> None:
        """The node has no usable published state any more; `releases`: also forget its
        released pods (False keeps them for when a readable state comes back)."""
        self._set_published(node, None)
        if releases:
            self.released.pop(node, None)

    def _set_published(self, node: str, entry: tuple[str, NodeState] | None) -> None:
        counts = self._publishers
        old = self.published.pop(node, None)
        if old is not None:
            for r in {r.name for r in old[1].resources}:
                left = counts[r] - 1
                if left:
                    counts[r] = left
                else:
                    del counts[r]
                    self._known = None
        if entry is not None:
            self.published[node] = entry
            for r in {r.name for r in entry[1].resources}:
                if r not in counts:
                    self._known = None
                counts[r] = counts.get(r, 0) + 1

    def _catch_up_releases(self, node: str, state: NodeState) -> bool:
        """Forget released pods the node's published state no longer lists; True if any."""
        released = self.released.get(node)
        if not released:
            return False
        done = [uid for uid in released if not scoring.placed_gpus(state, uid)]
        for uid in done:
            del released[uid]
        if not released:
            del self.released[node]
        return bool(done)

    def _settle(self, uid: str, reported: Mapping[str, frozenset[str]]) -> Settled | None:
        a = self._unassume(uid)
        self.settled.add(uid)
        if a is None or not a.placement:
            return None
        s = Settled(uid, a.node, scoring.placement_gpus(a.placement), reported)
        if s.match:
            self.placed[uid] = a.placement  # exact: how many devices on each GPU, for release
        return s

    # -- pods ------------------------------------------------------------------------------

    def bound(self, uid: str, node: str) -> None:
        self.pods[uid] = node

    def counted(self, uid: str, node: str) -> bool:
        """The pod counts already: assumed, settled, or listed by `node`'s published state (then
        it is settled from now on: its agent was faster than us)."""
        if uid in self.assumed or uid in self.settled:
            return True
        if self.listed(node, uid):
            self.settled.add(uid)
            return True
        return False

    def assume(self, uid: str, node: str, placement: Placement, expires: float) -> None:
        self.assumed[uid] = Assumed(uid, node, placement, expires)
        self.assumed_on.setdefault(node, {})[uid] = None

    def unassume(self, uid: str, node: str) -> bool:
        """Stop counting an assumed pod on `node`, and only there; True if it was."""
        a = self.assumed.get(uid)
        if a is None or a.node != node:
            return False
        self._unassume(uid)
        return True

    def _unassume(self, uid: str) -> Assumed | None:
        a = self.assumed.pop(uid, None)
        if a is not None:
            on = self.assumed_on.get(a.node)
            if on is not None:
                on.pop(uid, None)
                if not on:
                    del self.assumed_on[a.node]
        return a

    def forget(
        self, uid: str, request: PodRequest | None, expires: float, directed: Placement | None = None
    ) -> Forgotten:
        """The pod is gone (deleted, or Succeeded/Failed): stop counting it, and free what its
        node's published state still counts for it (`request`, when known, tells how many
        devices it held on a GPU it shared) until `expires`. `directed`: the placement the pod's
        directions name, which tells the counts when the published state lists the pod on
        exactly those GPUs (a pod split over shared GPUs, placed before this replica started)."""
        node = self.pods.pop(uid, None)
        self.settled.discard(uid)
        placed = self.placed.pop(uid, None)
        a = self._unassume(uid)
        node = node or (a.node if a is not None else None)
        if node is None:
            return Forgotten(uid, None)
        entry = self.published.get(node)
        released = False
        untold = False
        if entry is not None and scoring.placed_gpus(entry[1], uid):
            placement = placed or scoring.held_placement(entry[1], uid, request)
            if not placement and directed and scoring.placement_gpus(directed) == scoring.placed_gpus(entry[1], uid):
                placement = directed
            if placement:
                self.released.setdefault(node, {})[uid] = Released(placement, expires)
                released = True
            else:
                untold = True
        return Forgotten(uid, node, a is not None or released, untold)

    def keep_only(self, present: Iterable[str], expires: float) -> list[Forgotten]:
        """After a relist of pods: bound pods missing from it were deleted while we were not
        watching (released). Assumed pods stay (a /bind can be newer than the list; their TTL
        bounds them)."""
        present = set(present)
        out = []
        for uid in [u for u in self.pods if u not in present]:
            if uid in self.assumed:
                self.pods.pop(uid, None)
            else:
                out.append(self.forget(uid, None, expires))
        self.settled &= present | set(self.assumed)
        self.placed = {u: p for u, p in self.placed.items() if u in present}
        return out

    def expire(self, now: float) -> Expired:
        """Stop counting assumed pods older than their TTL, and end releases their agent never
        caught up with."""
        late = tuple(a for a in self.assumed.values() if a.expires <= now)
        for a in late:
            self._unassume(a.uid)
            self.settled.add(a.uid)
        nodes = {a.node for a in late}
        ended = []
        for node, released in list(self.released.items()):
            gone = [uid for uid, r in released.items() if r.expires <= now]
            for uid in gone:
                del released[uid]
                ended.append((node, uid))
            if gone:
                nodes.add(node)
            if not released:
                del self.released[node]
        return Expired(late, tuple(ended), frozenset(nodes))
