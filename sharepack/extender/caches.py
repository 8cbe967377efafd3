"""What the extender knows about the cluster, rebuilt from the API on every start.

* `ClusterView` (event loop thread only): the published `NodeGpuState` of every node, the GPU
  pods bound to nodes, and the pods *assumed* on a node: bound (by our /bind, or seen by the
  pod watch) but not yet counted by the node's agent. An assumed pod counts with its predicted
  placement until the node's published pod UIDs include it or `assume_ttl` passes; when the
  agent reports it, predicted and reported physical GPUs are compared
  (`sharepack_extender_predictions_total`). A pod whose `sharepack.io/gpus` annotation directs
  it on its node (written at bind, maybe by another replica: `extender.directing`) counts with
  those GPUs instead of our prediction: its agent allocates there. Symmetrically, a pod that is deleted or reaches
  Succeeded/Failed while its node's published state still lists it is *released*: its devices
  count as free at once (the kubelet frees them about when the DELETED event arrives, before
  the agent republishes), until the published state drops it or `assume_ttl` passes. Per node
  it keeps one `NodeScorer` for the effective state (published - released + assumed), rebuilt
  on every change, so the request path is dictionary lookups. The bookkeeping itself (assumed,
  released, settled pods and the effective state they make) is `extender.ledgers.Ledger`, a
  pure model: every watch event and verb here decodes its input, updates the ledger, and
  re-scores the nodes it says changed, logging and counting the outcomes it returns. With a
  filter tier (as shipped), the filter answers from its GPU shape's kept ranking
  (`extender.tierranks`: the failing nodes and a lazy heap of ranks that bound every CPU and
  memory request of that GPU shape), so a request costs a few heap steps and no Python per
  node, and a new CPU or memory request scores only the nodes the heap walk meets. For the
  few request shapes prioritize saw last (and the filter without a tier), the answers are
  kept per shape (`extender.replies`) and patched as nodes change.
* Freshness: each agent rewrites its state at least every heartbeat (`--state-heartbeat-seconds`)
  even when nothing changed, with a new `observedAt`. A state whose `observedAt` has not
  changed for `max_age_s`, *by this extender's clock*, is *stale* and the node is treated as
  unknown (filter passes it, prioritize scores it 0): its agent may be dead, and its counts may
  be wrong in either direction. The age is counted from when we saw `observedAt` change, never
  from its value: a node whose clock is minutes off would otherwise be always stale (or never).
  The cost: a state first seen at our start counts as fresh for one `max_age_s`, since we cannot
  tell an old write from a skewed clock. `WireScorer.fresh_until` holds that deadline
  (wall-clock seconds); the request path compares that float against one clock read per
  request. `sweep_stale` (called periodically) logs each node once as it goes stale; a write
  that makes it fresh again is logged as it arrives.
* The caches are fed by `kube.reflecting.Reflector`s (list + watch on the event loop, periodic
  resync, relist on 410 Gone, capped exponential backoff): `replace_states` / `replace_pods`
  after each list, `state_handler` / `pod_handler` for each watch event. The request path
  never calls the API.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any


from sharepack.common import directions, draslices, drascoring, fragmentation, gpumodels, podrequests, scoring, statebuilding
from sharepack.common.errors import DirectionsError, RequestError, StateSchemaError
from sharepack.common.podrequests import PodRequest
from sharepack.common.policies import NodePolicy, Policy
from sharepack.common.scoring import NodeScore, NodeScorer, Placement, ScoreTemplates
from sharepack.common.state import NodeState, from_status, observed_epoch
from sharepack.extender import ledgers, predictionlog, protocol
from sharepack.extender.metrics import Metrics, node_gauges, NodeGauges
from sharepack.extender.noderesources import NodeResources
from sharepack.extender.pendingpods import PendingPods
from sharepack.extender.ledgers import Assumed, Ledger
from sharepack.extender.replies import ShapeReplies, filter_failing
from sharepack.extender.tierranks import BoundRanks, Entry

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
RECENT_REQUESTS = 4096
# Request shapes scored ahead on every node change, so the next filter/prioritize of a pod like
# the last few finds that node's score memoised (one simulation is ~20 us; the request path
# has ~1-2 us per node).
PRESCORED_SHAPES = 4
# GPU shapes whose tier ranking is kept (`extender.tierranks`): each re-scores the nodes changed
# since it was last asked for; the default trace has 13 (its pods bring 81 shapes with their CPU
# and memory).
RANKED_GPU_SHAPES = 32
NEVER_STALE = math.inf


class WireScorer(NodeScorer):
    """A `NodeScorer` that also memoises the node's encoded `HostPriority` per request shape,
    so a warm prioritize is a lookup and a bytes join per node.

    `fresh_until`: wall-clock time (POSIX seconds) after which the state is stale and the node
    counts as unknown; `math.inf` when the age check is off."""

    __slots__ = ("name", "fresh_until", "_prefix", "_wire", "verdicts")

    def __init__(
        self,
        name: str,
        state: NodeState,
        node_policy: Policy | NodePolicy,
        version: object,
        templates: ScoreTemplates | None = None,
        room: tuple[int, int] | None = None,  # CPU and memory left (extender.noderesources)
        model: str | None = None,  # the node's GPU model (common.gpumodels)
        workload: fragmentation.TypicalWorkload | None = None,  # `fragaware`'s; default: the templates'
    ) -> None:
        super().__init__(state, node_policy, version, templates=templates, room=room, model=model, workload=workload)
        self.name = name
        self.fresh_until = NEVER_STALE
        self._prefix = protocol.host_prefix(name)
        self._wire: dict[str, bytes] = {}
        # request shape -> verdict, filled by `prescore` and the filter's first look: the
        # filter loop then reads it inline (one dict lookup per node, no method calls). The
        # dict `NodeScorer.verdict` keeps its shared verdicts in: one dict per node, not two.
        self.verdicts: dict[str, NodeScore] = self._verdicts

    def host_priority(self, request: PodRequest) -> bytes:
        """The node's encoded `HostPriority`; empty for a score of 0, which the reply leaves out."""
        hit = self._wire.get(request.shape)
        if hit is None:
            score = (self.verdicts.get(request.shape) or self.filter_verdict(request)).score
            hit = self._wire[request.shape] = protocol.host_priority(self._prefix, score) if score > 0 else b""
        return hit

    def filter_verdict(self, request: PodRequest) -> NodeScore:
        hit = self.verdicts.get(request.shape)
        if hit is None:
            hit = self.verdicts[request.shape] = self.verdict(request)
        return hit


