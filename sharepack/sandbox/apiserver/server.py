"""A small, faithful Kubernetes API server for the sandbox and the tests.

It speaks the JSON REST protocol the real `kubernetes` client and kubectl use, over real HTTP on
127.0.0.1: Namespaces, Nodes, Pods (with the `binding` subresource), ConfigMaps, Events (core/v1,
and events.k8s.io/v1 as a converted view of the same objects), Leases, the `NodeGpuState` custom
resource, SelfSubjectAccessReview and SelfSubjectReview; get / list / watch / create / update / patch (merge,
strategic, JSON, server-side apply) / delete, resource versions, 409 on stale writes, status
subresources, owner references and their garbage collection, and `Status` error bodies. Storage
and semantics live in `apiserver_store`; this module maps HTTP onto them.

Faithful details clients trip over: `create` of a custom resource with a status subresource
drops `status` (write it through `/status`); a custom resource refuses an update without
`metadata.resourceVersion` (422) and a strategic merge patch (415); fields the schema does not
declare are dropped, with a `Warning` header (`fieldValidation=Warn`, the default) or a 400
(`Strict`); a pod gets the real server's defaults (`apiserver_defaults`); a binding answers a
`Status` (201), which the generated client cannot read as a `V1Binding`: call
`create_namespaced_pod_binding(..., _preload_content=False)`; a watch from a version older than
the kept history gets an ERROR event with code 410; a write that changes nothing keeps the
resourceVersion and sends no event; an object whose owners are all gone is garbage-collected.

Simplifications: one global resource-version counter and in-memory storage; list ignores
`resourceVersion` (always the latest); deletion is immediate unless finalizers are set (no pod
grace period, no Foreground/Orphan propagation); no managed fields (server-side apply merges
without ownership); no authentication or authorization (any token is accepted, every access
review is allowed and says why); validation beyond names, ownerReferences, ConfigMap values, pod
spec immutability and unknown fields is not done.

Test conveniences: `pause("unavailable")` answers 503, `pause("refuse")` stops listening and drops
every connection (the port is reused on `resume()`), `fail_next(...)` injects errors,
`requests` records every call.

kubectl works against it: discovery, the OpenAPI v2 and v3 documents (`apiserver_openapi`) that
`apply`, `create` and `explain` need, the protobuf bodies of its typed clients (`auth can-i`,
`auth whoami`, `create namespace|configmap`, `drain`: `apiserver_protobuf`), and the `meta.k8s.io/v1` Table of `get` with the real server's columns
(`apiserver_printers`), for get, list and watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import orjson
import yaml
from aiohttp import web

from sharepack.sandbox.apiserver import fields
from sharepack.sandbox.apiserver import openapi
from sharepack.sandbox.apiserver import patching
from sharepack.sandbox.apiserver import protobuf
from sharepack.sandbox.apiserver import resources
from sharepack.sandbox.apiserver import tables
from sharepack.sandbox.apiserver.resources import ResourceType
from sharepack.sandbox.apiserver.store import ApiError, Obj, Store, Watcher, bad_request

log = logging.getLogger(__name__)

PauseMode = Literal["unavailable", "refuse"]
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class RequestRecord:
    at: float  # time.monotonic()
    method: str
    path: str
    query: str
    status: int


@dataclass(slots=True)
class _Injected:
    method: str
    path_contains: str
    code: int
    times: int


@dataclass(frozen=True, slots=True)
class _Target:
    rt: ResourceType
    namespace: str | None  # None: all namespaces (a list or watch of a namespaced type)
    name: str
    subresource: str


def _json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type=_JSON)


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "").lower() in ("1", "true")


class FakeApiServer:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        history: int = 1000,
        bookmark_interval: float = 1.0,
        gc_delay: float = 0.0,
    ) -> None:
        self.store = Store(history=history, gc_delay=gc_delay)
        self.requests: list[RequestRecord] = []
        self.bookmark_interval = bookmark_interval
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self._paused: PauseMode | None = None
        self._injected: list[_Injected] = []

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that hangs up ends its watch handler at once.
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5, handler_cancellation=True,
                               access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        if self._port == 0:
            # The port the OS chose; aiohttp exposes it only here. An asyncio or a uvloop Server:
            # no common class to check, the same `sockets`.
            server = cast(asyncio.Server, site._server)
            self._port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.store.close_watches()
        self.store.cancel_gc()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> FakeApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def pause(self, mode: PauseMode = "unavailable") -> None:
        """Simulate an outage: 503 for every request, or nothing listening at all."""
        self._paused = mode
        self.store.close_watches()
        if mode == "refuse" and self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def resume(self) -> None:
        mode, self._paused = self._paused, None
        if mode == "refuse" and self._runner is None:
            await self.start()

    def fail_next(self, method: str, path_contains: str, code: int = 500, *, times: int = 1) -> None:
        """Answer the next `times` matching requests with a `Status` error of `code`."""
        self._injected.append(_Injected(method.upper(), path_contains, code, times))

    def write_kubeconfig(self, path: Path | str, *, context: str = "sandbox") -> Path:
        path = Path(path)
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {"token": "sandbox"}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
            "current-context": context,
        }
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def writes(self, plural: str, *, since: float = 0.0) -> list[RequestRecord]:
        """Successful writes (POST/PUT/PATCH/DELETE) whose path names `plural`."""
        return [
            r for r in self.requests
            if r.at >= since and r.method in ("POST", "PUT", "PATCH", "DELETE")
            and f"/{plural}" in r.path and r.status < 300
        ]

    # -- HTTP ------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        status = 500
        try:
            response = await self._dispatch(request)
            status = response.status
            return response
        except ApiError as e:
            status = e.code
            return _json_response(e.status(), e.code)
        finally:
            self.requests.append(
                RequestRecord(time.monotonic(), request.method, request.path, request.query_string, status)
            )

    def _injected_error(self, request: web.Request) -> ApiError | None:
        for inj in self._injected:
            if inj.method == request.method and inj.path_contains in request.path:
                inj.times -= 1
                if inj.times <= 0:
                    self._injected.remove(inj)
                reason = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
                return ApiError(inj.code, reason.get(inj.code, "InternalError"), f"injected failure ({inj.code})")
        return None

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        if self._paused is not None:
            raise ApiError(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        injected = self._injected_error(request)
        if injected is not None:
            raise injected
        parts = [p for p in request.path.split("/") if p]
        if request.method == "GET":
            doc = self._discovery(parts)
            if doc is not None:
                return _json_response(doc)
            if parts[:1] == ["openapi"]:
                return self._openapi(parts[1:])
        target = self._route(parts)
        if target is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return await self._serve(request, target)

    @staticmethod
    def _discovery(parts: list[str]) -> Obj | None:
        if parts == ["version"]:
            return dict(resources.SERVER_VERSION)
        if parts == ["api"]:
            return resources.api_versions()
        if parts == ["api", "v1"]:
            return resources.api_resource_list("", "v1")
        if parts == ["apis"]:
            return resources.api_group_list()
        if len(parts) == 2 and parts[0] == "apis":
            return resources.api_group(parts[1])
        if len(parts) == 3 and parts[0] == "apis":
            return resources.api_resource_list(parts[1], parts[2])
        if parts in (["healthz"], ["readyz"], ["livez"]):
            return {"status": "ok"}
        return None

    @staticmethod
    def _openapi(parts: list[str]) -> web.Response:
        body: bytes | None = None
        if parts == ["v2"]:
            body = openapi.v2_document()
        elif parts == ["v3"]:
            body = orjson.dumps(openapi.v3_root())
        elif parts[:1] == ["v3"] and parts[1:2] == ["api"] and len(parts) == 3:
            body = openapi.v3_document("", parts[2])
        elif parts[:1] == ["v3"] and parts[1:2] == ["apis"] and len(parts) == 4:
            body = openapi.v3_document(parts[2], parts[3])
        if body is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return web.Response(body=body, content_type=_JSON)

    @staticmethod
    def _route(parts: list[str]) -> _Target | None:
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            rt = resources.BY_PATH.get((group, version, rest[2]))
            if rt is not None and rt.namespaced:
                namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            return None
        rt = resources.BY_PATH.get((group, version, rest[0]))
        if rt is None:
            return None
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if rt.namespaced and namespace is None and name:
            return None  # a namespaced object named without its namespace
        if sub and not (sub == "status" and rt.status_subresource) and not (sub == "binding" and rt is resources.PODS):
            return None
        return _Target(rt, namespace if rt.namespaced else "", name, sub)

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return {}
        if request.content_type == protobuf.MEDIA_TYPE:
            try:
                return protobuf.decode(raw)
            except protobuf.ProtobufError as e:
                raise bad_request(f"the body of the request could not be decoded as protobuf: {e}") from None
        if request.content_type == patching.APPLY:
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as e:
                raise bad_request(f"the apply configuration could not be decoded as YAML: {e}") from None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise bad_request(f"the body of the request could not be decoded as JSON: {e}") from None

    async def _serve(self, request: web.Request, t: _Target) -> web.StreamResponse:
        if t.rt.virtual:
            if request.method != "POST" or t.name:
                raise ApiError(405, "MethodNotAllowed", f"{t.rt.plural} only supports create")
            body = await self._body(request)
            if t.rt is resources.SELF_SUBJECT_REVIEWS:
                return _json_response(self._who_am_i(), 201)
            return _json_response(self._access_review(body), 201)
        if request.method not in ("POST", "PUT", "PATCH"):
            return await self._read_or_delete(request, t)
        try:
            mode = fields.mode(request.query.get("fieldValidation", ""))
        except ValueError as e:
            raise bad_request(str(e)) from None
        body = await self._body(request)
        # Synchronous from here: no other request runs inside the store's field_validation.
        with self.store.field_validation(mode) as warnings:
            response = self._write(request, t, body)
        for warning in warnings:
            response.headers.add("Warning", f'299 - "{warning.replace(chr(34), chr(92) + chr(34))}"')
        return response

    @staticmethod
    def _who_am_i() -> Obj:
        """A SelfSubjectReview: the sandbox does not authenticate; every caller is this one user."""
        review = resources.SELF_SUBJECT_REVIEWS
        user = {"username": "sandbox", "groups": ["system:masters", "system:authenticated"]}
        return {"kind": review.kind, "apiVersion": review.api_version, "metadata": {"creationTimestamp": None},
                "status": {"userInfo": user}}  # fmt: skip

    @staticmethod
    def _access_review(body: Any) -> Obj:
        """A SelfSubjectAccessReview: the sandbox has no authorization, so everything is allowed,
        and the answer says why."""
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            raise bad_request("a SelfSubjectAccessReview needs a spec")
        review = resources.SELF_SUBJECT_ACCESS_REVIEWS
        return {
            "kind": review.kind, "apiVersion": review.api_version,
            "metadata": {"creationTimestamp": None}, "spec": body["spec"],
            "status": {"allowed": True,
                       "reason": "the sharepack sandbox API server has no authorization: every request is allowed"},
        }  # fmt: skip

    def _write(self, request: web.Request, t: _Target, body: Any) -> web.Response:
        store, method, ns = self.store, request.method, t.namespace or ""
        if not t.name and method == "POST":
            if t.namespace is None:
                raise ApiError(405, "MethodNotAllowed", "create requires a namespace")
            return _json_response(store.create(t.rt, ns, body), 201)
        if t.subresource == "binding":
            if method != "POST":
                raise ApiError(405, "MethodNotAllowed", "binding only supports create")
            store.bind(ns, t.name, body)
            return _json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)
        if t.name and method == "PUT":
            return _json_response(store.update(t.rt, ns, t.name, body, t.subresource))
        if t.name and method == "PATCH":
            ctype = request.headers.get("Content-Type", "")
            self._check_patch_options(request.query, ctype)
            existed = store.exists(t.rt, ns, t.name)
            return _json_response(store.patch(t.rt, ns, t.name, ctype, body, t.subresource), 200 if existed else 201)
        raise ApiError(405, "MethodNotAllowed", f"method {method} is not allowed here")

    async def _read_or_delete(self, request: web.Request, t: _Target) -> web.StreamResponse:
        store, q, method = self.store, request.query, request.method
        ns = t.namespace or ""
        if not t.name:
            if method == "GET":
                matches = store.matcher(t.rt, q.get("labelSelector", ""), q.get("fieldSelector", ""))
                if _flag(q, "watch"):
                    return await self._watch(request, t, matches)
                limit = int(q.get("limit", "0") or 0)
                listed = store.list(t.rt, t.namespace, matches, limit=limit, cont=q.get("continue", ""))
                if tables.wants_table(request.headers.get("Accept", "")):
                    listed = tables.table(t.rt, listed["items"], listed["metadata"], q.get("includeObject", ""))
                return _json_response(listed)
            if method == "DELETE":
                matches = store.matcher(t.rt, q.get("labelSelector", ""), q.get("fieldSelector", ""))
                listed = store.list(t.rt, t.namespace, matches)
                for item in listed["items"]:
                    meta = item["metadata"]
                    with contextlib.suppress(ApiError):
                        store.delete(t.rt, meta.get("namespace", ""), meta["name"])
                return _json_response(listed)
            raise ApiError(405, "MethodNotAllowed", f"method {method} is not allowed on a collection")
        if t.subresource == "binding":
            raise ApiError(405, "MethodNotAllowed", "binding only supports create")
        if method == "GET":
            obj = store.get(t.rt, ns, t.name)
            if tables.wants_table(request.headers.get("Accept", "")) and not t.subresource:
                meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
                obj = tables.table(t.rt, [obj], meta, q.get("includeObject", ""))
            return _json_response(obj)
        if method == "DELETE" and not t.subresource:
            body = await self._body(request)
            return _json_response(store.delete(t.rt, ns, t.name, body if isinstance(body, dict) else None))
        raise ApiError(405, "MethodNotAllowed", f"method {method} is not allowed here")

    @staticmethod
    def _check_patch_options(q: Mapping[str, str], content_type: str) -> None:
        """The real server's PatchOptions rules: apply names its field manager; only apply forces."""
        apply = content_type.split(";")[0].strip() == patching.APPLY
        if apply and not q.get("fieldManager"):
            cause = ("fieldManager", "Required value: is required for apply patch")
        elif not apply and "force" in q:
            cause = ("force", "Forbidden: may not be specified for non-apply patch")
        else:
            return
        raise ApiError(422, "Invalid", f'PatchOptions.meta.k8s.io "" is invalid: {cause[0]}: {cause[1]}',
                       kind="PatchOptions", group="meta.k8s.io",
                       causes=[{"reason": "FieldValueInvalid", "message": cause[1], "field": cause[0]}])

    @staticmethod
    def _check_watch_options(q: Mapping[str, str]) -> None:
        """The real server's rules for streaming lists (sendInitialEvents), as 422s."""
        causes: list[tuple[str, str]] = []
        match = q.get("resourceVersionMatch", "")
        if "sendInitialEvents" in q:
            if match != "NotOlderThan":
                causes.append(("resourceVersionMatch", "Forbidden: sendInitialEvents requires setting "
                                                       "resourceVersionMatch to NotOlderThan"))
        elif match:
            causes.append(("resourceVersionMatch", "Forbidden: resourceVersionMatch is forbidden for watch "
                                                   "unless sendInitialEvents is provided"))
        if causes:
            raise ApiError(
                422, "Invalid", "ListOptions.meta.k8s.io \"\" is invalid: " + ", ".join(f"{f}: {m}" for f, m in causes),
                kind="ListOptions", group="meta.k8s.io",
                causes=[{"reason": "FieldValueForbidden", "message": m, "field": f} for f, m in causes],
            )

    async def _watch(self, request: web.Request, t: _Target, matches: Any) -> web.StreamResponse:
        q = request.query
        self._check_watch_options(q)
        initial = _flag(q, "sendInitialEvents")
        watcher = self.store.watch(t.rt, t.namespace, matches, q.get("resourceVersion", ""), initial=initial)
        bookmarks = _flag(q, "allowWatchBookmarks")
        if initial:  # after the initial events already queued, before anything newer
            watcher.queue.put_nowait(self._bookmark(t.rt, initial_end=True))
        timeout = float(q.get("timeoutSeconds", "0") or 0)
        deadline = time.monotonic() + timeout if timeout > 0 else None
        response = web.StreamResponse(headers={"Content-Type": _JSON})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            as_table = tables.wants_table(request.headers.get("Accept", ""))
            include = q.get("includeObject", "") if as_table else None
            await self._pump(response, watcher, t.rt, bookmarks, deadline, include)
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
        except ConnectionError:
            pass
        finally:
            self.store.unwatch(watcher)
        return response

    def _bookmark(self, rt: ResourceType, *, initial_end: bool = False) -> Obj:
        meta: Obj = {"resourceVersion": str(self.store.rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}}

    async def _pump(
        self,
        response: web.StreamResponse,
        watcher: Watcher,
        rt: ResourceType,
        bookmarks: bool,
        deadline: float | None,
        table_objects: str | None = None,
    ) -> None:
        """`table_objects`: None streams objects; else (`kubectl get -w`) each object goes out as a
        one-row Table, rows carrying what `includeObject` names."""
        while True:
            wait = self.bookmark_interval if bookmarks else None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                wait = left if wait is None else min(wait, left)
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # (a client hanging up) or drop a dequeued event when they race its timeout.
                async with asyncio.timeout(wait):
                    event = await watcher.queue.get()
            except TimeoutError:
                if bookmarks and (deadline is None or time.monotonic() < deadline):
                    await self._write_event(response, watcher, self._bookmark(rt))
                continue
            if event is None:
                return
            obj = event.get("object")
            if table_objects is not None and event.get("type") in ("ADDED", "MODIFIED", "DELETED") and obj:
                meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
                event = {**event, "object": tables.table(rt, [obj], meta, table_objects)}
            await self._write_event(response, watcher, event)

    @staticmethod
    async def _write_event(response: web.StreamResponse, watcher: Watcher, event: Obj) -> None:
        await response.write(orjson.dumps(event) + b"\n")
