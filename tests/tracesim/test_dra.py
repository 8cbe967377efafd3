"""The DRA model: a node as its slice, the allocator as the filter and the GPU choice, with and
without the extender ranking, and the CLI rows."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sharepack.common import dradevices
from sharepack.common.policies import NodePolicy, Policy
from sharepack.tracesim import dra, kubescheduler, policies, traces
from sharepack.tracesim.__main__ import main
from sharepack.tracesim.clusters import Cluster, Request
from sharepack.tracesim.fragmentation import FragModel
from sharepack.tracesim.workloads import typical_workload
from tests.tracesim.test_kubescheduler import cli_trace

R = 10


def req(num_gpu: int, milli: int) -> Request:
    return Request(index=0, cpu=1000, cpu_score=1000, memory=1024, num_gpu=num_gpu, milli=milli, spec="")


@pytest.fixture
def toy(write: Callable[[str, str], Path], pod_lines: Callable[..., str], node_lines: Callable[..., str]) -> Cluster:
    nodes = traces.load_nodes(write("nodes.csv", node_lines([
        ("n0", 32000, 131072, 2, "T4"), ("n1", 32000, 131072, 2, "T4"),
    ])))  # fmt: skip
    pods = traces.load_pods(write("pods.csv", pod_lines([("p", 1000, 1024, 1, 500, "")])))
    return Cluster(nodes, FragModel.build(typical_workload(pods, threshold=1.0), nodes))


ALL = np.arange(2, dtype=np.int64)


def test_a_nodes_slice_lists_whole_gpus_then_replicas_in_the_chosen_gpu_order() -> None:
    node = dra.dra_node([3, 7], 10, dra.DeviceOrder.PACKED)
    assert [d.name for d in node.devices[:3]] == ["gpu1-whole", "gpu0-whole", "gpu1-0"]
    assert sum(node.used.values()) == 10
    static = dra.dra_node([3, 7], 10, dra.DeviceOrder.INDEX, whole=False)
    assert static.devices[0].name == "gpu0-0" and len(static.devices) == 20


def test_fresh_first_meets_gpus_in_no_use_first_then_the_fullest_as_the_agent_orders_them() -> None:
    node = dra.dra_node([3, 0, 7, 0], 10, dra.DeviceOrder.FRESH_FIRST, whole=False)
    gpus = list(dict.fromkeys(d.gpu for d in node.devices))
    assert gpus == ["gpu1", "gpu3", "gpu2", "gpu0"]
    assert gpus == [f"gpu{g}" for g in dradevices.fresh_first(range(4), {0: 3, 2: 7})]


def test_under_fresh_first_a_share_opens_a_free_gpu_and_tops_up_the_fullest_when_none_is_free(toy: Cluster) -> None:
    toy.place(0, req(1, 800), {0: 800})  # GPU 0 of n0 has 2 replicas left, GPU 1 is free
    scorer = dra.DraScorer(Policy.PACKED, R, dra.DeviceOrder.FRESH_FIRST, dra.WholeGpus.GPU)
    assert scorer.verdicts(toy, req(1, 200), ALL).at(0).per_gpu == (0, 2)
    toy.place(0, req(1, 500), {1: 500})  # no free GPU left on n0: the fullest (GPU 0) first
    assert scorer.verdicts(toy, req(1, 200), ALL).at(0).per_gpu == (2, 0)


def test_a_share_takes_replicas_by_first_fit_and_spans_gpus_when_the_first_is_short(toy: Cluster) -> None:
    toy.place(0, req(1, 800), {0: 800})  # GPU 0 of n0 has 2 replicas left
    scorer = dra.DraScorer(Policy.PACKED, R, dra.DeviceOrder.INDEX, dra.WholeGpus.GPU)
    v = scorer.verdicts(toy, req(1, 500), ALL)
    assert v.at(0).per_gpu == (2, 3) and v.at(1).per_gpu == (5, 0)


def test_a_whole_gpu_takes_only_a_fully_free_gpu_with_its_own_device_class(toy: Cluster) -> None:
    toy.place(0, req(1, 100), {0: 100})
    toy.place(0, req(1, 100), {1: 100})
    gpu = dra.DraScorer(Policy.PACKED, R, dra.DeviceOrder.INDEX, dra.WholeGpus.GPU)
    v = gpu.verdicts(toy, req(1, 1000), ALL)
    assert not v.feasible[0] and v.feasible[1] and v.at(1).per_gpu == (R, 0)
    # As replicas (pod specs unchanged) it fits the partly used node, spanning its GPUs.
    replicas = dra.DraScorer(Policy.PACKED, R, dra.DeviceOrder.INDEX, dra.WholeGpus.REPLICAS)
    assert replicas.verdicts(toy, req(1, 1000), ALL).feasible[0]


def test_as_replicas_a_pod_of_more_than_32_devices_is_never_allocated(toy: Cluster) -> None:
    scorer = dra.DraScorer(Policy.PACKED, 10, dra.DeviceOrder.INDEX, dra.WholeGpus.REPLICAS)
    assert scorer.verdicts(toy, req(2, 1000), ALL).feasible.all()  # 20 devices
    big = dra.DraScorer(Policy.PACKED, 20, dra.DeviceOrder.INDEX, dra.WholeGpus.REPLICAS)
    assert not big.verdicts(toy, req(2, 1000), ALL).feasible.any()  # 40 devices


def test_without_the_extender_the_scheduler_filters_by_the_allocator_and_spreads(toy: Cluster) -> None:
    toy.place(0, req(1, 100), {0: 100})
    toy.place(0, req(1, 100), {1: 100})
    alone = dra.scheduler("dra", config=kubescheduler.SHAREPACK, tier_width=0, replicas=R, order=dra.DeviceOrder.INDEX)
    choice = alone(toy, req(1, 1000), ALL, np.random.default_rng(0))
    assert choice.node == 1 and choice.gpus == {0: 1000}


def test_the_extender_ranks_the_nodes_first_fit_and_the_tier_makes_it_the_choice(toy: Cluster) -> None:
    toy.place(0, req(1, 500), {0: 500})
    ranked = dra.scheduler(
        "dra-packed", config=kubescheduler.SHAREPACK, tier_width=1, replicas=R, order=dra.DeviceOrder.INDEX
    )
    for seed in range(5):
        choice = ranked(toy, req(1, 500), ALL, np.random.default_rng(seed))
        assert choice.node == 0 and choice.gpus == {0: 500}


def test_dra_policies_resolve_only_in_the_kube_model() -> None:
    spec = policies.resolve("dra-fragaware")
    assert spec.model is policies.SchedulerModel.KUBE and spec.replicas == R
    assert isinstance(spec.scorer, dra.DraScheduler)
    with pytest.raises(Exception, match="invalid --policy dra with --scheduler-model study"):
        policies.resolve("dra", scheduler=policies.SchedulerModel.STUDY)
    assert NodePolicy.FRAGAWARE.value in {p.removeprefix(dra.PREFIX) for p in policies.DRA}


def test_the_cli_runs_the_dra_rows_and_pairs_them_with_dra_alone(
    write: Callable[[str, str], Path], pod_lines: Callable[..., str], node_lines: Callable[..., str],
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "dra.csv"
    rc = main([*cli_trace(write, pod_lines, node_lines), "--policy", "dra,dra-fragaware", "--seeds", "1", "--filter-tier-width", "1",
               "--csv", str(out), "--plot", str(tmp_path / "d.png"), "--quiet"])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "dra-fragaware - dra" in printed
    with out.open() as f:
        assert [r["sc_policy"] for r in csv.DictReader(f)] == ["dra", "dra-fragaware"]