class FirstFitScorer(WireScorer):
    """The DRA mode's scorer of a node: the placement is the scheduler's own first fit over the
    node's devices in the order its slices list them (`common.drascoring`), with the use the
    node's effective state counts (its claims, and pods assumed since), ranked by the node
    policy as in the device-plugin mode. Not shared with alike nodes: two nodes with the same
    counts may list their devices in different orders."""

    __slots__ = ("devices",)

    def __init__(self, base: WireScorer, devices: tuple[draslices.Device, ...], workload: fragmentation.TypicalWorkload | None) -> None:
        super().__init__(base.name, base.state, base.node_policy, base.version, None, base.room, base.model, workload)
        self.devices = devices  # the node's pool in the allocator's order

    def score(self, request: PodRequest) -> NodeScore:
        hit = self._memo.get(request.shape)
        if hit is None:
            node = draslices.counted_node(self.name, self.devices, self.state)
            hit = self._memo[request.shape] = drascoring.score_node(
                node, request, self.node_policy, workload=self.workload, admitted=self.admitted(request), state=self.state
            )
        return hit

    def verdict(self, request: PodRequest) -> NodeScore:
        return self.score(request)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def directed_placement(obj: Any, node: str, request: PodRequest) -> Placement | None:
    """The placement a bound pod's `sharepack.io/gpus` annotation names for `node`: what its
    agent allocates, whichever extender replica wrote it. None without usable directions, and
    for directions that do not fit the pod's `request` (its agent ignores those too)."""
    try:
        d = directions.of_pod(obj, node)
    except DirectionsError as e:
        log.debug("%s", e)
        return None
    if d is None:
        return None
    wrong = directions.mismatch(d, request)
    if wrong is not None:
        log.debug("pod %s/%s: ignoring its directions, they do not fit it: %s",
                  _meta(obj).get("namespace"), _meta(obj).get("name"), wrong)  # fmt: skip
        return None
    return MappingProxyType(directions.placement(d))


