"""DRA mode on the real kube-apiserver and kube-scheduler: deploy/dra applied as users apply it,
agents as DRA kubelet plugins publishing ResourceSlices, the sandbox kubelet preparing claims.

* A user's pod asking `nvidia.com/gpu.shared: 1`, applied with kubectl, gets a claim the real
  kube-scheduler made and allocated (the DRA extended-resource mapping), which the agent prepares
  (a CDI spec), and runs; deleting it unprepares the claim.
* The allocator, first fit over the slice's devices, follows the `packed` order: replicas fill
  one GPU before the next, and a pod asking two replicas gets two of the same GPU.
* Each agent may write only its own node's ResourceSlices (RBAC plus the admission policy).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharepack.agent.dra import cdi
from sharepack.common import dradevices
from sharepack.sandbox.controlplane.plane import BackgroundControlPlane, RealControlPlane
from sharepack.sandbox.drivers.drastack import DraCluster
from tests.conftest import real_binaries

pytestmark = pytest.mark.timeout(300)

NODES = ("dra-a", "dra-b")
NAMESPACE = "default"
SHARED = "nvidia.com/gpu.shared"


def dra_stack(nodes: tuple[str, ...], **options: Any) -> Iterator[tuple[BackgroundControlPlane, DraCluster]]:
    """A real control plane with deploy/dra applied and `nodes` as DRA nodes (`DraCluster`'s
    `options`), for a module-scoped fixture."""
    background = BackgroundControlPlane(binaries=real_binaries())
    control = background.start()
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    cluster = DraCluster(control, root, nodes, **options)
    try:
        background.run(cluster.__aenter__(), timeout=240)
        yield background, cluster
        background.run(cluster.__aexit__(None, None, None))
    finally:
        background.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def dra() -> Iterator[tuple[BackgroundControlPlane, DraCluster]]:
    yield from dra_stack(NODES)


def kubectl(control: RealControlPlane, background: BackgroundControlPlane, *args: str, stdin: str | None = None,
            kubeconfig: Path | None = None) -> str:  # fmt: skip
    out: str = background.run(control.kubectl(*args, stdin=None if stdin is None else stdin.encode(), kubeconfig=kubeconfig))
    return out


def pod_manifest(name: str, replicas: int = 1, node: str | None = None) -> str:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "cuda-sample:latest",
                        "resources": {"limits": {SHARED: str(replicas)}}}],
    }  # fmt: skip
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec})


def get(control: RealControlPlane, background: BackgroundControlPlane, *args: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(kubectl(control, background, "get", *args, "-o", "json"))
    return doc


def wait_running(control: RealControlPlane, background: BackgroundControlPlane, name: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        pod = get(control, background, "pod", name, "-n", NAMESPACE)
        if (pod.get("status") or {}).get("phase") == "Running":
            return pod
        assert time.monotonic() < deadline, f"pod {name} is not Running: {json.dumps(pod.get('status'))}"
        time.sleep(0.2)


def allocated(control: RealControlPlane, background: BackgroundControlPlane, pod: dict[str, Any]) -> list[tuple[str, str]]:
    """(pool, device) of every device the pod's extended-resource claim holds from our driver."""
    name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = get(control, background, "resourceclaim", name, "-n", NAMESPACE)
    results = claim["status"]["allocation"]["devices"]["results"]
    return [(r["pool"], r["device"]) for r in results if r["driver"] == dradevices.DRIVER]


def run_pod(control: RealControlPlane, background: BackgroundControlPlane, name: str, replicas: int = 1,
            node: str | None = None) -> dict[str, Any]:  # fmt: skip
    kubectl(control, background, "apply", "-f", "-", stdin=pod_manifest(name, replicas, node))
    return wait_running(control, background, name)


