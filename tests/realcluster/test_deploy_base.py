"""deploy/base as users apply it (the kustomize build), on the real kube-apiserver: the CRD, what
the agent and extender identities may do, and the admission policy that keeps each agent to its
own node's NodeGpuState."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from sharepack.common import state as gpustate
from sharepack.common.policies import Policy
from sharepack.common.statebuilding import status_document
from sharepack.sandbox.controlplane import plane as controlplane
from sharepack.sandbox.controlplane.plane import RealControlPlane
from sharepack.sandbox.controlplane.identities import AGENT_DAEMONSET, Identities

CRD = Path(__file__).resolve().parents[2] / "deploy" / "base" / "crds" / "nodegpustates.yaml"
NAMESPACE = "sharepack-node"  # the agent's (Pod Security privileged)
EXTENDER_NAMESPACE = "sharepack-system"  # the extender's (restricted)
AGENT = "system:serviceaccount:sharepack-node:sharepack-agent"
GROUP, VERSION, PLURAL = gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL


def kubectl(control: RealControlPlane, *args: str, kubeconfig: Path | None = None) -> str:
    done = subprocess.run(
        [str(control.binaries.path("kubectl")), f"--kubeconfig={kubeconfig or control.kubeconfig}", *args],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def sample_status(node: str) -> dict[str, Any]:
    state = gpustate.NodeState(
        observed_at="2026-12-01T00:00:00Z",
        agent_version="0.1.0",
        allocation_policy=Policy.PACKED,
        mig_strategy=gpustate.MigStrategy.NONE,
        resources=(
            gpustate.ResourceState(
                "nvidia.com/gpu.shared", gpustate.Sharing.TIME_SLICING, False,
                (gpustate.GpuState(f"GPU-{node}-0", "0", "Tesla T4", 4, 1, 0, ("pod-a",)),),
            ),
        ),
    )  # fmt: skip
    return dict(status_document(state))


def body(node: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeGpuState", "metadata": {"name": node}}
    if status is not None:
        obj["status"] = status
    return obj


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# --- the CRD -------------------------------------------------------------------------------


def test_the_crd_is_structural_and_established(real_control_plane: RealControlPlane) -> None:
    crd = yaml.safe_load(kubectl(real_control_plane, "get", "crd", "nodegpustates.sharepack.io", "-o", "yaml"))
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True"
    assert conditions.get("NamesAccepted") == "True"
    assert "NonStructuralSchema" not in conditions, crd["status"]["conditions"]


def test_status_is_a_subresource_and_kubectl_prints_the_printer_columns(real_control_plane: RealControlPlane) -> None:
    api = controlplane.api_client(real_control_plane.kubeconfig)
    custom = client.CustomObjectsApi(api)
    name = unique("crd-node")
    try:
        # On create the status subresource drops `status`: only /status writes it.
        created = custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body(name, sample_status(name)))
        assert "status" not in created or not created["status"]
        created["status"] = sample_status(name)
        custom.replace_cluster_custom_object_status(GROUP, VERSION, PLURAL, name, created)
        got = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        assert gpustate.from_status(got["status"]).resources[0].gpus[0].allocated == 1

        printed = kubectl(real_control_plane, "get", "nodegpustates", name).splitlines()
        header = printed[0].split()
        columns = [c["name"] for c in yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["additionalPrinterColumns"]
                   if not c.get("priority")]
        assert " ".join(header) == " ".join(["NAME", *(c.upper() for c in columns)])
        # NAME, FREE GPUS (the one GPU holds a pod: 0 free), REPLICAS, POLICY, AGE
        assert printed[1].split()[:4] == [name, "0", "1/4", "packed"], printed
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        api.close()


# --- identities ----------------------------------------------------------------------------


class Identity:
    def __init__(self, control: RealControlPlane, kubeconfig: Path) -> None:
        self.api = controlplane.api_client(kubeconfig)
        self.custom = client.CustomObjectsApi(self.api)
        self.authz = client.AuthorizationV1Api(self.api)

    def can(self, verb: str, resource: str, *, group: str = "", subresource: str = "",
            namespace: str = "", name: str = "") -> bool:  # fmt: skip
        review = self.authz.create_self_subject_access_review(
            {"spec": {"resourceAttributes": {
                "verb": verb, "group": group, "resource": resource, "subresource": subresource,
                "namespace": namespace, "name": name,
            }}}  # fmt: skip
        )
        return bool(review.status.allowed)


@pytest.fixture(scope="module")
def identities(real_control_plane: RealControlPlane) -> Iterator[dict[str, Identity]]:
    """The agent on node-a and on node-b (tokens bound to their agent pods), an agent token
    bound to nothing, and the extender."""
    docs = [d for d in yaml.safe_load_all(kubectl(real_control_plane, "kustomize", str(CRD.parents[1]))) if d]
    made = Identities(real_control_plane, docs)
    nodes = {"a": unique("node-a"), "b": unique("node-b")}
    admin = controlplane.api_client(real_control_plane.kubeconfig)
    core = client.CoreV1Api(admin)
    for node in nodes.values():
        core.create_node({"metadata": {"name": node}})
    kubeconfigs = {
        "agent-a": asyncio.run(made.agent_kubeconfig(nodes["a"])),
        "agent-b": asyncio.run(made.agent_kubeconfig(nodes["b"])),
        "agent-unbound": real_control_plane.token_kubeconfig(
            "agent-unbound", asyncio.run(real_control_plane.service_account_token(NAMESPACE, "sharepack-agent"))
        ),
        "extender": asyncio.run(made.extender_kubeconfig()),
    }
    out = {k: Identity(real_control_plane, v) for k, v in kubeconfigs.items()}
    out["nodes"] = nodes  # type: ignore[assignment]
    try:
        yield out
    finally:
        for ident in out.values():
            if isinstance(ident, Identity):
                ident.api.close()
        for node in nodes.values():
            core.delete_namespaced_pod(f"{AGENT_DAEMONSET}-{node}", NAMESPACE, grace_period_seconds=0)
            core.delete_node(node)
        admin.close()


# (verb, resource, group, subresource, namespace, name)
AGENT_MAY = [
    ("get", "nodes", "", "", "", ""), ("list", "nodes", "", "", "", ""), ("watch", "nodes", "", "", "", ""),
    ("get", "pods", "", "", "", ""), ("list", "pods", "", "", "", ""), ("watch", "pods", "", "", "", ""),
    ("create", "nodegpustates", GROUP, "", "", ""), ("update", "nodegpustates", GROUP, "status", "", ""),
    ("patch", "nodegpustates", GROUP, "status", "", ""), ("watch", "nodegpustates", GROUP, "", "", ""),
    ("create", "events", "", "", "default", ""),
    ("get", "configmaps", "", "", NAMESPACE, "sharepack-agent-config"),
    ("watch", "configmaps", "", "", NAMESPACE, "sharepack-agent-config"),
]  # fmt: skip
AGENT_MAY_NOT = [
    ("delete", "nodegpustates", GROUP, "", "", ""), ("create", "pods", "", "", "default", ""),
    ("create", "pods", "", "binding", "default", ""), ("patch", "pods", "", "status", "default", ""),
    ("update", "nodes", "", "", "", ""), ("patch", "nodes", "", "status", "", ""),
    ("get", "secrets", "", "", NAMESPACE, ""), ("get", "configmaps", "", "", NAMESPACE, "other"),
    ("list", "configmaps", "", "", "kube-system", ""), ("create", "serviceaccounts", "", "token", NAMESPACE, "sharepack-agent"),
    # Events: core ones in `default` only, where the API server files events about a Node (24.7).
    ("create", "events", "events.k8s.io", "", "default", ""), ("create", "events", "", "", "kube-system", ""),
    ("create", "events", "", "", NAMESPACE, ""), ("create", "events", "", "", "", ""),
    ("patch", "events", "", "", "default", ""), ("update", "events", "", "", "default", ""),
    ("patch", "pods", "", "", "default", ""), ("create", "pods", "", "exec", "default", ""),
    # Nothing in the extender's namespace (issue 24.13).
    ("get", "configmaps", "", "", EXTENDER_NAMESPACE, "sharepack-agent-config"),
    ("get", "secrets", "", "", EXTENDER_NAMESPACE, "sharepack-extender-tls"),
]  # fmt: skip
EXTENDER_MAY = [
    ("get", "nodegpustates", GROUP, "", "", ""), ("list", "nodegpustates", GROUP, "", "", ""),
    ("watch", "nodegpustates", GROUP, "", "", ""), ("get", "pods", "", "", "default", ""),
    ("list", "pods", "", "", "", ""), ("watch", "pods", "", "", "", ""),
    ("create", "pods", "", "binding", "default", ""),
    # Nodes' allocatable CPU and memory: the CPU-aware ranks (issue 19).
    ("get", "nodes", "", "", "", ""), ("list", "nodes", "", "", "", ""), ("watch", "nodes", "", "", "", ""),
]  # fmt: skip
EXTENDER_MAY_NOT = [
    ("create", "nodegpustates", GROUP, "", "", ""), ("update", "nodegpustates", GROUP, "status", "", ""),
    ("delete", "nodegpustates", GROUP, "", "", ""), ("create", "pods", "", "", "default", ""),
    ("update", "pods", "", "", "default", ""), ("delete", "pods", "", "", "default", ""),
    ("patch", "pods", "", "", "default", ""),  # directions ride on the Binding: no pod write at all
    ("patch", "pods", "", "status", "default", ""), ("get", "secrets", "", "", EXTENDER_NAMESPACE, ""),
    ("update", "nodes", "", "", "", ""), ("create", "events", "", "", "default", ""),
    ("patch", "nodes", "", "", "", ""), ("create", "pods", "", "exec", "default", ""),
    ("create", "pods", "", "eviction", "default", ""), ("create", "serviceaccounts", "", "token", EXTENDER_NAMESPACE, "sharepack-extender"),
]  # fmt: skip


def _describe(who: str, allowed: bool, row: tuple[str, ...]) -> str:
    v, r, g, sub, ns, name = row
    what = f"{v} {g + '/' if g else ''}{r}{'/' + sub if sub else ''}{' in ' + ns if ns else ''}{' named ' + name if name else ''}"
    return f"{who} {'may' if allowed else 'may not'} {what}"


# (identity, allowed, row): what each needs, and a selection of what it must not have.
CASES = [
    *(("agent-a", True, row) for row in AGENT_MAY), *(("agent-a", False, row) for row in AGENT_MAY_NOT),
    *(("extender", True, row) for row in EXTENDER_MAY), *(("extender", False, row) for row in EXTENDER_MAY_NOT),
]  # fmt: skip


@pytest.mark.parametrize(("who", "allowed", "row"), CASES, ids=[_describe(*c) for c in CASES])
def test_what_each_identity_may_do(
    identities: dict[str, Identity], who: str, allowed: bool, row: tuple[str, ...]
) -> None:
    verb, resource, group, sub, ns, name = row
    assert identities[who].can(verb, resource, group=group, subresource=sub, namespace=ns, name=name) is allowed


# --- admission -----------------------------------------------------------------------------


def _denied(call: Any) -> str:
    with pytest.raises(client.ApiException) as info:
        call()
    assert info.value.status in (403, 422), info.value.body
    return str(info.value.body)


def test_an_agent_writes_its_own_nodes_state_and_no_other(identities: dict[str, Identity]) -> None:
    nodes: dict[str, str] = identities["nodes"]  # type: ignore[assignment]
    own, other = nodes["a"], nodes["b"]
    agent = identities["agent-a"].custom
    # Its own node: create, update, update the status.
    created = agent.create_cluster_custom_object(GROUP, VERSION, PLURAL, body(own))
    created["metadata"]["labels"] = {"touched": "yes"}
    updated = agent.replace_cluster_custom_object(GROUP, VERSION, PLURAL, own, created)
    updated["status"] = sample_status(own)
    agent.replace_cluster_custom_object_status(GROUP, VERSION, PLURAL, own, updated)
    # Another node's: each write is denied with the policy's own message.
    message = f"sharepack-agent may write only its own node's NodeGpuState, not {other}"
    assert message in _denied(lambda: agent.create_cluster_custom_object(GROUP, VERSION, PLURAL, body(other)))
    theirs = identities["agent-b"].custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body(other))
    assert message in _denied(lambda: agent.replace_cluster_custom_object(GROUP, VERSION, PLURAL, other, theirs))
    theirs["status"] = sample_status(other)
    assert message in _denied(
        lambda: agent.replace_cluster_custom_object_status(GROUP, VERSION, PLURAL, other, theirs)
    )


def test_an_agent_token_bound_to_no_node_writes_nothing(identities: dict[str, Identity]) -> None:
    nodes: dict[str, str] = identities["nodes"]  # type: ignore[assignment]
    unbound = identities["agent-unbound"].custom
    name = unique("unbound")
    for target in (name, nodes["a"]):
        denied = _denied(lambda t=target: unbound.create_cluster_custom_object(GROUP, VERSION, PLURAL, body(t)))
        assert "sharepack-agent may write only its own node's NodeGpuState" in denied
