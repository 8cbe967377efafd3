"""`sharepack-replay-kube`: the trace replayed through the real kube-scheduler, the real extender
and simulated nodes, side by side with tracesim's prediction for the same policy and seeds.

    sharepack-replay-kube                         # default trace, as shipped, seeds 42-44, to 100 %
    sharepack-replay-kube --baseline kube-default # kube-scheduler alone, same fleet and seeds
    sharepack-replay-kube --seeds 1 --nodes-limit 100 --until 50   # a quick look

With no flags it replays the configuration deploy/ ships (`common.shipped`: the extender's node
policy and flag defaults, deploy/scheduler's configuration, the agents' `packed`), predicted by
`sharepack-simulate --policy shipped`. `--baseline kube-default` (kube-scheduler's default
scores) or `kube-binpack` (`MostAllocated`, the GPU resource weighted 3, as the Kubernetes
documentation's bin-packing example) replays kube-scheduler without the extender, the agents
allocating as shipped, through the same control plane and fleet; predicted by the policy of
that name.

For each seed: the arrival sequence tracesim uses (`tracesim.workloads.arrival_order`, the same
pods in the same order), each pod created as a user would write it (CPU and memory requests;
ceil(share x R / 1000) replicas of `nvidia.com/gpu.shared` per GPU as a limit; a required node
affinity on `nvidia.com/gpu.product` for the GPU models it allows), one at a time: the next pod
is created once kube-scheduler bound the last one or declared it unschedulable (a pod that
finds no node is deleted: arrival only, no retries, as the simulator replays). The nodes are
the trace's node list (`sandbox.fleet`, GPUs x R replicas each, agents' allocation `packed`).
Allocation counts what bound pods asked for, binned as tracesim bins its runs
(`tracesim.metrics.bin_run`), so "unallocated GPU % at 100 % arrived" means the same in both.
The prediction is tracesim's own run through its public entry points
(`tracesim.running.default_specs` and `Experiment.run`) for the same policy, replicas and
seeds, under tracesim's default scheduler model for that policy.

A separate command rather than `sharepack-simulate --through-kube-scheduler`: tracesim stays
free of sandbox imports (an import-linter contract), and this one needs Go-built binaries.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharepack.common import shipped
from sharepack.common.errors import SharepackError
from sharepack.common.policies import NodePolicy, Policy
from sharepack.sandbox.controlplane.plane import ControlPlaneUnavailable
from sharepack.sandbox.kubelet.fleet import NodeShape, shapes_from_columns
from sharepack.sandbox.drivers.scalecluster import NAMESPACE, ScaleCluster, gpu_pod

# tracesim (and numpy) are imported where they are used: the sandbox package must import on a
# plain install, which has no simulator (`sharepack[sim]`); this command needs it.
if TYPE_CHECKING:
    from sharepack.tracesim import traces
    from sharepack.tracesim.clusters import Request
    from sharepack.tracesim.replaying import RunResult

RESOURCE = "nvidia.com/gpu.shared"
POD_TIMEOUT_S = 120.0
BASELINES = ("kube-default", "kube-binpack")
FIT = "NodeResourcesFit"


def baseline_plugin_config(baseline: str) -> list[dict[str, Any]]:
    """The profile's pluginConfig for `baseline`: none for kube-default; for kube-binpack the
    Kubernetes documentation's bin-packing example as tracesim's `KUBE_BINPACK` has it, with the
    GPU resource the fleet's agents serve (R replicas per GPU, as the model counts the GPU)."""
    if baseline != "kube-binpack":
        return []
    resources = [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}, {"name": RESOURCE, "weight": 3}]
    return [{"name": FIT, "args": {"scoringStrategy": {"type": "MostAllocated", "resources": resources}}}]


@dataclass(slots=True)
class Replay:
    """One seed through the real scheduler."""

    seed: int
    total_gpus: int
    arrived: list[int] = field(default_factory=lambda: [0])  # GPU milli, per event (0 first)
    used: list[int] = field(default_factory=lambda: [0])
    failed: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    honoured: int = 0  # containers the nodes gave the GPUs their directions named
    fallbacks: int = 0  # directions that did not fit: the node's policy chose

    def result(self, label: str) -> RunResult:
        import numpy as np

        from sharepack.tracesim.replaying import RunResult

        events = len(self.arrived)
        return RunResult(
            policy=label, seed=self.seed, total_gpus=self.total_gpus,
            arrived_milli=np.array(self.arrived, dtype=np.int64), used_milli=np.array(self.used, dtype=np.int64),
            frag_milli=np.zeros(events), free_gpus=np.zeros(events, dtype=np.int64),
            failed=dict(self.failed), seconds=self.seconds,
        )  # fmt: skip

    def unallocated(self, point: int) -> float:
        from sharepack.tracesim import metrics

        return metrics.bin_run(self.result("kube")).unallocated(point)


