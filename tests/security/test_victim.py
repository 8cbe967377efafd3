"""Issue 15's finding, replayed on the demo's stack (`sandbox.demo.Sandbox`: the API server, a
simulated node with its agent, the extender as a process), on both control planes (the real one,
with kube-scheduler running the shipped configuration, where it is built): a pod that requests
no GPU and whose nodeSelector matches no node, then `POST /bind` putting it on node-0. Before:
one unauthenticated call bound it. Now the call without a certificate gets no answer at all, and
the same call with the scheduler's own certificate is refused by the bind guard, with the rule;
the pod stays unbound."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes
import pytest

from sharepack.common.policies import Policy
from sharepack.extender.metrics import parse_text
from sharepack.sandbox.drivers import demo
from sharepack.sandbox.drivers.demo import Sandbox, Workload
from tests.conftest import real_binaries

pytestmark = pytest.mark.timeout(240)  # the real control plane takes a while to start


@pytest.mark.parametrize("control_plane", demo.CONTROL_PLANES)
async def test_the_victim_pod_cannot_be_bound_through_the_extender(control_plane: str) -> None:
    if control_plane == demo.REAL:
        real_binaries()  # or a skip saying why
    root = Path(tempfile.mkdtemp(prefix="sp-victim-", dir="/tmp"))
    try:
        async with Sandbox(Policy.PACKED, 1, "t4-pcie", Workload(4, ()), root, control_plane=control_plane) as box:
            core: Any = kubernetes.client.CoreV1Api(box.api)
            victim = await asyncio.to_thread(core.create_namespaced_pod, "default", {
                "metadata": {"name": "victim"},
                "spec": {"nodeSelector": {"sharepack.io/no-such-node": "true"},
                         "containers": [{"name": "main", "image": "busybox"}]},
            })  # fmt: skip
            body = {"PodName": "victim", "PodNamespace": "default", "PodUID": victim.metadata.uid, "Node": "node-0"}

            # The call from the issue, by anyone who reaches the port: no TLS, or TLS without
            # the scheduler's certificate. Neither gets an HTTP answer.
            trusting = ssl.create_default_context(cafile=str(box.tls.ca_cert))
            async with aiohttp.ClientSession() as anyone:
                for url, tls in ((box.extender_url.replace("https:", "http:"), None), (box.extender_url, trusting)):
                    with pytest.raises(aiohttp.ClientError):
                        async with anyone.post(f"{url}/bind", json=body, ssl=tls or True) as resp:
                            await resp.read()

            # The scheduler's own certificate reaches /bind, which refuses: no GPU request.
            async with box.session.post(f"{box.extender_url}/bind", json=body) as resp:
                assert resp.status == 200
                reply = await resp.json()
            assert reply == {"Error": "sharepack: bind refused (no-gpu-request): pod default/victim requests no "
                                      "resource an agent publishes: it is not this extender's to bind"}

            pod = await asyncio.to_thread(core.read_namespaced_pod, "victim", "default")
            assert pod.spec.node_name is None
            async with box.session.get(f"{box.extender_url}/metrics") as resp:
                text = await resp.text()
            samples = parse_text(text)
            assert samples['sharepack_extender_bind_refusals_total{rule="no-gpu-request"}'] == 1
            assert samples['sharepack_extender_binds_total{result="success"}'] == 0
    finally:
        shutil.rmtree(root, ignore_errors=True)
