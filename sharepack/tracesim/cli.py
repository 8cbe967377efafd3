"""`sharepack-simulate`: replay a GPU pod trace against placement policies and report fragmentation.

(Entered through tracesim.__main__, which first checks that the `sim` extra is installed.)

With no arguments it replays the built-in default trace (Alibaba cluster-trace-gpu-v2023,
openb_pod_list_default on the 1,213 GPU nodes) with every policy over the study's ten seeds, and
writes `tracesim-results.csv` (plus `_frag`, `_frag_ratio`, `_free_gpus` and `_failed` CSVs) and
`tracesim-allocation.png`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sharepack.common import scoring, shipped
from sharepack.common.errors import SharepackError
from sharepack.tracesim import dra, kubescheduler, policies, reporting, running, sharing, traces, workloads
from sharepack.tracesim.errors import PolicyError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sharepack-simulate",
        description="Replay a GPU pod trace (FGD study protocol) and measure GPU fragmentation per policy.",
    )
    p.add_argument("--pods", type=Path, help="pod list CSV (default: built-in openb_pod_list_default.csv)")
    p.add_argument("--nodes", type=Path, help="node list CSV (default: built-in openb_node_list_gpu_node.csv)")
    p.add_argument(
        "--policy",
        default=",".join(policies.NAMES),
        help=f"comma-separated policies (default: all): {', '.join(policies.NAMES)}",
    )
    p.add_argument("--seeds", type=int, default=10, help="number of seeds, from 42 as the study (default: 10)")
    p.add_argument("--first-seed", type=int, default=running.FIRST_SEED, help=argparse.SUPPRESS)
    p.add_argument(
        "--replicas",
        type=int,
        default=sharing.DEFAULT_REPLICAS,
        help="time-slicing replicas per GPU for packed/distributed (a divisor of 1000; default: 10)",
    )
    p.add_argument(
        "--share-model",
        choices=("milli", "replicas", "both"),
        default="both",
        help="how packed/distributed model a fractional share: on one GPU (milli), as replicas, or both (default)",
    )
    p.add_argument(
        "--scheduler-model",
        choices=[m.value for m in policies.SchedulerModel],
        default=None,
        help="kube: kube-scheduler's scores plus the extender's, random among the best (default for "
        "packed, distributed, fragaware, kube-default, kube-binpack); study: the FGD study's scheduler, "
        "ties by node order (default for the study's policies and ours)",
    )
    p.add_argument(
        "--filter-tier-width",
        type=int,
        default=scoring.DEFAULT_TIER_WIDTH,
        help="kube model: the extender's filter passes this many best nodes by its rank, 0 all (default: %(default)s)",
    )
    p.add_argument(
        "--directed",
        action=argparse.BooleanOptionalAction,
        default=shipped.DIRECTED_GPUS,
        help="kube model: the GPUs the extender chose, not the node agent's own choice (directed allocation, "
        "as the extender's --directed-gpus; default: on, as shipped)",
    )
    p.add_argument(
        "--gpu-models",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="kube model: the CPU-aware ranks know each node's GPU model and which models each typical "
        "shape allows, as the extender does from the nodes' nvidia.com/gpu.product label (default: on)",
    )
    p.add_argument(
        "--dra-order",
        choices=[o.value for o in dra.DeviceOrder],
        default=dra.DeviceOrder.INDEX.value,
        help="the DRA policies: the order of a node's devices in its ResourceSlice, which the scheduler's "
        "first-fit allocator follows: index (static, GPU by GPU), packed (republished fullest GPU first) or "
        "fresh-first (republished, GPUs in no use first, then the fullest: deploy/dra's agents, which "
        "dra-shipped always uses) (default: %(default)s)",
    )
    p.add_argument(
        "--dra-whole",
        choices=[w.value for w in dra.WholeGpus],
        default=dra.WholeGpus.GPU.value,
        help="the DRA policies: a whole-GPU pod asks R replicas per GPU as in the other rows (replicas; "
        "a claim holds at most 32 devices) or whole-GPU devices of their own class (gpu) (default: %(default)s)",
    )
    p.add_argument(
        "--extender-pods",
        choices=("gpu", "all"),
        default=None,
        help="kube model: which pods reach the extender: gpu (those requesting a managed resource, "
        "as the scheduler configuration lists them) or all (a configuration without managedResources)",
    )
    p.add_argument(
        "--scheduler-config",
        type=Path,
        help="kube model: KubeSchedulerConfiguration of the sharepack pipeline (default: built in, "
        "as deploy/scheduler/kube-scheduler-config.yaml)",
    )
    p.add_argument("--csv", type=Path, default=Path("tracesim-results.csv"), help="CSV output (default: %(default)s)")
    p.add_argument("--plot", type=Path, default=Path("tracesim-allocation.png"), help="PNG output (default: %(default)s)")
    p.add_argument("--published", type=Path, help="the study's cached results CSV to compare with (default: built-in means)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def kube_config(config: kubescheduler.SchedulerConfig, extender_pods: str | None) -> kubescheduler.SchedulerConfig:
    if extender_pods is None:
        return config
    return dataclasses.replace(config, extender_all_pods=extender_pods == "all")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    err = sys.stderr

    def report(line: str) -> None:
        if not args.quiet:
            print(line, file=err, flush=True)

    def live(line: str) -> None:
        if not args.quiet and err.isatty():
            print(f"\r{line}   ", end="", file=err, flush=True)

    try:
        if args.seeds < 1:
            raise PolicyError(f"invalid --seeds {args.seeds}: expected at least 1")
        names = [n.strip() for n in args.policy.split(",") if n.strip()]
        if not names:
            raise PolicyError("invalid --policy: no policy named")
        sharing.check_replicas(args.replicas)
        if args.filter_tier_width < 0:
            raise PolicyError(f"invalid --filter-tier-width {args.filter_tier_width}: expected 0 (off) or more")
        config = kubescheduler.SHAREPACK
        if args.scheduler_config is not None:
            config = kubescheduler.load_config(args.scheduler_config)
        kube = policies.KubeOptions(
            kube_config(config, args.extender_pods),
            args.filter_tier_width,
            args.directed,
            gpu_models=args.gpu_models,
            dra_order=dra.DeviceOrder(args.dra_order),
            dra_whole=dra.WholeGpus(args.dra_whole),
        )
        model = None if args.scheduler_model is None else policies.SchedulerModel(args.scheduler_model)
        specs = running.default_specs(names, args.share_model, args.replicas, model, kube)
        pods = traces.load_pods(args.pods)
        nodes = traces.load_nodes(args.nodes)
        workload = traces.workload_name(pods)
        report(f"trace {pods.source}: {len(pods)} pods; {nodes.source}: {len(nodes)} nodes, {nodes.total_gpus} GPUs")
        experiment = running.Experiment.build(pods, nodes)
        report(f"typical workload: {len(experiment.frag_model.freq)} pod shapes")
        published = reporting.load_published(workload, args.published)  # before the runs: fail fast
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        results = running.run_all(experiment, specs, seeds, report=report, live=live)
        summaries = [reporting.summarise(label, runs, published) for label, runs in results.items()]
        print(f"{workload}: {len(seeds)} seed(s), tune {workloads.TUNE_RATIO}")
        print(reporting.table(summaries))
        print()
        print(reporting.failures_table(results))
        # Paired against what users have without us (kube model), or against FGD (study model).
        baselines = [b for b in (*policies.KUBE_BASELINES, dra.ALONE) if b in results] or [b for b in ("fgd",) if b in results]
        if baselines and len(results) > len(baselines):
            print()
            print(reporting.paired_table(results, baselines))
        all_runs = [run for runs in results.values() for run in runs]
        written = reporting.write_csvs(args.csv, workload, all_runs)
        curves = {label: np.nanmean([r.binned.allocation for r in runs], axis=0) for label, runs in results.items()}
        written.append(reporting.plot(args.plot, workload, curves, published))
        report("wrote " + ", ".join(str(p) for p in written))
    except SharepackError as e:
        print(f"sharepack-simulate: {e}", file=err)
        return 2
    except OSError as e:
        print(f"sharepack-simulate: cannot write output: {e}", file=err)
        return 2
    return 0

