"""Calibration gate and timing of the trace simulator on the built-in default trace.

    .venv/bin/python benchmarks/bench_tracesim.py                 # random, bestfit, fgd x 10 seeds
    .venv/bin/python benchmarks/bench_tracesim.py --policies fgd --seeds 3

For each policy: our unallocated GPU % at 100 % arrived (mean of the seeds) next to the study's
cached result, PASS when within 0.3 points; and seconds per full run, also as a ratio to a fixed
pure-Python loop timed in the same process (the machine is shared, so the ratio is the figure
that travels).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sharepack.tracesim import policies, reporting, running, traces  # noqa: E402

GATE = 0.3


def baseline_loop() -> float:
    """Seconds for a fixed amount of plain Python work (the yardstick for the ratio)."""
    start = time.perf_counter()
    acc = 0
    for i in range(5_000_000):
        acc += i & 7
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--policies", default="random,bestfit,fgd")
    p.add_argument("--seeds", type=int, default=10)
    args = p.parse_args()
    pods, nodes = traces.load_pods(), traces.load_nodes()
    experiment = running.Experiment.build(pods, nodes)
    published = reporting.load_published(traces.workload_name(pods))
    seeds = list(range(running.FIRST_SEED, running.FIRST_SEED + args.seeds))
    yardstick = baseline_loop()
    print(f"baseline loop: {yardstick:.2f} s")
    failed = False
    for name in args.policies.split(","):
        spec = policies.resolve(name)
        runs = [experiment.run(spec, seed) for seed in seeds]
        s = reporting.summarise(spec.label, runs, published)
        verdict = ""
        if s.published_100 is not None:
            ok = abs(s.unallocated_100 - s.published_100) <= GATE
            failed |= not ok
            verdict = f"published {s.published_100:.2f}  {'PASS' if ok else 'FAIL'}"
        print(
            f"{spec.label:<12} unallocated@100% {s.unallocated_100:.2f} (sd {s.unallocated_100_sd:.2f}, "
            f"{len(seeds)} seeds)  {verdict}   {s.seconds:.1f} s/run = {s.seconds / yardstick:.1f} x baseline loop",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
