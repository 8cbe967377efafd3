"""kube-scheduler's node choice, as a cluster running it (with or without our extender) makes it.

Read from the v1.37 source (pkg/scheduler): the default score plugins are TaintToleration (3),
NodeAffinity (2), NodeResourcesFit (1), PodTopologySpread (2), InterPodAffinity (2),
NodeResourcesBalancedAllocation (1) and ImageLocality (1). On the trace only the two resource
plugins vary between nodes (no taints, preferred affinities, spread constraints, pod affinities
or images), so only they are modelled; the others add the same amount to every node and cannot
change the choice.

* NodeResourcesFit, `LeastAllocated` (default) or `MostAllocated`, over its `resources`
  (default cpu and memory, weight 1 each): per resource `(alloc - req) * 100 // alloc` (or
  `min(req, alloc) * 100 // alloc`) with `req` the node's requests plus the pod's, zero CPU and
  memory requests counted as 100m and 200 MiB; the weighted mean, integer division. An extended
  resource counts only when the pod requests it.
* NodeResourcesBalancedAllocation over cpu and memory, actual requests: per node the balance
  score `int((1 - |f_cpu - f_mem| / 2) * 100)` (fractions of allocatable, capped at 1) with and
  without the pod, combined as `50 + (50 + with - without) // 2`; skipped for a pod that
  requests nothing.
* The extender (every pod, as shipped; GPU pods only when the configuration lists
  `managedResources`): its filter runs after the in-tree filters, then passes its best
  `tier_width` nodes; its 0..10 score counts `score x weight x 10`.
* The node: uniformly at random among the best totals (the scheduler's reservoir sampling),
  from the run's seeded generator.

Every feasible node is scored (`percentageOfNodesToScore: 100`, as our deploy configuration
sets it and as the baselines are given too: sampling only makes a bin-packing score worse).
The configuration comes from a KubeSchedulerConfiguration document (`parse_config`): the
deploy file for sharepack (`SHAREPACK`, tied to deploy/scheduler/kube-scheduler-config.yaml by
a test), the defaults for `kube-default`, the Kubernetes documentation's bin-packing example
for `kube-binpack`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import yaml

from sharepack.common import scoring
from sharepack.tracesim.baselines import Choice
from sharepack.tracesim.clusters import Cluster, Request
from sharepack.tracesim.errors import PolicyError
from sharepack.tracesim.fragmentation import FloatArray, IntArray
from sharepack.tracesim.traces import MILLI
from sharepack.tracesim.workloads import scoring_memory

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = scoring.MAX_EXTENDER_PRIORITY
CPU = "cpu"
MEMORY = "memory"
GPU = "nvidia.com/gpu"  # the upstream device plugin's resource: R replicas per GPU when time-sliced
FIT = "NodeResourcesFit"
BALANCED = "NodeResourcesBalancedAllocation"
DEFAULT_RESOURCES = ((CPU, 1), (MEMORY, 1))
STRATEGIES = ("LeastAllocated", "MostAllocated")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The parts of a KubeSchedulerConfiguration that move a GPU pod on the trace."""

    fit_strategy: str = "LeastAllocated"
    fit_resources: tuple[tuple[str, int], ...] = DEFAULT_RESOURCES
    fit_weight: int = 1
    balanced_resources: tuple[tuple[str, int], ...] = DEFAULT_RESOURCES
    balanced_weight: int = 1
    extender_weight: int | None = None  # None: no extender
    # The extender's `managedResources`: when listed, only pods requesting one reach it (GPU
    # pods); without them every pod does, CPU-only pods included.
    extender_all_pods: bool = False


def _weights(profile: Mapping[str, Any], source: str) -> dict[str, int]:
    """Score weights of the two resource plugins after the profile's plugin sets."""
    weights = {FIT: 1, BALANCED: 1}
    plugins = profile.get("plugins") or {}
    for point in ("multiPoint", "score"):
        sets = plugins.get(point) or {}
        for item in sets.get("disabled") or []:
            name = item.get("name")
            if name == "*":
                weights = dict.fromkeys(weights, 0)
            elif name in weights:
                weights[name] = 0
        for item in sets.get("enabled") or []:
            name = item.get("name")
            if name in weights:
                weight = item.get("weight", 1)
                if not isinstance(weight, int) or weight < 0:
                    raise PolicyError(f"invalid {source}: plugin {name} weight {weight!r}: want an integer >= 0")
                weights[name] = weight or 1
    return weights


