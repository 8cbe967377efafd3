"""The extender's DRA mode (`--mode dra`): this driver's ResourceSlices and the ResourceClaims
allocated from them, turned into the per-node state the device-plugin mode reads from
NodeGpuState, and handed to the same `ClusterView`, so filter, prioritize, bind, assumed pods,
the tier filter and `sharepack_extender_predictions_total` work unchanged.

* A node's state is rebuilt from its pool (ResourceSlices of driver `gpu.sharepack.io`, pool =
  node name) and the claims holding its devices whenever one of them changes
  (`common.draslices.node_state`): per physical GPU, replicas in total and allocated, and the
  UIDs of the pods the claims are reserved for. A pod's prediction is then checked against the
  GPUs its claim was actually allocated by kube-scheduler.
* The prediction is the scheduler's own first fit over the node's devices in the order its
  slices list them (`caches.FirstFitScorer`, `common.drascoring`), with the use the node's
  state counts (its claims, and pods the view assumed since): whatever order the agent
  publishes (`--dra-device-order`: static, or `fresh-first` republished as claims are
  prepared), the ranking is of the devices the allocator will give. Exact for GPU-major orders;
  for a replica-major one it assumes a GPU's earliest replicas are the used ones
  (`draslices.counted_node`).
* Predictions: under DRA the scheduler writes a claim's allocation and `reservedFor` before it
  binds the pod (PreBind), so the claim usually shows up before the pod is seen bound, and the
  view's assumed-pod path would find the pod already counted and judge nothing. So a claim seen
  allocated for the first time is judged here, against what the node's scorer (the state
  before the claim) predicts for the pod's request as filter and prioritize saw it; a pod the
  view already assumed is left to the view, which judges it when the claim arrives.
* A GPU published both as a whole-GPU device and as replica devices is in both resources of
  its state (a replica taken makes the whole GPU taken); the view is built with `WHOLE_OF`, so
  the node policy ranks it by its free replicas, as `common.drascoring` does: in the
  two-resource view `fragaware` would count a GPU with one replica taken as having none free.
* Slices have no heartbeat: a node's state is as fresh as its slices, which its kubelet plugin
  withdraws when it stops, so the DRA mode does not age states (`--state-max-age-seconds` 0).
* A slice this reader does not understand makes its node unknown (score 0, never filtered
  out), as an unreadable NodeGpuState does, and is logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from sharepack.common import draslices, scoring
from sharepack.common.draslices import DEFAULT_RESOURCES, DRIVER, Device, Holding
from sharepack.common.errors import DraSchemaError
from sharepack.common.state import to_status
from sharepack.extender.caches import ClusterView

log = logging.getLogger(__name__)

SLICES = "resourceslices"
# A GPU's whole-GPU device and its replica devices exclude each other, so the view lists such a
# GPU under both resources; the view ranks it by its free replicas (`scoring.whole_as_shares`).
WHOLE_OF: scoring.WholeOf = (draslices.WHOLE_RESOURCE, draslices.SHARED_RESOURCE)
JUDGED_KEPT = 100_000
CLAIMS = "resourceclaims"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _claim_key(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _pool_of(obj: Mapping[str, Any]) -> str | None:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER:
        return None
    pool = spec.get("pool")
    name = pool.get("name") if isinstance(pool, Mapping) else None
    return name if isinstance(name, str) and name else None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class DraStates:
    """Raw slices and decoded claim holdings; `view` gets a NodeGpuState-shaped object per node
    after every change that touches the node."""

    def __init__(self, view: ClusterView, *, now: Callable[[], str] = _now) -> None:
        self.view = view
        self.now = now
        self.slices: dict[str, Mapping[str, Any]] = {}  # slice name -> object (our driver's only)
        self.slice_pool: dict[str, str] = {}  # slice name -> pool (node)
        self.holdings: dict[str, list[Holding]] = {}  # claim key -> devices of ours it holds
        # Indexes, so one event costs the node it touches, not the cluster.
        self.pool_slices: dict[str, set[str]] = {}  # pool -> slice names
        self.pool_claims: dict[str, set[str]] = {}  # pool -> claim keys holding its devices
        self.invalid: dict[str, str] = {}  # node -> why its slices or claims are unreadable
        self._version = 0
        self._published: set[str] = set()
        self.devices: dict[str, tuple[Device, ...]] = {}  # node -> its pool as last read
        view.pool_devices = self.devices.get  # the view's scorers predict first fit over them
        self._judged: set[str] = set()  # pod UIDs whose claim was compared with its prediction

    # -- ResourceSlices --------------------------------------------------------------------

    def replace_slices(self, objects: list[Any]) -> None:
        before = set(self.slice_pool.values())
        self.slices.clear()
        self.slice_pool.clear()
        self.pool_slices.clear()
        for obj in objects:
            self._put_slice(obj)
        for node in before | set(self.slice_pool.values()) | self._published:
            self._rebuild(node)

    def upsert_slice(self, obj: Any) -> None:
        name = str(_meta(obj).get("name", "")) if isinstance(obj, Mapping) else ""
        old = self.slice_pool.get(name)
        self._put_slice(obj)
        for node in {old, self.slice_pool.get(name)} - {None}:
            assert node is not None
            self._rebuild(node)

    def delete_slice(self, obj: Any) -> None:
        name = str(_meta(obj).get("name", "")) if isinstance(obj, Mapping) else ""
        node = self._drop_slice(name)
        if node is not None:
            self._rebuild(node)

    def _drop_slice(self, name: str) -> str | None:
        self.slices.pop(name, None)
        pool = self.slice_pool.pop(name, None)
        if pool is not None:
            names = self.pool_slices.get(pool, set())
            names.discard(name)
            if not names:
                self.pool_slices.pop(pool, None)
        return pool

    def _put_slice(self, obj: Any) -> None:
        if not isinstance(obj, Mapping):
            return
        name = str(_meta(obj).get("name", ""))
        pool = _pool_of(obj)
        if not name:
            return
        self._drop_slice(name)
        if pool is None:  # another driver's, or no longer ours
            return
        self.slices[name] = obj
        self.slice_pool[name] = pool
        self.pool_slices.setdefault(pool, set()).add(name)

    # -- ResourceClaims --------------------------------------------------------------------

    def replace_claims(self, objects: list[Any]) -> None:
        touched = set(self.pool_claims)
        self.holdings.clear()
        self.pool_claims.clear()
        for obj in objects:
            touched |= self._put_claim(obj)
        for node in touched:
            self._rebuild(node)

    def upsert_claim(self, obj: Any) -> None:
        before = self.holdings.get(_claim_key(obj), []) if isinstance(obj, Mapping) else []
        touched = {h.pool for h in before}
        touched |= self._put_claim(obj)
        if not before and isinstance(obj, Mapping):
            self._judge(self.holdings.get(_claim_key(obj), []))
        for node in touched:
            self._rebuild(node)

    def delete_claim(self, obj: Any) -> None:
        if not isinstance(obj, Mapping):
            return
        for node in self._drop_claim(_claim_key(obj)):
            self._rebuild(node)

    def _drop_claim(self, key: str) -> set[str]:
        pools = {h.pool for h in self.holdings.pop(key, ())}
        for pool in pools:
            keys = self.pool_claims.get(pool, set())
            keys.discard(key)
            if not keys:
                self.pool_claims.pop(pool, None)
        return pools

    def _put_claim(self, obj: Any) -> set[str]:
        if not isinstance(obj, Mapping):
            return set()
        key = _claim_key(obj)
        try:
            held = draslices.claim_holdings(obj)
        except DraSchemaError as e:
            log.warning("ignoring the allocation of ResourceClaim %s: %s", key, e)
            held = []
        self._drop_claim(key)
        if held:
            self.holdings[key] = held
            for pool in {h.pool for h in held}:
                self.pool_claims.setdefault(pool, set()).add(key)
        return {h.pool for h in held}

    def _judge(self, held: list[Holding]) -> None:
        """Count a newly allocated claim's devices against the prediction for its pod (before
        its node's state counts the claim)."""
        view = self.view
        for uid in dict.fromkeys(p for h in held for p in h.pods):
            if uid in self._judged or uid in view.assumed:
                continue
            request = view.recalled(uid)
            pools = {h.pool for h in held if uid in h.pods}
            scorer = view.scorers.get(next(iter(pools))) if len(pools) == 1 else None
            if request is None or scorer is None:
                continue
            predicted = scorer.score(view.relevant(request))
            if not predicted.feasible:
                continue
            by_name = {d.name: d for d in self.devices.get(next(iter(pools)), ())}
            actual: dict[str, set[str]] = {}
            for h in held:
                d = by_name.get(h.device)
                if d is not None and uid in h.pods:
                    actual.setdefault(DEFAULT_RESOURCES[d.type], set()).add(d.gpu)
            want = scoring.placement_gpus(predicted.placement)
            match = all(frozenset(actual.get(r, ())) == keys for r, keys in want.items())
            view.metrics.prediction(match)
            self._judged.add(uid)
            if len(self._judged) > JUDGED_KEPT:
                self._judged.clear()  # a UID is judged once, near its bind; old ones never return
            if not match:
                log.info(
                    "prediction missed for pod %s: predicted %s, the scheduler allocated %s",
                    uid, {r: sorted(k) for r, k in want.items()}, {r: sorted(k) for r, k in actual.items()},
                )  # fmt: skip

    # -- per node --------------------------------------------------------------------------

    def _rebuild(self, node: str) -> None:
        slices = [self.slices[s] for s in self.pool_slices.get(node, ())]
        try:
            devices = draslices.pool_devices(slices, node) if slices else None
        except DraSchemaError as e:
            if self.invalid.get(node) != str(e):
                log.warning("node %s is unknown to the DRA mode: %s", node, e)
            self.invalid[node] = str(e)
            devices = None
        else:
            self.invalid.pop(node, None)
        if devices is None:
            self.devices.pop(node, None)
            if node in self._published:
                self._published.discard(node)
                self.view.delete_state({"metadata": {"name": node}})
            return
        self.devices[node] = devices
        holdings = [h for key in self.pool_claims.get(node, ()) for h in self.holdings[key]]
        state = draslices.node_state(draslices.dra_node(node, devices, holdings), observed_at=self.now())
        self._version += 1
        self._published.add(node)
        self.view.upsert_state(
            {"metadata": {"name": node, "resourceVersion": f"dra-{self._version}"}, "status": to_status(state)}
        )


def _handler(upsert: Callable[[Any], None], delete: Callable[[Any], None]) -> Callable[[str, Any], None]:
    def on_event(kind: str, obj: Any) -> None:
        (delete if kind == "DELETED" else upsert)(obj)

    return on_event


def slice_handler(states: DraStates) -> Callable[[str, Any], None]:
    return _handler(states.upsert_slice, states.delete_slice)


def claim_handler(states: DraStates) -> Callable[[str, Any], None]:
    return _handler(states.upsert_claim, states.delete_claim)