def trace_shapes(nodes: traces.NodeList) -> list[NodeShape]:
    return shapes_from_columns(nodes.names, nodes.num_gpu.tolist(), nodes.model, nodes.cpu.tolist(), nodes.memory.tolist())


def pod_for(req: Request, name: str, replicas: int) -> dict[str, object]:
    from sharepack.tracesim import sharing

    count = req.num_gpu * sharing.replicas_for(req.milli, replicas) if req.num_gpu else 0
    products = [m for m in req.spec.split("|") if m] if req.num_gpu else []
    return gpu_pod(name, resource=RESOURCE, count=count, cpu_milli=req.cpu, memory_mib=req.memory, products=products)


def sequence(pods: traces.PodList, nodes: traces.NodeList, seed: int, until: float) -> list[Request]:
    """The arrival sequence of `seed` up to one pod past `until` + 1 % arrived (the bins of
    `until` then hold every row they would hold in a full run)."""
    from sharepack.tracesim import workloads
    from sharepack.tracesim.clusters import requests_of

    reqs = requests_of(pods.take(workloads.arrival_order(pods, nodes, seed)))
    limit = (until + 1) * nodes.total_gpus * 10  # milli
    arrived = 0
    for i, req in enumerate(reqs):
        arrived += req.total_milli
        if arrived > limit:
            return reqs[: i + 1]
    return reqs


