"""What a rendered install (a kustomize build or a Helm render) must hold together, whatever its
namespaces are called: every reference to a namespace or service account names one the install
makes, and each workload runs in a namespace whose Pod Security level is the one docs/security.md
gives it. Used by tests/deploy (every build and render) and tests/realcluster."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import yaml

Doc = Mapping[str, Any]
ENFORCE = "pod-security.kubernetes.io/enforce"
# The Pod Security level each workload's namespace enforces (docs/security.md, "Namespaces").
LEVELS = {("DaemonSet", "sharepack-agent"): "privileged", ("Deployment", "sharepack-extender"): "restricted"}
CLUSTER_SCOPED = {
    "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding", "DeviceClass",
}  # fmt: skip


def object_namespace(doc: Doc) -> str:
    """The object's namespace, "" for a cluster-scoped one."""
    return str(doc["metadata"].get("namespace", ""))


def _named(docs: Sequence[Doc], kind: str) -> set[tuple[str, str]]:
    return {(object_namespace(d), d["metadata"]["name"]) for d in docs if d["kind"] == kind}


def workload(docs: Sequence[Doc], kind: str, base_name: str) -> Doc:
    """The one `kind` whose name ends with `base_name` (an overlay may prefix it)."""
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(base_name)]
    return found


def expanded_args(container: Mapping[str, Any], namespace: str) -> list[str]:
    """The container's args as the kubelet passes them: `$(VAR)` replaced by the env var, here
    the downward API's metadata.namespace (the only fieldRef an arg of ours uses)."""
    values = {}
    for env in container.get("env", []):
        if "value" in env:
            values[env["name"]] = env["value"]
        elif env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            values[env["name"]] = namespace
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m.group(1), m.group(0)), a)
            for a in container.get("args", [])]  # fmt: skip


def namespace_of(docs: Sequence[Doc], kind: str, base_name: str) -> str:
    return object_namespace(workload(docs, kind, base_name))


def problems(docs: Sequence[Doc]) -> Iterator[str]:
    """Every broken reference, one line each (none for a consistent install)."""
    namespaces = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Namespace"}
    accounts = _named(docs, "ServiceAccount")
    configmaps = _named(docs, "ConfigMap")
    for d in docs:
        kind, name, ns = d["kind"], d["metadata"]["name"], object_namespace(d)
        if kind not in CLUSTER_SCOPED and ns not in namespaces and ns != "default":
            yield f"{kind} {name} is in namespace {ns!r}, which the install does not make"
        if kind in ("ClusterRoleBinding", "RoleBinding"):
            for s in d["subjects"]:
                if s["kind"] == "ServiceAccount" and (s["namespace"], s["name"]) not in accounts:
                    yield f"{kind} {ns}/{name} binds service account {s['namespace']}/{s['name']}, which does not exist"
        if kind == "ValidatingAdmissionPolicyBinding":
            ref = d["spec"]["paramRef"]
            if (ref["namespace"], ref["name"]) not in accounts:
                yield f"admission binding {name} takes service account {ref['namespace']}/{ref['name']} as parameter, which does not exist"
        if kind in ("DaemonSet", "Deployment"):
            yield from _pod_problems(d, namespaces, accounts, configmaps)
        if kind in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
            selector = d["spec"].get("selector") or d["spec"].get("podSelector") or {}
            labels = selector.get("matchLabels", selector)
            if not any(_selects(labels, w) for w in docs if w["kind"] in ("DaemonSet", "Deployment") and object_namespace(w) == ns):
                yield f"{kind} {ns}/{name} selects {labels}, which no workload in {ns} has"
        if kind == "ConfigMap" and name.endswith("scheduler-config"):
            yield from _scheduler_url_problems(yaml.safe_load(d["data"]["config.yaml"]), docs)


def _selects(labels: Mapping[str, str], workload_doc: Doc) -> bool:
    have = workload_doc["spec"]["template"]["metadata"].get("labels", {})
    return bool(labels) and all(have.get(k) == v for k, v in labels.items())


def _pod_problems(d: Doc, namespaces: Mapping[str, Doc], accounts: set[tuple[str, str]],
                  configmaps: set[tuple[str, str]]) -> Iterator[str]:  # fmt: skip
    kind, name, ns = d["kind"], d["metadata"]["name"], object_namespace(d)
    spec = d["spec"]["template"]["spec"]
    if (ns, spec["serviceAccountName"]) not in accounts:
        yield f"{kind} {ns}/{name} runs as {spec['serviceAccountName']}, which {ns} does not hold"
    for volume in spec.get("volumes", []):
        if "configMap" in volume and (ns, volume["configMap"]["name"]) not in configmaps:
            yield f"{kind} {ns}/{name} mounts ConfigMap {volume['configMap']['name']}, which {ns} does not hold"
    for container in spec["containers"]:
        for arg in expanded_args(container, ns):
            flag, _, value = arg.partition("=")
            if flag == "--node-config-configmap" and tuple(value.split("/", 1)) not in configmaps:
                yield f"{kind} {ns}/{name} passes {arg}, a ConfigMap the install does not make"
    level = next((lvl for (k, suffix), lvl in LEVELS.items() if k == kind and name.endswith(suffix)), None)
    labels = namespaces[ns]["metadata"].get("labels", {}) if ns in namespaces else {}
    if level is not None and labels.get(ENFORCE) != level:
        yield f"{kind} {name} runs in {ns}, which enforces Pod Security {labels.get(ENFORCE)!r}, not {level!r}"


def _scheduler_url_problems(config: Mapping[str, Any], docs: Sequence[Doc]) -> Iterator[str]:
    services = _named(docs, "Service")
    for ext in config["extenders"]:
        host = urlsplit(ext["urlPrefix"]).hostname or ""
        service, _, rest = host.partition(".")
        namespace = rest.removesuffix(".svc")
        if (namespace, service) not in services:
            yield f"the scheduler config calls {ext['urlPrefix']}, which is no Service of the install"
