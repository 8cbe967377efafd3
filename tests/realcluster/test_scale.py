"""The simulated fleet under the real kube-scheduler and the real extender: 20 nodes, 30 GPU
pods, one after the other. Every pod is bound and Running, every node's published state is what the agent's
allocation (`common.allocation`, replayed here in the order the node admitted its pods) gives
the pods bound there, and the extender's predicted GPUs are the ones the node then reports."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sharepack.common.policies import Policy
from sharepack.sandbox.drivers.scalecluster import NAMESPACE, ScaleCluster, gpu_pod
from sharepack.sandbox.kubelet.fleet import synthetic_shapes, wait_for
from tests.conftest import real_binaries
from tests.scale import expected

pytestmark = pytest.mark.timeout(400)

NODES, GPUS, REPLICAS = 20, 2, 4
SIZES = (1, 2, 3, 4, 2, 1)  # replicas per pod, cycled over 30 pods


async def test_published_states_match_the_allocation_of_the_pods_kube_scheduler_bound(tmp_path: Path) -> None:
    real_binaries()
    shapes = synthetic_shapes(NODES, gpus=GPUS)
    async with ScaleCluster(shapes, tmp_path, replicas=REPLICAS, agent_policy=Policy.PACKED, progress=False) as cluster:
        await cluster.start_scheduler(with_extender=True)
        pods = [
            gpu_pod(f"p-{i:02d}", resource="nvidia.com/gpu.shared", count=SIZES[i % len(SIZES)]) for i in range(30)
        ]
        size = {p["metadata"]["name"]: SIZES[i % len(SIZES)] for i, p in enumerate(pods)}
        # One at a time, as the agent sees a serial stream: the extender predicts each pod on
        # the state the node admits it in. (Bursts bind concurrently and the API may commit
        # them in another order than the extender assumed them; the benchmark does those.)
        for pod in pods:
            await cluster.create_pods([pod])
            (outcome,) = await cluster.tracker.wait([pod["metadata"]["name"]], 60)
            assert outcome.node, outcome.unschedulable
        # The fleet's own pod watch may see the last bind after the tracker's did.
        await wait_for(lambda: sum(len(n.pods) for n in cluster.fleet.nodes.values()) == 30, "the fleet admitting every pod", 60)
        await cluster.fleet.settled()

        listed = await cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")
        assert sorted(p["status"].get("phase") for p in listed["items"]) == ["Running"] * 30
        uid_size = {p["metadata"]["uid"]: size[p["metadata"]["name"]] for p in listed["items"]}
        node_of = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in listed["items"]}
        for shape in shapes:
            # The order the node admitted its pods; the sizes come from the pods as created.
            order = [uid for uid in cluster.fleet.nodes[shape.name].pods]
            assert sorted(order) == sorted(u for u, n in node_of.items() if n == shape.name)
            want = expected.replayed(shape.name, GPUS, REPLICAS, Policy.PACKED, [(u, uid_size[u]) for u in order])
            got = await cluster.api.get(f"/apis/sharepack.io/v1alpha1/nodegpustates/{shape.name}")
            assert expected.published(got) == want, shape.name

        # The extender settled each pod it bound against what the node reported.
        deadline = time.monotonic() + 60
        while True:
            m = await cluster.extender_metrics()
            settled = m.get('sharepack_extender_predictions_total{outcome="match"}', 0) + m.get(
                'sharepack_extender_predictions_total{outcome="mismatch"}', 0
            )
            if settled >= 30 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert m.get('sharepack_extender_predictions_total{outcome="mismatch"}') == 0
        assert m.get('sharepack_extender_predictions_total{outcome="match"}') == 30
        # kube-scheduler's Go client took the HTTP/2 the extender offers (extender.http2): its
        # 30 filters and 30 binds came on one connection, not a handshake per burst of binds.
        assert m.get('sharepack_extender_connections_total{protocol="h2"}', 0) >= 1
        assert m.get('sharepack_extender_connections_total{protocol="http/1.1"}', 0) == 0
        assert m.get("sharepack_extender_tls_handshakes", 0) <= 3
        await cluster.stop_scheduler()
