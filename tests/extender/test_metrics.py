"""The extender's per node and per GPU gauges, and the capacity rules behind them."""

from __future__ import annotations

import pytest

from sharepack.common.capacity import Capacity, capacity
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.extender.caches import ClusterView
from sharepack.extender.metrics import parse_text
from tests.extender.test_caches import SHARED, pod_obj, state_obj

MIG_1G = "nvidia.com/mig-1g.5gb"
MIG_3G = "nvidia.com/mig-3g.20gb"


def gpu(key: str, total: int, allocated: int, unhealthy: int = 0) -> GpuState:
    return GpuState(key, key[-1], "A100", total, allocated, unhealthy)


def node(*resources: tuple[str, tuple[GpuState, ...]]) -> NodeState:
    return NodeState("2026-11-30T03:00:00Z", "0.1.0", Policy.PACKED, MigStrategy.MIXED,
                     tuple(ResourceState(n, Sharing.NONE, False, g) for n, g in resources))  # fmt: skip


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(node((SHARED, (gpu("GPU-0", 4, 0), gpu("GPU-1", 4, 0)))), Capacity(2, 2, 0, 0, 8),
                     id="an idle node has every gpu whole and nothing stranded"),
        pytest.param(node((SHARED, (gpu("GPU-0", 4, 1), gpu("GPU-1", 4, 4)))), Capacity(2, 0, 3, 5, 8),
                     id="free replicas of a partly used gpu are stranded, a full gpu strands none"),
        pytest.param(node((SHARED, (gpu("GPU-0", 4, 0, unhealthy=1), gpu("GPU-1", 4, 0)))), Capacity(2, 1, 3, 0, 8),
                     id="an unhealthy replica makes its gpu not whole"),
        pytest.param(node((MIG_1G, (gpu("GPU-0", 3, 1),)), (MIG_3G, (gpu("GPU-0", 1, 0), gpu("GPU-1", 1, 0)))),
                     Capacity(2, 1, 3, 1, 5),
                     id="mig instances of one parent gpu count together across resources"),
    ],
)  # fmt: skip
def test_capacity(state: NodeState, expected: Capacity) -> None:
    assert capacity(state) == expected


async def scrape(view: ClusterView) -> dict[str, float]:
    return parse_text((await view.metrics.render()).decode())


async def test_node_and_gpu_gauges_follow_published_states_not_assumed_pods() -> None:
    view = ClusterView(Policy.PACKED)
    view.upsert_state(state_obj("node-a", [(4, 1, ("p0",)), (4, 0, ())]))
    view.upsert_state(state_obj("node-b", [(4, 4, ("p1",)), (4, 0, ())]))
    m = await scrape(view)
    gpu0 = f'node="node-a",resource="{SHARED}"'
    assert m[f'sharepack_extender_gpu_devices_allocated{{gpu="0",{gpu0}}}'] == 1
    assert m[f'sharepack_extender_gpu_devices_total{{gpu="0",{gpu0}}}'] == 4
    assert m[f'sharepack_extender_gpu_devices_unhealthy{{gpu="1",{gpu0}}}'] == 0
    assert m['sharepack_extender_node_whole_gpus_free{node="node-a"}'] == 1
    assert m['sharepack_extender_node_stranded_replicas{node="node-a"}'] == 3
    assert m['sharepack_extender_node_whole_gpus_free{node="node-b"}'] == 1
    assert m['sharepack_extender_node_stranded_replicas{node="node-b"}'] == 0

    # A pod the extender assumes is not published yet: the gauges say what the agent reported.
    view.upsert_pod(pod_obj("p2", "node-a", 2))
    assert view.assumed
    assert (await scrape(view))['sharepack_extender_node_stranded_replicas{node="node-a"}'] == 3

    # The agent's next write moves them; a deleted state takes its series away.
    view.upsert_state(state_obj("node-a", [(4, 3, ("p0", "p2")), (4, 0, ())], rv="2"))
    view.delete_state({"metadata": {"name": "node-b"}})
    m = await scrape(view)
    assert m['sharepack_extender_node_stranded_replicas{node="node-a"}'] == 1
    assert m[f'sharepack_extender_gpu_devices_allocated{{gpu="0",{gpu0}}}'] == 3
    assert not [k for k in m if 'node="node-b"' in k]

    # A heartbeat (same values, new resourceVersion) keeps the node's formatted text.
    formatted = view.gauges["node-a"]
    view.upsert_state(state_obj("node-a", [(4, 3, ("p0", "p2")), (4, 0, ())], rv="3"))
    assert view.gauges["node-a"] is formatted
    view.upsert_state(state_obj("node-a", [(4, 4, ("p0", "p2", "p3")), (4, 0, ())], rv="4"))
    assert (await scrape(view))['sharepack_extender_node_stranded_replicas{node="node-a"}'] == 0


async def test_an_unreadable_state_has_no_gauges() -> None:
    view = ClusterView(Policy.PACKED)
    view.upsert_state(state_obj("node-a", [(4, 1, ("p0",))]))
    view.upsert_state({"metadata": {"name": "node-a", "resourceVersion": "2"}, "status": {"schemaVersion": 99}})
    m = await scrape(view)
    assert "node-a" in view.invalid
    assert not [k for k in m if 'node="node-a"' in k]
