"""Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for.

kubectl no longer prints columns of its own: without a Table it shows only NAME and AGE. The
NodeGpuState columns must be the CRD's `additionalPrinterColumns` (tests/apiserver checks them
against deploy/base/crds/nodegpustates.yaml); Pods get the real server's default columns; other
types Name and Age, as a CRD without printer columns does.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sandbox import apiserver_resources as resources
from sandbox.apiserver_resources import ResourceType
from sandbox.apiserver_store import Obj


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # integer | number | string | boolean | date
    json_path: str  # a dotted path, all the CRD columns use
    priority: int = 0  # 1: only with `-o wide`
    description: str = ""


NODE_GPU_STATE_COLUMNS = (
    Column("Free GPUs", "integer", ".status.summary.freeGpus", 0,
           "physical GPUs with nothing allocated and nothing unhealthy"),
    Column("Replicas", "string", ".status.summary.replicas", 0, "devices held by pods / devices served (all resources)"),
    Column("Policy", "string", ".status.allocationPolicy", 0, "the node's allocation policy"),
    Column("Schema", "integer", ".status.schemaVersion", 1),
    Column("Observed", "date", ".status.observedAt", 1),
    Column("Age", "date", ".metadata.creationTimestamp"),
)  # fmt: skip
_AGE = Column("Age", "date", ".metadata.creationTimestamp")


def wants_table(accept: str) -> bool:
    """True when the first media type kubectl offers that we can serve is a v1 or v1beta1 Table."""
    for media in accept.split(","):
        params = {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in media.split(";")[1:])}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") in ("v1", "v1beta1"):
            return True
    return False


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


def _lookup(obj: Any, path: str) -> Any:
    for key in path.strip(".").split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _cell(column: Column, obj: Obj, now: datetime.datetime) -> Any:
    value = _lookup(obj, column.json_path)
    if value is None:
        return "<none>" if column.type == "string" else None
    if column.type == "date" and isinstance(value, str):
        with_tz = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return human_age((now - with_tz).total_seconds())
    return value


def _pod_cells(pod: Obj, now: datetime.datetime) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
    return [
        f"{ready}/{len(spec.get('containers') or [])}",
        status.get("reason") or status.get("phase") or "Unknown",
        restarts,
        _cell(_AGE, pod, now),  # Age before the wide columns, as the real server orders them
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
    ]


_POD_COLUMNS = (
    Column("Ready", "string", "", 0, "containers ready / containers"),
    Column("Status", "string", "", 0, "the pod's phase, or the reason it is in it"),
    Column("Restarts", "integer", "", 0, "container restarts"),
    _AGE,
    Column("IP", "string", "", 1),
    Column("Node", "string", "", 1),
)


def _columns(rt: ResourceType) -> tuple[tuple[Column, ...], Callable[[Obj, datetime.datetime], list[Any]]]:
    if rt is resources.NODE_GPU_STATES:
        return NODE_GPU_STATE_COLUMNS, lambda o, now: [_cell(c, o, now) for c in NODE_GPU_STATE_COLUMNS]
    if rt is resources.PODS:
        return _POD_COLUMNS, _pod_cells
    return (_AGE,), lambda o, now: [_cell(_AGE, o, now)]


def table(rt: ResourceType, objects: Sequence[Obj], list_meta: Obj, include_object: str) -> Obj:
    """A Table of `objects`; rows carry each object's metadata (the default `includeObject`),
    which kubectl reads for namespaces and labels, or the whole object, or nothing."""
    columns, cells = _columns(rt)
    now = datetime.datetime.now(datetime.UTC)
    definitions = [
        {"name": "Name", "type": "string", "format": "name", "description": "the object's name", "priority": 0},
        *({"name": c.name, "type": c.type, "format": "", "description": c.description, "priority": c.priority}
          for c in columns),
    ]  # fmt: skip
    rows = []
    for obj in objects:
        row: Obj = {"cells": [obj["metadata"]["name"], *cells(obj, now)]}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            meta = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1"}
            row["object"] = {**meta, "metadata": obj["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
            "columnDefinitions": definitions, "rows": rows}  # fmt: skip
