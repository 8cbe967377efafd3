"""Run policies x seeds over one trace: the study's protocol, end to end."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sharepack.tracesim import metrics, policies, replaying, workloads
from sharepack.tracesim.errors import PolicyError
from sharepack.tracesim.fragmentation import FragModel
from sharepack.tracesim.policies import PolicySpec
from sharepack.tracesim.sharing import ShareModel
from sharepack.tracesim.reporting import Run
from sharepack.tracesim.traces import NodeList, PodList

FIRST_SEED = 42  # the study's seeds are 42..51

Report = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Experiment:
    pods: PodList
    nodes: NodeList
    frag_model: FragModel

    @classmethod
    def build(cls, pods: PodList, nodes: NodeList) -> Experiment:
        typical = workloads.typical_workload(pods)
        return cls(pods, nodes, FragModel.build(typical, nodes))

    def run(self, spec: PolicySpec, seed: int, progress: replaying.Progress | None = None) -> Run:
        order = workloads.arrival_order(self.pods, self.nodes, seed)
        result = replaying.replay(self.pods, self.nodes, self.frag_model, spec, seed=seed, order=order, progress=progress)
        return Run(result, metrics.bin_run(result))


def run_all(
    experiment: Experiment,
    specs: Sequence[PolicySpec],
    seeds: Sequence[int],
    report: Report | None = None,
    live: Callable[[str], None] | None = None,
) -> dict[str, list[Run]]:
    """Runs per policy label, in the order given; `report` gets one line per finished run."""
    out: dict[str, list[Run]] = {}
    total = len(specs) * len(seeds)
    done = 0
    for spec in specs:
        for seed in seeds:
            label = f"[{done + 1}/{total}] {spec.label} seed {seed}"

            def tick(i: int, n: int, label: str = label) -> None:
                if live is not None:
                    live(f"{label}: {100 * i // n}%")

            run = experiment.run(spec, seed, progress=tick)
            done += 1
            out.setdefault(spec.label, []).append(run)
            if report is not None:
                report(
                    f"{label}: {run.binned.unallocated(100):.2f}% unallocated at 100% arrived "
                    f"({run.result.seconds:.1f} s)"
                )
    return out


def default_specs(
    names: Sequence[str],
    model: str,
    replicas: int,
    scheduler: policies.SchedulerModel | None = None,
    kube: policies.KubeOptions | None = None,
) -> list[PolicySpec]:
    """Specs for `names`; `model` "both" runs packed/distributed in the milli and replica
    models under the study's scheduler (the kube model runs every policy in replicas)."""
    kube = kube or policies.KubeOptions()
    specs: list[PolicySpec] = []
    for name in names:
        sched = scheduler or policies.default_model(name)
        if sched is policies.SchedulerModel.KUBE:
            if model == "milli":
                raise PolicyError(f"invalid --share-model milli for {name} with --scheduler-model kube: "
                                  "the kube model counts GPUs as the device plugin does, in replicas")  # fmt: skip
            specs.append(policies.resolve(name, replicas=replicas, scheduler=sched, kube=kube))
        elif name in ("packed", "distributed", "fragaware") and model == "both":
            specs.append(policies.resolve(name, model=ShareModel.MILLI, replicas=replicas, scheduler=sched))
            specs.append(policies.resolve(name, model=ShareModel.REPLICAS, replicas=replicas, scheduler=sched))
        else:
            share = ShareModel(model if model != "both" else "milli")
            specs.append(policies.resolve(name, model=share, replicas=replicas, scheduler=sched))
    return specs
