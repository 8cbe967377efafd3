"""The columns and cells of each type's Table, as the real server prints them.

The built-in types follow the real server's printers (which always print the wide columns;
kubectl hides those of priority 1 unless `-o wide`): a pod's READY counts containers that are
ready *and* running, its STATUS is the last container's waiting or terminated reason when there
is one, and Terminating once deletion started; a node's STATUS comes from its Ready condition
(`Unknown` without one), its ROLES from the `node-role.kubernetes.io/*` labels, its VERSION from
`status.nodeInfo.kubeletVersion`; an Event has no leading Name column (NAME is a wide column at the
end). NodeGpuState's columns are the CRD's `additionalPrinterColumns` (tests/apiserver checks them
against deploy/base/crds/nodegpustates.yaml); other types print Name and Age.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sharepack.sandbox.apiserver import resources
from sharepack.sandbox.apiserver.resources import ResourceType

Obj = dict[str, Any]
Now = datetime.datetime
Cells = Callable[[Obj, Now], list[Any]]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # integer | number | string | boolean | date
    json_path: str = ""  # a dotted path (the CRD's columns); built-in printers compute their cells
    priority: int = 0  # 1: only with `-o wide`
    description: str = ""
    format: str = ""


NAME = Column("Name", "string", ".metadata.name", 0, "the object's name", "name")
AGE = Column("Age", "date", ".metadata.creationTimestamp")  # a CRD's
BUILTIN_AGE = Column("Age", "string", description="time since the object was created")

NODE_GPU_STATE_COLUMNS = (
    Column("Free GPUs", "integer", ".status.summary.freeGpus", 0,
           "physical GPUs with nothing allocated and nothing unhealthy"),
    Column("Replicas", "string", ".status.summary.replicas", 0, "devices held by pods / devices served (all resources)"),
    Column("Policy", "string", ".status.allocationPolicy", 0, "the node's allocation policy"),
    Column("Schema", "integer", ".status.schemaVersion", 1),
    Column("Observed", "date", ".status.observedAt", 1),
    Column("Age", "date", ".metadata.creationTimestamp"),
)  # fmt: skip


def human_age(seconds: float) -> str:
    """kubectl's short durations: 45s, 5m30s, 3h10m, 2d5h, 40d, 2y."""
    s = max(int(seconds), 0)
    m, h, d = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 192:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d" if d < 730 else f"{d // 365}y"


def since(timestamp: Any, now: Now) -> str:
    """An RFC 3339 time as an age; `<unknown>` for none, as the real printers write it."""
    if not isinstance(timestamp, str) or not timestamp:
        return "<unknown>"
    when = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return human_age((now - when).total_seconds())


def _lookup(obj: Any, path: str) -> Any:
    for key in path.strip(".").split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _path_cell(column: Column, obj: Obj, now: Now) -> Any:
    value = _lookup(obj, column.json_path)
    if value is None:
        return None  # kubectl prints <none>
    if column.type == "date" and isinstance(value, str):
        return since(value, now)
    return value


def _by_path(columns: tuple[Column, ...]) -> Cells:
    return lambda obj, now: [_path_cell(c, obj, now) for c in columns]


# -- pods ------------------------------------------------------------------------------------


def _pod_reason(pod: Obj, statuses: list[Obj]) -> tuple[str, int]:
    """(STATUS, ready containers), walking the containers last to first as the real printer does
    (init containers are not looked at: the sandbox runs none)."""
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    reason = status.get("reason") or status.get("phase") or ""
    if any(c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated" for c in conditions):
        reason = "SchedulingGated"
    ready, running, error = 0, False, ""
    for c in reversed(statuses):
        state = c.get("state") or {}
        waiting, terminated = state.get("waiting"), state.get("terminated")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
        elif terminated is not None:
            signal, code = terminated.get("signal"), terminated.get("exitCode", 0)
            reason = terminated.get("reason") or (f"Signal:{signal}" if signal else f"ExitCode:{code}")
            error = reason if code else error
        elif c.get("ready") and state.get("running") is not None:
            running = True
            ready += 1
    if reason == "Completed":
        pod_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        reason = "Running" if running and pod_ready else error or ("NotReady" if running else reason)
    if pod["metadata"].get("deletionTimestamp"):
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif status.get("phase") not in ("Succeeded", "Failed"):
            reason = "Terminating"
    return reason, ready


def _pod_cells(pod: Obj, now: Now) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    reason, ready = _pod_reason(pod, statuses)
    restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
    finished = [((c.get("lastState") or {}).get("terminated") or {}).get("finishedAt") for c in statuses]
    last_restart = max((f for f in finished if f), default=None)
    ips = status.get("podIPs") or []
    gates = spec.get("readinessGates") or []
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    gated = f"{sum(1 for g in gates if conditions.get(g.get('conditionType')) == 'True')}/{len(gates)}"
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(spec.get('containers') or [])}",
        reason,
        f"{restarts} ({since(last_restart, now)} ago)" if restarts and last_restart else str(restarts),
        since(pod["metadata"].get("creationTimestamp"), now),
        (ips[0].get("ip") if ips else "") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        gated if gates else "<none>",
    ]


POD_COLUMNS = (
    NAME,
    Column("Ready", "string", description="containers ready and running / containers"),
    Column("Status", "string", description="the pod's phase, or the reason it is in it"),
    Column("Restarts", "string", description="container restarts"),
    BUILTIN_AGE,
    Column("IP", "string", priority=1),
    Column("Node", "string", priority=1),
    Column("Nominated Node", "string", priority=1),
    Column("Readiness Gates", "string", priority=1),
)

# -- nodes -----------------------------------------------------------------------------------

_ROLE_PREFIX = "node-role.kubernetes.io/"


