"""deploy/base's admission policies on the real kube-apiserver, each identity with its own token:

* the extender writes nothing to pods but Bindings, which may carry the `sharepack.io/gpus`
  annotation and nothing else (issue 21: its `patch pods` right used to swap images; the
  directions now ride on the Binding, which kube-apiserver merges into the pod);
* only the extender may set or change that annotation, on a pod or on a Binding, whoever else
  asks (issue 24.1);
* with kustomize, an overlay that moves and renames the service accounts (each part by its own
  `namespace:`, deploy/overlays/namespaces) moves the policies' parameters with them: the
  agent's policy still holds (issue 24.3).

The in-process sandbox API server evaluates no admission policy: only these tests show them."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from sharepack.common import directions
from sharepack.common import state as gpustate
from sharepack.sandbox.controlplane import plane as controlplane
from sharepack.sandbox.controlplane.plane import RealControlPlane
from sharepack.sandbox.controlplane.identities import Identities
from tests.deploy.test_manifests import renaming_overlay

DEPLOY_BASE = Path(__file__).resolve().parents[2] / "deploy" / "base"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
GROUP, VERSION, PLURAL = gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL
POLICY_WAIT_S = 60.0  # the API server loads a new policy binding, and its parameter, in the background
DIRECTIONS = directions.encode(
    directions.Directions("some-node", (directions.ContainerDirections("main", {"nvidia.com/gpu": ("GPU-0",)}),))
)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def refused(call: Callable[[], Any]) -> str:
    """The API server's refusal of `call` (its body), failing the test if it was admitted."""
    with pytest.raises(client.ApiException) as info:
        call()
    assert info.value.status in (403, 422), info.value.body
    return str(info.value.body)


@dataclass
class Cluster:
    control: RealControlPlane
    namespace: str
    node: str
    admin: Any  # CoreV1Api
    extender: Any
    tenant: Any  # a user who may create and edit pods in `namespace`, as a team that runs pods
    tenant_name: str

    def pod(self, name: str, *, annotations: dict[str, str] | None = None, by: Any = None) -> Any:
        meta: dict[str, Any] = {"name": name, "labels": {"app": "victim"}}
        if annotations:
            meta["annotations"] = annotations
        body = {
            "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "registry.example/app:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }  # fmt: skip
        return (by or self.admin).create_namespaced_pod(self.namespace, body)

    def read(self, name: str) -> Any:
        return self.admin.read_namespaced_pod(name, self.namespace)

    def patch(self, who: Any, name: str, body: Any, content_type: str = MERGE_PATCH) -> Any:
        return who.patch_namespaced_pod(name, self.namespace, body, _content_type=content_type)

    def bind(self, name: str, *, annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
             by: Any = None) -> None:  # fmt: skip
        """A Binding of pod `name` to the node, as the extender writes it (or `by` another)."""
        meta: dict[str, Any] = {"name": name}
        if annotations:
            meta["annotations"] = annotations
        if labels:
            meta["labels"] = labels
        body = {"metadata": meta, "target": {"apiVersion": "v1", "kind": "Node", "name": self.node}}
        # _preload_content=False: the client cannot decode the Status a binding returns.
        (by or self.extender).create_namespaced_pod_binding(name, self.namespace, body, _preload_content=False)


def _wait_for_the_policies(cluster: Cluster) -> None:
    """The API server loads a new policy and its parameter in the background: wait until both of
    the extender's are in force (a Binding with a label from the extender refused, a pod with
    directions from the administrator refused), so no test meets them half loaded."""
    deadline = time.monotonic() + POLICY_WAIT_S
    probe = unique("probe")
    cluster.pod(probe)
    checks = (
        lambda: cluster.bind(probe, labels={"app": "probe"}),
        lambda: cluster.pod(unique("probe"), annotations={directions.ANNOTATION: DIRECTIONS}),
    )
    for check in checks:
        while True:
            try:
                check()
            except client.ApiException as e:
                if e.status in (403, 422):
                    break
                raise
            assert time.monotonic() < deadline, f"the admission policies were not in force after {POLICY_WAIT_S:.0f} s"
            time.sleep(0.5)
            probe = unique("probe")  # the admitted write bound the probe or created a pod: a fresh one
            cluster.pod(probe)


