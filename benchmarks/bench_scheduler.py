"""Scheduling throughput of the real kube-scheduler with our extender and without it.

    .venv/bin/python benchmarks/bench_scheduler.py --nodes 1000 --pods 1000 [--out FILE]

The real control plane (etcd, kube-apiserver, deploy/base applied), N simulated GPU nodes
(`sandbox.fleet`: 8 GPUs x 10 time-slicing replicas each, agents' allocation `packed`, states
published as the agent publishes them, pods marked Running), the real extender as a process.
Then, in the same run, phases on the same empty cluster, alternating `--pairs` times (with,
without, with, without, ...), so that load from elsewhere on the machine hits both alike:

* **with**: kube-scheduler configured by deploy/scheduler/kube-scheduler-config.yaml as shipped
  (the extender's filter, prioritize and bind; `percentageOfNodesToScore: 100`; mutual TLS with
  kube-scheduler's client certificate, only the URL and certificate paths filled in), the
  extender with its shipped flags (directed GPUs on);
* **without**: the same file without its `extenders` stanza (the default plugins only).

`--insecure-http` serves the extender over plain HTTP instead (for comparison only).
`--with-http1` adds a phase to each pair, after the with phase: the same extender process,
kube-scheduler started with `DISABLE_HTTP2=1`, so that it calls the extender over HTTP/1.1 as it
did before the extender offered HTTP/2 (its API client speaks HTTP/1.1 too then, so the rates
differ by that as well; the extender's CPU per pod differs by its transport alone). Printed: the
HTTP/2 phase's extender CPU and rate over the HTTP/1.1 phase's, per pair.

In both, kube-scheduler's client rate limit is raised to 5,000 QPS as scheduler_perf raises it
(`--client-qps`; as shipped it is 50 QPS, which caps binds and their events without the extender
but not the binds the extender makes with its own client).

Each phase creates P pods whose shapes (GPUs, share, CPU, memory) are drawn with a fixed seed
from the default Alibaba trace's pods, CPU-only pods included (13 % of the trace; they reach
the extender only if its managedResources say so), as fast as the API server takes them, and
measures as Kubernetes' scheduler_perf does: pods bound per second from the first create to
the last bind (each bind timed when its watch event arrives). Also reported: the CPU seconds of
the extender and of kube-scheduler in the phase (/proc/<pid>/stat); the extender's latency as
kube-scheduler sees it (`scheduler_scheduling_algorithm_duration_seconds`, which holds the
extender's filter and prioritize calls, with against without) and as its own histogram shows it
(`sharepack_extender_request_duration_seconds`, per verb). After a phase every pod is deleted
and the fleet and the extender are waited on until they count none. A with phase that follows a
without phase also waits until `extender.directing.SHARED_S` (30 s) has passed since then: the
extender sees the GPU pods kube-scheduler bound itself as another binder's, and for that long
lists each bind's node pods first (the count is printed per phase); without the wait every with
phase but the first measured that, not the extender binding alone.

Per pair, the ratio is with / without; the figures reported are medians over the pairs. Also
per phase: the extender's CPU-ms per pod created and kube-scheduler's algorithm-duration mean.

`--extender-profile FILE` runs the extender under cProfile (slower: for where the time goes,
not for the ratio; it times wall clock, which on a busy machine includes waiting for a CPU);
`--extender-sample FILE` under `sharepack.sandbox.cpusampler` (its stack at every millisecond of
its CPU), and prints each with phase's samples by function. `--watch-floor` also runs benchmarks/watch_floor.py beside the extender: the
same watches with the same client, decoded and counted only, whose CPU per pod per phase is what
receiving them costs before any handler runs. The last line is always

    scheduler throughput at N nodes: with extender X pods/s, without Y pods/s, ratio R

(X and Y the median rates, R the median of the pairs' ratios).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import math
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from sharepack.common import shipped
from sharepack.common.policies import Policy
from sharepack.sandbox import cpusampler
from sharepack.sandbox.kubelet import fleet
from sharepack.sandbox.controlplane.plane import ControlPlaneUnavailable
from sharepack.extender import directing
from sharepack.sandbox.drivers.scalecluster import ScaleCluster, cpu_seconds, gpu_pod, histogram
from sharepack.sandbox.processes import LoggedProcess
from sharepack.tracesim import traces

RESOURCE = "nvidia.com/gpu.shared"
SEED = 7
TIMEOUT_S = 1800.0
PHASES = (("with", True), ("without", False))  # one pair, in this order
# --with-http1's phase, between the two: the same extender, kube-scheduler's clients told to speak
# HTTP/1.1 only (Kubernetes' DISABLE_HTTP2), as before the extender offered HTTP/2.
HTTP1 = ("http1", True)
HTTP1_ENV = {"DISABLE_HTTP2": "1"}
CLIENT_QPS = 5000  # kube-scheduler's API rate limit in both phases, as scheduler_perf sets it


def pod_mix(count: int, replicas: int, seed: int = SEED, prefix: str = "pod") -> list[dict[str, Any]]:
    """`count` pods shaped like the default trace's pods (GPUs x replicas of the share, CPU,
    memory; CPU-only pods too), drawn with replacement."""
    pods = traces.load_pods()
    rng = np.random.default_rng(seed)
    out = []
    for i, k in enumerate(rng.choice(len(pods.num_gpu), size=count)):
        share = math.ceil(int(pods.milli[k]) * replicas / traces.MILLI)
        out.append(
            gpu_pod(
                f"{prefix}-{i:05d}", resource=RESOURCE, count=int(pods.num_gpu[k]) * share,
                cpu_milli=int(pods.cpu[k]), memory_mib=int(pods.memory[k]),
            )  # fmt: skip
        )
    return out


async def phase(
    cluster: ScaleCluster, name: str, with_extender: bool, pods: list[dict[str, Any]], client_qps: int,
    env: dict[str, str] | None = None, floor: LoggedProcess | None = None,
) -> dict[str, Any]:
    assert cluster.extender is not None and cluster.extender.proc is not None
    extender_pid = cluster.extender.proc.pid
    floor_pid = floor.proc.pid if floor is not None and floor.proc is not None else None
    floor_before = cpu_seconds(floor_pid) if floor_pid else 0.0
    scheduler_pid = await cluster.start_scheduler(with_extender=with_extender, client_qps=client_qps, env=env)
    cluster.say(f"[{name}] kube-scheduler leads; creating {len(pods)} pods")
    extender_before = await cluster.extender_metrics()
    cpu_before = (cpu_seconds(extender_pid), cpu_seconds(scheduler_pid))
    restarts = cluster.control.scheduler_restarts if cluster.control is not None else 0
    names = [p["metadata"]["name"] for p in pods]
    window_start = time.time()  # POSIX seconds, as sandbox.cpusampler stamps its samples
    started = time.monotonic()
    await cluster.create_pods(pods)
    created = time.monotonic() - started
    outcomes = await cluster.tracker.wait(names, TIMEOUT_S)
    bound = [o for o in outcomes if o.node]
    last = max((o.bound_at for o in bound), default=started)
    elapsed = last - started
    # kube-scheduler exits when it cannot renew its lease in time (an overloaded API server)
    # and is started again: its CPU is then counted from the new process's start.
    scheduler = cluster.control.scheduler if cluster.control is not None else None
    if scheduler is not None and scheduler.proc is not None and scheduler.proc.pid != scheduler_pid:
        scheduler_pid, cpu_before = scheduler.proc.pid, (cpu_before[0], 0.0)
    cpu_after = (cpu_seconds(extender_pid), cpu_seconds(scheduler_pid))
    floor_cpu_s = cpu_seconds(floor_pid) - floor_before if floor_pid else None
    restarts = (cluster.control.scheduler_restarts if cluster.control is not None else 0) - restarts
    sched = await cluster.scheduler_metrics()
    extender_after = await cluster.extender_metrics()
    await cluster.stop_scheduler()
    handshakes, lists = (
        extender_after.get(m, 0.0) - extender_before.get(m, 0.0)
        for m in ("sharepack_extender_tls_handshakes", "sharepack_extender_bind_node_lists")
    )
    result: dict[str, Any] = {
        "pods": len(pods),
        "gpu_pods": sum(1 for p in pods if "limits" in p["spec"]["containers"][0]["resources"]),
        "bound": len(bound),
        "unschedulable": len(outcomes) - len(bound),
        "create_s": round(created, 3),
        "first_create_to_last_bind_s": round(elapsed, 3),
        "pods_per_s": round(len(bound) / elapsed, 2) if elapsed > 0 else 0.0,
        "extender_cpu_s": round(cpu_after[0] - cpu_before[0], 2),
        "extender_cpu_ms_per_pod": round((cpu_after[0] - cpu_before[0]) * 1000 / len(pods), 2),
        "scheduler_cpu_s": round(cpu_after[1] - cpu_before[1], 2),
        "watch_floor_cpu_ms_per_pod": round(floor_cpu_s * 1000 / len(pods), 2) if floor_cpu_s is not None else None,
        "tls_handshakes": int(handshakes),
        "bind_node_lists": int(lists),
        "scheduler_restarts": restarts,
        "window": [int(window_start), int(window_start + elapsed)],  # the seconds from first create to last bind
    }
    algorithm = histogram(sched, "scheduler_scheduling_algorithm_duration_seconds")
    attempt = histogram(sched, "scheduler_scheduling_attempt_duration_seconds", {"result": "scheduled"})
    result["scheduler_algorithm"] = algorithm.describe() if algorithm else "not scraped"
    result["scheduler_algorithm_mean_ms"] = round(algorithm.mean * 1000, 3) if algorithm else None
    result["scheduler_attempt"] = attempt.describe() if attempt else "not scraped"
    for verb in ("filter", "prioritize", "bind"):
        labels = {"verb": verb}
        after = histogram(extender_after, "sharepack_extender_request_duration_seconds", labels)
        before = histogram(extender_before, "sharepack_extender_request_duration_seconds", labels)
        result[f"extender_{verb}"] = after.minus(before).describe() if after else "no calls"
    cluster.say(f"[{name}] {result['bound']}/{len(pods)} bound in {elapsed:.1f} s: {result['pods_per_s']} pods/s")
    await cluster.delete_all_pods()
    return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    shapes = fleet.synthetic_shapes(args.nodes)
    workdir = Path(tempfile.mkdtemp(prefix="sp-bench-", dir="/tmp"))
    async with ScaleCluster(
        shapes, workdir, replicas=args.replicas, agent_policy=Policy(args.policy), node_policy=args.node_policy,
        profile_to=args.extender_profile, sample_to=args.extender_sample, extender_args=args.extender_arg,
        tls=not args.insecure_http,
    ) as cluster:  # fmt: skip
        results: dict[str, Any] = {
            "nodes": args.nodes, "extender_args": args.extender_arg, "tls": not args.insecure_http,
            "setup_s": {k: round(v, 1) for k, v in cluster.timings.items()}, "pairs": [],
        }  # fmt: skip
        floor = await start_watch_floor(cluster) if args.watch_floor else None
        foreign_until = 0.0  # monotonic: until then the extender takes another binder to be about
        phases = phases_of(args)
        results["phases"] = [name for name, _ in phases]
        for i in range(args.pairs):
            pair: dict[str, Any] = {}
            for name, with_extender in phases:
                pods = pod_mix(args.pods, args.replicas, prefix=f"{name}-{i}")
                wait = foreign_until - time.monotonic()
                if with_extender and wait > 0:
                    # The last phase's GPU pods were bound by kube-scheduler itself, which the
                    # extender takes as another binder about: for directing.SHARED_S after, each
                    # of its binds lists its node's pods first. A with phase measures the
                    # extender binding alone, as in a cluster it schedules for.
                    cluster.say(f"waiting {wait:.0f} s for the extender to see kube-scheduler's own binds as past "
                                "(directing.SHARED_S)")  # fmt: skip
                    await asyncio.sleep(wait)
                env = HTTP1_ENV if name == HTTP1[0] else None
                pair[name] = await phase(
                    cluster, f"{name} {i + 1}/{args.pairs}", with_extender, pods, args.client_qps, env, floor
                )
                if not with_extender:
                    foreign_until = time.monotonic() + directing.SHARED_S
            results["pairs"].append(pair)
            if args.out:  # each pair as it completes: a run cut short keeps what it measured
                args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


async def start_watch_floor(cluster: ScaleCluster) -> LoggedProcess:
    """benchmarks/watch_floor.py with the extender's credentials, once its first lists are in;
    stopped with the cluster."""
    assert cluster.extender_kubeconfig is not None
    log = cluster.workdir / "watch-floor.log"
    floor = LoggedProcess(
        [sys.executable, str(Path(__file__).with_name("watch_floor.py")), f"--kubeconfig={cluster.extender_kubeconfig}"], log
    )
    await floor.start()
    cluster.on_close(floor.stop)
    deadline = time.monotonic() + 120
    while "synced" not in floor.log_tail(4000):
        if floor.exited or time.monotonic() > deadline:
            raise ControlPlaneUnavailable(f"watch_floor.py did not sync: {floor.log_tail(800)}")
        await asyncio.sleep(0.2)
    cluster.say("watch floor (the extender's watches, handlers counting only) synced")
    return floor


def phases_of(args: argparse.Namespace) -> tuple[tuple[str, bool], ...]:
    return (PHASES[0], HTTP1, PHASES[1]) if args.with_http1 else PHASES


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def report(results: dict[str, Any]) -> str:
    transport = "mutual TLS" if results["tls"] else "plain HTTP (--insecure-http)"
    lines = [f"nodes {results['nodes']}, extender over {transport}; setup " + ", ".join(f"{k} {v} s" for k, v in results["setup_s"].items())]
    ratios = []
    names = results.get("phases", [name for name, _ in PHASES])
    for i, pair in enumerate(results["pairs"]):
        for name in names:
            r = pair[name]
            lines.append(
                f"pair {i + 1} {name:>7} extender: {r['bound']}/{r['pods']} bound ({r['gpu_pods']} GPU pods, "
                f"{r['unschedulable']} unschedulable), created in {r['create_s']} s, first create to last bind "
                f"{r['first_create_to_last_bind_s']} s: {r['pods_per_s']} pods/s; CPU s: kube-scheduler "
                f"{r['scheduler_cpu_s']}, extender {r['extender_cpu_s']} ({r['extender_cpu_ms_per_pod']} ms per pod)"
                + (f"; kube-scheduler restarted {r['scheduler_restarts']} time(s)" if r["scheduler_restarts"] else "")
            )
            lines.append(f"          kube-scheduler algorithm (filter+score, extender calls included): {r['scheduler_algorithm']}")
            lines.append(f"          kube-scheduler attempt (scheduled): {r['scheduler_attempt']}")
            if name != "without":
                for verb in ("filter", "prioritize", "bind"):
                    lines.append(f"          extender {verb} (its histogram): {r[f'extender_{verb}']}")
                lines.append(f"          TLS handshakes on the extender: {r['tls_handshakes']}; binds that listed "
                             f"their node's pods: {r.get('bind_node_lists', 0)}")
            if r.get("watch_floor_cpu_ms_per_pod") is not None:
                lines.append(f"          watch floor (the extender's watches alone, decoded and counted): "
                             f"{r['watch_floor_cpu_ms_per_pod']} CPU-ms per pod")
        w, wo = pair["with"], pair["without"]
        ratios.append(w["pods_per_s"] / wo["pods_per_s"] if wo["pods_per_s"] else 0.0)
        lines.append(f"pair {i + 1}: ratio {ratios[-1]:.2f}")
    medians: dict[str, dict[str, float]] = {}
    for name in names:
        runs = [pair[name] for pair in results["pairs"]]
        medians[name] = {
            key: _median([r[key] for r in runs if r[key] is not None])
            for key in ("pods_per_s", "extender_cpu_ms_per_pod", "scheduler_algorithm_mean_ms", "scheduler_cpu_s",
                        "watch_floor_cpu_ms_per_pod")
            if any(r.get(key) is not None for r in runs)
        }  # fmt: skip
        m = medians[name]
        lines.append(
            f"median {name:>7} extender: {m['pods_per_s']:.1f} pods/s; extender CPU {m['extender_cpu_ms_per_pod']:.2f} ms "
            f"per pod; kube-scheduler algorithm mean {m['scheduler_algorithm_mean_ms']:.2f} ms, CPU {m['scheduler_cpu_s']:.2f} s"
            + (f"; watch floor {m['watch_floor_cpu_ms_per_pod']:.2f} ms per pod" if "watch_floor_cpu_ms_per_pod" in m else "")
        )
    results["medians"] = medians
    w_alg, wo_alg = medians["with"]["scheduler_algorithm_mean_ms"], medians["without"]["scheduler_algorithm_mean_ms"]
    lines.append(
        f"extender latency as kube-scheduler sees it (median algorithm mean, with - without): {w_alg - wo_alg:.2f} ms per pod"
    )
    if HTTP1[0] in names:
        h2_cpu = [p["with"]["extender_cpu_ms_per_pod"] / p[HTTP1[0]]["extender_cpu_ms_per_pod"] for p in results["pairs"]]
        h2_rate = [p["with"]["pods_per_s"] / p[HTTP1[0]]["pods_per_s"] for p in results["pairs"]]
        results["h2_over_http1"] = {"cpu": [round(r, 3) for r in h2_cpu], "rate": [round(r, 3) for r in h2_rate]}
        lines.append(
            f"kube-scheduler over HTTP/2 (as shipped) / over HTTP/1.1, same extender: extender CPU per pod "
            f"{_median(h2_cpu):.2f} (pairs {', '.join(f'{r:.2f}' for r in h2_cpu)}), pods/s "
            f"{_median(h2_rate):.2f} (pairs {', '.join(f'{r:.2f}' for r in h2_rate)})"
        )
    ratio = _median(ratios)
    results["ratio"] = round(ratio, 3)
    results["ratios"] = [round(r, 3) for r in ratios]
    lines.append(
        f"scheduler throughput at {results['nodes']} nodes: with extender {medians['with']['pods_per_s']:.1f} pods/s, "
        f"without {medians['without']['pods_per_s']:.1f} pods/s, ratio {ratio:.2f}"
    )
    return "\n".join(lines)


def profile_summary(path: Path, top: int = 25) -> str:
    """The extender's functions by own time, from its cProfile stats (written as it exits)."""
    if not path.exists():
        return f"no profile at {path}: the extender did not exit cleanly"
    out = io.StringIO()
    pstats.Stats(str(path), stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--pods", type=int, default=200)
    p.add_argument("--pairs", type=int, default=3, help="alternating (with, without) pairs (default 3)")
    p.add_argument("--insecure-http", action="store_true",
                   help="serve the extender over plain HTTP, not mutual TLS as shipped (for comparison)")
    p.add_argument("--replicas", type=int, default=10, help="time-slicing replicas per GPU (default 10)")
    p.add_argument("--policy", default=str(shipped.AGENT_POLICY), help="the agents' allocation policy (default: as shipped, %(default)s)")
    p.add_argument("--node-policy", default=str(shipped.NODE_POLICY), help="the extender's --node-policy (default: as shipped, %(default)s)")
    p.add_argument("--client-qps", type=int, default=CLIENT_QPS,
                   help="kube-scheduler's API QPS and burst in both phases (default %(default)s, as scheduler_perf; 0: as shipped, 50)")
    p.add_argument("--extender-arg", action="append", default=[],
                   help="extra extender flag, e.g. --extender-arg=--filter-tier-width=1 (repeatable)")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("--with-http1", action="store_true",
                   help="add a phase per pair, after the with phase: kube-scheduler calling the same "
                        "extender over HTTP/1.1 (DISABLE_HTTP2=1), as before the extender offered HTTP/2")  # fmt: skip
    p.add_argument("--extender-profile", type=Path, help="run the extender under cProfile, stats to this file")
    p.add_argument("--extender-sample", type=Path,
                   help="run the extender under sharepack.sandbox.cpusampler (its stack at every CPU "
                        "millisecond), samples to this file; prints each with phase's by function")  # fmt: skip
    p.add_argument("--watch-floor", action="store_true",
                   help="also run benchmarks/watch_floor.py (the extender's watches, nothing done with them) "
                        "and report its CPU per pod per phase")  # fmt: skip
    args = p.parse_args(argv)
    if args.extender_profile and args.extender_sample:
        p.error("--extender-profile and --extender-sample both wrap the extender: choose one")
    if args.nodes < 1 or args.pods < 1 or args.pairs < 1:
        p.error(f"--nodes, --pods and --pairs must be at least 1, got {args.nodes}, {args.pods} and {args.pairs}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        results = asyncio.run(run(args))
    except ControlPlaneUnavailable as e:
        print(f"bench_scheduler: {e}", file=sys.stderr)
        return 1
    text = report(results)
    if args.extender_profile:
        print(profile_summary(args.extender_profile))
    if args.extender_sample:
        for i, pair in enumerate(results["pairs"]):
            start, end = pair["with"]["window"]
            print(f"pair {i + 1}, with phase: where the extender's CPU went\n"
                  f"{cpusampler.summary(args.extender_sample, start, end)}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
