"""Creating Bindings (and reading a pod /bind did not see) through the Kubernetes API.

Calls go through asyncio (`kube.rawapi`, with the `kubernetes.aio` client's server and
credentials), so a burst of binds waits on the API server side by side without a thread each,
and answers are read as raw JSON (orjson), never into the client's model objects. Only /bind calls the API; /filter and /prioritize never do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from sharepack.extender.protocol import BindingArgs
from sharepack.kube import rawapi


class BindError(Exception):
    pass


class Binder(Protocol):
    async def bind(self, args: BindingArgs, annotations: Mapping[str, str] | None = None) -> None: ...

    async def get_pod(self, namespace: str, name: str) -> Any: ...


def _api_message(e: Exception) -> str:
    status = getattr(e, "status", None)
    body = getattr(e, "body", None)
    if status is None:
        return str(e) or type(e).__name__
    try:
        message = orjson.loads(body).get("message", "") if body else ""
    except (orjson.JSONDecodeError, AttributeError):
        message = ""
    return f"API answered {status}" + (f": {message}" if message else "")


class ApiBinder:
    """Binds, reads and lists pods through `kube.rawapi` over the server and
    credentials of the `kubernetes.aio` client the reflectors hold: no thread per call, no
    model objects, one connection pool. (Through the blocking client in threads, the
    (de)serialising held the GIL and delayed the event loop's next filter, which is on
    kube-scheduler's serial path; through the generated aio methods, each call cost ~1 ms of
    CPU.)"""

    def __init__(self, aio_api_client: Any, *, timeout_s: float = 10.0) -> None:
        self._api = rawapi.RawApi(aio_api_client, timeout_s=timeout_s)

    async def close(self) -> None:
        await self._api.close()

    async def _send(self, method: str, path: str, body: Any = None, **kwargs: Any) -> bytes:
        status, raw = await self._api.request(method, path, None if body is None else orjson.dumps(body), **kwargs)
        if status >= 300:
            raise _Answer(status, raw)
        return raw

    async def bind(self, args: BindingArgs, annotations: Mapping[str, str] | None = None) -> None:
        """Create the Binding; `annotations` ride on it: kube-apiserver's Binding handler merges a
        Binding's annotations into the pod in the same write that sets `spec.nodeName`, so the
        pod is never bound without them and no separate patch (nor the right to patch pods)
        is needed."""
        metadata: dict[str, Any] = {"name": args.pod_name, "namespace": args.pod_namespace}
        if args.pod_uid:
            metadata["uid"] = args.pod_uid  # a precondition: a pod deleted and created again is not bound
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        }
        try:
            await self._send("POST", rawapi.pod_path(args.pod_namespace, args.pod_name, "binding"), body)
        except Exception as e:
            raise BindError(
                f"binding pod {args.pod_namespace}/{args.pod_name} to node {args.node} failed: "
                f"{_api_message(e)}"
            ) from e

    async def get_pod(self, namespace: str, name: str) -> Any:
        """The pod from kube-apiserver's watch cache (`resourceVersion=0`: no etcd read on the
        bind's path). It may trail etcd by milliseconds, which the Binding itself covers: its
        UID precondition fails for a pod deleted and created again, and kube-apiserver refuses
        to bind a pod already bound or being deleted; what else the guard reads of a pending
        pod (its scheduler, its requests) does not change before it is bound."""
        try:
            raw = await self._send("GET", rawapi.pod_path(namespace, name), query={"resourceVersion": "0"})
        except Exception as e:
            raise BindError(f"reading pod {namespace}/{name} failed: {_api_message(e)}") from e
        return orjson.loads(raw)

    async def pods_on(self, node: str) -> list[Any]:
        """The pods bound to `node`, as the API has them now."""
        try:
            raw = await self._send("GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}"})
        except Exception as e:
            raise BindError(f"listing the pods of node {node} failed: {_api_message(e)}") from e
        items = orjson.loads(raw).get("items")
        return items if isinstance(items, list) else []


class _Answer(Exception):
    """A non-2xx answer, shaped as the blocking client's ApiException for `_api_message`."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body