@pytest.fixture(scope="module")
def cluster(real_control_plane: RealControlPlane) -> Iterator[Cluster]:
    control = real_control_plane
    namespace, node = unique("admission"), unique("admission-node")
    asyncio.run(control.ensure_namespace(namespace))
    admin_api = controlplane.api_client(control.kubeconfig)
    admin = client.CoreV1Api(admin_api)
    admin.create_node({"metadata": {"name": node}})
    tenant_name = unique("tenant")
    # What the `edit` role gives a team on pods (no kube-controller-manager here aggregates it).
    rbac = client.RbacAuthorizationV1Api(admin_api)
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": tenant_name},
        "rules": [{"apiGroups": [""], "resources": ["pods"],
                   "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]}],
    })  # fmt: skip
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": tenant_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": tenant_name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": tenant_name}],
    })  # fmt: skip
    docs = [d for d in yaml.safe_load_all(asyncio.run(control.kubectl("kustomize", str(DEPLOY_BASE)))) if d]
    extender_api = controlplane.api_client(asyncio.run(Identities(control, docs).extender_kubeconfig()))
    tenant_api = controlplane.api_client(control.client_kubeconfig(tenant_name, tenant_name))
    try:
        made = Cluster(
            control, namespace, node, admin, client.CoreV1Api(extender_api), client.CoreV1Api(tenant_api), tenant_name
        )
        _wait_for_the_policies(made)
        yield made
    finally:
        for api in (extender_api, tenant_api):
            api.close()
        admin.delete_node(node)
        admin_api.close()


# --- issue 21: what the extender's token may do to a pod ----------------------------------------

ATTACKS = {
    "image swap": ([{"op": "replace", "path": "/spec/containers/0/image", "value": "attacker/evil:1"}], JSON_PATCH),
    "relabel": ({"metadata": {"labels": {"app": "attacker"}}}, MERGE_PATCH),
    "another annotation": ({"metadata": {"annotations": {"example.com/owner": "attacker"}}}, MERGE_PATCH),
    "directions": ({"metadata": {"annotations": {directions.ANNOTATION: DIRECTIONS}}}, MERGE_PATCH),
}  # fmt: skip


def _unchanged(before: Any, after: Any) -> None:
    assert after.metadata.resource_version == before.metadata.resource_version
    assert after.spec.containers[0].image == "registry.example/app:1"
    assert after.metadata.labels == {"app": "victim"}
    assert after.spec.node_name == before.spec.node_name


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("bound", [False, True], ids=["pending", "bound"])
def test_the_extender_may_not_patch_a_pod_at_all(cluster: Cluster, attack: str, bound: bool) -> None:
    name = unique("bound" if bound else "pending")
    cluster.pod(name)
    if bound:
        cluster.bind(name, annotations={directions.ANNOTATION: DIRECTIONS})
    before = cluster.read(name)
    body, content_type = ATTACKS[attack]
    with pytest.raises(client.ApiException) as info:
        cluster.patch(cluster.extender, name, body, content_type)
    assert info.value.status == 403 and 'cannot patch resource \\"pods\\"' in info.value.body, info.value.body
    _unchanged(before, cluster.read(name))


def test_the_extender_binds_a_pending_pod_with_its_directions_in_one_write(cluster: Cluster) -> None:
    name = unique("directed")
    created = cluster.pod(name)
    cluster.bind(name, annotations={directions.ANNOTATION: DIRECTIONS})
    bound = cluster.read(name)
    assert bound.metadata.annotations == {directions.ANNOTATION: DIRECTIONS}
    assert bound.spec.node_name == cluster.node  # a node with no GPU at all: binding skips every check
    assert int(bound.metadata.resource_version) > int(created.metadata.resource_version)
    with pytest.raises(client.ApiException) as again:  # nor can it move a bound pod, or redirect it
        cluster.bind(name, annotations={directions.ANNOTATION: DIRECTIONS.replace("GPU-0", "GPU-1")})
    assert again.value.status == 409, again.value.body
    after = cluster.read(name)
    assert after.metadata.annotations == {directions.ANNOTATION: DIRECTIONS}
    assert after.metadata.resource_version == bound.metadata.resource_version


BINDING_SMUGGLES = {
    "another annotation": ({"example.com/owner": "attacker"}, None, "rule: extender-binds-with-directions-only"),
    "directions and another annotation": (
        {directions.ANNOTATION: DIRECTIONS, "example.com/owner": "attacker"}, None,
        "rule: extender-binds-with-directions-only",
    ),
    "a label": (None, {"app": "attacker"}, "rule: extender-binds-without-labels"),
}  # fmt: skip


