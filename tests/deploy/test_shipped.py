"""What deploy/ ships is `common.shipped`, and `sharepack-simulate --policy shipped` runs exactly
that: the extender's flags and defaults, the agents' policy, the scheduler configuration and the
Helm chart's values, each tied to the one module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sharepack.common import config as agent_config
from sharepack.common import scoring, shipped
from sharepack.extender import __main__ as extender_main

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _flag(args: list[str], name: str) -> str | None:
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def test_the_extender_deployment_runs_the_shipped_node_policy_and_tier() -> None:
    (deployment,) = [d for d in _docs(DEPLOY / "base" / "extender" / "deployment.yaml") if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert _flag(args, "node-policy") == str(shipped.NODE_POLICY)
    assert _flag(args, "filter-tier-width") == str(shipped.FILTER_TIER_WIDTH)
    assert "--no-directed-gpus" not in args and shipped.DIRECTED_GPUS


def test_replicated_extenders_recheck_unscored_binds_in_deploy_the_chart_and_the_sandbox(tmp_path: Path) -> None:
    from sharepack.sandbox.drivers import demo

    (deployment,) = [d for d in _docs(DEPLOY / "base" / "extender" / "deployment.yaml") if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == shipped.EXTENDER_REPLICAS > 1
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert _flag(args, "unscored-binds") == shipped.REPLICATED_UNSCORED_BINDS
    values = yaml.safe_load((DEPLOY / "helm" / "sharepack" / "values.yaml").read_text())
    assert values["extender"]["replicas"] == shipped.EXTENDER_REPLICAS
    assert values["extender"]["unscoredBinds"] == shipped.REPLICATED_UNSCORED_BINDS
    # The sandbox's replicas (the chaos soak's two) run with the same flag; one replica keeps
    # the extender's own default.
    workload = demo.default_workload(1, 8, 4)
    two = demo.Sandbox(shipped.AGENT_POLICY, 1, "dgx-a100", workload, tmp_path, extender_replicas=2)
    one = demo.Sandbox(shipped.AGENT_POLICY, 1, "dgx-a100", workload, tmp_path)
    assert _flag(list(two.extender_args), "unscored-binds") == shipped.REPLICATED_UNSCORED_BINDS
    assert _flag(list(one.extender_args), "unscored-binds") is None


def test_the_extenders_own_defaults_are_the_shipped_ones() -> None:
    opts = extender_main.parse_args(["--insecure-http"])
    assert opts.node_policy == shipped.NODE_POLICY
    assert opts.filter_tier_width == shipped.FILTER_TIER_WIDTH == scoring.DEFAULT_TIER_WIDTH
    assert opts.directed_gpus == shipped.DIRECTED_GPUS


def test_the_agents_allocate_as_shipped() -> None:
    (configmap,) = [d for d in _docs(DEPLOY / "base" / "agent" / "configmap.yaml") if d["kind"] == "ConfigMap"]
    for key, text in configmap["data"].items():
        cfg = agent_config.load_config(file_text=text, file_source=key, env={}, flags={})
        assert cfg.allocation_policy == shipped.AGENT_POLICY


def test_the_scheduler_sends_every_pod_with_the_shipped_weight() -> None:
    doc = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())
    extender, binder = doc["extenders"]  # the ranking entry, then the bind-only one
    assert extender["weight"] == shipped.EXTENDER_WEIGHT
    assert ("managedResources" not in extender) == shipped.EVERY_POD
    assert extender["ignorable"] is True  # an extender outage must not stop scheduling
    assert binder["bindVerb"] == "bind" and binder["ignorable"] is True and binder["managedResources"]


def test_the_helm_values_are_the_shipped_ones() -> None:
    values = yaml.safe_load((DEPLOY / "helm" / "sharepack" / "values.yaml").read_text())
    assert values["extender"]["nodePolicy"] == str(shipped.NODE_POLICY)
    assert values["extender"]["filterTierWidth"] == shipped.FILTER_TIER_WIDTH
    assert values["scheduler"]["weight"] == shipped.EXTENDER_WEIGHT
    assert (values["scheduler"]["managedResources"] == []) == shipped.EVERY_POD
    assert values["config"]["allocationPolicy"] == str(shipped.AGENT_POLICY)


def test_simulate_shipped_runs_the_deployed_configuration() -> None:
    pytest.importorskip("numpy")
    from sharepack.tracesim import kubescheduler, policies

    spec = policies.resolve("shipped")
    scorer = spec.scorer
    assert isinstance(scorer, kubescheduler.KubeScheduler)
    assert scorer.config == kubescheduler.load_config(DEPLOY / "scheduler" / "kube-scheduler-config.yaml")
    assert scorer.config.extender_all_pods == shipped.EVERY_POD
    assert scorer.config.extender_weight == shipped.EXTENDER_WEIGHT
    assert scorer.tier_width == shipped.FILTER_TIER_WIDTH
    extender = scorer.extender
    assert extender is not None
    assert extender.node_policy == shipped.NODE_POLICY  # type: ignore[attr-defined]
    assert extender.policy == shipped.AGENT_POLICY  # type: ignore[attr-defined]
    assert extender.gpu_models is True  # type: ignore[attr-defined]  # the extender reads nodes' GPU models
    assert spec.label == "shipped"


def test_the_kube_models_defaults_are_the_shipped_configuration() -> None:
    """`sharepack-simulate --policy packed` (kube model, default flags) is `--policy shipped`."""
    pytest.importorskip("numpy")
    from sharepack.tracesim import kubescheduler, policies

    ours, deployed = policies.resolve(str(shipped.NODE_POLICY)).scorer, policies.resolve("shipped").scorer
    assert isinstance(ours, kubescheduler.KubeScheduler) and isinstance(deployed, kubescheduler.KubeScheduler)
    assert (ours.config, ours.tier_width, ours.replicas) == (deployed.config, deployed.tier_width, deployed.replicas)
    a, b = ours.extender, deployed.extender
    fields = ("node_policy", "policy", "directed", "gpu_models", "replicas")
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
