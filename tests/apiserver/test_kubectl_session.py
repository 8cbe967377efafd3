"""What a user does with kubectl against the sandbox API server (issue 10, item 5): apply and
create (which need the OpenAPI documents), explain, auth can-i, get nodes / pods / events,
describe. Run with every kubectl found: the one on PATH and the one the real control plane's
build makes; skipped where there is none (a failure under SHAREPACK_REQUIRE_REAL)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer
from tests.conftest import kubectl as any_kubectl
from tests.conftest import kubectls


KUBECTLS = kubectls() or ["(none)"]  # "(none)": the test skips, or fails under SHAREPACK_REQUIRE_REAL
POD = """apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: c
    image: busybox:1.36
    resources:
      limits: {nvidia.com/gpu: "1"}
"""


def _seed(server: FakeApiServer) -> None:
    store = server.store
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
             "lastHeartbeatTime": "2026-12-01T00:00:00Z", "lastTransitionTime": "2026-12-01T00:00:00Z"}  # fmt: skip
    store.create(kinds.NODES, "", {
        "metadata": {"name": "gpu-1"},
        "status": {"conditions": [ready], "nodeInfo": {"kubeletVersion": "v1.37.0-sandbox"},
                   "capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"}},
    })  # fmt: skip
    bound = {"metadata": {"name": "z-bound"}, "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "i"}]}}
    store.create(kinds.PODS, "default", bound)
    store.create(kinds.EVENTS_V1, "default", {
        "metadata": {"name": "gpu-1.1"}, "eventTime": "2026-12-01T00:00:00.000000Z",
        "reportingController": "sharepack.io/agent", "reportingInstance": "gpu-1", "action": "Configure",
        "reason": "ConfigApplied", "note": "policy packed", "type": "Normal",
        "regarding": {"kind": "Node", "name": "gpu-1", "uid": store.get(kinds.NODES, "", "gpu-1")["metadata"]["uid"]},
    })  # fmt: skip


async def _kubectl(kubectl: str, kubeconfig: Path, home: Path, *args: str, stdin: str = "") -> str:
    proc = await asyncio.create_subprocess_exec(
        kubectl, "--kubeconfig", str(kubeconfig), *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), timeout=45)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
    return out.decode()


@pytest.mark.parametrize("kubectl", KUBECTLS)
async def test_a_kubectl_session_works_as_on_a_cluster(server: FakeApiServer, tmp_short: Path, kubectl: str) -> None:
    if kubectl == "(none)":
        kubectl = any_kubectl()  # the skip or failure that says why
    _seed(server)
    config = server.write_kubeconfig(tmp_short / "config")

    async def run(*args: str, stdin: str = "") -> str:
        return await _kubectl(kubectl, config, tmp_short, *args, stdin=stdin)

    assert (await run("apply", "-f", "-", stdin=POD)).strip() == "pod/web created"
    relabelled = POD.replace("labels: {app: web}", "labels: {app: web, tier: front}")
    assert (await run("apply", "-f", "-", stdin=relabelled)).strip() == "pod/web configured"
    assert (await run("get", "pod", "web", "-o", "jsonpath={.metadata.labels.tier}")) == "front"
    assert (await run("create", "-f", "-", stdin="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")).strip() \
        == "configmap/c created"  # fmt: skip

    # kubectl's typed clients send these in protobuf.
    assert (await run("create", "namespace", "team")).strip() == "namespace/team created"
    assert (await run("create", "configmap", "d", "-n", "team", "--from-literal=k=v")).strip() == "configmap/d created"
    assert await run("get", "configmap", "d", "-n", "team", "-o", "jsonpath={.data.k}") == "v"

    explained = await run("explain", "pods.spec.containers.resources")
    assert "FIELD: resources" in explained and "limits\t<map[string]Quantity>" in explained

    assert (await run("auth", "can-i", "create", "pods")).strip() == "yes"
    assert (await run("auth", "whoami")).split()[2:4] == ["Username", "sandbox"]

    nodes = [line.split() for line in (await run("get", "nodes")).splitlines()]
    assert nodes[0] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert (nodes[1][:3], nodes[1][4]) == (["gpu-1", "Ready", "<none>"], "v1.37.0-sandbox")

    pods = [line.split() for line in (await run("get", "pods")).splitlines()]
    assert pods[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"] and pods[1][:4] == ["web", "0/1", "Pending", "0"]

    events = (await run("get", "events")).splitlines()
    assert events[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert events[1].split()[1:] == ["Normal", "ConfigApplied", "node/gpu-1", "policy", "packed"]

    described = await run("describe", "node", "gpu-1")
    assert "Kubelet Version:            v1.37.0-sandbox" in described
    tail = described.split("Events:", 1)[1].split()
    assert tail[-6:] == ["Normal", "ConfigApplied", tail[-4], "sharepack.io/agent", "policy", "packed"]
    described_pod = await run("describe", "pod", "web")
    assert ["QoS", "Class:", "BestEffort"] in [line.split() for line in described_pod.splitlines()], described_pod
    assert "nvidia.com/gpu:  1" in described_pod, described_pod

    drained = await run("drain", "gpu-1", "--force", "--ignore-daemonsets")
    assert "node/gpu-1 drained" in drained
    assert server.store.get(kinds.NODES, "", "gpu-1")["spec"]["unschedulable"] is True
    assert not server.store.exists(kinds.PODS, "default", "z-bound"), "drain deletes the node's pods"
