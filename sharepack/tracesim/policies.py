"""Policy names on the command line and in the CSV's `sc_policy` column, and what runs them.

Two scheduler models (`--scheduler-model`):

* `study`: the FGD study's scheduler fork, score ties by a seeded node order; the study's
  policies and `ours` run only here (that is how they were calibrated).
* `kube`: kube-scheduler as deployed (`tracesim.kubescheduler`): in-tree scores plus the
  extender's, a seeded uniform choice among the best. The default for our extender policies
  (`packed`, `distributed`, `fragaware`) and the only model of the baselines users have without
  sharepack (`kube-default`, `kube-binpack`). All of them run in the replica model there, as
  the agent (and the upstream device plugin) allocate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from sharepack.common import scoring, shipped
from sharepack.common.policies import NodePolicy
from sharepack.tracesim import baselines, dra, fragaware, kubescheduler, sharing
from sharepack.tracesim.baselines import Scorer
from sharepack.tracesim.errors import PolicyError
from sharepack.tracesim.kubescheduler import SchedulerConfig
from sharepack.tracesim.sharing import ShareModel

STUDY = tuple(baselines.BASELINES)  # random, dotprod, clustering, packing, bestfit, fgd
EXTENDER = ("packed", "distributed", NodePolicy.FRAGAWARE.value)  # what the extender runs
KUBE_BASELINES = {"kube-default": kubescheduler.KUBE_DEFAULT, "kube-binpack": kubescheduler.KUBE_BINPACK}
# Exactly what deploy/ ships (`common.shipped`, deploy/scheduler's configuration), whatever the
# kube-model flags say: the configuration the README's headline figures are of.
SHIPPED = "shipped"
OURS = ("packed", "distributed", fragaware.NAME, NodePolicy.FRAGAWARE.value, SHIPPED)
# The DRA mode (`tracesim.dra`): the scheduler's first fit alone, and with our extender ranking;
# `dra-shipped`: exactly what deploy/dra ships (`common.shipped`), whatever the kube-model flags say.
DRA_SHIPPED = dra.PREFIX + SHIPPED
DRA = (dra.ALONE, *(dra.PREFIX + p for p in EXTENDER), DRA_SHIPPED)
NAMES = STUDY + OURS + tuple(KUBE_BASELINES) + DRA


class SchedulerModel(StrEnum):
    KUBE = "kube"
    STUDY = "study"


@dataclass(frozen=True, slots=True)
class KubeOptions:
    """How our extender is deployed in the kube model."""

    config: SchedulerConfig = kubescheduler.SHAREPACK
    tier_width: int = scoring.DEFAULT_TIER_WIDTH  # the extender's --filter-tier-width
    # GPUs as the extender chose them (directed allocation, on as shipped), not the agent's loop.
    directed: bool = shipped.DIRECTED_GPUS
    # The CPU-aware ranks know each node's GPU model and which models each typical shape allows
    # (the extender reads the node's `nvidia.com/gpu.product` label, `common.gpumodels`).
    gpu_models: bool = True
    dra_order: dra.DeviceOrder = dra.DeviceOrder.INDEX  # the DRA mode: the order of a node's devices
    dra_whole: dra.WholeGpus = dra.WholeGpus.GPU  # the DRA mode: how whole-GPU pods ask


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str  # as written in the CSV's sc_policy column
    scorer: Scorer
    replicas: int | None = None  # set: the replica model (feasibility and charging in replicas)
    model: SchedulerModel = field(default=SchedulerModel.STUDY)

    @property
    def label(self) -> str:
        if self.replicas is None or self.model is SchedulerModel.KUBE:
            return self.name
        return f"{self.name}@r{self.replicas}"


def default_model(name: str) -> SchedulerModel:
    return SchedulerModel.STUDY if name in STUDY or name == fragaware.NAME else SchedulerModel.KUBE


def resolve(
    name: str,
    *,
    model: ShareModel = ShareModel.MILLI,
    replicas: int = sharing.DEFAULT_REPLICAS,
    scheduler: SchedulerModel | None = None,
    kube: KubeOptions = KubeOptions(),
    label: str | None = None,
) -> PolicySpec:
    """`name` under `scheduler` (default: `default_model`); the study's policies and `ours`
    exist only in the study's scheduler and share models, the kube baselines only in the kube
    model; under it every policy runs in the replica model."""
    if name not in NAMES:
        raise PolicyError(f"invalid --policy {name}: expected one of {', '.join(NAMES)}")
    scheduler = scheduler or default_model(name)
    if name == SHIPPED:
        if scheduler is not SchedulerModel.KUBE:
            raise PolicyError(f"invalid --policy {name} with --scheduler-model {scheduler}: it runs only in the kube model")
        kube = KubeOptions(kubescheduler.SHAREPACK, shipped.FILTER_TIER_WIDTH, shipped.DIRECTED_GPUS, gpu_models=True)
        return resolve(str(shipped.NODE_POLICY), replicas=replicas, scheduler=scheduler, kube=kube, label=SHIPPED)
    if name == DRA_SHIPPED:
        if scheduler is not SchedulerModel.KUBE:
            raise PolicyError(f"invalid --policy {name} with --scheduler-model {scheduler}: it runs only in the kube model")
        # deploy/dra: deploy/scheduler's configuration and base's tier, the agents' device order
        # (`--dra-device-order`), whole-GPU pods on whole-GPU devices (the model's default).
        kube = KubeOptions(
            kubescheduler.SHAREPACK, shipped.FILTER_TIER_WIDTH, shipped.DIRECTED_GPUS, gpu_models=False,
            dra_order=dra.DeviceOrder(shipped.DRA_DEVICE_ORDER), dra_whole=dra.WholeGpus.GPU,
        )  # fmt: skip
        spec = resolve(dra.PREFIX + str(shipped.DRA_NODE_POLICY), replicas=replicas, scheduler=scheduler, kube=kube)
        return PolicySpec(DRA_SHIPPED, spec.scorer, spec.replicas, spec.model)
    if scheduler is SchedulerModel.KUBE and dra.is_dra(name):
        sharing.check_replicas(replicas)
        allocating = dra.scheduler(
            name,
            config=kube.config,
            tier_width=kube.tier_width,
            replicas=replicas,
            order=kube.dra_order,
            whole=kube.dra_whole,
            gpu_models=kube.gpu_models,
        )
        return PolicySpec(name, allocating, replicas, SchedulerModel.KUBE)
    if scheduler is SchedulerModel.KUBE:
        if name not in EXTENDER and name not in KUBE_BASELINES:
            raise PolicyError(f"invalid --policy {name} with --scheduler-model kube: it runs only in the study model")
        sharing.check_replicas(replicas)
        # kube-scheduler alone: the upstream device plugin on the node, allocating as the
        # agents do as shipped (`packed`).
        placer = sharing.shared_scorer(str(shipped.AGENT_POLICY), ShareModel.REPLICAS, replicas)
        if name in KUBE_BASELINES:
            scorer = kubescheduler.KubeScheduler(
                KUBE_BASELINES[name], extender=None, placer=placer, tier_width=0, replicas=replicas
            )
        else:
            extender = sharing.shared_scorer(
                name, ShareModel.REPLICAS, replicas, directed=kube.directed, gpu_models=kube.gpu_models
            )
            scorer = kubescheduler.KubeScheduler(
                kube.config, extender=extender, placer=placer, tier_width=kube.tier_width, replicas=replicas
            )
        return PolicySpec(label or name, scorer, replicas, SchedulerModel.KUBE)
    if name in KUBE_BASELINES or dra.is_dra(name):
        raise PolicyError(f"invalid --policy {name} with --scheduler-model study: it runs only in the kube model")
    if name in baselines.BASELINES:
        return PolicySpec(name, baselines.BASELINES[name])
    if name == fragaware.NAME:
        return PolicySpec(name, fragaware.FragAwareScorer())
    shared = sharing.shared_scorer(name, model, replicas)
    return PolicySpec(name, shared, replicas if model is ShareModel.REPLICAS else None)
