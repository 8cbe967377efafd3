"""Replay one arrival sequence against one policy, recording the cluster after every pod.

Arrival only: no departures, no retries. A pod that no node can take fails and is counted by
class. One metric row is written before the first pod and one after each pod, like the study's
per-event `[Alloc]` / `[Report]` log lines that its analysis bins.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sharepack.tracesim.clusters import Cluster, requests_of
from sharepack.tracesim.fragmentation import FloatArray, FragModel, IntArray
from sharepack.tracesim.policies import PolicySpec
from sharepack.tracesim.traces import NodeList, PodList

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    seed: int
    total_gpus: int
    arrived_milli: IntArray  # [E] GPU milli requested by the pods arrived so far (failed included)
    used_milli: IntArray  # [E] GPU milli allocated
    frag_milli: FloatArray  # [E] cluster fragmentation (study definition)
    free_gpus: IntArray  # [E] fully free GPUs
    failed: dict[str, int] = field(default_factory=dict)  # pods that found no node, by class
    first_failure_milli: int | None = None  # arrived GPU milli when the first GPU pod failed
    seconds: float = 0.0

    @property
    def idle_milli(self) -> IntArray:
        out: IntArray = self.total_gpus * 1000 - self.used_milli
        return out


def replay(
    pods: PodList,
    nodes: NodeList,
    frag_model: FragModel,
    policy: PolicySpec,
    *,
    seed: int,
    order: IntArray,
    progress: Progress | None = None,
) -> RunResult:
    started = time.perf_counter()
    rng = np.random.default_rng([seed, 1])
    cluster = Cluster(nodes, frag_model, rank=rng.permutation(len(nodes)).astype(np.int64))
    sequence = requests_of(pods.take(order))
    events = len(sequence) + 1
    arrived = np.zeros(events, dtype=np.int64)
    used = np.zeros(events, dtype=np.int64)
    frag = np.zeros(events, dtype=np.float64)
    free = np.zeros(events, dtype=np.int64)
    frag[0] = cluster.frag_total
    free[0] = cluster.free_gpus
    failed: dict[str, int] = {}
    first_failure: int | None = None
    arrived_now = 0
    step = max(len(sequence) // 20, 1)
    for i, req in enumerate(sequence, start=1):
        arrived_now += req.total_milli
        idx = cluster.feasible(req, replicas=policy.replicas)
        choice = policy.scorer(cluster, req, idx, rng) if len(idx) else None
        if choice is None or choice.node < 0:
            failed[req.pod_class] = failed.get(req.pod_class, 0) + 1
            if first_failure is None and req.num_gpu > 0:
                first_failure = arrived_now
        else:
            charged = req.total_milli if policy.replicas is not None else None
            cluster.place(choice.node, req, choice.gpus, charged=charged)
        arrived[i] = arrived_now
        used[i] = cluster.used_milli
        frag[i] = cluster.frag_total
        free[i] = cluster.free_gpus
        if progress is not None and (i % step == 0 or i == len(sequence)):
            progress(i, len(sequence))
    return RunResult(
        policy=policy.label,
        seed=seed,
        total_gpus=nodes.total_gpus,
        arrived_milli=arrived,
        used_milli=used,
        frag_milli=frag,
        free_gpus=free,
        failed=failed,
        first_failure_milli=first_failure,
        seconds=time.perf_counter() - started,
    )