@pytest.mark.parametrize("smuggle", sorted(BINDING_SMUGGLES))
def test_a_binding_from_the_extender_carries_nothing_onto_the_pod_but_directions(cluster: Cluster, smuggle: str) -> None:
    """A Binding's annotations and labels are merged into the pod: the policy allows only the
    directions (a relabel would move the pod into another Service's endpoints)."""
    name = unique("smuggle")
    before = cluster.pod(name)
    annotations, labels, rule = BINDING_SMUGGLES[smuggle]
    denied = refused(lambda: cluster.bind(name, annotations=annotations, labels=labels))
    assert rule in denied and f"{cluster.namespace}/{name}" in denied
    _unchanged(before, cluster.read(name))
    assert not cluster.read(name).metadata.annotations


def test_the_extender_may_not_write_a_pods_status_or_delete_it(cluster: Cluster) -> None:
    name = unique("status")
    before = cluster.pod(name)
    refused(lambda: cluster.extender.patch_namespaced_pod_status(
        name, cluster.namespace, {"status": {"phase": "Failed"}}, _content_type=MERGE_PATCH))  # fmt: skip
    refused(lambda: cluster.extender.delete_namespaced_pod(name, cluster.namespace))
    _unchanged(before, cluster.read(name))


# --- issue 24.1: only the extender writes directions --------------------------------------------

def _reserved(who: str) -> str:
    return (
        "only the sharepack extender (service account sharepack-system/sharepack-extender) may set or "
        f"change the sharepack.io/gpus annotation of a pod, not {who}"
    )


def test_a_user_who_creates_pods_cannot_create_one_with_directions(cluster: Cluster) -> None:
    name = unique("forged")
    denied = refused(lambda: cluster.pod(name, annotations={directions.ANNOTATION: DIRECTIONS}, by=cluster.tenant))
    assert _reserved(cluster.tenant_name) in denied and "(rule: directions-from-the-extender-only)" in denied
    with pytest.raises(client.ApiException) as gone:
        cluster.read(name)
    assert gone.value.status == 404
    # The cluster's administrators too: the annotation is the extender's alone.
    denied = refused(lambda: cluster.pod(name, annotations={directions.ANNOTATION: DIRECTIONS}))
    assert _reserved(controlplane.ADMIN) in denied


def test_no_one_but_the_extender_may_bind_a_pod_with_directions(cluster: Cluster) -> None:
    """A Binding's annotations land on the pod: another scheduler (here the cluster's
    administrator, who may bind) cannot smuggle directions in that way either."""
    name = unique("other-binder")
    before = cluster.pod(name)
    denied = refused(lambda: cluster.bind(name, annotations={directions.ANNOTATION: DIRECTIONS}, by=cluster.admin))
    assert _reserved(controlplane.ADMIN) in denied and "(rule: directions-from-the-extender-only)" in denied
    _unchanged(before, cluster.read(name))
    cluster.bind(name, by=cluster.admin)  # a plain Binding, as kube-scheduler's own, is admitted
    assert cluster.read(name).spec.node_name == cluster.node


def test_a_user_cannot_add_change_or_remove_directions_but_may_edit_the_rest(cluster: Cluster) -> None:
    name = unique("tenant-pod")
    cluster.pod(name, by=cluster.tenant)
    denied = refused(lambda: cluster.patch(cluster.tenant, name, {"metadata": {"annotations": {directions.ANNOTATION: DIRECTIONS}}}))
    assert "directions-from-the-extender-only" in denied
    cluster.bind(name, annotations={directions.ANNOTATION: DIRECTIONS})  # the extender's own write is admitted
    relabelled = cluster.patch(cluster.tenant, name, {"metadata": {"labels": {"team": "a"}}})
    assert relabelled.metadata.annotations == {directions.ANNOTATION: DIRECTIONS}
    for value in (DIRECTIONS.replace("GPU-0", "GPU-1"), None):
        body = {"metadata": {"annotations": {directions.ANNOTATION: value}}}
        assert "directions-from-the-extender-only" in refused(lambda b=body: cluster.patch(cluster.tenant, name, b))
    assert cluster.read(name).metadata.annotations == {directions.ANNOTATION: DIRECTIONS}


# --- issue 24.3: the policies follow the accounts into an overlay's namespace -------------------

CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
PREFIX = "gpu-"
OVERLAY_NAMESPACE = "gpu-node"  # the agent's; the extender's is gpu-system