def _node_cells(node: Obj, now: Now) -> list[Any]:
    meta, status = node["metadata"], node.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    states = ["Ready" if c.get("status") == "True" else "NotReady" for c in ready[-1:]] or ["Unknown"]
    if (node.get("spec") or {}).get("unschedulable"):
        states.append("SchedulingDisabled")
    labels = meta.get("labels") or {}
    roles = {k.removeprefix(_ROLE_PREFIX) for k in labels if k.startswith(_ROLE_PREFIX)}
    roles |= {labels["kubernetes.io/role"]} if labels.get("kubernetes.io/role") else set()
    addresses = status.get("addresses") or []
    info = status.get("nodeInfo") or {}

    def address(kind: str) -> str:
        return next((a.get("address") for a in addresses if a.get("type") == kind), None) or "<none>"

    kernel = info.get("kernelVersion") or "<unknown>"
    if info.get("architecture"):
        kernel += f" ({info['architecture']})"
    return [
        meta["name"], ",".join(states), ",".join(sorted(r for r in roles if r)) or "<none>",
        since(meta.get("creationTimestamp"), now), info.get("kubeletVersion", ""),
        address("InternalIP"), address("ExternalIP"), info.get("osImage") or "<unknown>",
        kernel, info.get("containerRuntimeVersion") or "<unknown>",
    ]  # fmt: skip


NODE_COLUMNS = (
    NAME,
    Column("Status", "string", description="the node's Ready condition"),
    Column("Roles", "string", description="the node's roles, from its node-role.kubernetes.io labels"),
    BUILTIN_AGE,
    Column("Version", "string", description="the kubelet's version"),
    Column("Internal-IP", "string", priority=1),
    Column("External-IP", "string", priority=1),
    Column("OS-Image", "string", priority=1),
    Column("Kernel-Version", "string", priority=1),
    Column("Container-Runtime", "string", priority=1),
)

# -- events (core v1 and events.k8s.io/v1 print the same columns) ----------------------------


def _event_cells(event: Obj, now: Now) -> list[Any]:
    core = "involvedObject" in event or "regarding" not in event
    involved = event.get("involvedObject" if core else "regarding") or {}
    source = event.get("source" if core else "deprecatedSource") or {}
    controller = event.get("reportingComponent" if core else "reportingController") or ""
    first_ts = event.get("firstTimestamp" if core else "deprecatedFirstTimestamp")
    last_ts = event.get("lastTimestamp" if core else "deprecatedLastTimestamp")
    first = since(first_ts, now) if first_ts else since(event.get("eventTime"), now)
    last = since(last_ts, now) if last_ts else first
    count = event.get("count" if core else "deprecatedCount") or 0
    series = event.get("series")
    if series:
        last, count = since(series.get("lastObservedTime"), now), series.get("count", 0)
    elif count == 0:
        count = 1
    kind, name = str(involved.get("kind", "")).lower(), involved.get("name", "")
    component = source.get("component") or controller
    instance = source.get("host") or event.get("reportingInstance") or ""
    shown_source = f"{component}, {instance}" if instance else component
    message = event.get("message" if core else "note") or ""
    return [
        last, event.get("type", ""), event.get("reason", ""), f"{kind}/{name}" if name else kind,
        involved.get("fieldPath", ""), shown_source, message.strip(), first, int(count), event["metadata"]["name"],
    ]  # fmt: skip


EVENT_COLUMNS = (
    Column("Last Seen", "string"),
    Column("Type", "string"),
    Column("Reason", "string"),
    Column("Object", "string"),
    Column("Subobject", "string", priority=1),
    Column("Source", "string", priority=1),
    Column("Message", "string"),
    Column("First Seen", "string", priority=1),
    Column("Count", "string", priority=1),
    Column("Name", "string", priority=1, format="name"),
)

# -- the rest --------------------------------------------------------------------------------


def _lease_cells(lease: Obj, now: Now) -> list[Any]:
    holder = (lease.get("spec") or {}).get("holderIdentity") or ""
    return [lease["metadata"]["name"], holder, since(lease["metadata"].get("creationTimestamp"), now)]


def _namespace_cells(ns: Obj, now: Now) -> list[Any]:
    phase = (ns.get("status") or {}).get("phase", "")
    return [ns["metadata"]["name"], phase, since(ns["metadata"].get("creationTimestamp"), now)]


def _configmap_cells(cm: Obj, now: Now) -> list[Any]:
    size = len(cm.get("data") or {}) + len(cm.get("binaryData") or {})
    return [cm["metadata"]["name"], size, since(cm["metadata"].get("creationTimestamp"), now)]


PRINTERS: dict[ResourceType, tuple[tuple[Column, ...], Cells]] = {
    resources.PODS: (POD_COLUMNS, _pod_cells),
    resources.NODES: (NODE_COLUMNS, _node_cells),
    resources.EVENTS: (EVENT_COLUMNS, _event_cells),
    resources.EVENTS_V1: (EVENT_COLUMNS, _event_cells),
    resources.LEASES: ((NAME, Column("Holder", "string"), BUILTIN_AGE), _lease_cells),
    resources.NAMESPACES: ((NAME, Column("Status", "string"), BUILTIN_AGE), _namespace_cells),
    resources.CONFIGMAPS: ((NAME, Column("Data", "string"), BUILTIN_AGE), _configmap_cells),
    resources.NODE_GPU_STATES: ((NAME, *NODE_GPU_STATE_COLUMNS), _by_path((NAME, *NODE_GPU_STATE_COLUMNS))),
}


def printer(rt: ResourceType) -> tuple[tuple[Column, ...], Cells]:
    return PRINTERS.get(rt, ((NAME, AGE), _by_path((NAME, AGE))))
