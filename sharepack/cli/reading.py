"""Reads from the cluster in the kubeconfig: NodeGpuStates, a pod, node names (`--watch`
follows NodeGpuStates with kube.reflecting, see sharepack/cli/__main__.py).

The blocking `kubernetes` client is enough: the CLI does one thing at a time. Raw JSON
(`_preload_content=False`) keeps the objects exactly as the API serves them, the shape the
extender also receives from kube-scheduler.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import kubernetes
from kubernetes import config

from sharepack.cli.errors import ApiReadError, KubeconfigError
from sharepack.common import state as gpustate
from sharepack.common.errors import StateSchemaError
from sharepack.common.state import NodeState



@dataclass(frozen=True, slots=True)
class PublishedNode:
    name: str
    state: NodeState | None  # None when `error` says why it cannot be read
    error: str = ""


def api_client(kubeconfig: str | None) -> Any:
    """A client for `kubeconfig`, else $KUBECONFIG, else ~/.kube/config (as kubectl)."""
    try:
        return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, TypeError, ValueError) as e:
        where = kubeconfig or "$KUBECONFIG or ~/.kube/config"
        raise KubeconfigError(f"cannot load kubeconfig {where}: {e}") from e


def _json(resp: Any) -> Any:
    return json.loads(resp.data)


def _read(what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return _json(call(*args, _preload_content=False, **kwargs))
    except kubernetes.client.ApiException as e:
        reason = e.reason or ""
        try:
            reason = json.loads(e.body or "").get("message", reason)
        except (TypeError, ValueError, AttributeError):
            pass
        raise ApiReadError(f"cannot read {what}: {e.status} {reason}") from e
    except OSError as e:  # urllib3 wraps connection failures in OSError subclasses
        raise ApiReadError(f"cannot read {what}: {e}") from e


def published(obj: Any) -> PublishedNode:
    name = str((obj.get("metadata") or {}).get("name", ""))
    try:
        return PublishedNode(name, gpustate.from_status(obj.get("status"), source=f"NodeGpuState {name} status"))
    except StateSchemaError as e:
        return PublishedNode(name, None, str(e))


def list_states(api: Any) -> tuple[str, dict[str, PublishedNode]]:
    """Every NodeGpuState: (the list's resourceVersion, node name -> its state)."""
    custom = kubernetes.client.CustomObjectsApi(api)
    doc = _read(
        "nodegpustates", custom.list_cluster_custom_object, gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL
    )
    nodes = {p.name: p for p in map(published, doc.get("items") or []) if p.name}
    return str((doc.get("metadata") or {}).get("resourceVersion", "")), nodes


def read_pod(api: Any, namespace: str, name: str) -> dict[str, Any]:
    core = kubernetes.client.CoreV1Api(api)
    pod: dict[str, Any] = _read(f"pod {namespace}/{name}", core.read_namespaced_pod, name, namespace)
    return pod


def nodes(api: Any) -> dict[str, dict[str, Any]]:
    """Every Node object by name."""
    core = kubernetes.client.CoreV1Api(api)
    doc = _read("nodes", core.list_node)
    return {str(n["metadata"]["name"]): n for n in doc.get("items") or []}
