"""Creating Bindings (and reading a pod /bind did not see) through the Kubernetes API.

The kubernetes client blocks, so each call runs in a worker thread of the binder's own pool
(`BIND_CONCURRENCY` threads: asyncio's default executor has cpu + 4, which on a small node lets
a burst of binds queue behind a slow API server and caps the scheduler's rate; the client's
connection pool must be as large, see `extender.__main__.api_client`). Only /bind calls the
API; /filter and /prioritize never do.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import orjson

from extender.protocol import BindingArgs


BIND_CONCURRENCY = 32  # API calls /bind keeps in flight at once


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
    def __init__(self, api_client: Any, *, timeout_s: float = 10.0) -> None:
        from kubernetes import client  # imported here: only the composition root needs it

        self._core = client.CoreV1Api(api_client)
        self._timeout = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=BIND_CONCURRENCY, thread_name_prefix="sharepack-bind")

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

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
            # _preload_content=False: the client cannot deserialise the Status a binding
            # create answers with into a V1Binding.
            await self._call(
                self._core.create_namespaced_pod_binding,
                args.pod_name,
                args.pod_namespace,
                body,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except Exception as e:
            raise BindError(
                f"binding pod {args.pod_namespace}/{args.pod_name} to node {args.node} failed: "
                f"{_api_message(e)}"
            ) from e

    async def get_pod(self, namespace: str, name: str) -> Any:
        try:
            resp: Any = await self._call(
                self._core.read_namespaced_pod,
                name,
                namespace,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except Exception as e:
            raise BindError(f"reading pod {namespace}/{name} failed: {_api_message(e)}") from e
        return orjson.loads(resp.data)