def _overlay(tmp: Path) -> Path:
    """deploy/overlays/namespaces as an operator copies it, each part with a `namePrefix` too, so
    that the overlay sits beside the session's deploy/base."""
    return renaming_overlay(tmp, OVERLAY_NAMESPACE, "gpu-system", prefix=PREFIX)


def _nodegpustate(node: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeGpuState", "metadata": {"name": node}}


@pytest.mark.timeout(240)
def test_in_a_namespace_overlay_an_agent_still_writes_only_its_own_nodes_state(
    real_control_plane: RealControlPlane, tmp_short: Path
) -> None:
    """Each part moved by its own `namespace:` (deploy/overlays/namespaces; and a `namePrefix`, so
    that the overlay sits beside the session's deploy/base): the agent runs as
    gpu-node:gpu-sharepack-agent. The literal policy matched sharepack-system:sharepack-agent
    only, and every agent could write every node's state."""
    control = real_control_plane
    rendered = asyncio.run(control.kubectl("kustomize", str(_overlay(tmp_short))))
    # The CRD is the session's already. The overlay's directions policy would reserve the
    # annotation for the overlay's extender, refusing the session's: a second install in one
    # cluster is not what this test is about.
    # The agent's Events Role in `default` is the session's too (the overlay names it alike).
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] != "CustomResourceDefinition"
            and "gpu-directions" not in d["metadata"]["name"] and d["metadata"]["name"] != "sharepack-agent-events"]  # fmt: skip
    applied = yaml.safe_dump_all(docs).encode()
    asyncio.run(control.kubectl("apply", "--server-side", "--field-manager=overlay-test", "-f", "-", stdin=applied))
    admin_api = controlplane.api_client(control.kubeconfig)
    core = client.CoreV1Api(admin_api)
    nodes = {k: unique(f"overlay-{k}") for k in ("a", "b")}
    made = Identities(control, docs, agent=f"{PREFIX}sharepack-agent", extender=f"{PREFIX}sharepack-extender")
    apis: list[Any] = []
    try:
        asyncio.run(control.ensure_namespace(OVERLAY_NAMESPACE))
        for node in nodes.values():
            core.create_node({"metadata": {"name": node}})
        agents = {}
        for k, node in nodes.items():
            api = controlplane.api_client(asyncio.run(made.agent_kubeconfig(node)))
            apis.append(api)
            agents[k] = client.CustomObjectsApi(api)
        whoami = client.AuthenticationV1Api(apis[0]).create_self_subject_review({})
        assert whoami.status.user_info.username == f"system:serviceaccount:{OVERLAY_NAMESPACE}:{PREFIX}sharepack-agent"

        # Agent A on node B's object: refused once the API server has loaded the binding (dry
        # runs: nothing is written while it has not). The literal policy never refused it.
        message = f"sharepack-agent may write only its own node's NodeGpuState, not {nodes['b']}"
        deadline = time.monotonic() + POLICY_WAIT_S
        while True:
            try:
                agents["a"].create_cluster_custom_object(GROUP, VERSION, PLURAL, _nodegpustate(nodes["b"]), dry_run="All")
            except client.ApiException as e:
                assert e.status == 403 and message in str(e.body), e.body
                break
            assert time.monotonic() < deadline, f"agent A may still write node B's state after {POLICY_WAIT_S:.0f} s"
            time.sleep(0.2)
        # Each agent writes its own; A is refused B's, for real this time.
        agents["a"].create_cluster_custom_object(GROUP, VERSION, PLURAL, _nodegpustate(nodes["a"]))
        theirs = agents["b"].create_cluster_custom_object(GROUP, VERSION, PLURAL, _nodegpustate(nodes["b"]))
        denied = refused(lambda: agents["a"].replace_cluster_custom_object(GROUP, VERSION, PLURAL, nodes["b"], theirs))
        assert message in denied
    finally:
        for api in apis:
            api.close()
        custom = client.CustomObjectsApi(admin_api)
        for node in nodes.values():
            for delete in (lambda n=node: custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, n),
                           lambda n=node: core.delete_namespaced_pod(f"{PREFIX}sharepack-agent-{n}", OVERLAY_NAMESPACE,
                                                                     grace_period_seconds=0),
                           lambda n=node: core.delete_node(n)):  # fmt: skip
                try:
                    delete()
                except client.ApiException as e:
                    if e.status != 404:
                        raise
        cluster_scoped = [d for d in docs if d["kind"] in CLUSTER_SCOPED]
        asyncio.run(control.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-",
                                    stdin=yaml.safe_dump_all(cluster_scoped).encode()))  # fmt: skip
        admin_api.close()
