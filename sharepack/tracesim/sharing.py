"""Our policies `packed` and `distributed` in the simulator, through the shared code (`ours`: fragaware.py).

`packed` and `distributed` rank nodes with `common.scoring.score_node`, unchanged, over a view of
each simulated node as the agent would publish it (`common.state.NodeState`) and each pod as the
extender would decode it (`common.podrequests.PodRequest`). Two models of a fractional share:

* `milli` (as the FGD study): a share stays on one GPU. Nodes are ranked over a replica view
  (R replicas per GPU; a GPU's allocated replicas = ceil(used milli x R / 1000); a share asks for
  ceil(milli x R / 1000) replicas of `nvidia.com/gpu.shared`, a whole-GPU pod for whole GPUs of
  `nvidia.com/gpu`, of which only fully free GPUs are available). On the chosen node the share
  goes to one GPU that fits: the fullest for `packed` (best fit), the emptiest for `distributed`.
* `replicas` (time-slicing as the agent does it): every GPU offers R replicas and nothing else;
  a pod takes ceil(milli x R / 1000) replicas per GPU requested, and the node's own greedy loop
  (`common.allocation.pick_gpus`, as predicted by `score_node`) decides which GPUs give them.
  A whole-GPU pod takes R replicas per GPU it asks for, wherever the loop finds them: there is no
  exclusive GPU in a time-sliced resource. Allocation counts what pods asked for; the rounding up
  to whole replicas is idle capacity nobody else can use, and shows as unallocated.

Node ties go to the scheduler's node order, as for the study's policies. Score calls are
memoised per (node view, request shape): most nodes share a handful of states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from sharepack.common import fragmentation, scoring
from sharepack.common.podrequests import ContainerKind, ContainerRequest, PodRequest
from sharepack.common.policies import MigStrategy, NodePolicy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.tracesim.baselines import Choice, best_fit_gpu, pick_top
from sharepack.tracesim.clusters import MAX_GPUS, Cluster, Request
from sharepack.tracesim.errors import PolicyError
from sharepack.tracesim import fragaware
from sharepack.tracesim.fragmentation import FragModel, IntArray
from sharepack.tracesim.kubescheduler import Verdict, Verdicts
from sharepack.tracesim.traces import MILLI

FULL = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
DEFAULT_REPLICAS = 10


class ShareModel(StrEnum):
    MILLI = "milli"
    REPLICAS = "replicas"


def replicas_for(milli: int, replicas: int) -> int:
    """Replicas a share of `milli` needs when a GPU is cut into `replicas`."""
    return math.ceil(milli * replicas / MILLI)


def check_replicas(replicas: int) -> None:
    if not 1 <= replicas <= 100 or MILLI % replicas:
        raise PolicyError(f"invalid --replicas {replicas}: expected a divisor of 1000 in 1..100")


def pod_request(req: Request, model: ShareModel, replicas: int) -> PodRequest:
    """The pod as the extender decodes it: one app container asking for devices."""
    if req.num_gpu == 0:
        amounts: tuple[tuple[str, int], ...] = ()
    elif model is ShareModel.REPLICAS:
        amounts = ((SHARED, req.num_gpu * replicas_for(req.milli, replicas)),)
    elif req.shared:
        amounts = ((SHARED, replicas_for(req.milli, replicas)),)
    else:
        amounts = ((FULL, req.num_gpu),)
    return PodRequest(
        uid=f"pod-{req.index}",
        namespace="trace",
        name=f"pod-{req.index}",
        containers=(ContainerRequest("main", ContainerKind.APP, amounts),),
    )


def gpu_key(index: int) -> str:
    return f"gpu{index}"  # one digit: keys sort in index order, as the loop's tie-break wants


def node_view(allocated: list[int], model: ShareModel, replicas: int, policy: Policy) -> NodeState:
    """A node as its agent would publish it, from allocated replicas per GPU."""
    shared = tuple(
        GpuState(key=gpu_key(i), index=str(i), product="trace", total=replicas, allocated=a, unhealthy=0)
        for i, a in enumerate(allocated)
    )
    resources = [ResourceState(SHARED, Sharing.TIME_SLICING, False, shared)]
    if model is ShareModel.MILLI:
        full = tuple(
            GpuState(key=gpu_key(i), index=str(i), product="trace", total=1, allocated=int(a > 0), unhealthy=0)
            for i, a in enumerate(allocated)
        )
        resources.insert(0, ResourceState(FULL, Sharing.NONE, False, full))
    return NodeState(
        observed_at="",
        agent_version="tracesim",
        allocation_policy=policy,
        mig_strategy=MigStrategy.NONE,
        resources=tuple(resources),
    )


@dataclass(frozen=True, slots=True)
class _FragContext:
    """What `fragaware` knows of a trace's nodes beyond their GPUs: the typical workload (with
    CPU; the study's shapes carry no memory), the GPU models' admitted shapes, and the CPU
    thresholds at which a node starts or stops admitting a shape."""

    model: FragModel
    workload: fragmentation.TypicalWorkload
    access: list[int]  # per node: shapes its GPU model admits (bit mask)
    access_kind: IntArray  # per node: which distinct `access` mask it has
    kinds: int
    thresholds: IntArray  # sorted distinct shape CPU requests

    @classmethod
    def build(cls, model: FragModel, *, gpu_models: bool = True) -> _FragContext:
        workload = fragaware.common_workload(model)
        assert all(s.memory == 0 for s in workload.shapes), "admitted classes assume no memory per shape"
        # Each node's GPU model as the extender knows it (its label), through the extender's
        # own rule (`Fragmentation.access`); without `gpu_models` every node admits every shape
        # by its model, as an extender that knows no node's model would see them.
        measure = fragmentation.measure_for(workload)
        access = [measure.access(m if gpu_models else None) for m in model.node_model]
        distinct = {m: i for i, m in enumerate(dict.fromkeys(access))}
        kind = np.array([distinct[m] for m in access], dtype=np.int64)
        thresholds = np.unique(np.array([s.cpu for s in workload.shapes], dtype=np.int64))
        return cls(model, workload, access, kind, len(distinct), thresholds)


class SharedScorer:
    """`packed` / `distributed` / `fragaware` through `common.scoring.score_node`, memoised.

    As a `Scorer` (the study's scheduler model) it ranks nodes by their 0..10 score, ties by
    node order; as a `kubescheduler.Extender` it gives each node's verdict (feasible, score,
    fine rank, predicted placement) for the kube-scheduler model to choose from.
    """

    def __init__(
        self,
        policy: Policy | NodePolicy,
        model: ShareModel,
        replicas: int,
        *,
        directed: bool = False,
        gpu_models: bool = True,
    ) -> None:
        check_replicas(replicas)
        self.node_policy = policy
        # The agents' allocation policy: `fragaware` ranks nodes, the node packs its GPUs.
        self.policy = Policy.PACKED if policy == NodePolicy.FRAGAWARE else Policy(policy)
        self.model = model
        self.replicas = replicas
        self.workload: fragmentation.TypicalWorkload | None = None  # `fragaware`: the trace's
        self.directed = directed
        self.gpu_models = gpu_models  # the CPU-aware policies know which GPU models a shape allows
        self._memo: dict[tuple[int, int, str], Verdict] = {}
        self._ctx: _FragContext | None = None
        self.calls = 0

    @property
    def cpu_aware(self) -> bool:
        """`fragaware` and `packed` rank with the node's CPU and memory (`common.stranding`)."""
        return self.node_policy in (NodePolicy.FRAGAWARE, NodePolicy.PACKED)

    def allocated(self, cluster: Cluster, idx: IntArray) -> IntArray:
        """Allocated replicas per GPU ([len(idx), 8]); absent GPUs as -1."""
        used = MILLI - cluster.gpu_left[idx]
        alloc = -((-used * self.replicas) // MILLI)  # ceil
        out: IntArray = np.where(cluster.present[idx], alloc, -1)
        return out

    def _signature(self, alloc: IntArray) -> IntArray:
        base = self.replicas + 2
        weights = base ** np.arange(MAX_GPUS, dtype=np.int64)
        out: IntArray = (alloc + 1) @ weights
        return out

    def _score(self, alloc_row: IntArray, request: PodRequest, admitted: tuple[int, int] | None) -> Verdict:
        allocated = [int(a) for a in alloc_row if a >= 0]
        state = node_view(allocated, self.model, self.replicas, self.policy)
        self.calls += 1
        result = scoring.score_node(
            state, request, self.node_policy, workload=self.workload, admitted=admitted, directed=self.directed
        )
        per_gpu = [0] * len(allocated)
        for keys in result.placement.values():
            for key in keys:
                per_gpu[int(key.removeprefix("gpu"))] += 1
        return Verdict(result.feasible, result.score, result.rank, tuple(per_gpu))

    def _context(self, cluster: Cluster) -> _FragContext:
        ctx = self._ctx
        if ctx is None or ctx.model is not cluster.model:
            # The trace's typical workload (with CPU), as `ours` uses it; a new trace, new memo.
            ctx = self._ctx = _FragContext.build(cluster.model, gpu_models=self.gpu_models)
            self.workload = ctx.workload
            self._memo.clear()
        return ctx

    def _admitted_class(self, cluster: Cluster, req: Request, idx: IntArray) -> IntArray:
        """Per node, a number that is equal for nodes admitting the same typical shapes before
        and after the pod (the CPU-aware policies only; 0 for the others)."""
        if not self.cpu_aware:
            return np.zeros(len(idx), dtype=np.int64)
        ctx = self._context(cluster)
        n = len(ctx.thresholds) + 1
        before = np.searchsorted(ctx.thresholds, cluster.cpu_left[idx], side="right")
        after = np.searchsorted(ctx.thresholds, cluster.cpu_left[idx] - req.cpu, side="right")
        out: IntArray = ((before * n + after) * ctx.kinds + ctx.access_kind[idx]).astype(np.int64)
        return out

    def _admitted(self, cluster: Cluster, req: Request, node: int) -> tuple[int, int] | None:
        """The typical shapes `node` admits before and after the pod (GPU model, CPU and memory
        left, by `common.fragmentation`'s rule), for the CPU-aware policies; None for the others."""
        if not self.cpu_aware:
            return None
        ctx = self._context(cluster)
        measure = fragmentation.measure_for(ctx.workload)
        cpu, mem = int(cluster.cpu_left[node]), int(cluster.mem_left[node])
        access = ctx.access[node]
        return access & measure.admitted(cpu, mem), access & measure.admitted(cpu - req.cpu, mem - req.memory)

    def verdicts(self, cluster: Cluster, req: Request, idx: IntArray) -> Verdicts:
        """Each node's verdict; nodes alike (same GPU counts, same admitted shapes) share one."""
        request = pod_request(req, self.model, self.replicas)
        alloc = self.allocated(cluster, idx)
        sig, cls = self._signature(alloc), self._admitted_class(cluster, req, idx)
        span = int(cls.max()) + 1 if len(cls) else 1
        if len(sig) and int(sig.max()) < (1 << 62) // span:
            # One int64 key per node (much faster to unique than rows), split again below.
            uniq_keys, first, inverse = np.unique(sig * span + cls, return_index=True, return_inverse=True)
            uniq = np.stack([uniq_keys // span, uniq_keys % span], axis=1)
        else:
            uniq, first, inverse = np.unique(np.stack([sig, cls], axis=1), axis=0, return_index=True, return_inverse=True)
        memo = self._memo
        shape = request.shape
        out = []
        for (sig_u, cls_u), i in zip(uniq.tolist(), first.tolist(), strict=True):
            key = (sig_u, cls_u, shape)
            hit = memo.get(key)
            if hit is None:
                hit = memo[key] = self._score(alloc[i], request, self._admitted(cluster, req, int(idx[i])))
            out.append(hit)
        return Verdicts(out, inverse.reshape(-1).astype(np.int64))

    def __call__(self, cluster: Cluster, req: Request, idx: IntArray, rng: np.random.Generator) -> Choice:
        v = self.verdicts(cluster, req, idx)
        scores = np.where(v.feasible, v.score, -1)
        if self.model is ShareModel.REPLICAS:
            ok = scores >= 0
            if not ok.any():
                return Choice(-1, [])
            idx, scores, v = idx[ok], scores[ok], v.take(np.flatnonzero(ok))
        node = pick_top(cluster, idx, scores)
        if self.model is ShareModel.MILLI:
            return Choice(node, self._one_gpu(cluster, node, req))
        chosen = v.at(int(np.flatnonzero(idx == node)[0]))
        step = MILLI // self.replicas
        return Choice(node, {g: n * step for g, n in enumerate(chosen.per_gpu) if n})

    def _one_gpu(self, cluster: Cluster, node: int, req: Request) -> list[int]:
        if not req.shared or self.policy is Policy.PACKED:
            return best_fit_gpu(cluster, node, req)
        row = cluster.gpu_left[node]
        return [int(np.where(row >= req.milli, row, -1).argmax())]


def replica_feasible(cluster: Cluster, req: Request, idx: IntArray, replicas: int) -> IntArray:
    """In the replica model a pod needs free replicas on the node, not a GPU with room for its share."""
    need = req.num_gpu * replicas_for(req.milli, replicas)
    free = (cluster.gpu_left[idx] * replicas) // MILLI
    out: IntArray = idx[free.sum(axis=1) >= need]
    return out


def shared_scorer(
    name: str, model: ShareModel, replicas: int, *, directed: bool = False, gpu_models: bool = True
) -> SharedScorer:
    policy = NodePolicy(name)
    if policy is NodePolicy.SPREAD:
        raise PolicyError("invalid policy spread: it ranks nodes as distributed; use distributed")
    return SharedScorer(policy, model, replicas, directed=directed, gpu_models=gpu_models)