def _resources(raw: Any, source: str, where: str) -> tuple[tuple[str, int], ...]:
    if raw is None:
        return DEFAULT_RESOURCES
    out = []
    for item in raw:
        name, weight = item.get("name"), item.get("weight", 1) or 1
        if not isinstance(name, str) or not isinstance(weight, int) or weight < 0:
            raise PolicyError(f"invalid {source}: {where} resource {item!r}: want a name and an integer weight")
        out.append((name, weight))
    return tuple(out)


def parse_config(text: str, source: str) -> SchedulerConfig:
    """A KubeSchedulerConfiguration (v1) as the model needs it; errors name the bad value."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyError(f"invalid {source}: not YAML: {e}") from e
    if not isinstance(doc, dict) or doc.get("kind") != "KubeSchedulerConfiguration":
        raise PolicyError(f"invalid {source}: not a KubeSchedulerConfiguration")
    percentage = doc.get("percentageOfNodesToScore")
    if percentage != 100:
        raise PolicyError(
            f"invalid {source}: percentageOfNodesToScore {percentage}: the model scores every feasible node; "
            "set 100 (as GPU bin-packing needs)"
        )
    profiles = doc.get("profiles") or [{}]
    profile = profiles[0]
    weights = _weights(profile, source)
    strategy = "LeastAllocated"
    fit_resources: tuple[tuple[str, int], ...] = DEFAULT_RESOURCES
    balanced_resources: tuple[tuple[str, int], ...] = DEFAULT_RESOURCES
    for item in profile.get("pluginConfig") or []:
        args = item.get("args") or {}
        if item.get("name") == FIT:
            scoring_strategy = args.get("scoringStrategy") or {}
            strategy = scoring_strategy.get("type", "LeastAllocated")
            if strategy not in STRATEGIES:
                raise PolicyError(f"invalid {source}: {FIT} scoringStrategy {strategy!r}: want one of {STRATEGIES}")
            fit_resources = _resources(scoring_strategy.get("resources"), source, FIT)
        elif item.get("name") == BALANCED:
            balanced_resources = _resources(args.get("resources"), source, BALANCED)
    extender_weight, all_pods = None, False
    extenders = doc.get("extenders") or []
    # An entry with neither filterVerb nor prioritizeVerb (as shipped: the bind-only entry, for
    # GPU pods) places nothing: it changes nothing in the model.
    ranking = [e for e in extenders if isinstance(e, dict) and (e.get("filterVerb") or e.get("prioritizeVerb"))]
    if len(ranking) > 1:
        raise PolicyError(f"invalid {source}: {len(ranking)} ranking extenders: the model has one")
    if ranking and ranking[0].get("prioritizeVerb"):
        extender_weight = ranking[0].get("weight")
        if not isinstance(extender_weight, int) or extender_weight <= 0:
            raise PolicyError(f"invalid {source}: extender weight {extender_weight!r}: want a positive integer")
        all_pods = not ranking[0].get("managedResources")
    return SchedulerConfig(
        strategy, fit_resources, weights[FIT], balanced_resources, weights[BALANCED], extender_weight, all_pods
    )


def load_config(path: Path) -> SchedulerConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(f"invalid --scheduler-config {path}: cannot read it: {e}") from e
    return parse_config(text, f"--scheduler-config {path}")


# deploy/scheduler/kube-scheduler-config.yaml, its scoring part (a test keeps them equal).
SHAREPACK = parse_config(
    """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
percentageOfNodesToScore: 100
profiles:
- schedulerName: default-scheduler
extenders:
- prioritizeVerb: prioritize
  weight: 5
""",
    "built-in sharepack configuration",
)
# kube-scheduler's defaults (scoring every node, as above).
KUBE_DEFAULT = parse_config(
    "kind: KubeSchedulerConfiguration\npercentageOfNodesToScore: 100\n", "built-in default configuration"
)
# The Kubernetes documentation's bin-packing example (MostAllocated, the extended resource
# weighted 3), with the GPU as the upstream device plugin names it.
KUBE_BINPACK = parse_config(
    f"""
kind: KubeSchedulerConfiguration
percentageOfNodesToScore: 100
profiles:
- pluginConfig:
  - name: {FIT}
    args:
      scoringStrategy:
        type: MostAllocated
        resources: [{{name: cpu, weight: 1}}, {{name: memory, weight: 1}}, {{name: "{GPU}", weight: 3}}]
