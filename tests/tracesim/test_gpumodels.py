"""The kube model's extender knows each node's GPU model (as the extender does from the node's
`nvidia.com/gpu.product` label): `fragaware` keeps the GPUs that pods needing one model can use
whole, and without the models both nodes look alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from sharepack.common.policies import NodePolicy
from sharepack.tracesim import policies, sharing, traces
from sharepack.tracesim.clusters import Cluster, Request
from sharepack.tracesim.fragmentation import FragModel
from sharepack.tracesim.sharing import ShareModel
from sharepack.tracesim.workloads import typical_workload


def cluster(write: Callable[[str, str], Path], pod_lines: Callable[..., str], node_lines: Callable[..., str]) -> Cluster:
    # Most pods want a whole V100; a few want half of any GPU.
    rows = [(f"p{i}", 4000, 1024, 1, 1000, "V100M32") for i in range(8)]
    rows += [(f"q{i}", 4000, 1024, 1, 500, "") for i in range(2)]
    pods = traces.load_pods(write("pods.csv", pod_lines(rows)))
    nodes = traces.load_nodes(write("nodes.csv", node_lines([("n-v100", 32000, 65536, 1, "V100M32"), ("n-t4", 32000, 65536, 1, "T4")])))
    return Cluster(nodes, FragModel.build(typical_workload(pods, threshold=1.0), nodes))


def ranks(c: Cluster, gpu_models: bool) -> list[float]:
    scorer = sharing.SharedScorer(NodePolicy.FRAGAWARE, ShareModel.REPLICAS, 10, gpu_models=gpu_models)
    half = Request(index=0, cpu=4000, cpu_score=4000, memory=1024, num_gpu=1, milli=500, spec="")
    v = scorer.verdicts(c, half, np.arange(c.size, dtype=np.int64))
    return [v.at(i).rank for i in range(c.size)]


def test_a_share_goes_to_the_t4_when_the_model_knows_gpu_models(
    write: Callable[[str, str], Path], pod_lines: Callable[..., str], node_lines: Callable[..., str]
) -> None:
    c = cluster(write, pod_lines, node_lines)
    v100, t4 = c.nodes.names.index("n-v100"), c.nodes.names.index("n-t4")
    known = ranks(c, gpu_models=True)
    assert known[t4] > known[v100]
    unknown = ranks(c, gpu_models=False)
    assert unknown[t4] == unknown[v100]


def test_the_kube_model_knows_gpu_models_by_default_as_shipped() -> None:
    for name in ("shipped", "fragaware", "packed"):
        scorer = policies.resolve(name, scheduler=policies.SchedulerModel.KUBE).scorer
        assert scorer.extender.gpu_models is True  # type: ignore[attr-defined]
