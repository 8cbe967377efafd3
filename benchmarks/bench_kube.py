"""The kube-model table of README.md and sharepack/tracesim/README.md: sharepack's policies against the
baselines users have without it, on the study's five traces, under the kube-scheduler model.

    .venv/bin/python benchmarks/bench_kube.py --traces $TRACE --seeds 10       # the table (long)
    .venv/bin/python benchmarks/bench_kube.py --seeds 2 --workloads default    # a quick look

`$TRACE`: the trace's `csv/` folder (the default trace is built in). Prints one markdown row per
workload: unallocated GPU % at 100 % arrived (mean of the seeds) per policy, then each of our
policies minus each baseline, paired by seed, with its standard error; then seconds per run, and
the same as a multiple of a fixed pure-Python loop timed in this process (the machine is shared).
Extra `sharepack-simulate` flags (`--filter-tier-width 0`, `--directed`, ...) pass through
`--simulate-args`, so a variant is one command too.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sharepack.tracesim import kubescheduler, policies, reporting, running, traces  # noqa: E402
from sharepack.tracesim.cli import _parser, kube_config  # noqa: E402

# The same yardstick as the calibration benchmark, so their ratios compare.
from bench_tracesim import baseline_loop  # noqa: E402  (benchmarks/ is sys.path[0] when run)

WORKLOADS = ("default", "cpu250", "gpushare100", "multigpu50", "gpuspec33")
BASELINES = ("kube-default", "kube-binpack")
OURS = ("shipped", "fragaware")  # shipped: exactly deploy/'s configuration (`--policy shipped`)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--traces", type=Path, help="the trace's csv/ folder (needed for workloads other than default)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--other-seeds", type=int, help="seeds for the workloads other than default (default: --seeds)")
    p.add_argument("--simulate-args", default="", help="sharepack-simulate flags for our policies' kube model")
    p.add_argument("--ours", default=",".join(OURS), help="our policies to run (default: %(default)s)")
    args = p.parse_args()
    ours = tuple(n for n in args.ours.split(",") if n)
    sim = _parser().parse_args(["--scheduler-model", "kube", *shlex.split(args.simulate_args)])
    config = kube_config(kubescheduler.SHAREPACK, sim.extender_pods)
    kube = policies.KubeOptions(config, tier_width=sim.filter_tier_width, directed=sim.directed, gpu_models=sim.gpu_models)
    names = BASELINES + ours
    specs = running.default_specs(names, "replicas", sim.replicas, policies.SchedulerModel.KUBE, kube)
    yardstick = baseline_loop()
    pairs = [(o, b) for o in ours for b in BASELINES]
    print(f"kube model: {shlex.join(sys.argv[1:])}; baseline loop {yardstick:.2f} s")
    print("| workload | seeds | " + " | ".join(names) + " | " + " | ".join(f"{o} − {b}" for o, b in pairs) + " |")
    print("|---" * (2 + len(names) + len(pairs)) + "|")
    seconds: dict[str, list[float]] = {}
    for w in args.workloads.split(","):
        path = None if w == "default" else (args.traces or Path(".")) / f"openb_pod_list_{w}.csv"
        count = args.seeds if w == "default" or args.other_seeds is None else args.other_seeds
        seeds = list(range(running.FIRST_SEED, running.FIRST_SEED + count))
        experiment = running.Experiment.build(traces.load_pods(path), traces.load_nodes())
        results = running.run_all(experiment, specs, seeds)
        for label, runs in results.items():
            seconds.setdefault(label, []).extend(r.result.seconds for r in runs)
        means = [reporting.summarise(n, results[n], {}).unallocated_100 for n in names]
        diffs = {(d.policy, d.baseline): d for b in BASELINES for d in reporting.paired(results, b)}
        cells = [f"{m:.2f}" for m in means] + [f"{diffs[k].mean:+.2f} ± {diffs[k].se:.2f}" for k in pairs]
        print(f"| {w} | {count} | " + " | ".join(cells) + " |", flush=True)
    per_run = {n: sum(v) / len(v) for n, v in seconds.items()}
    print("seconds per run: " + ", ".join(f"{n} {s:.1f} ({s / yardstick:.1f}x loop)" for n, s in per_run.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
