"""Whole replays on a slice of the default trace: books balance, seeds reproduce, policies differ."""

from __future__ import annotations

import numpy as np
import pytest

from sharepack.tracesim import metrics, policies, replaying, traces, workloads
from sharepack.tracesim.fragmentation import FragModel
from sharepack.tracesim.sharing import ShareModel

NODES = 80


@pytest.fixture(scope="module")
def slice_() -> tuple[traces.PodList, traces.NodeList, FragModel]:
    pods = traces.load_pods()
    full = traces.load_nodes()
    pick = np.arange(0, len(full), len(full) // NODES)[:NODES]
    nodes = traces.NodeList(
        source="slice",
        names=tuple(full.names[i] for i in pick),
        cpu=full.cpu[pick],
        memory=full.memory[pick],
        num_gpu=full.num_gpu[pick],
        model=tuple(full.model[i] for i in pick),
    )
    sample = pods.take(np.random.default_rng(0).choice(len(pods), 600, replace=False))
    return sample, nodes, FragModel.build(workloads.typical_workload(sample), nodes)


def replay(slice_: tuple[traces.PodList, traces.NodeList, FragModel], name: str, seed: int = 42,
           model: ShareModel = ShareModel.MILLI,
           scheduler: policies.SchedulerModel | None = None) -> replaying.RunResult:  # fmt: skip
    pods, nodes, fm = slice_
    order = workloads.arrival_order(pods, nodes, seed)
    spec = policies.resolve(name, model=model, scheduler=scheduler)  # None: the policy's default model
    return replaying.replay(pods, nodes, fm, spec, seed=seed, order=order)


@pytest.mark.parametrize("name", list(policies.NAMES))
def test_every_policy_keeps_the_books(slice_: tuple[traces.PodList, traces.NodeList, FragModel], name: str) -> None:
    run = replay(slice_, name)
    capacity = run.total_gpus * 1000
    assert np.all(np.diff(run.arrived_milli) >= 0)
    assert np.all(np.diff(run.used_milli) >= 0)
    assert run.used_milli[-1] <= capacity
    assert run.arrived_milli[-1] > 1.25 * capacity  # tuned to 130 %
    assert sum(run.failed.values()) > 0  # overload makes pods fail
    assert run.first_failure_milli is not None and run.first_failure_milli <= run.arrived_milli[-1]
    binned = metrics.bin_run(run)
    assert 0.0 < binned.unallocated(100) < 40.0


def test_a_seed_reproduces_its_run(slice_: tuple[traces.PodList, traces.NodeList, FragModel]) -> None:
    a, b = replay(slice_, "bestfit", seed=44), replay(slice_, "bestfit", seed=44)
    assert np.array_equal(a.used_milli, b.used_milli)
    assert not np.array_equal(a.used_milli, replay(slice_, "bestfit", seed=45).used_milli)


def test_fragmentation_aware_policies_leave_less_unallocated_than_random(
    slice_: tuple[traces.PodList, traces.NodeList, FragModel],
) -> None:
    at_100 = {name: metrics.bin_run(replay(slice_, name)).unallocated(100) for name in ("random", "fgd", "ours")}
    assert at_100["fgd"] < at_100["random"]
    assert at_100["ours"] < at_100["random"]


def test_the_replica_model_charges_requests_not_rounded_replicas(
    slice_: tuple[traces.PodList, traces.NodeList, FragModel],
) -> None:
    run = replay(slice_, "packed", model=ShareModel.REPLICAS, scheduler=policies.SchedulerModel.STUDY)
    assert run.policy == "packed@r10"
    assert run.used_milli[-1] <= run.total_gpus * 1000
