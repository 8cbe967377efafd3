"""Creating Bindings (and reading a pod /bind did not see) through the Kubernetes API.

Calls go through the asyncio client (`kubernetes.aio`), so a burst of binds waits on the API
server side by side without a thread each. Only /bind calls the API; /filter and /prioritize
never do.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson

from sharepack.extender.protocol import BindingArgs


class BindError(Exception):
    pass


class Binder(Protocol):
    async def bind(self, args: BindingArgs) -> None: ...

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
    """Binds through the `kubernetes.aio` client the reflectors already hold: no thread per
    call. (Through the blocking client in threads, the (de)serialising held the GIL and delayed
    the event loop's next filter, which is on kube-scheduler's serial path.)"""

    def __init__(self, aio_api_client: Any, *, timeout_s: float = 10.0) -> None:
        from kubernetes.aio import client  # imported here: only the composition root needs it

        self._core = client.CoreV1Api(aio_api_client)
        self._timeout = timeout_s

    async def _send(self, call: Callable[..., Awaitable[Any]], *args: Any) -> bytes:
        response = await call(*args, _request_timeout=self._timeout)
        try:
            body: bytes = await response.read()
        finally:
            response.release()
        if response.status >= 300:
            raise _Answer(response.status, body)
        return body

    async def bind(self, args: BindingArgs) -> None:
        body: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": args.pod_name, "namespace": args.pod_namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        }
        if args.pod_uid:
            body["metadata"]["uid"] = args.pod_uid
        try:
            # Without preloading: the client cannot deserialise the Status a binding create
            # answers with into a V1Binding.
            await self._send(
                self._core.create_namespaced_pod_binding_without_preload_content, args.pod_name, args.pod_namespace, body
            )
        except Exception as e:
            raise BindError(
                f"binding pod {args.pod_namespace}/{args.pod_name} to node {args.node} failed: "
                f"{_api_message(e)}"
            ) from e

    async def get_pod(self, namespace: str, name: str) -> Any:
        try:
            raw = await self._send(self._core.read_namespaced_pod_without_preload_content, name, namespace)
        except Exception as e:
            raise BindError(f"reading pod {namespace}/{name} failed: {_api_message(e)}") from e
        return orjson.loads(raw)


class _Answer(Exception):
    """A non-2xx answer, shaped as the blocking client's ApiException for `_api_message`."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body
