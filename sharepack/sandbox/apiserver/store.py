"""Storage, resource versions, watches and garbage collection of the sandbox API server.

Everything here runs on the server's event loop and mutates synchronously, so each request is
atomic and a watch registered in the same step as its replay misses nothing. Resource versions
are one global counter (as etcd's revision); each type keeps a bounded event history, and a watch
that asks for a version older than what the history still holds gets 410 Gone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import re
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from sharepack.sandbox.apiserver import defaults
from sharepack.sandbox.apiserver import events
from sharepack.sandbox.apiserver import fields
from sharepack.sandbox.apiserver import openapi
from sharepack.sandbox.apiserver import patching
from sharepack.sandbox.apiserver import resources
from sharepack.sandbox.apiserver import selectors
from sharepack.sandbox.apiserver.resources import ResourceType

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)
Matcher = Callable[[Obj], bool]

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class ApiError(Exception):
    """An error answered as a `Status` body."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        name: str = "",
        kind: str = "",
        group: str = "",
        causes: list[dict[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details: dict[str, Any] = {}
        if name:
            self.details["name"] = name
        if group:
            self.details["group"] = group
        if kind:
            self.details["kind"] = kind
        if causes:
            self.details["causes"] = causes

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def name_problem(name: str) -> str | None:
    """Why `name` is not a DNS subdomain (the rule for object names), or None."""
    if len(name) <= 253 and _NAME_RE.match(name):
        return None
    return (f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric '
            "characters, '-' or '.', and must start and end with an alphanumeric character")  # fmt: skip


def not_found(rt: ResourceType, name: str) -> ApiError:
    qualified = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
    return ApiError(404, "NotFound", f'{qualified} "{name}" not found', name=name, kind=rt.plural, group=rt.group)


def conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    qualified = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
    return ApiError(
        409, "Conflict", f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
        name=name, kind=rt.plural, group=rt.group,
    )


def invalid(rt: ResourceType, name: str, causes: list[tuple[str, str]]) -> ApiError:
    text = ", ".join(f"{f}: {m}" for f, m in causes)
    return ApiError(
        422, "Invalid", f'{rt.kind} "{name}" is invalid: {text}',
        name=name, kind=rt.kind, group=rt.group,
        causes=[{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes],
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class WatchEvent:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj
    prev: Obj | None  # the object before a MODIFIED, for selector transitions


def stored_as(rt: ResourceType) -> ResourceType:
    """Where `rt`'s objects live: events.k8s.io/v1 Events are the core v1 ones, converted."""
    return resources.EVENTS if rt is resources.EVENTS_V1 else rt


def present(rt: ResourceType, obj: Obj) -> Obj:
    """A stored object as `rt` serves it."""
    return events.to_v1(obj) if rt is resources.EVENTS_V1 else obj


@dataclass(slots=True, eq=False)  # identity: watchers live in sets
class Watcher:
    rt: ResourceType
    namespace: str | None
    matches: Matcher
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)

    def offer(self, event: WatchEvent) -> None:
        if self.namespace is not None and event.obj["metadata"].get("namespace", "") != self.namespace:
            return
        obj = present(self.rt, event.obj)
        now = self.matches(obj)
        kind = event.type
        if kind == "MODIFIED" and event.prev is not None:
            prev = present(self.rt, event.prev)
            before = self.matches(prev)
            if now and not before:
                kind = "ADDED"
            elif before and not now:
                # As the real watch cache: the object as it last matched, at the event's version.
                obj = {**prev, "metadata": {**prev["metadata"], "resourceVersion": obj["metadata"]["resourceVersion"]}}
                kind, now = "DELETED", True
        if now:
            self.queue.put_nowait({"type": kind, "object": obj})

    def close(self) -> None:
        self.queue.put_nowait(None)


def _stamp(rt: ResourceType, obj: Obj) -> Obj:
    obj["apiVersion"] = rt.api_version
    obj["kind"] = rt.kind
    return obj


def _without_rv(obj: Obj) -> Obj:
    clone = dict(obj)
    meta = dict(clone.get("metadata", {}))
    meta.pop("resourceVersion", None)
    meta.pop("managedFields", None)
    clone["metadata"] = meta
    return clone


class Store:
    def __init__(self, *, history: int = 1000, gc_delay: float = 0.0) -> None:
        self.rv = 1
        self.history_limit = history
        self.gc_delay = gc_delay
        self.objects: dict[ResourceType, dict[Key, Obj]] = {rt: {} for rt in resources.ALL}
        self.history: dict[ResourceType, deque[WatchEvent]] = {rt: deque() for rt in resources.ALL}
        self.compacted: dict[ResourceType, int] = {rt: 0 for rt in resources.ALL}
        self.watchers: dict[ResourceType, set[Watcher]] = {rt: set() for rt in resources.ALL}
        self.by_uid: dict[str, tuple[ResourceType, Key]] = {}
        self._gc_handles: set[asyncio.TimerHandle] = set()
        # The `fieldValidation` of the request being served, and the warnings it collects.
        self._field_mode = "Ignore"
        self._field_warnings: list[str] = []
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create(resources.NAMESPACES, "", {"metadata": {"name": ns}})

    @contextlib.contextmanager
    def field_validation(self, mode: str) -> Iterator[list[str]]:
        """Writes inside the block treat unknown fields as `mode` says; the block gets the warnings."""
        self._field_mode, self._field_warnings = mode, []
        try:
            yield self._field_warnings
        finally:
            self._field_mode, self._field_warnings = "Ignore", []

    def _drop_unknown_fields(self, rt: ResourceType, obj: Obj) -> None:
        try:
            dropped = fields.prune(obj, openapi.schema_of(rt))
        except fields.TimeFormatError as e:
            raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {e}') from None
        if dropped and self._field_mode == "Strict":
            found = ", ".join(f'unknown field "{d}"' for d in dropped)
            raise bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding error: {found}'
            )
        if self._field_mode == "Warn":
            self._field_warnings += [f'unknown field "{d}"' for d in dropped]

    # -- reading ---------------------------------------------------------------------------

    def get(self, rt: ResourceType, ns: str, name: str) -> Obj:
        obj = self.objects[stored_as(rt)].get((ns, name))
        if obj is None:
            raise not_found(rt, name)
        return present(rt, copy.deepcopy(obj))

    def exists(self, rt: ResourceType, ns: str, name: str) -> bool:
        return self._key(rt, ns, name) in self.objects[stored_as(rt)]

    def matcher(self, rt: ResourceType, label_selector: str, field_selector: str) -> Matcher:
        try:
            by_label = selectors.parse_label_selector(label_selector)
            by_field = selectors.parse_field_selector(field_selector, rt.field_selectors, rt.kind)
        except selectors.SelectorError as e:
            raise bad_request(str(e)) from None

        def matches(obj: Obj) -> bool:
            return by_label(obj["metadata"].get("labels") or {}) and by_field(obj)

        return matches

    def list(
        self, rt: ResourceType, ns: str | None, matches: Matcher, *, limit: int = 0, cont: str = ""
    ) -> Obj:
        start = ""
        if cont:
            try:
                start = str(orjson.loads(base64.urlsafe_b64decode(cont))["start"])
            except (ValueError, KeyError, TypeError):
                raise bad_request(f"continue key is not valid: {cont}") from None
        items: list[Obj] = []
        meta: Obj = {"resourceVersion": str(self.rv)}
        shown = (
            (key, present(rt, obj))
            for key, obj in sorted(self.objects[stored_as(rt)].items())
            if (ns is None or key[0] == ns) and f"{key[0]}/{key[1]}" > start
        )
        chosen = [(key, obj) for key, obj in shown if matches(obj)]
        for i, (key, obj) in enumerate(chosen):
            if limit and i == limit:
                token = orjson.dumps({"rv": self.rv, "start": f"{items_key(items[-1])}"})
                meta["continue"] = base64.urlsafe_b64encode(token).decode()
                meta["remainingItemCount"] = len(chosen) - limit
                break
            item = copy.deepcopy(obj)
            if not rt.group:  # typed lists of built-in kinds omit kind/apiVersion per item
                item.pop("kind", None)
                item.pop("apiVersion", None)
            items.append(item)
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items}

    # -- watching --------------------------------------------------------------------------

    def watch(
        self, rt: ResourceType, ns: str | None, matches: Matcher, since: str, *, initial: bool = False
    ) -> Watcher:
        watcher = Watcher(rt, ns, matches)
        rt = stored_as(rt)
        if since in ("", "0") or initial:
            for (ons, _), obj in sorted(self.objects[rt].items()):
                shown = present(watcher.rt, obj)
                if (ns is None or ons == ns) and matches(shown):
                    watcher.queue.put_nowait({"type": "ADDED", "object": copy.deepcopy(shown)})
        else:
            try:
                start = int(since)
            except ValueError:
                raise bad_request(f"invalid resourceVersion: {since!r}") from None
            if start < self.compacted[rt]:
                watcher.queue.put_nowait(
                    {"type": "ERROR", "object": ApiError(
                        410, "Expired", f"too old resource version: {start} ({self.compacted[rt]})"
                    ).status()}
                )
                watcher.close()
                return watcher
            for event in self.history[rt]:
                if event.rv > start:
                    watcher.offer(event)
        self.watchers[rt].add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers[stored_as(watcher.rt)].discard(watcher)

    def close_watches(self) -> None:
        for group in self.watchers.values():
            for watcher in group:
                watcher.close()
            group.clear()

    def compact(self) -> None:
        """Forget every event so far: watches from any older version now get 410 Gone."""
        for rt in resources.ALL:
            self.history[rt].clear()
            self.compacted[rt] = self.rv

    def _emit(self, rt: ResourceType, kind: str, obj: Obj, prev: Obj | None = None) -> None:
        event = WatchEvent(self.rv, kind, copy.deepcopy(obj), prev)
        history = self.history[rt]
        history.append(event)
        while len(history) > self.history_limit:
            self.compacted[rt] = history.popleft().rv
        for watcher in self.watchers[rt]:
            watcher.offer(event)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    # -- writing ---------------------------------------------------------------------------

    def _validate(self, rt: ResourceType, obj: Obj, name: str) -> None:
        causes: list[tuple[str, str]] = []
        if problem := name_problem(name):
            causes.append(("metadata.name", problem))
        for i, ref in enumerate(obj["metadata"].get("ownerReferences") or []):
            where = f"metadata.ownerReferences[{i}]"
            if not isinstance(ref, dict):
                causes.append((where, "Invalid value: not an object"))
                continue
            for key in ("apiVersion", "kind", "name", "uid"):
                if not ref.get(key):
                    causes.append((f"{where}.{key}", f'Invalid value: "": {key} must not be empty'))
        if rt is resources.EVENTS:
            causes += events.namespace_problems(obj, "involvedObject")
        if rt is resources.CONFIGMAPS:
            for section in ("data", "binaryData"):
                for key, value in (obj.get(section) or {}).items():
                    if not isinstance(value, str):
                        causes.append((f"{section}[{key}]", "Invalid value: must be a string"))
        if causes:
            raise invalid(rt, name, causes)

    def _check_body(self, rt: ResourceType, ns: str, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise bad_request("the body of the request is not a JSON object")
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if api_version and api_version != rt.api_version:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version ({rt.api_version})"
            )
        if kind and kind != rt.kind:
            raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            body_ns = meta.get("namespace") or ns
            if body_ns != ns:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        return body

    def create(self, rt: ResourceType, ns: str, body: Any) -> Obj:
        if rt is not stored_as(rt):
            checked = self._check_body(rt, ns, copy.deepcopy(body))
            problems = events.v1_problems(checked, name_problem)
            if problems:
                raise invalid(rt, checked["metadata"].get("name", ""), problems)
            return present(rt, self.create(stored_as(rt), ns, events.to_core(checked)))
        obj = self._check_body(rt, ns, copy.deepcopy(body))
        self._drop_unknown_fields(rt, obj)
        meta = obj["metadata"]
        if rt.namespaced and ("", ns) not in self.objects[resources.NAMESPACES]:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', name=ns, kind="namespaces")
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = meta["generateName"] + "".join(
                _GENERATE_ALPHABET[b % len(_GENERATE_ALPHABET)] for b in uuid.uuid4().bytes[:5]
            )
        if not name:
            raise invalid(rt, "", [("metadata.name", "Required value: name or generateName is required")])
        self._validate(rt, obj, name)
        key = (ns if rt.namespaced else "", name)
        if key in self.objects[rt]:
            qualified = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
            raise ApiError(
                409, "AlreadyExists", f'{qualified} "{name}" already exists', name=name, kind=rt.plural, group=rt.group
            )
        for transient in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(transient, None)
        meta["name"] = name
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if rt.tracks_generation:
            meta["generation"] = 1
        if not rt.create_keeps_status:
            obj.pop("status", None)
            if rt is resources.PODS:
                defaults.default_pod(obj)
        if rt is resources.NAMESPACES:
            defaults.default_namespace(obj)
        meta["resourceVersion"] = self._next_rv()
        _stamp(rt, obj)
        self.objects[rt][key] = obj
        self.by_uid[meta["uid"]] = (rt, key)
        self._emit(rt, "ADDED", obj)
        self._schedule_gc_if_orphaned(obj)
        return copy.deepcopy(obj)

    def _key(self, rt: ResourceType, ns: str, name: str) -> Key:
        return (ns if rt.namespaced else "", name)

    def _replace(self, rt: ResourceType, key: Key, old: Obj, new: Obj, subresource: str) -> Obj:
        """Common tail of update and patch: subresource rules, then store and notify."""
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        sent_rv = meta.get("resourceVersion")
        if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise conflict(rt, key[1], "the object has been modified; please apply your changes to the latest version and try again")
        sent_uid = meta.get("uid")
        if sent_uid and sent_uid != old["metadata"]["uid"]:
            raise conflict(
                rt, key[1], f"Precondition failed: UID in precondition: {sent_uid}, UID in object meta: {old['metadata']['uid']}"
            )
        if meta.get("name", key[1]) != key[1]:
            raise bad_request("the name of the object does not match the name on the URL")
        self._drop_unknown_fields(rt, new)
        if subresource == "status":
            result = copy.deepcopy(old)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
        else:
            result = new
            if rt.status_subresource:
                if "status" in old:
                    result["status"] = copy.deepcopy(old["status"])
                else:
                    result.pop("status", None)
            rmeta = result["metadata"]
            for fixed in ("uid", "creationTimestamp", "namespace", "name", "generation", "deletionTimestamp"):
                if fixed in old["metadata"]:
                    rmeta[fixed] = old["metadata"][fixed]
                else:
                    rmeta.pop(fixed, None)
            self._validate(rt, result, key[1])
            if rt is resources.PODS:
                self._check_pod_update(old, result)
            if rt.tracks_generation and self._spec_part(result) != self._spec_part(old):
                rmeta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        _stamp(rt, result)
        result["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if _without_rv(result) == _without_rv(old):
            return copy.deepcopy(old)  # a no-op write: no new version, no event
        if old["metadata"].get("deletionTimestamp") and not result["metadata"].get("finalizers"):
            return self._remove(rt, key)
        result["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[rt][key] = result
        self._emit(rt, "MODIFIED", result, copy.deepcopy(old))
        self._schedule_gc_if_orphaned(result)
        return copy.deepcopy(result)

    @staticmethod
    def _spec_part(obj: Obj) -> Obj:
        return {k: v for k, v in obj.items() if k not in ("metadata", "status")}

    @staticmethod
    def _check_pod_update(old: Obj, new: Obj) -> None:
        def frozen(pod: Obj) -> Any:
            spec = copy.deepcopy(pod.get("spec") or {})
            for c in spec.get("containers") or []:
                c.pop("image", None)
            spec.pop("activeDeadlineSeconds", None)
            return spec

        if frozen(old) != frozen(new):
            name = old["metadata"]["name"]
            raise invalid(resources.PODS, name, [(
                "spec", "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations)",
            )])

    def update(self, rt: ResourceType, ns: str, name: str, body: Any, subresource: str = "") -> Obj:
        if rt is not stored_as(rt):
            core = events.to_core(self._check_body(rt, ns, copy.deepcopy(body)))
            return present(rt, self.update(stored_as(rt), ns, name, core, subresource))
        new = self._check_body(rt, ns, copy.deepcopy(body))
        key = self._key(rt, ns, name)
        old = self.objects[rt].get(key)
        if old is None:
            raise not_found(rt, name)
        if not new["metadata"].get("resourceVersion") and not rt.unconditional_update:
            raise invalid(rt, name, [("metadata.resourceVersion", "Invalid value: 0x0: must be specified for an update")])
        return self._replace(rt, key, old, new, subresource)

    def patch(
        self, rt: ResourceType, ns: str, name: str, content_type: str, patch: Any, subresource: str = ""
    ) -> Obj:
        key = self._key(rt, ns, name)
        stored = self.objects[stored_as(rt)].get(key)
        if stored is None and patching.APPLY in content_type:  # apply creates what is missing
            if isinstance(patch, dict) and isinstance(patch.get("metadata"), dict):
                if patch["metadata"].get("name", name) != name:
                    raise bad_request("the name of the object does not match the name on the URL")
                patch["metadata"]["name"] = name
            return self.create(rt, ns, patch)
        if stored is None:
            raise not_found(rt, name)
        old = present(rt, stored)
        try:
            if rt.custom and patching.STRATEGIC in content_type:
                raise LookupError(content_type)  # custom resources have no strategic merge
            new = patching.apply_patch(content_type, old, patch, lambda: openapi.schema_of(rt))
        except LookupError:
            raise ApiError(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format - accepted media "
                f"types include: {patching.JSON_PATCH}, {patching.MERGE}, {patching.STRATEGIC}",
            ) from None
        except patching.PatchError as e:
            raise ApiError(422 if "test" in str(e) else 400, "BadRequest", str(e)) from None
        if not isinstance(new, dict):
            raise bad_request("the patch produced something other than an object")
        # A resourceVersion the patch itself sets is a precondition; the old one is not.
        sent_rv = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
        new.setdefault("metadata", {})["resourceVersion"] = sent_rv or old["metadata"]["resourceVersion"]
        self._check_body(rt, ns, new)
        if rt is not stored_as(rt):
            new = events.to_core(new)
        return present(rt, self._replace(stored_as(rt), key, stored, new, subresource))

    def delete(self, rt: ResourceType, ns: str, name: str, options: Mapping[str, Any] | None = None) -> Obj:
        if rt is not stored_as(rt):
            return present(rt, self.delete(stored_as(rt), ns, name, options))
        key = self._key(rt, ns, name)
        obj = self.objects[rt].get(key)
        if obj is None:
            raise not_found(rt, name)
        pre = (options or {}).get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]:
            raise conflict(rt, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {obj['metadata']['uid']}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise conflict(rt, name, "the object has been modified; please apply your changes to the latest version and try again")
        if obj["metadata"].get("finalizers"):
            if obj["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(obj)
            prev = copy.deepcopy(obj)
            obj["metadata"]["deletionTimestamp"] = now_rfc3339()
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._emit(rt, "MODIFIED", obj, prev)
            return copy.deepcopy(obj)
        if rt is resources.PODS:
            # A pod is deleted gracefully: the real server first records the deletion (an update,
            # so watchers see MODIFIED with deletionTimestamp), then removes it. The sandbox
            # removes it at once, as the real server does an unscheduled pod or grace period 0.
            prev = copy.deepcopy(obj)
            obj["metadata"]["deletionTimestamp"] = now_rfc3339()
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._emit(rt, "MODIFIED", obj, prev)
        return self._remove(rt, key)

    def _remove(self, rt: ResourceType, key: Key) -> Obj:
        obj = self.objects[rt].pop(key)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        uid = obj["metadata"]["uid"]
        self.by_uid.pop(uid, None)
        self._emit(rt, "DELETED", obj)
        if rt is resources.NAMESPACES:
            for other in resources.ALL:
                for okey in [k for k in self.objects[other] if other.namespaced and k[0] == key[1]]:
                    self._remove(other, okey)
        self._schedule_gc_of_dependents(uid)
        return copy.deepcopy(obj)

    def bind(self, ns: str, name: str, body: Any) -> None:
        rt = resources.PODS
        if not isinstance(body, dict):
            raise bad_request("the body of the request is not a JSON object")
        target = body.get("target") or {}
        node = target.get("name") if isinstance(target, dict) else None
        if not node:
            raise invalid(rt, name, [("target.name", "Required value")])
        key = (ns, name)
        pod = self.objects[rt].get(key)
        if pod is None:
            raise not_found(rt, name)
        want_uid = (body.get("metadata") or {}).get("uid")
        if want_uid and want_uid != pod["metadata"]["uid"]:
            raise conflict(rt, name, f"Precondition failed: UID in precondition: {want_uid}, UID in object meta: {pod['metadata']['uid']}")
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound:
            raise ApiError(
                409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already assigned to node "{bound}"',
                name=name, kind="pods/binding",
            )
        if pod["metadata"].get("deletionTimestamp"):
            raise conflict(rt, name, "pod is being deleted, cannot be assigned to a host")
        prev = copy.deepcopy(pod)
        pod.setdefault("spec", {})["nodeName"] = node
        # As the real Binding handler: the Binding's annotations and labels are merged into the
        # pod in the same write (the extender's directed GPUs ride on it).
        meta = body.get("metadata") or {}
        for part in ("annotations", "labels"):
            extra = meta.get(part) if isinstance(meta, dict) else None
            if isinstance(extra, dict) and extra:
                pod["metadata"].setdefault(part, {}).update({str(k): str(v) for k, v in extra.items()})
        conditions = [c for c in pod.setdefault("status", {}).get("conditions", []) if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()})
        pod["status"]["conditions"] = conditions
        pod["metadata"]["resourceVersion"] = self._next_rv()
        self._emit(rt, "MODIFIED", pod, prev)

    # -- garbage collection ----------------------------------------------------------------

    def _owner_alive(self, ref: Mapping[str, Any]) -> bool:
        where = self.by_uid.get(str(ref.get("uid")))
        if where is None:
            return False
        rt, (_, name) = where
        return rt.kind == ref.get("kind") and name == ref.get("name")

    def _iter_all(self) -> Iterator[tuple[ResourceType, Key, Obj]]:
        for rt, objs in self.objects.items():
            for key, obj in objs.items():
                yield rt, key, obj

    def _schedule_gc_if_orphaned(self, obj: Obj) -> None:
        refs = obj["metadata"].get("ownerReferences") or []
        if refs and not any(self._owner_alive(r) for r in refs):
            self._schedule_collect(obj["metadata"]["uid"])

    def _schedule_gc_of_dependents(self, owner_uid: str) -> None:
        for _, _, obj in list(self._iter_all()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == owner_uid for r in refs):
                self._schedule_collect(obj["metadata"]["uid"])

    def _schedule_collect(self, uid: str) -> None:
        # The real garbage collector runs asynchronously; so does ours (after gc_delay).
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._collect(uid)
            return
        handle: asyncio.TimerHandle | None = None

        def run() -> None:
            if handle is not None:
                self._gc_handles.discard(handle)
            self._collect(uid)

        handle = loop.call_later(self.gc_delay, run)
        self._gc_handles.add(handle)

    def _collect(self, uid: str) -> None:
        where = self.by_uid.get(uid)
        if where is None:
            return
        rt, key = where
        obj = self.objects[rt][key]
        refs = obj["metadata"].get("ownerReferences") or []
        if refs and not any(self._owner_alive(r) for r in refs):
            self.delete(rt, key[0], key[1])

    def cancel_gc(self) -> None:
        for handle in self._gc_handles:
            handle.cancel()
        self._gc_handles.clear()


def items_key(item: Obj) -> str:
    meta = item["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"
