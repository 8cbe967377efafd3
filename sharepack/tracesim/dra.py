"""The DRA mode under kube-scheduler: the scheduler's own first-fit allocator picks the devices,
with or without sharepack's extender ranking nodes.

What the model takes from the v1.37.2 source (see `common.draallocation` for the allocator):

* A pod's `nvidia.com/gpu.shared: N` becomes a claim of N devices of the shared DeviceClass
  (one device per replica, R = `--replicas` per GPU: with one multi-allocatable device per GPU
  instead, N devices would be N distinct GPUs and a share of several replicas could not land on
  one GPU). A whole-GPU pod asks `nvidia.com/gpu: k` of a whole-GPU DeviceClass
  (`--dra-whole gpu`, the default: k whole-GPU devices, which only fully free GPUs offer, the
  counter set keeping whole and shared use of a GPU apart), or as in the device-plugin rows
  (`--dra-whole replicas`: R replicas of the shared class per GPU, wherever first fit finds
  them; a claim holds at most 32 devices, so at R = 10 a pod of 4 or 8 GPUs is never
  allocated).
* The devices a node offers are met in its slice's order: `index` (a static slice, GPU-major by
  GPU index: what a driver that publishes its GPUs in order gives, and what the allocator's
  first fit then packs by), `packed` (republished with the fullest GPU first, which makes first
  fit the device-plugin mode's `packed` loop) or `fresh-first` (republished with the GPUs in
  no use first, then the fullest: the agent's `--dra-device-order=fresh-first`, deploy/dra's,
  `common.dradevices.fresh_first`). A republished order is the one before each pod: exact when
  the agent has prepared the node's last claim before the scheduler allocates the next.
* Node choice: the in-tree scores as `tracesim.kubescheduler` models them. The DynamicResources
  plugin scores (weight 2) only `firstAvailable` subrequests (`computeScore`), so it adds the
  same 0 to every node for an extended-resource claim; its filter is the allocator itself,
  which the model applies before the scores (a node where first fit fails is not feasible).
* `dra`: no extender (what a cluster with a DRA driver and no sharepack gets); `dra-<policy>`:
  sharepack's extender as deployed (the shipped KubeSchedulerConfiguration, `--filter-tier-width`,
  `--extender-pods`), ranking each node's first fit with `common.drascoring`.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from sharepack.common import dradevices, drascoring
from sharepack.common.draslices import Device, DeviceType, DraNode
from sharepack.common.podrequests import PodRequest
from sharepack.common.policies import NodePolicy, Policy
from sharepack.tracesim import kubescheduler, sharing
from sharepack.tracesim.baselines import Choice
from sharepack.tracesim.clusters import Cluster, Request
from sharepack.tracesim.errors import PolicyError
from sharepack.tracesim.fragmentation import IntArray
from sharepack.tracesim.kubescheduler import KubeScheduler, SchedulerConfig, Verdict
from sharepack.tracesim.sharing import ShareModel, SharedScorer

ALONE = "dra"
PREFIX = "dra-"


class DeviceOrder(StrEnum):
    INDEX = "index"
    PACKED = "packed"
    FRESH_FIRST = dradevices.FRESH_FIRST  # the agent's `--dra-device-order=fresh-first`


class WholeGpus(StrEnum):
    """How a whole-GPU pod asks under DRA."""

    REPLICAS = "replicas"  # R replicas of the shared class per GPU, as in the device-plugin rows
    GPU = "gpu"  # whole-GPU devices of their own class


def dra_node(allocated: list[int], replicas: int, order: DeviceOrder, *, whole: bool = True) -> DraNode:
    """A node as a DRA driver would publish it, from allocated replicas per GPU: with `whole`
    a whole-GPU device per GPU, then one device per replica, GPUs in `order`; a GPU's first
    replicas are the ones in use."""
    gpus = list(range(len(allocated)))
    if order is DeviceOrder.PACKED:
        gpus.sort(key=lambda g: (-allocated[g], sharing.gpu_key(g)))
    elif order is DeviceOrder.FRESH_FIRST:
        gpus = dradevices.fresh_first(gpus, dict(enumerate(allocated)))
    devices: list[Device] = []
    used: dict[str, int] = {}
    for g in gpus if whole else ():
        key = sharing.gpu_key(g)
        devices.append(Device(f"{key}-whole", key, g, "trace", DeviceType.GPU, False, 1, 1))
    for g in gpus:
        key = sharing.gpu_key(g)
        for r in range(replicas):
            name = f"{key}-{r}"
            devices.append(Device(name, key, g, "trace", DeviceType.SHARED, False, 1, 1))
            if r < allocated[g]:
                used[name] = 1
    return DraNode("trace", tuple(devices), used)


class DraScorer(SharedScorer):
    """Each node's verdict under DRA: feasible when the allocator's first fit succeeds, the
    replicas it takes per GPU, and (for a ranking extender) the node policy's score of that
    placement. A `kubescheduler.Extender`, memoised per node view as `SharedScorer`."""

    def __init__(
        self, policy: Policy | NodePolicy, replicas: int, order: DeviceOrder, whole: WholeGpus, *, gpu_models: bool = False
    ) -> None:
        # The request and the node view: shares in replicas, whole GPUs as `whole` says;
        # `gpu_models` as the kube rows' extender (the deployed one's typical workload names none).
        model = ShareModel.MILLI if whole is WholeGpus.GPU else ShareModel.REPLICAS
        super().__init__(policy, model, replicas, gpu_models=gpu_models)
        self.order = order

    def _score(self, alloc_row: IntArray, request: PodRequest, admitted: tuple[int, int] | None) -> Verdict:
        allocated = [int(a) for a in alloc_row if a >= 0]
        node = dra_node(allocated, self.replicas, self.order, whole=self.model is ShareModel.MILLI)
        state = sharing.node_view(allocated, self.model, self.replicas, self.policy)
        self.calls += 1
        result = drascoring.score_node(
            node, request, self.node_policy, workload=self.workload, admitted=admitted, state=state
        )
        per_gpu = [0] * len(allocated)
        for name, keys in result.placement.items():
            for key in keys:
                # A whole GPU counts as all its replicas (the cluster charges milli).
                per_gpu[int(key.removeprefix("gpu"))] += self.replicas if name == sharing.FULL else 1
        return Verdict(result.feasible, result.score, result.rank, tuple(per_gpu))


class DraScheduler:
    """A `Scorer`: the allocator's filter (first fit must succeed on the node), then
    kube-scheduler with or without the extender (`kubescheduler.KubeScheduler`)."""

    def __init__(self, allocator: DraScorer, scheduler: KubeScheduler) -> None:
        self.allocator = allocator  # the ranker when there is one: its feasibility is the allocator's
        self.scheduler = scheduler

    def __call__(self, cluster: Cluster, req: Request, idx: IntArray, rng: np.random.Generator) -> Choice:
        if req.num_gpu > 0:
            ok = self.allocator.verdicts(cluster, req, idx).feasible
            idx = idx[ok]
            if not len(idx):
                return Choice(-1, [])
        return self.scheduler(cluster, req, idx, rng)


def is_dra(name: str) -> bool:
    return name == ALONE or name.startswith(PREFIX)


def scheduler(
    name: str,
    *,
    config: SchedulerConfig,
    tier_width: int,
    replicas: int,
    order: DeviceOrder,
    whole: WholeGpus = WholeGpus.GPU,
    gpu_models: bool = False,
) -> DraScheduler:
    """`dra` (kube-scheduler's defaults, no extender) or `dra-<node policy>` (the extender as
    `config` deploys it)."""
    placer = DraScorer(Policy.PACKED, replicas, order, whole)
    if name == ALONE:
        return DraScheduler(
            placer,
            KubeScheduler(kubescheduler.KUBE_DEFAULT, extender=None, placer=placer, tier_width=0, replicas=replicas),
        )
    try:
        policy = NodePolicy(name.removeprefix(PREFIX))
    except ValueError:
        raise PolicyError(f"invalid --policy {name}: want {ALONE} or {PREFIX}<node policy>") from None
    if policy is NodePolicy.SPREAD:
        raise PolicyError(f"invalid --policy {name}: spread ranks nodes as distributed; use {PREFIX}distributed")
    ranker = DraScorer(policy, replicas, order, whole, gpu_models=gpu_models)
    return DraScheduler(
        ranker, KubeScheduler(config, extender=ranker, placer=placer, tier_width=tier_width, replicas=replicas)
    )


__all__ = [
    "ALONE",
    "PREFIX",
    "DeviceOrder",
    "WholeGpus",
    "DraScheduler",
    "DraScorer",
    "dra_node",
    "is_dra",
    "scheduler",
]
