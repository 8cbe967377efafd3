"""The simulated fleet on the in-process API server: what it publishes for pods bound to its
nodes is what the agent's allocation gives them, pods it admits run, pods that do not fit fail
as the kubelet fails them, and deleted pods give their devices back."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sharepack.common import devices, directions
from sharepack.common.policies import Policy
from sharepack.sandbox.apiwatch import ApiSession
from sharepack.sandbox.kubelet.fleet import Fleet, synthetic_shapes
from sharepack.sandbox.drivers.scalecluster import gpu_pod
from tests.scale import expected

NS = "scale"
NGS = "/apis/sharepack.io/v1alpha1/nodegpustates"
REPLICAS = 4
SHARED = "nvidia.com/gpu.shared"


@pytest.fixture
async def api(sandbox_api: ApiSession) -> ApiSession:
    await sandbox_api.send("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    return sandbox_api


async def running_fleet(api: ApiSession, policy: Policy, nodes: int = 2) -> tuple[Fleet, asyncio.Task[None]]:
    fleet = Fleet(api, synthetic_shapes(nodes, gpus=2), replicas=REPLICAS, policy=policy, heartbeat_s=0)
    await fleet.register()
    return fleet, asyncio.create_task(fleet.run(), name="fleet")


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def bind(api: ApiSession, name: str, node: str, replicas: int, *, annotation: str = "") -> dict[str, Any]:
    pod = gpu_pod(name, resource=SHARED, count=replicas, namespace=NS)
    pod["spec"]["nodeName"] = node
    if annotation:
        pod["metadata"]["annotations"] = {"sharepack.io/gpus": annotation}
    return await api.send("POST", f"/api/v1/namespaces/{NS}/pods", pod)


async def until(api: ApiSession, path: str, check: Any, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        obj = await api.get(path)
        if check(obj):
            return obj
        assert time.monotonic() < deadline, f"{path} never satisfied the check: {obj.get('status')}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("policy", [Policy.PACKED, Policy.DISTRIBUTED])
async def test_published_states_are_the_agents_allocation_of_the_bound_pods(api: ApiSession, policy: Policy) -> None:
    fleet, task = await running_fleet(api, policy)
    try:
        node = "sim-node-00000"
        sizes = [3, 1, 2, 2]
        uids = [str((await bind(api, f"p{i}", node, n))["metadata"]["uid"]) for i, n in enumerate(sizes)]
        want = expected.replayed(node, 2, REPLICAS, policy, list(zip(uids, sizes, strict=True)))
        # Sanity: the two policies really place these differently, so this can tell them apart.
        other = Policy.DISTRIBUTED if policy is Policy.PACKED else Policy.PACKED
        assert want != expected.replayed(node, 2, REPLICAS, other, list(zip(uids, sizes, strict=True)))
        await until(api, f"{NGS}/{node}", lambda o: expected.published(o) == want)
        pods = await api.get(f"/api/v1/namespaces/{NS}/pods")
        assert sorted(p["status"]["phase"] for p in pods["items"]) == ["Running"] * 4
        empty = await api.get(f"{NGS}/sim-node-00001")
        assert {a for a, _ in expected.published(empty).values()} == {0}
    finally:
        await stop(task)


async def test_a_pod_that_does_not_fit_fails_and_a_deleted_pod_frees_its_devices(api: ApiSession) -> None:
    fleet, task = await running_fleet(api, Policy.PACKED)
    try:
        node = "sim-node-00000"
        big = await bind(api, "big", node, 7)
        await bind(api, "late", node, 2)  # 1 replica left
        failed = await until(
            api, f"/api/v1/namespaces/{NS}/pods/late", lambda p: p.get("status", {}).get("phase") == "Failed"
        )
        assert failed["status"]["reason"] == "UnexpectedAdmissionError"
        assert "Requested: 2, Available: 1" in failed["status"]["message"]
        uid = str(big["metadata"]["uid"])
        await until(api, f"{NGS}/{node}", lambda o: expected.published(o) == expected.replayed(
            node, 2, REPLICAS, Policy.PACKED, [(uid, 7)]))  # fmt: skip
        await api.send("DELETE", f"/api/v1/namespaces/{NS}/pods/big", {"gracePeriodSeconds": 0})
        await until(api, f"{NGS}/{node}", lambda o: {a for a, _ in expected.published(o).values()} == {0})
    finally:
        await stop(task)


async def test_directed_gpus_are_honoured_where_they_fit_and_fall_back_with_a_reason(api: ApiSession) -> None:
    """As the agent does (agent.directing): a pod directed to a GPU gets its devices there,
    against what the node's policy would choose; directions that do not fit, for another node
    or unreadable fall back to the policy, counted by reason."""
    fleet, task = await running_fleet(api, Policy.PACKED, nodes=1)
    node = "sim-node-00000"
    try:
        gpus = sorted({d.physical_key for d in fleet.nodes[node].resources[0].devices})
        assert len(gpus) == 2
        first = await bind(api, "first", node, 1)  # packed: the policy puts it on the first GPU
        await until(api, f"{NGS}/{node}", lambda o: sum(a for a, _ in expected.published(o).values()) == 1)
        policy_gpu = devices_of(fleet, node, str(first["metadata"]["uid"]))
        other = next(g for g in gpus if g not in policy_gpu)
        # Packed would put 2 more replicas beside the first; the directions say the other GPU.
        steered = await bind(api, "steered", node, 2, annotation=directions_for(node, {other: 2}))
        # More devices than the pod requests: not what the extender writes (agent.directing too).
        too_many = await bind(api, "too-many", node, 1, annotation=directions_for(node, {other: 3}))
        elsewhere = await bind(api, "elsewhere", node, 1, annotation=directions_for("sim-node-00009", {other: 1}))
        garbled = await bind(api, "garbled", node, 1, annotation="{not json")
        await until(api, f"{NGS}/{node}", lambda o: sum(a for a, _ in expected.published(o).values()) == 6)
        assert devices_of(fleet, node, str(steered["metadata"]["uid"])) == [other, other]
        for pod in (too_many, elsewhere, garbled):
            assert str(pod["metadata"]["uid"]) in fleet.nodes[node].pods  # admitted by the policy
        assert fleet.directed.honoured == 1
        assert {str(r): n for r, n in fleet.directed.fallbacks.items() if n} == {
            "no-directions": 1, "mismatched": 1, "other-node": 1, "malformed": 1,
        }
    finally:
        await stop(task)


def directions_for(node: str, gpus: dict[str, int]) -> str:
    keys = tuple(sorted(k for k, n in gpus.items() for _ in range(n)))
    return directions.encode(directions.Directions(node, (directions.ContainerDirections("main", {SHARED: keys}),)))


def devices_of(fleet: Fleet, node: str, uid: str) -> list[str]:
    return sorted(devices.physical_key(d) for d in fleet.nodes[node].pods[uid].devices[SHARED])


async def test_nodes_advertise_the_agents_resources_and_are_ready(api: ApiSession) -> None:
    fleet, task = await running_fleet(api, Policy.PACKED, nodes=1)
    try:
        node = await api.get("/api/v1/nodes/sim-node-00000")
        assert node["status"]["allocatable"]["nvidia.com/gpu.shared"] == str(2 * REPLICAS)
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "A100"
        assert [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
        ngs = await api.get(f"{NGS}/sim-node-00000")
        assert ngs["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    finally:
        await stop(task)


async def test_heartbeats_rewrite_every_state_and_never_hold_up_settling(api: ApiSession) -> None:
    fleet = Fleet(api, synthetic_shapes(3, gpus=2), replicas=REPLICAS, heartbeat_s=0.2)
    await fleet.register()
    task = asyncio.create_task(fleet.run(), name="fleet")
    try:
        first = {n: (await api.get(f"{NGS}/{n}"))["status"]["observedAt"] for n in fleet.nodes}
        await bind(api, "p0", "sim-node-00000", 1)
        await asyncio.wait_for(fleet.settled(), 10)  # while heartbeats keep going
        assert fleet.published("sim-node-00000") is not None
        await until(api, f"{NGS}/sim-node-00002", lambda o: o["status"]["observedAt"] != first["sim-node-00002"])
    finally:
        await stop(task)
