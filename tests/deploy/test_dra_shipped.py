"""What deploy/dra ships is `common.shipped`'s DRA configuration, and `sharepack-simulate --policy
dra-shipped` (the DRA row docs/dra.md publishes) runs exactly that: the extender in the DRA mode
with the shipped node policy and tier, every pod sent to it by deploy/scheduler's configuration,
the agents publishing their devices in the shipped order (`fresh-first`, republished as claims are
prepared)."""

from __future__ import annotations

import subprocess
from functools import cache
from typing import Any

import pytest
import yaml

from sharepack.common import config as agent_config
from sharepack.agent import options as agent_options
from sharepack.common import shipped
from sharepack.extender import __main__ as extender_main
from tests.conftest import kubectl
from tests.deploy.test_manifests import DEPLOY


@cache
def built_dra() -> tuple[dict[str, Any], ...]:
    built = subprocess.run([kubectl(), "kustomize", str(DEPLOY / "dra")], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return tuple(d for d in yaml.safe_load_all(built.stdout) if d)


def extender_options() -> Any:
    (deployment,) = [d for d in built_dra() if d["kind"] == "Deployment" and d["metadata"]["name"] == "sharepack-extender"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return extender_main.parse_args([a for a in args if not a.startswith(("--tls", "--client-ca"))] + ["--insecure-http"])


def test_deploy_dra_runs_the_extender_in_the_dra_mode_with_the_shipped_node_policy_and_tier() -> None:
    opts = extender_options()
    assert opts.mode == extender_main.MODE_DRA
    assert opts.node_policy == shipped.DRA_NODE_POLICY
    assert opts.filter_tier_width == shipped.FILTER_TIER_WIDTH
    (role,) = [d for d in built_dra() if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "sharepack-extender"]
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices", "resourceclaims"],
            "verbs": ["get", "list", "watch"]} in role["rules"]  # fmt: skip


def agent_options_built() -> agent_options.Options:
    (daemonset,) = [d for d in built_dra() if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "sharepack-agent"]
    return agent_options.parse(daemonset["spec"]["template"]["spec"]["containers"][0]["args"], env={})


def test_deploy_dras_agents_publish_in_the_shipped_policys_order() -> None:
    (configmap,) = [d for d in built_dra() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sharepack-agent-config"]
    for key, text in configmap["data"].items():
        cfg = agent_config.load_config(file_text=text, file_source=key, env={}, flags={})
        assert cfg.allocation_policy == shipped.AGENT_POLICY
    opts = agent_options_built()
    assert opts.mode == agent_options.DRA_MODE
    assert opts.dra_device_order == shipped.DRA_DEVICE_ORDER


def test_simulate_dra_shipped_runs_deploy_dras_configuration() -> None:
    pytest.importorskip("numpy")
    from sharepack.tracesim import dra, kubescheduler, policies

    spec = policies.resolve(policies.DRA_SHIPPED)
    assert spec.label == "dra-shipped"
    allocating = spec.scorer
    assert isinstance(allocating, dra.DraScheduler)
    scheduler = allocating.scheduler
    assert scheduler.config == kubescheduler.load_config(DEPLOY / "scheduler" / "kube-scheduler-config.yaml")
    assert scheduler.config.extender_all_pods == shipped.EVERY_POD
    assert scheduler.config.extender_weight == shipped.EXTENDER_WEIGHT
    opts = extender_options()
    assert scheduler.tier_width == opts.filter_tier_width
    ranker = allocating.allocator
    assert ranker is scheduler.extender
    assert ranker.node_policy == opts.node_policy
    # The agents' --dra-device-order (tests/dra: `common.dradevices.republished`) is the model's order.
    assert ranker.order is dra.DeviceOrder(agent_options_built().dra_device_order)
    assert ranker.gpu_models is False  # the extender's typical workload names no GPU models
