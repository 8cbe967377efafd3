"""`--no-directed-gpus` needs no write on pods at all (issue 21): on the real control plane, with
deploy/base applied and then the extender's ClusterRole stripped of `patch pods`, the demo's
stack (kube-scheduler, the extender with its own token, an agent) still schedules, binds and
admits every pod; none carries directions."""

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
from sharepack.sandbox.controlplane import plane as controlplane
from sharepack.sandbox.drivers import demo
from sharepack.sandbox.drivers.demo import Sandbox, Workload
from tests.conftest import real_binaries

pytestmark = pytest.mark.timeout(300)  # the real control plane takes a while to start


async def _without_pod_writes(box: Sandbox) -> None:
    """What an operator who runs `--no-directed-gpus` may do: drop `patch` from the pods rule."""
    rbac: Any = kubernetes.client.RbacAuthorizationV1Api(box.api)
    role = await asyncio.to_thread(rbac.read_cluster_role, "sharepack-extender")
    for rule in role.rules:
        if rule.resources == ["pods"]:
            rule.verbs = [v for v in rule.verbs if v != "patch"]
    await asyncio.to_thread(rbac.replace_cluster_role, "sharepack-extender", role)


async def test_without_directed_gpus_the_extender_binds_every_pod_with_no_right_to_write_pods() -> None:
    real_binaries()  # or a skip saying why
    root = Path(tempfile.mkdtemp(prefix="sp-nodirect-", dir="/tmp"))
    try:
        async with Sandbox(
            Policy.PACKED, 1, "t4-pcie", Workload(4, ()), root, control_plane=demo.REAL,
            extender_args=("--no-directed-gpus",), before_nodes=_without_pod_writes,
        ) as box:  # fmt: skip
            extender = controlplane.api_client(box.extender_kubeconfig)
            try:
                review = await asyncio.to_thread(
                    kubernetes.client.AuthorizationV1Api(extender).create_self_subject_access_review,
                    {"spec": {"resourceAttributes": {"verb": "patch", "resource": "pods", "namespace": "default"}}},
                )
            finally:
                extender.close()
            assert review.status.allowed is False
            core: Any = kubernetes.client.CoreV1Api(box.api)
            for i, replicas in enumerate((1, 2, 4)):
                decision, gpus = await box.run_pod(f"plain-{i}", replicas)
                assert decision.node == "node-0", decision
                assert gpus, f"plain-{i} was bound but its agent published no GPU for it"
                pod = await asyncio.to_thread(core.read_namespaced_pod, f"plain-{i}", "default")
                assert directions.ANNOTATION not in (pod.metadata.annotations or {})
            assert "cannot write its directed GPUs" not in (root / "extender.log").read_text()
    finally:
        shutil.rmtree(root, ignore_errors=True)