class ClusterView:
    def __init__(
        self,
        node_policy: Policy | NodePolicy,
        *,
        metrics: Metrics | None = None,
        assume_ttl: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        managed: podrequests.Managed | None = None,
        max_age_s: float = 0.0,
        wall_clock: Callable[[], float] = time.time,
        workload: fragmentation.TypicalWorkload | None = None,  # `fragaware` only; default built in
        tier_width: int = 0,  # the filter passes only this many best nodes (`scoring.best_tier`); 0: all
        resources: NodeResources | None = None,  # nodes' CPU and memory: the CPU-aware ranks use them
        directed: bool = False,  # predict the placement the extender directs (`score_node(directed=)`)
        whole_of: scoring.WholeOf | None = None,  # GPUs listed whole and shared: rank in replicas (DRA)
    ) -> None:
        self.node_policy = node_policy
        self.directed = directed
        self.resources = resources
        if resources is not None:
            resources.on_change = self.refresh_node
        self.tier_width = tier_width
        self.metrics = metrics or Metrics()
        self.assume_ttl = assume_ttl
        self.clock = clock
        self.managed = managed
        # States older than this are stale (the node counts as unknown); 0: no age check.
        self.max_age_s = max_age_s
        self.wall_clock = wall_clock  # ours only: never compared with an agent's observedAt
        self._fresh_until: dict[str, float] = {}  # node -> when its published state goes stale
        self._heard: dict[str, tuple[str, float]] = {}  # node -> (observedAt, when we saw it change)
        self.stale: set[str] = set()  # nodes last logged as stale
        self.scorers: dict[str, WireScorer] = {}  # nodes with a usable published state
        self.invalid: dict[str, str] = {}  # node -> why its state is unusable (treated unknown)
        self.ledger = Ledger()  # assumed, released, settled pods: the effective states
        self._recent: OrderedDict[str, PodRequest] = OrderedDict()  # from filter/prioritize
        self._shapes: OrderedDict[str, PodRequest] = OrderedDict()  # most recent last
        self._replies: dict[str, ShapeReplies] = {}  # shape -> its kept answers, for `_shapes`
        # GPU shape -> the tier filter's ranking (`extender.tierranks`), most recent last. Not in
        # the DRA mode's view (`whole_of`): there the bound it relies on is not proven.
        self._ranks: OrderedDict[str, BoundRanks] = OrderedDict()
        self._ranked = tier_width > 0 and whole_of is None
        # No node in `_replies` is stale before this (wall clock); past it, `_drop_stale`.
        self.soonest_stale = NEVER_STALE
        self._generation = 0
        self.last_foreign_bind = -math.inf  # `clock` when a GPU pod this view did not count was bound
        self.on_change: Callable[[], None] | None = None  # called after every cache change
        self.templates = ScoreTemplates(node_policy, workload=workload, directed=directed, whole_of=whole_of)
        # The DRA mode (`extender.draview`): a node's devices in the allocator's order, so its
        # scorer predicts the scheduler's first fit over them (`FirstFitScorer`); None: the
        # node agent's loop, as the device-plugin mode.
        self.pool_devices: Callable[[str], tuple[draslices.Device, ...] | None] | None = None
        # Per node gauge rows, computed at the next scrape from the states published since
        # (`_gauges_due`): a node written many times between two scrapes is computed once.
        self._gauges: dict[str, NodeGauges] = {}
        self._gauges_due: dict[str, NodeState] = {}
        self.metrics.node_rows(lambda: tuple(self.gauges.values()))

    # -- NodeGpuState events ---------------------------------------------------------------

    def replace_states(self, objects: list[Any]) -> None:
        names = {str(_meta(o).get("name", "")) for o in objects if isinstance(o, Mapping)}
        for gone in [n for n in (*self.published, *self.invalid) if n not in names]:
            self._drop_state(gone)
        for obj in objects:
            self.upsert_state(obj)

    # The ledger's tables, read by the metrics, /explain and tests.
    @property
    def published(self) -> Mapping[str, tuple[str, NodeState]]:
        return self.ledger.published

    @property
    def assumed(self) -> Mapping[str, Assumed]:
        return self.ledger.assumed

    @property
    def pods(self) -> Mapping[str, str]:
        return self.ledger.pods

    @property
    def known_resources(self) -> frozenset[str]:
        return self.ledger.known_resources

    @property
    def gauges(self) -> Mapping[str, NodeGauges]:
        """Per node gauge rows, as of the last published states."""
        due, self._gauges_due = self._gauges_due, {}
        for name, state in due.items():
            gauges = node_gauges(name, state)
            kept = self._gauges.get(name)
            if kept is None or kept.values != gauges.values:  # a heartbeat keeps the formatted text
                self._gauges[name] = gauges
        return self._gauges

    def _gauge(self, name: str, state: NodeState | None) -> None:
        if state is None:
            self._gauges_due.pop(name, None)
            self._gauges.pop(name, None)
        else:
            self._gauges_due[name] = state

    def relevant(self, request: PodRequest) -> PodRequest:
        """The part of `request` this extender judges: resources some node publishes.

        A `nvidia.com/` resource no agent publishes belongs to another device plugin; failing
        every node that lacks it would reject pods we know nothing about.
        """
        return podrequests.restrict(request, self.known_resources.__contains__)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def upsert_state(self, obj: Any) -> None:
        if not isinstance(obj, Mapping):
            return
        meta = _meta(obj)
        name = str(meta.get("name", ""))
        if not name:
            return
        rv = str(meta.get("resourceVersion", ""))
        known = self.published.get(name)
        if rv and known is not None and known[0] == rv:
            return  # a resync repeating what we have: keep the scorer and its memo
        try:
            state = from_status(obj.get("status"), source=f"NodeGpuState {name} status")
        except StateSchemaError as e:
            # An agent too new or too old for us: the node is unknown, not infeasible.
            if self.invalid.get(name) != str(e):
                log.warning("ignoring the published state of node %s: %s", name, e)
            self.invalid[name] = str(e)
            self.ledger.unpublish(name, releases=False)
            self._gauge(name, None)
            self.scorers.pop(name, None)
            self._index(name, None)
            self._forget_freshness(name)
            self._changed()
            return
        self.invalid.pop(name, None)
        published = self.ledger.publish(name, rv, state)
        self._gauge(name, state)
        fresh_until = self._track_freshness(name, state)
        for settled in published.settled:
            self._count_prediction(settled)
        scorer = self.scorers.get(name)
        effective = self.ledger.effective(name) if published.changed and scorer is not None else None
        if scorer is not None and (effective is None or statebuilding.same_use(scorer.state, effective)):
            # A heartbeat (only observedAt moved), or the agent reporting the pods we counted
            # where we counted them (most writes after a bind): keep the scorer and its memo.
            scorer.fresh_until = fresh_until
            self._index(name, scorer)  # back in the answers if it had gone stale
            self._changed()
            return
        self._rebuild(name, effective)

    # -- freshness -------------------------------------------------------------------------

    def _track_freshness(self, name: str, state: NodeState) -> float:
        """Note when `observedAt` changed (by our clock), remember when the state goes stale,
        log a transition."""
        if self.max_age_s <= 0:
            fresh_until = NEVER_STALE
        else:
            now = self.wall_clock()
            if observed_epoch(state.observed_at) is None:
                fresh_until = -math.inf  # no usable time: we cannot tell it is fresh
            else:
                heard = self._heard.get(name)
                if heard is None or heard[0] != state.observed_at:
                    heard = self._heard[name] = (state.observed_at, now)
                fresh_until = heard[1] + self.max_age_s
            if fresh_until <= now:
                self._went_stale(name, state.observed_at, now)
            elif name in self.stale:
                self.stale.discard(name)
                log.info("NodeGpuState of node %s is fresh again (observed at %s): scoring it",
                         name, state.observed_at)  # fmt: skip
        self._fresh_until[name] = fresh_until
        return fresh_until

    def _went_stale(self, name: str, observed_at: str, now: float) -> None:
        if name in self.stale:
            return
        self.stale.add(name)
        heard = self._heard.get(name)
        if observed_epoch(observed_at) is None or heard is None:
            age = "unreadable"
        else:
            age = f"unchanged for {now - heard[1]:.0f} s by our clock"
        log.warning(
            "NodeGpuState of node %s is stale: observed at %s (%s), max age %.0f s; treating the "
            "node as unknown (filter passes it, score 0) until its agent writes again",
            name, observed_at or "never", age, self.max_age_s,
        )  # fmt: skip

    def _forget_freshness(self, name: str) -> None:
        self._fresh_until.pop(name, None)
        self._heard.pop(name, None)
        self.stale.discard(name)

    def sweep_stale(self) -> int:
        """Log nodes whose state went stale since the last sweep; returns how many are stale.

        The request path needs no sweep (it compares `fresh_until` itself): this only makes
        the transition visible in the log."""
        if self.max_age_s <= 0:
            return 0
        now = self.wall_clock()
        for name, scorer in self.scorers.items():
            if scorer.fresh_until <= now and name not in self.stale:
                # The published entry, not the scorer's state: a heartbeat keeps the scorer.
                entry = self.published.get(name)
                self._went_stale(name, entry[1].observed_at if entry else "", now)
        return self.count_stale(now)

    def count_stale(self, now: float | None = None) -> int:
        """Nodes with a usable published state that is too old (the `stale_nodes` gauge)."""
        if self.max_age_s <= 0:
            return 0
        now = self.wall_clock() if now is None else now
        return sum(1 for s in self.scorers.values() if s.fresh_until <= now)

    def fresh_scorer(self, name: str) -> WireScorer | None:
        """The node's scorer if its state is usable and fresh (the per-request loops above
        inline this with one clock read per request)."""
        scorer = self.scorers.get(name)
        if scorer is None or scorer.fresh_until <= self.wall_clock():
            return None
        return scorer

    def filter_nodes(
        self, names: Sequence[str], request: PodRequest, *, all_reasons: bool = True
    ) -> tuple[list[int], dict[str, str], dict[str, str]]:
        """Which of `names` can host `request`: (indexes of survivors, node -> why it cannot,
        node -> why it never can). Unknown or stale nodes pass: correctness is the kubelet's.
        `all_reasons` False: the caller reads the reasons only when no node passes (the
        filter's reply): nodes that fail only for being outside the tier are left out of them,
        and where the tier is found from the kept ranking, every reason is."""
        now = self.wall_clock()  # one clock read per request; per node a float comparison
        ranks = self._kept_ranks(request, now)
        if ranks is not None:
            answer = self._filter_ranked(names, request, ranks, now, all_reasons)
            if answer is not None:
                return answer
        return self._filter_by_node(names, request, now, all_reasons)

    def _filter_by_node(
        self, names: Sequence[str], request: PodRequest, now: float, all_reasons: bool = True
    ) -> tuple[list[int], dict[str, str], dict[str, str]]:
        """`filter_nodes` without the kept ranking: the shape's kept answers (or every node's
        verdict), then every survivor ranked for the tier (`_best_tier`)."""
        replies = self._kept_replies(request, now)
        if replies is not None:
            survivors, failed, unresolvable = replies.filter(names)
        else:
            survivors, failed, unresolvable = self._filter_each(names, request, now)
        if 0 < self.tier_width < len(survivors):
            survivors = self._best_tier(names, survivors, request, now, failed if all_reasons else None)
        return survivors, failed, unresolvable

    def _filter_ranked(
        self, names: Sequence[str], request: PodRequest, ranks: BoundRanks, now: float, all_reasons: bool = True
    ) -> tuple[list[int], dict[str, str], dict[str, str]] | None:
        """`filter_nodes` from the GPU shape's kept ranking (`extender.tierranks`): the same
        answer as the node-by-node loops, in C but for the nodes the heap walk meets. None
        where the ranking cannot tell (a name given twice, a rank that is not a finite number,
        a request with negative CPU or memory): the caller ranks node by node."""
        candidates = set(names)
        if len(candidates) != len(names) or ranks.odd or request.cpu < 0 or request.memory < 0:
            return None
        width = self.tier_width
        scorers = self.scorers

        def exact(name: str) -> float:
            verdict = scorers[name].filter_verdict(request)
            return verdict.rank if verdict.feasible else math.nan

        best: list[Entry] | None = None
        if not all_reasons and not request.empty:
            # The tier full of known nodes is the answer whatever else passes (unknown nodes
            # rank below them): no need to sort out the failing ones, most of the filter's time
            # at 5,000 nodes (benchmarks/bench_tierfilter.py), when the reasons are not read.
            best = ranks.best(candidates, width, exact)
            if best is None:
                return None
            if len(best) == width:
                return sorted(map(names.index, (name for _, _, name in best))), {}, {}
        survivors, failed, unresolvable = filter_failing(ranks.failing, names)
        if len(survivors) <= width:
            return survivors, failed, unresolvable
        best = best if best is not None else ranks.best(candidates, width, exact)
        if best is None:
            return None
        chosen = [name for _, _, name in best]
        if len(chosen) < width or request.empty:
            # Candidates that pass unknown or stale: below every known node, except for a pod
            # without GPUs on a node without any (`_unknown_rank`), above them.
            unknown = candidates.difference(ranks.bounds, ranks.failing)
            if unknown:
                ordered = sorted(unknown, key=scoring.tie_key)
                above = [n for n in ordered if self._unknown_rank(n, request) > 0] if request.empty else []
                if above:
                    high = set(above)
                    ordered = [n for n in ordered if n not in high]
                chosen = (above + chosen + ordered)[:width]
        if all_reasons:
            kept = set(chosen)
            self._fail_outside_tier(failed, (names[i] for i in survivors if names[i] not in kept))
        return sorted(map(names.index, chosen)), failed, unresolvable

    def _filter_each(
        self, names: Sequence[str], request: PodRequest, now: float
    ) -> tuple[list[int], dict[str, str], dict[str, str]]:
        """`filter_nodes` node by node: for shapes without kept answers."""
        scorers = self.scorers
        shape = request.shape
        survivors: list[int] = []
        keep = survivors.append
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for i, name in enumerate(names):
            scorer = scorers.get(name)
            if scorer is None or scorer.fresh_until <= now:
                keep(i)
                continue
            s = scorer.verdicts.get(shape) or scorer.filter_verdict(request)
            if s.feasible:
                keep(i)
            elif s.unresolvable:
                unresolvable[name] = s.reason
            else:
                failed[name] = s.reason
        return survivors, failed, unresolvable

    def _best_tier(
        self, names: Sequence[str], survivors: list[int], request: PodRequest, now: float,
        failed: dict[str, str] | None,
    ) -> list[int]:
        """The best `tier_width` survivors by the node policy's fine rank, ties by
        `scoring.tie_key` (a hash of the node's name);
        unknown and stale nodes rank below every known one. The scheduler picks at random among
        its best totals: passing it only our best is what makes the choice ours. The others
        fail with a reason that says so (they could run the pod; preemption never sees them,
        since a survivor remains); `failed` None: no reasons wanted."""
        entries = []
        for i in survivors:
            scorer = self.scorers.get(names[i])
            known = scorer is not None and scorer.fresh_until > now
            rank = scorer.verdict(request).rank if scorer is not None and known else self._unknown_rank(names[i], request)
            entries.append((rank, scoring.tie_key(names[i])))
        keep = [survivors[k] for k in scoring.best_tier(entries, self.tier_width)]
        if failed is not None:
            kept = set(keep)
            self._fail_outside_tier(failed, (names[i] for i in survivors if i not in kept))
        return keep

    def _fail_outside_tier(self, failed: dict[str, str], outside: Iterable[str]) -> None:
        """Nodes that could host the pod but are not among the tier's best fail with this reason."""
        failed.update(dict.fromkeys(outside, f"outside the best {self.tier_width} node(s) by {self.node_policy} "
                                             "(--filter-tier-width)"))  # fmt: skip

    def _unknown_rank(self, name: str, request: PodRequest) -> float:
        """A node without a usable state ranks below every known one, except for a pod that
        needs no GPU on a node that has none (`NodeResources.gpu_free`): there it strands
        nothing, so it ranks above them."""
        r = self.resources
        return math.inf if request.empty and r is not None and r.gpu_free(name) else -math.inf

    @property
    def ranks_every_pod(self) -> bool:
        """Whether pods that request no GPU are ranked too (a CPU-aware policy knowing nodes'
        CPU and memory): they decide whether a GPU node keeps the CPU its GPUs need."""
        return self.resources is not None and scoring.cpu_aware(self.node_policy)

    def refresh_node(self, name: str) -> None:
        """The node's CPU or memory room (or GPU model) may have changed: rescore it, unless its
        scorer has them already (rebuilt since: `NodeResources.deferred`, a directed bind)."""
        if name not in self.published:
            return
        scorer = self.scorers.get(name)
        if scorer is None or not scorer.built_with(*self._node_inputs(name, scorer.state)):
            self._rebuild(name)

    def _node_inputs(self, name: str, state: NodeState) -> tuple[tuple[int, int] | None, str | None]:
        """The node's room and GPU model, as its scorer is made with them."""
        r = self.resources
        if r is None:
            return None, None
        return r.room(name), r.gpu_model(name) or gpumodels.published_model(state)

    def count_resources(self, uid: str, node: str, request: PodRequest, *, deferred: bool = False) -> None:
        """Count the pod's CPU and memory on `node` now (at bind, before the pod watch shows it).
        `deferred`: the node keeps its scorer until the next rebuild or `refresh_node`, so that
        the GPUs the bind then directs (`direct`) are chosen as its filter ranked them, with the
        room before the pod, and the node is rebuilt once for both."""
        if self.resources is not None:
            self.resources.assume(uid, node, request.cpu, request.memory, notify=not deferred)

    def uncount_resources(self, uid: str, node: str) -> None:
        """Undo `count_resources` after a failed bind (only if still counted on `node`)."""
        r = self.resources
        if r is not None and r.pods.get(uid, ("",))[0] == node:
            r.forget(uid)

    def host_priorities(self, names: Sequence[str], request: PodRequest) -> list[bytes]:
        """The wire-encoded HostPriority of each node that scores above 0. kube-scheduler adds
        an extender's score only to the hosts its reply names, so a node left out scores 0,
        the lowest: unknown and stale nodes, and most nodes of a large cluster under `packed`
        (empty ones). Leaving them out spares both sides encoding and decoding them."""
        now = self.wall_clock()
        replies = self._kept_replies(request, now)
        if replies is not None:
            return replies.priorities(names)
        return self._priorities_each(names, request, now)

    def _priorities_each(self, names: Sequence[str], request: PodRequest, now: float) -> list[bytes]:
        """`host_priorities` node by node: for shapes without kept answers."""
        scorers = self.scorers
        shape = request.shape
        parts: list[bytes] = []
        append = parts.append
        for name in names:
            scorer = scorers.get(name)
            if scorer is None or scorer.fresh_until <= now:
                if request.empty and self._unknown_rank(name, request) > 0:
                    append(protocol.host_priority(name, scoring.MAX_EXTENDER_PRIORITY))  # GPU-free, for a CPU-only pod
                continue
            wire = scorer._wire.get(shape)
            if wire is None:
                wire = scorer.host_priority(request)
            if wire:
                append(wire)
        return parts

    def delete_state(self, obj: Any) -> None:
        if isinstance(obj, Mapping):
            self._drop_state(str(_meta(obj).get("name", "")))

    def _drop_state(self, name: str) -> None:
        self.ledger.unpublish(name)
        self._gauge(name, None)
        self.invalid.pop(name, None)
        self.scorers.pop(name, None)
        self._index(name, None)
        self._forget_freshness(name)
        self._changed()

    def _count_prediction(self, settled: ledgers.Settled) -> None:
        match = settled.match
        self.metrics.prediction(match)
        if not match:
            log.info(
                "prediction missed for pod %s on node %s: predicted %s, agent reports %s",
                settled.uid, settled.node, {r: sorted(k) for r, k in settled.predicted.items()},
                {r: sorted(k) for r, k in settled.reported.items()},
            )  # fmt: skip

    def _rebuild(self, name: str, state: NodeState | None = None) -> None:
        """A new scorer for the node's effective state (`state`, when the caller has it)."""
        if state is None:
            state = self.ledger.effective(name)
        if state is None:
            self.scorers.pop(name, None)
            self._index(name, None)
        else:
            rv = self.ledger.published[name][0]
            self._generation += 1
            room, model = self._node_inputs(name, state)
            scorer = WireScorer(name, state, self.node_policy, (rv, self._generation), self.templates, room, model)
            devices = self.pool_devices(name) if self.pool_devices is not None else None
            if devices is not None:
                scorer = FirstFitScorer(scorer, devices, self.templates.workload)
            scorer.fresh_until = self._fresh_until.get(name, NEVER_STALE)
            for request in self._shapes.values():
                scorer.host_priority(request)  # memoises the filter's verdict too
            self.scorers[name] = scorer
            self._index(name, scorer)
        self._changed()

    # -- answers kept per request shape (extender.replies) ---------------------------------

    def _index(self, name: str, scorer: WireScorer | None) -> None:
        """Patch the node into every kept shape's answers and GPU shape's ranking; a node
        without a scorer, or stale, leaves them (it passes and scores 0)."""
        replies = self._replies
        ranks = self._ranks
        if not replies and not ranks:
            return
        if scorer is None or scorer.fresh_until <= self.wall_clock():
            for r in replies.values():
                r.drop(name)
            for k in ranks.values():
                k.drop(name)
            return
        self.soonest_stale = min(self.soonest_stale, scorer.fresh_until)
        for shape, r in replies.items():
            request = self._shapes[shape]
            r.put(name, scorer.filter_verdict(request), scorer.host_priority(request))
        for k in ranks.values():
            k.dirty.add(name)  # scored when its shape is next asked for (`_kept_ranks`)

    def _kept_replies(self, request: PodRequest, now: float) -> ShapeReplies | None:
        """The shape's kept answers, current at `now`; None for a shape not kept."""
        replies = self._replies.get(request.shape)
        if replies is not None and now >= self.soonest_stale:
            self._drop_stale(now)
        return replies

    def _drop_stale(self, now: float) -> None:
        """Take nodes gone stale by `now` out of every kept answer (each comes back with its
        next write), and note when the next one can."""
        soonest = NEVER_STALE
        for name, scorer in self.scorers.items():
            if scorer.fresh_until <= now:
                for r in self._replies.values():
                    r.drop(name)
                for k in self._ranks.values():
                    k.drop(name)
            elif scorer.fresh_until < soonest:
                soonest = scorer.fresh_until
        self.soonest_stale = soonest

    def _kept_ranks(self, request: PodRequest, now: float) -> BoundRanks | None:
        """The GPU shape's kept ranking, current at `now`; None for a GPU shape not kept."""
        ranks = self._ranks.get(request.gpu_shape)
        if ranks is None:
            return None
        if ranks.dirty:
            scorers = self.scorers
            bound = ranks.bound
            dirty, ranks.dirty = ranks.dirty, set()
            for name in dirty:
                scorer = scorers.get(name)
                if scorer is None or scorer.fresh_until <= now:
                    ranks.drop(name)
                else:
                    ranks.put(name, scorer.filter_verdict(bound))
        if now >= self.soonest_stale:
            self._drop_stale(now)
        return ranks

    def _keep_ranks(self, request: PodRequest) -> None:
        """Start keeping the ranking of a newly remembered GPU shape: every fresh node's, once."""
        bound = dataclasses.replace(request, cpu=0, memory=0)  # no CPU, no memory: the best rank
        k = self._ranks[request.gpu_shape] = BoundRanks(bound)
        now = self.wall_clock()
        soonest = self.soonest_stale
        for name, scorer in self.scorers.items():
            if scorer.fresh_until > now:
                k.put(name, scorer.filter_verdict(bound))
                if scorer.fresh_until < soonest:
                    soonest = scorer.fresh_until
        k.heapify()
        self.soonest_stale = soonest

    def _keep_replies(self, request: PodRequest) -> None:
        """Start keeping answers for a newly remembered shape: every fresh node's, once."""
        r = self._replies[request.shape] = ShapeReplies()
        now = self.wall_clock()
        soonest = self.soonest_stale
        for name, scorer in self.scorers.items():
            if scorer.fresh_until > now:
                r.put(name, scorer.filter_verdict(request), scorer.host_priority(request))
                if scorer.fresh_until < soonest:
                    soonest = scorer.fresh_until
        self.soonest_stale = soonest

    # -- pods ------------------------------------------------------------------------------

    def replace_pods(self, objects: list[Any]) -> None:
        present = set()
        for obj in objects:
            if isinstance(obj, Mapping):
                present.add(str(_meta(obj).get("uid", "")))
        for forgotten in self.ledger.keep_only(present, self.clock() + self.assume_ttl):
            self._forgotten(forgotten)
        for obj in objects:
            self.upsert_pod(obj)

    def upsert_pod(self, obj: Any) -> None:
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        if not isinstance(spec, Mapping) or not spec.get("nodeName"):
            return  # not bound: nothing to count (the watch delivers pending pods too)
        if self._counted_already(obj, spec["nodeName"]):
            self._changed()
            return
        try:
            pod = podrequests.decode_pod(obj, self.managed)
        except RequestError as e:
            log.debug("ignoring an undecodable pod: %s", e)
            return
        if not pod.uid or not pod.node_name:
            return
        whole = podrequests.pod_request(pod, self.managed)
        request = self.relevant(whole)
        if pod.phase in TERMINAL_PHASES:
            self.forget_pod(pod.uid, request, directed_placement(obj, pod.node_name, whole))
            return
        if request.empty:
            return
        self.ledger.bound(pod.uid, pod.node_name)
        if self.ledger.counted(pod.uid, pod.node_name):
            self._changed()
            return
        # A GPU pod bound that this view did not count: another replica's bind (or one from
        # before this replica listed), which `extender.directing` takes as a sign that binds
        # here may race others'.
        self.last_foreign_bind = self.clock()
        self.assume(pod.uid, pod.node_name, request, directed_placement(obj, pod.node_name, whole))

    def _counted_already(self, obj: Mapping[str, Any], node: object) -> bool:
        """A running pod's status updates, most pod events, and the binding of a pod this view
        assumed there (its own binds): a pod this view counts on the node it is bound to, not
        finished; such a pod is recorded as bound there (`Ledger.bound`). Nothing to decode: its
        GPU requests cannot change (an in-place resize changes CPU and memory only, which
        `extender.noderesources` reads)."""
        uid = _meta(obj).get("uid")
        ledger = self.ledger
        if not uid:
            return False
        where = ledger.pods.get(uid)
        if where is None:
            assumed = ledger.assumed.get(uid)
            if assumed is None or assumed.node != node:
                return False
        elif where != node or (uid not in ledger.assumed and uid not in ledger.settled):
            return False
        status = obj.get("status")
        if isinstance(status, Mapping) and status.get("phase") in TERMINAL_PHASES:
            return False
        ledger.bound(uid, str(node))
        return True

    def delete_pod(self, obj: Any) -> None:
        if not isinstance(obj, Mapping):
            return
        request = directed = None
        try:
            pod = podrequests.decode_pod(obj, self.managed)
            whole = podrequests.pod_request(pod, self.managed)
            request = self.relevant(whole)
            directed = directed_placement(obj, pod.node_name, whole) if pod.node_name else None
        except RequestError as e:
            log.debug("a deleted pod is undecodable; releasing only what its placement shows: %s", e)
        self.forget_pod(str(_meta(obj).get("uid", "")), request, directed)

    def forget_pod(self, uid: str, request: PodRequest | None = None, directed: Placement | None = None) -> None:
        """The pod is gone (deleted, or Succeeded/Failed): stop counting it, and free what its
        node's published state still counts for it (`request`, when known, tells how many
        devices it held on a GPU it shared; `directed`, its directions, where the state lists it
        on exactly those GPUs)."""
        self._forgotten(self.ledger.forget(uid, request, self.clock() + self.assume_ttl, directed))

    def _forgotten(self, forgotten: ledgers.Forgotten) -> None:
        if forgotten.untold:
            log.info("pod %s on node %s is gone; its devices count until its agent republishes "
                     "(the published counts do not say how many it held)", forgotten.uid, forgotten.node)  # fmt: skip
        if forgotten.changed and forgotten.node is not None:
            self._rebuild(forgotten.node)
        else:
            self._changed()

    # -- assumptions -----------------------------------------------------------------------

    def assume(
        self, uid: str, node: str, request: PodRequest, directed: Placement | None = None
    ) -> NodeScore | None:
        """Count `request` on `node` with its predicted placement until the agent reports it;
        `directed`: the placement the pod's directions name (another replica's prediction, which
        the agent follows), used instead of ours."""
        request = self.relevant(request)
        if request.empty or uid in self.ledger.assumed or uid in self.ledger.settled:
            return None
        if self.ledger.counted(uid, node):  # its agent was faster than us: already counted
            self._changed()
            return None
        scorer = self.fresh_scorer(node)  # a stale node is unknown: no prediction either
        predicted = scorer.score(request) if scorer is not None else None
        placement = predicted.placement if predicted is not None and predicted.feasible else {}
        if directed:
            placement = directed
        else:
            predictionlog.record(uid, node, placement)
        self.ledger.assume(uid, node, placement, self.clock() + self.assume_ttl)
        self._rebuild(node)
        return predicted

    def direct(self, uid: str, node: str, request: PodRequest) -> scoring.ContainerPlacements:
        """Assume the pod on `node` now, and return its predicted placement split by container
        (the directed GPUs), both computed on one effective state: what the pod is told to take
        is exactly what it counts with. Empty when there is nothing to direct (a stale or
        unknown node, an infeasible pod, a pod already counted)."""
        request = self.relevant(request)
        scorer = self.fresh_scorer(node)
        if scorer is None or request.empty or uid in self.ledger.assumed or uid in self.ledger.settled:
            return ()
        # The policy chooses one container's GPUs itself (`fragaware`: a share's GPU, as FGD
        # chooses it), not the agent's loop: its prediction is what to direct, and the loop's
        # split (a second simulation) is not needed.
        chosen = self.directed and len(request.containers) == 1
        split = () if chosen else scoring.container_placements(scorer.state, request)  # before the pod counts
        predicted = self.assume(uid, node, request)
        if chosen and predicted is not None and scoring.placement_gpus(predicted.placement):
            split = ((request.containers[0].name, predicted.placement),)
        if not split or predicted is None or not predicted.feasible:
            log.info("pod %s: not directing its GPUs on node %s: %s", uid, node,
                     predicted.reason if predicted is not None else "not predicted")  # fmt: skip
            return ()
        joined = directions.placement(directions.from_placements(node, split))
        # The split comes from the same loop as the prediction; renaming alike nodes' shared
        # scores must not change it. If it ever did, directing would break the prediction.
        if scoring.placement_gpus(predicted.placement) != scoring.placement_gpus(joined):
            log.warning("pod %s on node %s: per-container placement %s disagrees with the "
                        "prediction %s; not directing its GPUs", uid, node, split, predicted.placement)  # fmt: skip
            return ()
        return split

    def unassume(self, uid: str, node: str) -> None:
        """Undo `direct` after a failed bind: stop counting the pod on `node`, and only there
        (the pod watch may have seen it bound elsewhere meanwhile)."""
        if self.ledger.unassume(uid, node):
            self._rebuild(node)

    def expire(self) -> int:
        """Stop counting assumed pods older than the TTL; returns how many."""
        expired = self.ledger.expire(self.clock())
        for a in expired.assumed:
            log.info("pod %s on node %s not reported by its agent in time: no longer counted",
                     a.uid, a.node)  # fmt: skip
        for node, uid in expired.released:
            log.info("released pod %s still listed by node %s's agent after the TTL: counted again", uid, node)
        for node in expired.nodes:
            self._rebuild(node)
        return len(expired.assumed)

    def remember(self, request: PodRequest, *, prioritizing: bool = False) -> None:
        """Keep the request of a pod being scheduled: /bind carries only its name and UID.

        And start keeping what answers its like fast: for the filter with a tier, its GPU
        shape's ranking (`extender.tierranks`); for prioritize (`prioritizing`) and a filter
        without a tier, its shape's answers (`extender.replies`)."""
        if not request.uid:
            return
        recent = self._recent
        recent[request.uid] = request
        recent.move_to_end(request.uid)
        if len(recent) > RECENT_REQUESTS:
            recent.popitem(last=False)
        if self._ranked and not prioritizing and (not request.empty or self.ranks_every_pod):
            ranks = self._ranks
            if request.gpu_shape in ranks:
                ranks.move_to_end(request.gpu_shape)
            else:
                self._keep_ranks(request)
                if len(ranks) > RANKED_GPU_SHAPES:
                    ranks.popitem(last=False)
            return
        if request.empty:
            return  # nothing to prescore; kept above so that /bind need not read the pod
        shapes = self._shapes
        new = request.shape not in shapes
        shapes[request.shape] = request
        shapes.move_to_end(request.shape)
        if len(shapes) > PRESCORED_SHAPES:
            self._replies.pop(shapes.popitem(last=False)[0], None)
        if new:
            self._keep_replies(request)

    def recalled(self, uid: str) -> PodRequest | None:
        return self._recent.get(uid)


# --- handlers for kube.reflecting.Reflector ------------------------------------------------------


def state_handler(view: ClusterView) -> Callable[[str, Any], None]:
    def on_event(kind: str, obj: Any) -> None:
        if kind == "DELETED":
            view.delete_state(obj)
        else:
            view.upsert_state(obj)

    return on_event


def pod_handler(view: ClusterView, pending: PendingPods | None = None) -> Callable[[str, Any], None]:
    """The pod watch's handler: the view counts bound pods; `pending` keeps the pods not bound
    yet, for the bind guard (`extender.pendingpods`)."""

    def on_event(kind: str, obj: Any) -> None:
        if kind == "DELETED":
            if pending is not None:
                pending.delete(obj)
            view.delete_pod(obj)
        else:
            if pending is not None:
                pending.upsert(obj)
            view.upsert_pod(obj)

    return on_event
