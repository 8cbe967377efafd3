"""The extender's DRA mode on the real control plane: ResourceSlices written by hand (as a DRA
driver publishes them) and a DeviceClass mapping `nvidia.com/gpu.shared`; pods asking for it are
given claims by the real kube-scheduler on the node the extender ranks best, and the extender's
prediction matches the device the scheduler's allocator chose.

The extender runs as deployed with deploy/components/dra-extender (its service account, the
component's RBAC, `--mode=dra`), with a tier of one node so that its choice is the scheduler's."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sharepack.common import draslices
from sharepack.extender.metrics import parse_text
from sharepack.sandbox.apiwatch import ApiSession
from sharepack.sandbox.controlplane.plane import RealControlPlane, api_client, free_port
from sharepack.sandbox.controlplane.identities import Identities
from sharepack.sandbox.processes import LoggedProcess
from sharepack.sandbox.drivers.scalecluster import gpu_pod
from tests.conftest import real_binaries
from tests.deploy.test_dra_extender import dra_overlay

pytestmark = pytest.mark.timeout(300)

NS = "dra-test"
NODES = ("dra-a", "dra-b", "dra-c")
SHARED = "nvidia.com/gpu.shared"
RESOURCE = f"/apis/{draslices.GROUP}/{draslices.VERSION}"


def _node(name: str) -> dict[str, Any]:
    room = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": room, "allocatable": room},
    }


def _slice(node: str) -> dict[str, Any]:
    """Two GPUs of four replicas each, one device per replica, GPU by GPU."""
    devices = [
        {
            "name": f"gpu-{g}-replica-{r}",
            "attributes": {
                "uuid": {"string": f"GPU-{node}-{g}"},
                "index": {"int": g},
                "productName": {"string": "NVIDIA A100-SXM4-40GB"},
                "type": {"string": "shared"},
                "replica": {"int": r},
            },
        }
        for g in range(2)
        for r in range(4)
    ]
    return {
        "apiVersion": f"{draslices.GROUP}/{draslices.VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{draslices.DRIVER}"},
        "spec": {
            "driver": draslices.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


DEVICE_CLASS = {
    "apiVersion": f"{draslices.GROUP}/{draslices.VERSION}",
    "kind": "DeviceClass",
    "metadata": {"name": f"shared.{draslices.DRIVER}"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": f'device.driver == "{draslices.DRIVER}" && '
                    f'device.attributes["{draslices.DRIVER}"].type == "shared"'
                }
            }
        ],
        "extendedResourceName": SHARED,
    },
}


async def _wait(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def test_the_scheduler_allocates_on_the_node_and_gpu_the_dra_extender_predicts(tmp_path: Path) -> None:
    binaries = real_binaries()
    (tmp_path / "kube").mkdir()
    async with RealControlPlane(tmp_path / "kube", binaries=binaries) as control:
        manifests = await control.apply_deploy_base(dra_overlay(tmp_path))
        await control.ensure_namespace(NS)
        admin = api_client(control.kubeconfig)
        api = ApiSession.of(admin)
        extender: LoggedProcess | None = None
        try:
            for name in NODES:
                await api.send("POST", "/api/v1/nodes", _node(name))
                await api.send("POST", f"{RESOURCE}/resourceslices", _slice(name))
            await api.send("POST", f"{RESOURCE}/deviceclasses", DEVICE_CLASS)

            deployment = next(
                m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"] == "sharepack-extender"
            )
            args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            assert "--mode=dra" in args  # the component's flag, passed on below as deployed
            kubeconfig = await Identities(control, manifests).extender_kubeconfig()
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            extender = LoggedProcess(
                [sys.executable, "-m", "sharepack.extender", f"--listen=127.0.0.1:{port}", "--insecure-http",
                 f"--kubeconfig={kubeconfig}", "--mode=dra", "--node-policy=packed", "--filter-tier-width=1",
                 "--log-level=info"],
                tmp_path / "extender.log",
            )  # fmt: skip
            await extender.start()
            async with aiohttp.ClientSession() as http:

                async def metrics() -> dict[str, float]:
                    try:
                        async with http.get(f"{url}/metrics") as resp:
                            return parse_text(await resp.text())
                    except (aiohttp.ClientError, OSError):
                        return {}

                async def cached() -> bool:
                    assert not extender.exited, extender.log_tail(1500)
                    return (await metrics()).get("sharepack_extender_cache_nodes") == len(NODES)

                await _wait("the extender to read every node's slices", cached)
                await control.start_scheduler(url)

                async def bound(name: str) -> str:
                    pod = await api.get(f"/api/v1/namespaces/{NS}/pods/{name}")
                    return str(pod["spec"].get("nodeName", ""))

                async def claim_of(name: str) -> list[str]:
                    claims = await api.get(f"{RESOURCE}/namespaces/{NS}/resourceclaims")
                    for c in claims["items"]:
                        if any(r.get("name") == name for r in c.get("status", {}).get("reservedFor", [])):
                            results = c["status"].get("allocation", {}).get("devices", {}).get("results", [])
                            return [f"{r['pool']}/{r['device']}" for r in results]
                    return []

                # A first pod pinned to the last node by name: its GPU 0 is now in use there.
                first = gpu_pod("first", resource=SHARED, count=1, namespace=NS)
                first["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODES[-1]}
                await api.send("POST", f"/api/v1/namespaces/{NS}/pods", first)
                assert await _wait("the first pod to bind", lambda: bound("first")) == NODES[-1]
                assert await _wait("its claim", lambda: claim_of("first")) == [f"{NODES[-1]}/gpu-0-replica-0"]

                # Unpinned pods: packed ranks the used node first (the in-tree LeastAllocated
                # and the node names would not), and first fit puts them on its used GPU.
                for i, count in enumerate((1, 2)):
                    name = f"next-{i}"
                    await api.send(
                        "POST",
                        f"/api/v1/namespaces/{NS}/pods",
                        gpu_pod(name, resource=SHARED, count=count, namespace=NS),
                    )
                    assert await _wait(f"{name} to bind", lambda name=name: bound(name)) == NODES[-1]
                    devices = await _wait(f"the claim of {name}", lambda name=name: claim_of(name))
                    assert all(d.startswith(f"{NODES[-1]}/gpu-0-") for d in devices), devices

                async def settled() -> dict[str, float]:
                    m = await metrics()
                    total = sum(
                        m.get(f'sharepack_extender_predictions_total{{outcome="{o}"}}', 0)
                        for o in ("match", "mismatch")
                    )
                    return m if total >= 3 else {}

                # Every pod it bound, the pinned one too, checked against its allocated claim.
                m = await _wait("the extender to settle its predictions against the claims", settled)
                assert m['sharepack_extender_predictions_total{outcome="match"}'] == 3
                assert m['sharepack_extender_predictions_total{outcome="mismatch"}'] == 0
        finally:
            if extender is not None:
                await extender.stop()
            await api.close()
            admin.close()