async def replay_seed(
    cluster: ScaleCluster, reqs: Sequence[Request], seed: int, total_gpus: int, replicas: int
) -> Replay:
    out = Replay(seed, total_gpus)
    honoured_before, fallbacks_before = directed_counts(cluster)
    started = time.monotonic()
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    arrived = used = 0
    step = max(len(reqs) // 20, 1)
    for i, req in enumerate(reqs):
        name = f"s{seed}-{i:05d}"
        await cluster.api.send("POST", path, pod_for(req, name, replicas))
        (outcome,) = await cluster.tracker.wait([name], POD_TIMEOUT_S)
        arrived += req.total_milli
        if outcome.node:
            used += req.total_milli  # the replica model charges what the pod asked for
        else:
            out.failed[req.pod_class] = out.failed.get(req.pod_class, 0) + 1
            await cluster.api.send("DELETE", f"{path}/{name}", {"gracePeriodSeconds": 0}, ok=(404,))
        out.arrived.append(arrived)
        out.used.append(used)
        if i % step == 0:
            cluster.say(f"  seed {seed}: {i}/{len(reqs)} pods, {100 * arrived / total_gpus / 1000:.0f}% arrived, "
                        f"{time.monotonic() - started:.0f} s")  # fmt: skip
    out.seconds = time.monotonic() - started
    honoured, fallbacks = directed_counts(cluster)
    out.honoured, out.fallbacks = honoured - honoured_before, fallbacks - fallbacks_before
    return out


def directed_counts(cluster: ScaleCluster) -> tuple[int, int]:
    """Containers the fleet gave their directed GPUs, and directions that did not fit, so far."""
    counted = cluster.fleet.directed
    return counted.honoured, sum(counted.fallbacks.values())


def predicted(
    pods: traces.PodList, nodes: traces.NodeList, policy: str, replicas: int, seed: int, point: int
) -> tuple[str, float]:
    """tracesim's own figure for this policy and seed (its default scheduler model, replicas)."""
    from sharepack.tracesim import running

    (spec,) = running.default_specs([policy], "replicas", replicas)
    run = running.Experiment.build(pods, nodes).run(spec, seed)
    return spec.label, run.binned.unallocated(point)


def first_nodes(nodes: traces.NodeList, count: int) -> traces.NodeList:
    """The first `count` nodes of the list (a smaller cluster for a quick look)."""
    from sharepack.tracesim import traces

    return traces.NodeList(
        source=f"{nodes.source} (first {count})", names=nodes.names[:count], cpu=nodes.cpu[:count],
        memory=nodes.memory[:count], num_gpu=nodes.num_gpu[:count], model=nodes.model[:count],
    )  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    from sharepack.tracesim import running, sharing

    p = argparse.ArgumentParser(prog="sharepack-replay-kube", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--pods", type=Path, help="pod list CSV (default: built-in openb_pod_list_default.csv)")
    p.add_argument("--nodes", type=Path, help="node list CSV (default: built-in openb_node_list_gpu_node.csv)")
    p.add_argument("--baseline", choices=BASELINES, default=None,
                   help="kube-scheduler alone, without the extender: its default scores or the bin-packing example")
    p.add_argument("--policy", default=None,
                   help=f"the extender's --node-policy (default: as shipped, {shipped.NODE_POLICY}, predicted by "
                        "`--policy shipped`; another is predicted by the policy of its name)")
    p.add_argument("--agent-policy", default=str(shipped.AGENT_POLICY),
                   help="the nodes' allocation policy (default: as shipped, %(default)s)")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds, from 42 (default 3)")
    p.add_argument("--first-seed", type=int, default=running.FIRST_SEED)
    p.add_argument("--replicas", type=int, default=sharing.DEFAULT_REPLICAS, help="time-slicing replicas per GPU (default 10)")
    p.add_argument("--until", type=float, default=100.0, help="stop after this %% of GPU capacity arrived (default 100)")
    p.add_argument("--nodes-limit", type=int, default=0, help="only the first N nodes of the list (0: all)")
    p.add_argument("--extender-arg", action="append", default=[], help="extra extender flag (repeatable)")
    p.add_argument("--csv", type=Path, default=Path("replay-kube.csv"), help="per-seed figures (default: %(default)s)")
    p.add_argument("--no-prediction", action="store_true", help="skip tracesim's run")
    return p


async def _run(args: argparse.Namespace, pods: traces.PodList, nodes: traces.NodeList) -> list[Replay]:
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    workdir = Path(tempfile.mkdtemp(prefix="sp-replay-", dir="/tmp"))
    out: list[Replay] = []
    async with ScaleCluster(
        trace_shapes(nodes), workdir, replicas=args.replicas, agent_policy=args.agent_policy,
        node_policy=args.node_policy, extender_args=args.extender_arg,
    ) as cluster:  # fmt: skip
        if args.baseline:
            await cluster.start_scheduler(with_extender=False, plugin_config=baseline_plugin_config(args.baseline))
        else:
            await cluster.start_scheduler(with_extender=True)
        for seed in seeds:
            reqs = sequence(pods, nodes, seed, args.until)
            cluster.say(f"seed {seed}: {len(reqs)} pods through kube-scheduler")
            replay = await replay_seed(cluster, reqs, seed, nodes.total_gpus, args.replicas)
            # Without the extender nothing is directed: no such count to show.
            directed = f", directed GPUs honoured {replay.honoured}/{replay.honoured + replay.fallbacks}"
            directed = "" if args.baseline else directed
            cluster.say(f"seed {seed}: {replay.unallocated(int(args.until)):.2f}% unallocated at {args.until:.0f}% "
                        f"arrived, {sum(replay.failed.values())} pods found no node, {replay.seconds:.0f} s{directed}")  # fmt: skip
            out.append(replay)
            if seed != seeds[-1]:
                await cluster.delete_all_pods()
        await cluster.stop_scheduler()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from sharepack.tracesim import sharing, traces
    except ImportError as e:
        print(f"sharepack-replay-kube: needs the simulator: pip install 'sharepack[sim]' ({e})", file=sys.stderr)
        return 2
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.baseline and args.policy is not None:
        print("sharepack-replay-kube: --baseline runs without the extender: --policy does not apply", file=sys.stderr)
        return 2
    # What tracesim predicts it with: the baseline, the shipped configuration, or the policy named.
    args.model_policy = args.baseline or ("shipped" if args.policy is None else args.policy)
    args.policy = args.policy or str(shipped.NODE_POLICY)
    try:
        args.agent_policy = Policy(args.agent_policy)
        args.node_policy = NodePolicy(args.policy) if args.policy == NodePolicy.FRAGAWARE else Policy(args.policy)
    except ValueError as e:
        print(f"sharepack-replay-kube: invalid policy: {e}", file=sys.stderr)
        return 2
    if args.seeds < 1 or not 0 < args.until <= 130:
        print(f"sharepack-replay-kube: invalid --seeds {args.seeds} or --until {args.until}", file=sys.stderr)
        return 2
    try:
        sharing.check_replicas(args.replicas)
        pods, nodes = traces.load_pods(args.pods), traces.load_nodes(args.nodes)
        if args.nodes_limit > 0:
            nodes = first_nodes(nodes, args.nodes_limit)
        replays = asyncio.run(_run(args, pods, nodes))
        point = int(args.until)
        rows = []
        what = args.baseline or ("as shipped" if args.model_policy == "shipped" else args.policy)
        print(f"{traces.workload_name(pods)}: {what}, R={args.replicas}, unallocated GPU % at {point} % arrived")
        print(f"{'seed':>6} {'kube-scheduler':>15} {'tracesim':>10} {'diff':>7}  model")
        for replay in replays:
            real = replay.unallocated(point)
            label, model_at = (
                ("-", float("nan")) if args.no_prediction
                else predicted(pods, nodes, args.model_policy, args.replicas, replay.seed, point)
            )  # fmt: skip
            rows.append({"seed": replay.seed, "kube_scheduler": round(real, 2), "tracesim": round(model_at, 2),
                         "diff": round(real - model_at, 2), "model": label,
                         "failed": sum(replay.failed.values()), "seconds": round(replay.seconds, 1),
                         "directed_honoured": replay.honoured, "directed_fallbacks": replay.fallbacks})  # fmt: skip
            print(f"{replay.seed:>6} {real:>15.2f} {model_at:>10.2f} {real - model_at:>+7.2f}  {label}")
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    except ControlPlaneUnavailable as e:
        print(f"sharepack-replay-kube: {e}", file=sys.stderr)
        return 1
    except SharepackError as e:
        print(f"sharepack-replay-kube: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
