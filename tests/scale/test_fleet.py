"""The simulated fleet on the in-process API server: what it publishes for pods bound to its
nodes is what the agent's allocation gives them, pods it admits run, pods that do not fit fail
as the kubelet fails them, and deleted pods give their devices back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sharepack.common.policies import Policy
from sharepack.sandbox.controlplane import plane as controlplane
from sharepack.sandbox.apiserver.server import FakeApiServer
from sharepack.sandbox.apiwatch import ApiSession
from sharepack.sandbox.kubelet.fleet import Fleet, synthetic_shapes
from sharepack.sandbox.drivers.scalecluster import gpu_pod
from tests.scale import expected

NS = "scale"
NGS = "/apis/sharepack.io/v1alpha1/nodegpustates"
REPLICAS = 4


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[ApiSession]:
    async with FakeApiServer() as server:
        client = controlplane.api_client(server.write_kubeconfig(tmp_path / "kubeconfig"))
        session = ApiSession.of(client)
        try:
            await session.send("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
            yield session
        finally:
            await session.close()
            client.close()


async def running_fleet(api: ApiSession, policy: Policy, nodes: int = 2) -> tuple[Fleet, asyncio.Task[None]]:
    fleet = Fleet(api, synthetic_shapes(nodes, gpus=2), replicas=REPLICAS, policy=policy, heartbeat_s=0)
    await fleet.register()
    return fleet, asyncio.create_task(fleet.run(), name="fleet")


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def bind(api: ApiSession, name: str, node: str, replicas: int) -> dict[str, Any]:
    pod = gpu_pod(name, resource="nvidia.com/gpu.shared", count=replicas, namespace=NS)
    pod["spec"]["nodeName"] = node
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


def test_a_node_gives_a_directed_pod_the_gpus_its_directions_name() -> None:
    from sharepack.common import directions, podrequests
    from sharepack.sandbox.kubelet.fleet import NodeDevices, agent_config, pod_directions

    shape = synthetic_shapes(1, gpus=2)[0]
    node = NodeDevices(shape, agent_config(REPLICAS, Policy.PACKED))
    (res,) = node.resources
    key_of = {d.id: d.physical_key for d in res.devices}
    gpu0, gpu1 = sorted(set(key_of.values()))

    def pod(name: str, count: int, keys: tuple[str, ...] | None) -> dict[str, Any]:
        doc = gpu_pod(name, resource=res.name, count=count, namespace=NS)
        doc["metadata"]["uid"] = name
        if keys is not None:
            d = directions.from_placements(shape.name, [("main", {res.name: keys})])
            doc["metadata"]["annotations"] = {directions.ANNOTATION: directions.encode(d)}
        return doc

    def admit(doc: dict[str, Any]) -> set[str]:
        devices = node.admit(podrequests.decode_pod_request(doc), pod_directions(doc, shape.name))
        return {key_of[i] for i in devices.devices[res.name]}

    assert admit(pod("first", 1, None)) == {gpu0}  # packed, undirected: the first GPU
    assert admit(pod("second", 2, (gpu1, gpu1))) == {gpu1}  # directed: GPU 1, though packed says GPU 0
    assert node.honoured == 1 and node.fallbacks == 0
    third = pod("third", 3, (gpu1,))  # directions for 1 device, a request for 3: the policy chooses
    devices = node.admit(podrequests.decode_pod_request(third), pod_directions(third, shape.name))
    assert len(devices.devices[res.name]) == 3 and node.fallbacks == 1 and node.honoured == 1
    other = pod("fourth", 1, None)
    other["metadata"]["annotations"] = {directions.ANNOTATION: "not directions"}
    assert pod_directions(other, shape.name) is None
