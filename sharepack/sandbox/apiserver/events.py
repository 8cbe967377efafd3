"""`events.k8s.io/v1` Events as a view of the core `v1` Events.

The real server stores one kind of Event and serves it under both groups: an event written
through one group is read, listed and watched through the other, field by field converted. So
`kubectl get events` and `kubectl describe` (core v1) show what a component reported through
events.k8s.io/v1, and the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]

# events.k8s.io/v1 field -> core v1 field; the others (reason, type, action, eventTime, related,
# reportingInstance, series) have the same name in both.
_RENAMED = {
    "regarding": "involvedObject",
    "note": "message",
    "reportingController": "reportingComponent",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
}
_TO_V1 = {core: v1 for v1, core in _RENAMED.items()}
API_VERSION = "events.k8s.io/v1"


def namespace_problems(event: Obj, involved_key: str) -> list[tuple[str, str]]:
    """The real server's rule: an event about a namespaced object lives in that namespace; one
    about a cluster-scoped object lives in `default` (or no namespace)."""
    involved = event.get(involved_key) or {}
    mine = (event.get("metadata") or {}).get("namespace", "")
    theirs = involved.get("namespace", "") if isinstance(involved, dict) else ""
    if (theirs and theirs != mine) or (not theirs and mine not in ("", "default")):
        return [(f"{involved_key}.namespace", f'Invalid value: "{theirs}": does not match event.namespace')]
    return []


def v1_problems(event: Obj, name_problem: Callable[[str], str | None]) -> list[tuple[str, str]]:
    """What events.k8s.io/v1 requires of a new event (core v1 requires none of it): a valid
    generateName, then eventTime, and only once that is there the reporting fields."""
    causes = namespace_problems(event, "regarding")
    prefix = (event.get("metadata") or {}).get("generateName")
    if prefix and prefix.endswith("-") and len(prefix) > 1:
        prefix = prefix[:-1] + "a"  # a trailing dash is fine in a prefix: the random part follows
    if prefix and (problem := name_problem(prefix)):
        causes.append(("metadata.generateName", problem))
    if not event.get("eventTime"):
        return [*causes, ("eventTime", "Required value")]
    for required in ("reportingController", "reportingInstance", "action", "reason"):
        if not event.get(required):
            causes.append((required, "Required value"))
    return causes


def _rename(obj: Obj, names: dict[str, str], api_version: str) -> Obj:
    out: Obj = {}
    for key, value in obj.items():
        out[names.get(key, key)] = value
    out["apiVersion"] = api_version
    out["kind"] = "Event"
    return out


def to_core(event: Obj) -> Obj:
    """An events.k8s.io/v1 Event as the core v1 Event the server stores."""
    out = _rename(event, _RENAMED, "v1")
    if not out.get("count"):
        out.pop("count", None)
    return out


def to_v1(event: Obj) -> Obj:
    """A stored core v1 Event as events.k8s.io/v1 serves it."""
    out = _rename(event, _TO_V1, API_VERSION)
    # Both Go fields are `omitempty` integers: a zero count is not written.
    if not out.get("deprecatedCount"):
        out.pop("deprecatedCount", None)
    return out