def test_a_shared_gpu_pod_gets_a_claim_the_agent_prepares_and_runs(dra: tuple[BackgroundControlPlane, DraCluster]) -> None:
    background, cluster = dra
    control = cluster.control
    pod = run_pod(control, background, "dra-user-pod")
    node = pod["spec"]["nodeName"]
    (device,) = allocated(control, background, pod)
    assert device[0] == node  # pool = node name
    assert device[1].startswith("gpu-") and "-replica-" in device[1]
    mappings = pod["status"]["extendedResourceClaimStatus"]["requestMappings"]
    assert [(m["containerName"], m["resourceName"]) for m in mappings] == [("main", SHARED)]
    # The node's allocatable has no nvidia.com/gpu.shared: the scheduler served it through DRA.
    assert SHARED not in get(control, background, "node", node)["status"]["allocatable"]
    simulated = cluster.nodes[node]
    assert simulated.dra is not None
    (prepared,) = simulated.dra.prepared(pod["metadata"]["uid"])
    spec_file = cdi.spec_path(simulated.cdi_root, prepared.ref.uid)
    spec = json.loads(spec_file.read_text())
    assert spec["kind"] == cdi.KIND and len(spec["devices"]) == 1
    assert any(e.startswith("NVIDIA_VISIBLE_DEVICES=GPU-") for e in spec["devices"][0]["containerEdits"]["env"])
    kubectl(control, background, "delete", "pod", "dra-user-pod", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    deadline = time.monotonic() + 30
    while spec_file.exists():  # unprepared once the pod is gone
        assert time.monotonic() < deadline, "the claim was not unprepared after its pod was deleted"
        time.sleep(0.1)
    assert simulated.dra.prepared(pod["metadata"]["uid"]) == ()


def held_on(control: RealControlPlane, background: BackgroundControlPlane, node: str) -> set[str]:
    """Devices of `node` that allocated claims hold (a deleted pod's claim stays allocated here:
    no kube-controller-manager runs to release it)."""
    held = set()
    for claim in get(control, background, "resourceclaims", "-A")["items"]:
        for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []:
            if r["driver"] == dradevices.DRIVER and r["pool"] == node:
                held.add(r["device"])
    return held


def test_the_allocator_follows_the_packed_order_of_the_slice(dra: tuple[BackgroundControlPlane, DraCluster]) -> None:
    background, cluster = dra
    control = cluster.control
    node = NODES[1]
    (published,) = get(control, background, "resourceslices", f"--field-selector=spec.nodeName={node}")["items"]
    order = [d["name"] for d in published["spec"]["devices"]]
    assert order[:5] == [
        "gpu-0-replica-0", "gpu-0-replica-1", "gpu-0-replica-2", "gpu-0-replica-3", "gpu-1-replica-0",
    ]  # fmt: skip
    held = held_on(control, background, node)
    free = [d for d in order if d not in held]
    devices = []
    for i in range(5):
        devices += [d for _, d in allocated(control, background, run_pod(control, background, f"dra-packed-{i}", node=node))]
    assert devices == free[:5]  # first fit, in the slice's order
    two = [d for _, d in allocated(control, background, run_pod(control, background, "dra-packed-two", 2, node=node))]
    assert two == free[5:7]
    # Two replicas for one container come from one GPU, as `packed` does in device-plugin mode.
    assert len({d.rsplit("-replica-", 1)[0] for d in two}) == 1


def foreign_slice(owner: str, node: str, driver: str = dradevices.DRIVER) -> str:
    return yaml.safe_dump({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{owner}-writes-{node}-{driver}"},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": []},
    })  # fmt: skip


def test_an_agent_writes_only_its_own_nodes_resourceslices(dra: tuple[BackgroundControlPlane, DraCluster]) -> None:
    background, cluster = dra
    control = cluster.control
    own, other = NODES
    agent = cluster.agent_kubeconfigs[own]  # what the agent on `own` publishes with
    for body, why in (
        (foreign_slice(own, other), f"on its own node {own}, not"),
        (foreign_slice(own, own, "other.example.com"), "of driver gpu.sharepack.io"),
    ):
        with pytest.raises(Exception, match=why) as refused:
            kubectl(control, background, "create", "-f", "-", stdin=body, kubeconfig=agent)
        assert "Forbidden" in str(refused.value) or "denied" in str(refused.value)
    # Its own node's slice of its own driver: allowed (what the agent publishes), then cleaned up.
    name = yaml.safe_load(foreign_slice(own, own))["metadata"]["name"]
    kubectl(control, background, "create", "-f", "-", stdin=foreign_slice(own, own), kubeconfig=agent)
    kubectl(control, background, "delete", "resourceslice", name, kubeconfig=agent)
    # Another node's slice may not be changed or deleted either.
    (theirs,) = get(control, background, "resourceslices", f"--field-selector=spec.nodeName={other}")["items"]
    with pytest.raises(Exception, match=f"on its own node {own}, not"):
        kubectl(control, background, "delete", "resourceslice", theirs["metadata"]["name"], kubeconfig=agent)
    # A token of the agent's account bound to no pod names no node: refused too.
    unbound = control.token_kubeconfig("agent-unbound", background.run(control.service_account_token("sharepack-node", "sharepack-agent")))
    with pytest.raises(Exception, match="names no node"):
        kubectl(control, background, "create", "-f", "-", stdin=foreign_slice(own, own), kubeconfig=unbound)


