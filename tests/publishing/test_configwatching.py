"""Per-node config: the Node's label picks a named config from a ConfigMap, applied live."""

from __future__ import annotations

from typing import Any

from sharepack.agent.configwatching import ConfigSource
from sharepack.common.config import NODE_CONFIG_LABEL
from sharepack.common.policies import Policy
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer
from tests.publishing.harness import NODE, config, gpus, held, node, time_slicing, wait_object

CONFIGMAP = "sharepack-agent-config"
NAMED = {
    "distributed": time_slicing(4, "distributed"),
    "packed": time_slicing(4, "packed"),
    "broken": "version: v1\nflags:\n  plugin:\n    sharedDevicesAllocationPolicy: spreadd\n",
    "too-many-devices": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 2\n      devices: 5\n",
}
SOURCE = ConfigSource(namespace="default", configmap=CONFIGMAP)


def _setup(label: str | None) -> Any:
    def setup(server: FakeApiServer) -> None:
        server.store.create(kinds.CONFIGMAPS, "default", {"metadata": {"name": CONFIGMAP}, "data": NAMED})
        if label is not None:
            server.store.patch(kinds.NODES, "", NODE, "application/merge-patch+json",
                               {"metadata": {"labels": {NODE_CONFIG_LABEL: label}}})

    return setup


def _label(server: FakeApiServer, value: str) -> None:
    server.store.patch(kinds.NODES, "", NODE, "application/merge-patch+json",
                       {"metadata": {"labels": {NODE_CONFIG_LABEL: value}}})


async def test_a_label_change_switches_from_distributed_to_packed_live() -> None:
    async with node(config(time_slicing(4, "distributed")), gpus(2), config_source=SOURCE,
                    before_start=_setup("distributed")) as n:
        await n.start_pod("a0")
        await n.start_pod("a1")
        state = await n.wait_state(lambda s: sum(held(s).values()) == 2)
        assert sorted(held(state).values()) == [1, 1], "distributed spreads over both GPUs"
        await n.stop_pod("a0")
        await n.stop_pod("a1")

        _label(n.server, "packed")
        state = await n.wait_state(lambda s: s.allocation_policy is Policy.PACKED)
        assert n.agent.config.allocation_policy is Policy.PACKED
        await n.kubelet.wait_for_resource("nvidia.com/gpu")
        await n.kubelet.wait_until(lambda: n.kubelet.connected("nvidia.com/gpu"), what="plugin re-registered")
        await n.start_pod("b0")
        await n.start_pod("b1")
        state = await n.wait_state(lambda s: sum(held(s).values()) == 2)
        assert sorted(held(state).values()) == [0, 2], "packed fills one GPU first"
        applied = await wait_object(n.server, kinds.EVENTS, lambda e: e.get("reason") == "ConfigApplied"
                                    and "packed" in e.get("message", ""))
        assert applied["involvedObject"]["name"] == NODE and applied["type"] == "Normal"
        reloads = "sharepack_agent_config_reloads_total"
        assert n.agent.metrics.value(reloads, source="configmap", outcome="success") == 1
        assert n.agent.metrics.value(reloads, source="configmap", outcome="failure") == 0


async def test_without_a_label_the_default_fallback_rules_apply() -> None:
    named = {"packed": time_slicing(2, "packed")}  # the only config: chosen without a label

    def setup(server: FakeApiServer) -> None:
        server.store.create(kinds.CONFIGMAPS, "default", {"metadata": {"name": CONFIGMAP}, "data": named})

    async with node(config(time_slicing(4, "distributed")), gpus(1), config_source=SOURCE, before_start=setup) as n:
        state = await n.wait_state(lambda s: s.allocation_policy is Policy.PACKED)
        assert [g.total for g in state.resources[0].gpus] == [2]


async def test_an_invalid_named_config_is_reported_and_the_old_one_keeps_serving() -> None:
    async with node(config(time_slicing(4, "distributed")), gpus(2), config_source=SOURCE,
                    before_start=_setup("distributed")) as n:
        await n.wait_state(lambda s: True)
        _label(n.server, "broken")
        event = await wait_object(n.server, kinds.EVENTS, lambda e: e.get("reason") == "InvalidConfig")
        assert event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == NODE
        assert event["involvedObject"]["uid"] == n.server.store.get(kinds.NODES, "", NODE)["metadata"]["uid"]
        assert "spreadd" in event["message"]
        assert n.agent.config.allocation_policy is Policy.DISTRIBUTED
        reloads = "sharepack_agent_config_reloads_total"
        assert n.agent.metrics.value(reloads, source="configmap", outcome="failure") == 1
        # still serving: a pod is admitted, and published under the old policy
        uid = await n.start_pod("p0")
        state = await n.wait_state(lambda s: uid in {p for g in s.resources[0].gpus for p in g.pods})
        assert state.allocation_policy is Policy.DISTRIBUTED


async def test_a_config_this_node_cannot_serve_is_reported_and_the_old_one_stays() -> None:
    async with node(config(time_slicing(4, "distributed")), gpus(2), config_source=SOURCE,
                    before_start=_setup("distributed")) as n:
        await n.wait_state(lambda s: True)
        _label(n.server, "too-many-devices")
        event = await wait_object(n.server, kinds.EVENTS, lambda e: e.get("reason") == "InvalidConfig")
        assert "too-many-devices" in event["message"]
        assert [r.replicas for r in n.agent.resources] == [4]


async def test_a_label_naming_a_missing_config_is_reported() -> None:
    async with node(config(time_slicing(4, "distributed")), gpus(1), config_source=SOURCE,
                    before_start=_setup("nope")) as n:
        event = await wait_object(n.server, kinds.EVENTS, lambda e: e.get("reason") == "InvalidConfig")
        assert "nope" in event["message"]
        assert n.agent.config.allocation_policy is Policy.DISTRIBUTED
