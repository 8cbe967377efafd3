"""Pods not bound yet, as the extender's pod watch delivers them: what the bind guard reads of
the pod it is asked to bind, instead of asking kube-apiserver once per bind.

The guard judges the pod as the API has it, never as a /bind or /filter body describes it. The
pod watch is the API's own account: kube-apiserver serves it from its watch cache, the place a
GET with `resourceVersion=0` reads too, and it trails etcd by milliseconds. Those milliseconds
are covered where they matter: the Binding carries the pod's UID as a precondition (a pod
deleted and created again under the same name is not bound), and kube-apiserver refuses to bind
a pod already bound or being deleted. What else the guard reads of a pending pod, its
`schedulerName` and its GPU requests, cannot change before it is bound (a resize changes CPU and
memory only).

Only pods no node holds yet, not being deleted, of a scheduler this extender serves are kept
(the watch lists every pod: most of them are bound and counted elsewhere). A pod the watch has
not delivered yet, or has with another UID, is read from the API as before.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from sharepack.common import podrequests

Key = tuple[str, str]  # (namespace, name)


def _pending_key(obj: Any, scheduler_names: frozenset[str]) -> tuple[Key, bool]:
    """The pod's (namespace, name), and whether it is a pending pod of ours to keep."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return ("", ""), False
    key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or spec.get("nodeName") or meta.get("deletionTimestamp"):
        return key, False
    scheduler = spec.get("schedulerName") or podrequests.DEFAULT_SCHEDULER_NAME
    return key, scheduler in scheduler_names


class PendingPods:
    """The pending pods of the schedulers this extender serves, by (namespace, name)."""

    def __init__(self, scheduler_names: Collection[str] = (podrequests.DEFAULT_SCHEDULER_NAME,)) -> None:
        self.scheduler_names = frozenset(scheduler_names)
        self._pods: dict[Key, Any] = {}
        self.hits = 0  # binds whose pod came from here (for tests)
        self.misses = 0  # binds that had to read the pod from the API

    @property
    def count(self) -> int:
        """Pods kept (a property, not __len__: an empty cache is no less a cache)."""
        return len(self._pods)

    def replace(self, objects: Iterable[Any]) -> None:
        self._pods = {}
        for obj in objects:
            self.upsert(obj)

    def upsert(self, obj: Any) -> None:
        key, keep = _pending_key(obj, self.scheduler_names)
        if keep:
            self._pods[key] = obj
        else:
            self._pods.pop(key, None)

    def delete(self, obj: Any) -> None:
        key, _ = _pending_key(obj, self.scheduler_names)
        self._pods.pop(key, None)

    def get(self, namespace: str, name: str, uid: str) -> Any | None:
        """The pod as the watch last delivered it, if it is that UID's and still pending."""
        obj = self._pods.get((namespace, name))
        meta = obj.get("metadata") if obj is not None else None
        if isinstance(meta, Mapping) and uid and meta.get("uid") == uid:
            self.hits += 1
            return obj
        self.misses += 1
        return None
