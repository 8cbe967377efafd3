"""The resource types the sandbox API server serves, and the discovery documents that list them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sharepack.common import state


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    field_selectors: frozenset[str]
    status_subresource: bool = True
    # CRDs refuse an update without metadata.resourceVersion; most built-in types accept one.
    unconditional_update: bool = True
    # A custom resource's create drops `status`, a pod's create resets it; nodes keep theirs.
    create_keeps_status: bool = True
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
    # metadata.generation, bumped by spec changes: custom resources and (since 1.34) pods have one.
    tracks_generation: bool = False
    # What `kubectl get <category>` expands to: pods are in `all`.
    categories: tuple[str, ...] = ()
    # A custom resource (CRD): no strategic merge patch.
    custom: bool = False
    # Answered, never stored (SelfSubjectAccessReview): only `create`.
    virtual: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> tuple[str, str]:
        return (self.group, self.version)

    @property
    def singular(self) -> str:
        return self.kind.lower()


_META = frozenset({"metadata.name", "metadata.namespace"})

NAMESPACES = ResourceType(
    "", "v1", "namespaces", "Namespace", False, _META | {"status.phase"}, short_names=("ns",)
)
NODES = ResourceType("", "v1", "nodes", "Node", False, _META | {"spec.unschedulable"}, short_names=("no",))
PODS = ResourceType(
    "",
    "v1",
    "pods",
    "Pod",
    True,
    _META
    | {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    create_keeps_status=False,
    short_names=("po",),
    categories=("all",),
    tracks_generation=True,
)
CONFIGMAPS = ResourceType(
    "", "v1", "configmaps", "ConfigMap", True, _META, status_subresource=False, short_names=("cm",)
)
EVENTS = ResourceType(
    "",
    "v1",
    "events",
    "Event",
    True,
    _META
    | {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    },
    status_subresource=False,
    short_names=("ev",),
)
EVENTS_V1 = ResourceType(
    "events.k8s.io",
    "v1",
    "events",
    "Event",
    True,
    _META
    | {
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "reason",
        "reportingController",
        "type",
    },
    status_subresource=False,
    short_names=("ev",),
)
NODE_GPU_STATES = ResourceType(
    state.GROUP,
    state.VERSION,
    state.PLURAL,
    state.KIND,
    False,
    _META,
    unconditional_update=False,
    create_keeps_status=False,
    short_names=("ngs",),
    custom=True,
    tracks_generation=True,
)

LEASES = ResourceType(
    "coordination.k8s.io", "v1", "leases", "Lease", True, _META, status_subresource=False
)
SELF_SUBJECT_ACCESS_REVIEWS = ResourceType(
    "authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False, frozenset(),
    status_subresource=False, verbs=("create",), virtual=True,
)
SELF_SUBJECT_REVIEWS = ResourceType(
    "authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", False, frozenset(),
    status_subresource=False, verbs=("create",), virtual=True,
)

ALL: tuple[ResourceType, ...] = (
    NAMESPACES, NODES, PODS, CONFIGMAPS, EVENTS, EVENTS_V1, NODE_GPU_STATES, LEASES, SELF_SUBJECT_ACCESS_REVIEWS,
    SELF_SUBJECT_REVIEWS,
)
STORED: tuple[ResourceType, ...] = tuple(r for r in ALL if not r.virtual)
BY_PATH: Mapping[tuple[str, str, str], ResourceType] = {(r.group, r.version, r.plural): r for r in ALL}
BY_KIND: Mapping[tuple[str, str], ResourceType] = {(r.api_version, r.kind): r for r in ALL}

SERVER_VERSION: dict[str, str] = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-sharepack-sandbox",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

def _groups() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in ALL:
        if r.group and r.version not in out.setdefault(r.group, []):
            out[r.group].append(r.version)
    return out


def api_versions() -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    }


def _group_doc(name: str, versions: list[str]) -> dict[str, Any]:
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list() -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_doc(g, vs) for g, vs in sorted(_groups().items())],
    }


def api_group(name: str) -> dict[str, Any] | None:
    versions = _groups().get(name)
    return _group_doc(name, versions) if versions else None


def api_resource_list(group: str, version: str) -> dict[str, Any] | None:
    members = [r for r in ALL if r.group_version == (group, version)]
    if not members:
        return None
    resources: list[dict[str, Any]] = []
    for r in members:
        resources.append(
            {
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(r.verbs),
                "shortNames": list(r.short_names),
                **({"categories": list(r.categories)} if r.categories else {}),
            }
        )
        if r.status_subresource:
            resources.append(
                {"name": f"{r.plural}/status", "singularName": "", "namespaced": r.namespaced,
                 "kind": r.kind, "verbs": ["get", "patch", "update"]}
            )
        if r is PODS:
            resources.append(
                {"name": "pods/binding", "singularName": "", "namespaced": True, "kind": "Binding",
                 "verbs": ["create"]}
            )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
