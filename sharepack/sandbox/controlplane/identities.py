"""The identities sharepack's processes have in a cluster, made on the real control plane.

* An agent runs as deploy/base's `sharepack-agent` service account, in a pod of the agent
  DaemonSet on its node. Here the pod is created from the DaemonSet's own template, bound to the
  node as the DaemonSet controller would place it, and the agent gets a token bound to that pod
  (TokenRequest with the pod as bound object, as the kubelet projects it): the token carries the
  node's name, which deploy/base's ValidatingAdmissionPolicy checks on every NodeGpuState write.
* The extender runs as the `sharepack-extender` service account.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import kubernetes

from sharepack.sandbox.controlplane.plane import RealControlPlane, api_client

AGENT_DAEMONSET = "sharepack-agent"
EXTENDER_DEPLOYMENT = "sharepack-extender"


def find(docs: Sequence[Mapping[str, Any]], kind: str, name: str) -> Mapping[str, Any]:
    for doc in docs:
        if doc.get("kind") == kind and (doc.get("metadata") or {}).get("name") == name:
            return doc
    raise LookupError(f"the manifests have no {kind} {name}")


def daemon_pod(daemonset: Mapping[str, Any], node: str) -> dict[str, Any]:
    """The pod the DaemonSet controller would create for `node`, placed on it directly."""
    template = copy.deepcopy(dict(daemonset["spec"]["template"]))
    meta = daemonset["metadata"]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template.get("metadata", {}), "name": f"{meta['name']}-{node}", "namespace": meta["namespace"]},
        "spec": {**template["spec"], "nodeName": node},
    }
    return pod


class Identities:
    def __init__(
        self, control: RealControlPlane, manifests: Sequence[Mapping[str, Any]],
        *, agent: str = AGENT_DAEMONSET, extender: str = EXTENDER_DEPLOYMENT,
    ) -> None:  # fmt: skip
        """`agent`, `extender`: the DaemonSet's and the Deployment's names in `manifests` (an
        overlay with a `namePrefix` renames them)."""
        self._control = control
        self._manifests = manifests
        self._agent = agent
        self._extender = extender

    async def agent_kubeconfig(self, node: str) -> Path:
        """A kubeconfig with the token of the agent pod on `node` (the pod is created first)."""
        daemonset = find(self._manifests, "DaemonSet", self._agent)
        pod = daemon_pod(daemonset, node)
        namespace = pod["metadata"]["namespace"]
        api = api_client(self._control.kubeconfig)
        core: Any = kubernetes.client.CoreV1Api(api)
        try:
            created = await asyncio.to_thread(core.create_namespaced_pod, namespace, pod)
        finally:
            api.close()
        account = pod["spec"]["serviceAccountName"]
        token = await self._control.service_account_token(
            namespace, account, bound_pod=(created.metadata.name, created.metadata.uid)
        )
        return self._control.token_kubeconfig(f"agent-{node}", token)

    async def extender_kubeconfig(self) -> Path:
        deployment = find(self._manifests, "Deployment", self._extender)
        spec = deployment["spec"]["template"]["spec"]
        token = await self._control.service_account_token(
            deployment["metadata"]["namespace"], spec["serviceAccountName"]
        )
        return self._control.token_kubeconfig("extender", token)