""",
    "built-in bin-packing configuration",
)


def _node_resource(
    cluster: Cluster, req: Request, idx: IntArray, name: str, replicas: int, *, nonzero: bool
) -> tuple[IntArray, IntArray, int] | None:
    """(allocatable, allocated, the pod's request) of resource `name` on the nodes `idx`;
    None when the pod does not request an extended resource (the plugins then skip it)."""
    if name == CPU:
        alloc = cluster.cpu_cap[idx]
        used = cluster.cpu_nonzero[idx] if nonzero else alloc - cluster.cpu_left[idx]
        return alloc, used, req.cpu_score if nonzero else req.cpu
    if name == MEMORY:
        alloc = cluster.nodes.memory[idx]
        used = cluster.mem_nonzero[idx] if nonzero else alloc - cluster.mem_left[idx]
        return alloc, used, scoring_memory(req.memory) if nonzero else req.memory
    if name == GPU and req.num_gpu > 0:
        alloc = cluster.num_gpu[idx] * replicas
        used = (cluster.num_gpu[idx] * MILLI - cluster.gpu_total_left[idx]) * replicas // MILLI
        return alloc, used, req.num_gpu * -(-req.milli * replicas // MILLI)
    return None


def fit_scores(config: SchedulerConfig, cluster: Cluster, req: Request, idx: IntArray, replicas: int) -> IntArray:
    """NodeResourcesFit's score (0..100) of each node in `idx`."""
    total = np.zeros(len(idx), dtype=np.int64)
    weight_sum = np.zeros(len(idx), dtype=np.int64)
    for name, weight in config.fit_resources:
        got = _node_resource(cluster, req, idx, name, replicas, nonzero=True)
        if got is None:
            continue
        alloc, used, pod = got
        requested = used + pod
        safe = np.maximum(alloc, 1)
        if config.fit_strategy == "LeastAllocated":
            score = np.where(requested > alloc, 0, (alloc - requested) * MAX_NODE_SCORE // safe)
        else:
            score = np.minimum(requested, alloc) * MAX_NODE_SCORE // safe
        present = alloc > 0
        total += np.where(present, score * weight, 0)
        weight_sum += np.where(present, weight, 0)
    out: IntArray = np.where(weight_sum > 0, total // np.maximum(weight_sum, 1), 0)
    return out


def _balance(requested: list[IntArray], alloc: list[IntArray]) -> IntArray:
    fractions = [np.minimum(r / np.maximum(a, 1), 1.0) for r, a in zip(requested, alloc, strict=True)]
    if len(fractions) == 2:
        std = np.abs((fractions[0] - fractions[1]) / 2)
    elif len(fractions) > 2:
        stacked = np.stack(fractions)
        std = np.sqrt(((stacked - stacked.mean(axis=0)) ** 2).mean(axis=0))
    else:
        std = np.zeros(len(requested[0]) if requested else 0)
    out: IntArray = ((1 - std) * MAX_NODE_SCORE).astype(np.int64)  # Go's int64(): toward zero
    return out


def balanced_scores(config: SchedulerConfig, cluster: Cluster, req: Request, idx: IntArray, replicas: int) -> IntArray:
    """NodeResourcesBalancedAllocation's score (0..100) of each node in `idx` (0 everywhere for
    a pod that requests nothing it balances: the plugin skips it)."""
    parts = [_node_resource(cluster, req, idx, name, replicas, nonzero=False) for name, _ in config.balanced_resources]
    got = [p for p in parts if p is not None]
    if not got or all(pod == 0 for _, _, pod in got):
        return np.zeros(len(idx), dtype=np.int64)
    alloc = [a for a, _, _ in got]
    with_pod = _balance([u + pod for _, u, pod in got], alloc)
    without = _balance([u for _, u, _ in got], alloc)
    out: IntArray = MAX_NODE_SCORE // 2 + (MAX_NODE_SCORE // 2 + with_pod - without) // 2
    return out


def in_tree_scores(config: SchedulerConfig, cluster: Cluster, req: Request, idx: IntArray, replicas: int) -> IntArray:
    out: IntArray = config.fit_weight * fit_scores(config, cluster, req, idx, replicas) + (
        config.balanced_weight * balanced_scores(config, cluster, req, idx, replicas)
    )
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """The extender's answer for one node, as `common.scoring.score_node` gives it."""

    feasible: bool
    score: int  # 0..10
    rank: float  # fine-grained: what the tier filter orders by
    per_gpu: tuple[int, ...]  # replicas the pod would take from each GPU


class Verdicts:
    """The verdicts of the nodes of one request: `unique` ones, and which each node has."""

    __slots__ = ("unique", "inverse", "feasible", "score", "rank")

    def __init__(self, unique: list[Verdict], inverse: IntArray) -> None:
        self.unique = unique
        self.inverse = inverse
        self.feasible = np.array([v.feasible for v in unique], dtype=np.bool_)[inverse]
        self.score: IntArray = np.array([v.score for v in unique], dtype=np.int64)[inverse]
        self.rank: FloatArray = np.array([v.rank for v in unique], dtype=np.float64)[inverse]

    def __len__(self) -> int:
        return len(self.inverse)

    def at(self, i: int) -> Verdict:
        return self.unique[int(self.inverse[i])]

    def take(self, positions: IntArray) -> Verdicts:
        return Verdicts(self.unique, self.inverse[positions])


class Extender(Protocol):
    def verdicts(self, cluster: Cluster, req: Request, idx: IntArray) -> Verdicts: ...


def select_host(total: IntArray, rng: np.random.Generator) -> int:
    """Position of the node chosen among the best totals: uniform, as the scheduler's
    reservoir sampling (one draw from the run's generator only when several tie)."""
    top = np.flatnonzero(total == total.max())
    return int(top[0]) if len(top) == 1 else int(top[rng.integers(len(top))])


class KubeScheduler:
    """A `Scorer`: the in-tree filters have run (the replayer's feasibility); then the
    extender's filter (its own feasibility, then the best `tier_width` nodes by its rank, ties
    by the node order; 0: no tier), the scores, and the seeded uniform choice among the best.

    GPUs on the chosen node: the extender's predicted placement (the node agent's own loop,
    or with `directed` the placement the extender chose), or without an extender `placer`'s
    (upstream `packed`)."""

    def __init__(
        self, config: SchedulerConfig, *, extender: Extender | None, placer: Extender, tier_width: int, replicas: int
    ) -> None:
        if extender is not None and config.extender_weight is None:
            raise PolicyError("invalid scheduler configuration: an extender policy needs an extender with a weight")
        self.config = config
        self.extender = extender if config.extender_weight is not None else None
        self.placer = placer
        self.tier_width = tier_width
        self.replicas = replicas

    def __call__(self, cluster: Cluster, req: Request, idx: IntArray, rng: np.random.Generator) -> Choice:
        extra = np.zeros(len(idx), dtype=np.int64)
        verdicts: Verdicts | None = None
        if self.extender is not None and (req.num_gpu > 0 or self.config.extender_all_pods):
            verdicts = self.extender.verdicts(cluster, req, idx)
            ok = np.flatnonzero(verdicts.feasible)
            if not len(ok):
                return Choice(-1, [])
            if 0 < self.tier_width < len(ok):
                # Only nodes ranked at least the tier's last can be in it: the rule sees those.
                ranks = verdicts.rank[ok]
                floor = np.partition(ranks, len(ranks) - self.tier_width)[len(ranks) - self.tier_width]
                ok = ok[ranks >= floor]
                # Ties by `scoring.tie_key`, as the extender breaks them (not the run's seeded node order).
                names = cluster.nodes.names
                keys = [scoring.tie_key(names[i]) for i in idx[ok].tolist()]
                entries = list(zip(verdicts.rank[ok].tolist(), keys, strict=True))
                ok = ok[scoring.best_tier(entries, self.tier_width)]
            if len(ok) < len(idx):
                idx, verdicts = idx[ok], verdicts.take(ok)
            weight = self.config.extender_weight or 0
            extra = verdicts.score * weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        total = in_tree_scores(self.config, cluster, req, idx, self.replicas) + extra
        pos = select_host(total, rng)
        node = int(idx[pos])
        if req.num_gpu == 0:
            return Choice(node, {})
        chosen = verdicts.at(pos) if verdicts is not None else self.placer.verdicts(cluster, req, idx[pos : pos + 1]).at(0)
        if not chosen.feasible:
            return Choice(-1, [])
        step = MILLI // self.replicas
        return Choice(node, {g: n * step for g, n in enumerate(chosen.per_gpu) if n})
