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

from common import scoring
from common.podrequests import ContainerKind, ContainerRequest, PodRequest
from common.policies import MigStrategy, Policy, Sharing
from common.state import GpuState, NodeState, ResourceState
from tracesim.baselines import Choice, Scorer, best_fit_gpu, pick_top
from tracesim.clusters import MAX_GPUS, Cluster, Request
from tracesim.errors import PolicyError
from tracesim.fragmentation import IntArray
from tracesim.traces import MILLI

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
class Scored:
    feasible: bool
    score: int
    per_gpu: tuple[int, ...]  # replicas the pod takes from each GPU (index order)


class SharedScorer:
    """`packed` / `distributed` through `common.scoring.score_node`, memoised."""

    def __init__(self, policy: Policy, model: ShareModel, replicas: int) -> None:
        check_replicas(replicas)
        self.policy = policy
        self.model = model
        self.replicas = replicas
        self._memo: dict[tuple[int, str], Scored] = {}
        self.calls = 0

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

    def _score(self, alloc_row: IntArray, request: PodRequest) -> Scored:
        allocated = [int(a) for a in alloc_row if a >= 0]
        state = node_view(allocated, self.model, self.replicas, self.policy)
        self.calls += 1
        result = scoring.score_node(state, request, self.policy)
        per_gpu = [0] * len(allocated)
        for keys in result.placement.values():
            for key in keys:
                per_gpu[int(key.removeprefix("gpu"))] += 1
        return Scored(result.feasible, result.score, tuple(per_gpu))

    def __call__(self, cluster: Cluster, req: Request, idx: IntArray, rng: np.random.Generator) -> Choice:
        request = pod_request(req, self.model, self.replicas)
        alloc = self.allocated(cluster, idx)
        sigs = self._signature(alloc)
        results = []
        for row, sig in zip(alloc, sigs, strict=True):
            key = (int(sig), request.shape)
            hit = self._memo.get(key)
            if hit is None:
                hit = self._memo[key] = self._score(row, request)
            results.append(hit)
        scores = np.array([r.score if r.feasible else -1 for r in results], dtype=np.int64)
        if self.model is ShareModel.REPLICAS:
            ok = scores >= 0
            if not ok.any():
                return Choice(-1, [])
            idx, scores = idx[ok], scores[ok]
            results = [r for r, good in zip(results, ok, strict=True) if good]
        node = pick_top(cluster, idx, scores)
        if self.model is ShareModel.MILLI:
            return Choice(node, self._one_gpu(cluster, node, req))
        chosen = results[int(np.flatnonzero(idx == node)[0])]
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


def shared_scorer(name: str, model: ShareModel, replicas: int) -> Scorer:
    policy = Policy(name)
    if policy is Policy.SPREAD:
        raise PolicyError("invalid policy spread: it ranks nodes as distributed; use distributed")
    return SharedScorer(policy, model, replicas)