# --- why one device per replica: what the real allocator does with consumable capacity ---------

CC_NODE = "dra-consumable"


def consumable_slice(gpus: int, replicas: int) -> dict[str, Any]:
    """The alternative design: one shareable device per GPU with a `replicas` capacity."""
    devices = [
        {
            "name": f"gpu-{i}",
            "allowMultipleAllocations": True,
            "attributes": {
                "uuid": {"string": f"GPU-consumable-{i}"}, "index": {"int": i}, "productName": {"string": "Tesla T4"},
                "type": {"string": "shared"}, "resource": {"string": SHARED},
            },
            "capacity": {"replicas": {"value": str(replicas), "requestPolicy": {
                "default": "1", "validRange": {"min": "1", "max": str(replicas)}}}},
        }
        for i in range(gpus)
    ]  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{CC_NODE}-slice"},
        "spec": {"driver": dradevices.DRIVER, "nodeName": CC_NODE,
                 "pool": {"name": CC_NODE, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
    }  # fmt: skip


def scheduled_or_reason(control: RealControlPlane, background: BackgroundControlPlane, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        pod = get(control, background, "pod", name, "-n", NAMESPACE)
        conditions = (pod.get("status") or {}).get("conditions") or []
        if pod["spec"].get("nodeName") or any(c.get("reason") == "Unschedulable" for c in conditions):
            return pod
        assert time.monotonic() < deadline, f"pod {name} neither scheduled nor unschedulable"
        time.sleep(0.2)


def test_with_consumable_capacity_n_shares_always_span_n_distinct_gpus(dra: tuple[BackgroundControlPlane, DraCluster]) -> None:
    """The extended-resource mapping asks N devices with no capacity request; the allocator takes
    each next device strictly after the previous one. So with one shareable device per GPU, two
    shares land on two GPUs (never one), and a node of two GPUs cannot serve three shares however
    many replicas each GPU has left. One device per replica (the agent's choice) has neither limit."""
    background, cluster = dra
    control = cluster.control
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": CC_NODE, "labels": {"kubernetes.io/hostname": CC_NODE}}}
    kubectl(control, background, "create", "-f", "-", stdin=yaml.safe_dump(node))
    status = {"status": {"allocatable": {"pods": "110", "cpu": "8", "memory": "64Gi"},
                         "capacity": {"pods": "110", "cpu": "8", "memory": "64Gi"},
                         "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}  # fmt: skip
    kubectl(control, background, "patch", "node", CC_NODE, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    kubectl(control, background, "create", "-f", "-", stdin=yaml.safe_dump(consumable_slice(gpus=2, replicas=4)))
    try:
        kubectl(control, background, "apply", "-f", "-", stdin=pod_manifest("dra-cc-two", 2, CC_NODE))
        pod = scheduled_or_reason(control, background, "dra-cc-two")
        assert pod["spec"].get("nodeName") == CC_NODE
        claim = get(control, background, "resourceclaim", pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"],
                    "-n", NAMESPACE)  # fmt: skip
        results = claim["status"]["allocation"]["devices"]["results"]
        assert sorted(r["device"] for r in results) == ["gpu-0", "gpu-1"]  # two GPUs, one share each
        assert all(r.get("shareID") and r["consumedCapacity"] == {"replicas": "1"} for r in results)
        kubectl(control, background, "apply", "-f", "-", stdin=pod_manifest("dra-cc-three", 3, CC_NODE))
        pod = scheduled_or_reason(control, background, "dra-cc-three")
        assert not pod["spec"].get("nodeName")  # 6 replicas left, but only 2 devices
        (why,) = [c["message"] for c in pod["status"]["conditions"] if c.get("reason") == "Unschedulable"]
        assert "1 cannot allocate all claims" in why
    finally:
        for name in ("dra-cc-two", "dra-cc-three"):
            kubectl(control, background, "delete", "pod", name, "-n", NAMESPACE, "--ignore-not-found", "--grace-period=0", "--force")
        kubectl(control, background, "delete", "resourceslice", f"{CC_NODE}-slice", "--ignore-not-found")
