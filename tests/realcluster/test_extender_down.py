"""While the extender is down, pods still schedule (issue 19): the shipped scheduler
configuration marks both extender entries `ignorable`, so the real kube-scheduler filters,
scores and binds GPU pods by itself, and the agent still packs them on the node. What is lost
meanwhile is the cluster-wide ranking and the directed GPUs (README, "While the extender is
down"), which this test shows too: no pod placed during the outage carries directions."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from sharepack.common import directions
from sharepack.common.policies import Policy
from sharepack.sandbox.drivers import demo
from sharepack.sandbox.drivers.demo import Sandbox, Workload
from tests.conftest import real_binaries

pytestmark = pytest.mark.timeout(300)  # the real control plane takes a while to start


async def test_with_the_extender_down_kube_scheduler_places_pods_and_the_agent_still_packs_them() -> None:
    real_binaries()  # or a skip saying why
    root = Path(tempfile.mkdtemp(prefix="sp-extdown-", dir="/tmp"))
    try:
        async with Sandbox(Policy.PACKED, 1, "t4-pcie", Workload(4, ()), root, control_plane=demo.REAL) as box:
            core: Any = kubernetes.client.CoreV1Api(box.api)
            decision, before = await box.run_pod("with-extender", 1)
            assert decision.node == "node-0", decision
            pod = await asyncio.to_thread(core.read_namespaced_pod, "with-extender", "default")
            assert directions.ANNOTATION in (pod.metadata.annotations or {}), "the extender did not bind it"

            assert box.extender is not None
            await box.extender.stop()
            placed: dict[str, tuple[str, ...]] = {}
            for name, replicas in (("down-1", 1), ("down-2", 2)):
                decision, gpus = await box.run_pod(name, replicas)
                assert decision.node == "node-0", f"{name} was not placed with the extender down: {decision}"
                pod = await asyncio.to_thread(core.read_namespaced_pod, name, "default")
                assert directions.ANNOTATION not in (pod.metadata.annotations or {}), (
                    f"{name} carries directions although no extender was running"
                )
                placed[name] = gpus
            # 1 + 1 + 2 replicas of a GPU's 4: `packed` on the node keeps them on one GPU.
            assert placed["down-1"] == before and placed["down-2"] == before, (before, placed)
    finally:
        shutil.rmtree(root, ignore_errors=True)
