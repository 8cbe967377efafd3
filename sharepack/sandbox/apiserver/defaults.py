"""What the real API server fills in when a pod or a namespace is created. For a pod: its defaulting of the pod spec, what
the default admission plugins add (Priority, DefaultTolerationSeconds), and the status it
starts with (Pending, with the pod's QoS class). Consumers read these: a container's
`resources.requests` defaults to its `limits` (so a pod that sets only a GPU limit requests it),
and `schedulerName` names who schedules the pod.

Not done: the ServiceAccount admission's token volume and `serviceAccountName`, which need
ServiceAccount objects the sandbox does not serve.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

_POD_SPEC_DEFAULTS: dict[str, Any] = {
    "restartPolicy": "Always",
    "dnsPolicy": "ClusterFirst",
    "schedulerName": "default-scheduler",
    "terminationGracePeriodSeconds": 30,
    "securityContext": {},
    "enableServiceLinks": True,
    "priority": 0,
    "preemptionPolicy": "PreemptLowerPriority",
}
_DEFAULT_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
)
_QOS_RESOURCES = ("cpu", "memory")


def _pull_policy(image: str) -> str:
    tag = image.rsplit("/", 1)[-1].partition("@")[0].partition(":")[2]
    return "Always" if "@" not in image and tag in ("", "latest") else "IfNotPresent"


def _default_container(c: Obj) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("imagePullPolicy", _pull_policy(str(c.get("image", ""))))
    resources = c.setdefault("resources", {})
    limits = resources.get("limits") or {}
    if limits:
        requests = resources.setdefault("requests", {})
        for name, value in limits.items():
            requests.setdefault(name, value)
    for port in c.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")


def qos_class(spec: Obj) -> str:
    """Guaranteed: cpu and memory limits on every container, requests equal to them; BestEffort:
    no cpu or memory request or limit anywhere; Burstable otherwise."""
    containers = [c for c in (spec.get("initContainers") or []) + (spec.get("containers") or []) if isinstance(c, dict)]
    any_set, guaranteed = False, True
    for c in containers:
        resources = c.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        if any(r in requests or r in limits for r in _QOS_RESOURCES):
            any_set = True
        if not all(r in limits and requests.get(r, limits[r]) == limits[r] for r in _QOS_RESOURCES):
            guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def default_namespace(ns: Obj) -> None:
    """A new namespace is Active and carries the `kubernetes` finalizer (emptied by the namespace
    controller before it goes)."""
    finalizers = ns.setdefault("spec", {}).setdefault("finalizers", [])
    if "kubernetes" not in finalizers:
        finalizers.append("kubernetes")
    ns["status"] = {"phase": "Active"}


def default_pod(pod: Obj) -> None:
    """Fill in, in place, what the real server adds to a pod it creates."""
    spec = pod.setdefault("spec", {})
    if not isinstance(spec, dict):
        return  # validation reports it
    for key, value in _POD_SPEC_DEFAULTS.items():
        spec.setdefault(key, value)
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        if isinstance(c, dict):
            _default_container(c)
    tolerations = spec.setdefault("tolerations", [])
    for default in _DEFAULT_TOLERATIONS:
        if not any(t.get("key") == default["key"] and t.get("effect") in ("NoExecute", None, "") for t in tolerations):
            tolerations.append(dict(default))
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}
