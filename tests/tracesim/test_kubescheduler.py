"""The kube-scheduler model: in-tree scores by hand, the seeded choice among ties, the
extender's weight and tier, the configurations, and the CLI."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sharepack.tracesim import kubescheduler as ks
from sharepack.tracesim import policies, traces
from sharepack.tracesim.__main__ import main
from sharepack.tracesim.clusters import Cluster, Request
from sharepack.tracesim.errors import PolicyError
from sharepack.tracesim.fragmentation import FragModel
from sharepack.tracesim.workloads import typical_workload

REPO = Path(__file__).resolve().parents[2]
SHARE = Request(index=0, cpu=4000, cpu_score=4000, memory=8192, num_gpu=1, milli=500, spec="")


@pytest.fixture
def toy(write: Callable[[str, str], Path], pod_lines: Callable[..., str], node_lines: Callable[..., str]) -> Cluster:
    nodes = traces.load_nodes(write("nodes.csv", node_lines([
        ("n0", 32000, 131072, 4, "T4"), ("n1", 32000, 131072, 4, "T4"), ("n2", 16000, 65536, 2, "T4"),
    ])))  # fmt: skip
    pods = traces.load_pods(write("pods.csv", pod_lines([("p", 4000, 8192, 1, 500, "")])))
    return Cluster(nodes, FragModel.build(typical_workload(pods, threshold=1.0), nodes))


ALL = np.arange(3, dtype=np.int64)


def test_default_scores_by_hand(toy: Cluster) -> None:
    # Fit (LeastAllocated): n0 cpu 28000*100//32000 = 87, memory 122880*100//131072 = 93 -> 90;
    # n2 75 and 87 -> 81. Balanced: n0 std (0.125 - 0.0625)/2 -> 96, 100 without the pod ->
    # 50 + (50 + 96 - 100) // 2 = 73; n2 std 0.0625 -> 93 -> 71.
    assert ks.fit_scores(ks.KUBE_DEFAULT, toy, SHARE, ALL, 10).tolist() == [90, 90, 81]
    assert ks.balanced_scores(ks.KUBE_DEFAULT, toy, SHARE, ALL, 10).tolist() == [73, 73, 71]
    # MostAllocated with the GPU weighted 3: n0 (12 + 6 + 3 x 12) // 5 = 10, n2 (25 + 12 + 3 x 25) // 5 = 22.
    assert ks.fit_scores(ks.KUBE_BINPACK, toy, SHARE, ALL, 10).tolist() == [10, 10, 22]


def test_the_scheduler_draws_uniformly_among_the_best_totals(toy: Cluster) -> None:
    spec = policies.resolve("kube-default")
    chosen = set()
    for seed in range(8):
        choice = spec.scorer(toy, SHARE, ALL, np.random.default_rng(seed))
        expected = [0, 1][np.random.default_rng(seed).integers(2)]  # n0 and n1 tie at 163
        assert choice.node == expected
        chosen.add(choice.node)
    assert chosen == {0, 1}
    # The upstream device plugin packs the replicas onto the first GPU.
    assert spec.scorer(toy, SHARE, ALL, np.random.default_rng(0)).gpus == {0: 500}
    # Bin-packing picks the small node: 22 + 71 against 10 + 73.
    assert policies.resolve("kube-binpack").scorer(toy, SHARE, ALL, np.random.default_rng(0)).node == 2


def test_the_tier_filter_overrules_the_in_tree_scores_and_no_tier_does_not(toy: Cluster) -> None:
    # n0 has 5 replicas used on GPU 0 and much CPU taken; n1 3 replicas. One more replica
    # scores 7 on both (packed: 0.735 and 0.715 before rounding); the in-tree scores prefer n1.
    toy.place(0, Request(1, 16000, 16000, 8192, 1, 500, ""), {0: 500})
    toy.place(1, Request(2, 1000, 1000, 8192, 1, 300, ""), {0: 300})
    small = Request(3, 1000, 1000, 1024, 1, 100, "")
    in_tree = ks.in_tree_scores(ks.SHAREPACK, toy, small, ALL[:2], 10).tolist()
    assert in_tree[1] > in_tree[0]
    rng = np.random.default_rng(0)
    wide = policies.resolve("packed", kube=policies.KubeOptions(tier_width=0)).scorer(toy, small, ALL[:2], rng)
    narrow = policies.resolve("packed", kube=policies.KubeOptions(tier_width=1)).scorer(toy, small, ALL[:2], rng)
    assert (wide.node, narrow.node) == (1, 0)


def test_the_built_in_configuration_is_the_deployed_one() -> None:
    deployed = ks.load_config(REPO / "deploy" / "scheduler" / "kube-scheduler-config.yaml")
    assert deployed == ks.SHAREPACK
    assert deployed.extender_weight == 5 and deployed.fit_strategy == "LeastAllocated"


def test_a_bind_only_extender_entry_changes_nothing_in_the_model() -> None:
    ranking = "kind: KubeSchedulerConfiguration\npercentageOfNodesToScore: 100\nextenders:\n- {prioritizeVerb: p, weight: 3}\n"
    binder = "- {bindVerb: bind, managedResources: [{name: nvidia.com/gpu, ignoredByScheduler: false}]}\n"
    alone, both = ks.parse_config(ranking, "a.yaml"), ks.parse_config(ranking + binder, "b.yaml")
    assert alone == both and both.extender_weight == 3 and both.extender_all_pods


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: KubeSchedulerConfiguration\n", "percentageOfNodesToScore None"),
        ("kind: Pod\n", "not a KubeSchedulerConfiguration"),
        ("kind: KubeSchedulerConfiguration\npercentageOfNodesToScore: 100\nprofiles:\n- pluginConfig:\n"
         "  - {name: NodeResourcesFit, args: {scoringStrategy: {type: RequestedToCapacityRatio}}}\n",
         "scoringStrategy 'RequestedToCapacityRatio'"),
        ("kind: KubeSchedulerConfiguration\npercentageOfNodesToScore: 100\nextenders:\n"
         "- {prioritizeVerb: prioritize, weight: 0}\n", "extender weight 0"),
        ("kind: KubeSchedulerConfiguration\npercentageOfNodesToScore: 100\nextenders:\n"
         "- {prioritizeVerb: prioritize, weight: 5}\n- {filterVerb: filter}\n", "2 ranking extenders"),
    ],
)  # fmt: skip
def test_a_configuration_the_model_cannot_follow_is_refused(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        ks.parse_config(text, "test.yaml")


def test_plugin_weights_and_strategy_come_from_the_file() -> None:
    c = ks.parse_config(
        "kind: KubeSchedulerConfiguration\npercentageOfNodesToScore: 100\nprofiles:\n"
        "- plugins: {score: {disabled: [{name: NodeResourcesBalancedAllocation}],"
        " enabled: [{name: NodeResourcesFit, weight: 4}]}}\n"
        "  pluginConfig: [{name: NodeResourcesFit, args: {scoringStrategy: {type: MostAllocated}}}]\n",
        "test.yaml",
    )
    assert (c.fit_strategy, c.fit_weight, c.balanced_weight, c.extender_weight) == ("MostAllocated", 4, 0, None)


def cli_trace(write: Callable[[str, str], Path], pod_lines: Callable[..., str], node_lines: Callable[..., str]) -> list[str]:
    """`--pods` and `--nodes` of a small trace the CLI tests run: 60 GPU pods, 8 CPU pods, 9 nodes."""
    pods = [(f"pod-{i:03d}", 2000 + 500 * (i % 5), 4096, 1, (250, 500, 1000, 750)[i % 4], "") for i in range(60)]
    pods += [(f"cpu-{i}", 4000, 4096, 0, 0, "") for i in range(8)]
    nodes = [(f"n{i}", 64000, 262144, (2, 4, 8)[i % 3], "T4") for i in range(9)]
    return ["--pods", str(write("p.csv", pod_lines(pods))), "--nodes", str(write("n.csv", node_lines(nodes)))]


def test_the_cli_runs_the_kube_model_with_the_baselines(
    write: Callable[[str, str], Path], pod_lines: Callable[..., str], node_lines: Callable[..., str],
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "kube.csv"
    rc = main([*cli_trace(write, pod_lines, node_lines), "--scheduler-model", "kube", "--policy", "kube-default,kube-binpack,packed,fragaware",
               "--seeds", "2", "--csv", str(out), "--plot", str(tmp_path / "k.png")])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["sc_policy"] for r in rows] == [p for p in ("kube-default", "kube-binpack", "packed", "fragaware") for _ in (42, 43)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scheduler-model", "kube", "--policy", "fgd"], "invalid --policy fgd with --scheduler-model kube"),
        (["--scheduler-model", "study", "--policy", "kube-default"], "invalid --policy kube-default with --scheduler-model study"),
        (["--policy", "packed", "--share-model", "milli"], "invalid --share-model milli for packed"),
        (["--filter-tier-width", "-2"], "invalid --filter-tier-width -2"),
        (["--scheduler-config", "/nonexistent.yaml"], "invalid --scheduler-config /nonexistent.yaml"),
    ],
)  # fmt: skip
def test_cli_errors_name_the_bad_value(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*args, "--seeds", "1", "--quiet"]) == 2
    assert message in capsys.readouterr().err
