"""One Kubernetes API endpoint to run the protocol tests against: the sandbox API server or the
real kube-apiserver (tests/conftest.py's `real_control_plane`). The tests see only this class, so
the two are driven by the same code and must answer the same."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from sharepack.sandbox.apiserver.server import FakeApiServer

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
CRD = Path(__file__).parents[2] / "deploy" / "base" / "crds" / "nodegpustates.yaml"


@dataclass
class Endpoint:
    kind: str  # "sandbox" | "real"
    kubeconfig: Path
    api: client.ApiClient
    sandbox: FakeApiServer | None = None  # the in-process server, for what only it can do
    control: Any = None  # the real control plane (tests/conftest.py's real_control_plane)

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A (blocking) kubernetes client call, off the event loop."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def new_namespace(self) -> str:
        """A fresh namespace per test: the real control plane is shared by the whole session.
        On the real server nothing creates the `default` ServiceAccount (no controller manager),
        which pods need to pass admission: create it."""
        name = f"proto-{uuid.uuid4().hex[:8]}"
        core = client.CoreV1Api(self.api)
        await self.call(core.create_namespace, {"metadata": {"name": name}})
        if self.kind == "real":
            await self.call(core.create_namespaced_service_account, name, {"metadata": {"name": "default"}})
        return name

    def unique(self, stem: str) -> str:
        """A cluster-scoped name (a node) no other test on the shared server uses."""
        return f"{stem}-{uuid.uuid4().hex[:6]}"

    async def expired_resource_version(self) -> str:
        """A resourceVersion a watch can no longer start from (410 Gone). The sandbox forgets its
        history on demand. The real server's watch cache keeps every event since it started
        (checked: a watch from resourceVersion 1 replays, even after etcd is compacted), so the
        session's real control plane serves pod watches from etcd and compacts it
        (`RealControlPlane.expire_watch_history`)."""
        if self.sandbox is not None:
            old = str(self.sandbox.store.rv)
            await self.call(client.CoreV1Api(self.api).create_namespace, {"metadata": {"generateName": "expire-"}})
            self.sandbox.store.compact()
            return old
        assert self.control is not None
        return str(await self.control.expire_watch_history())

    def _get(self, path: str, query: list[tuple[str, str]], accept: str) -> Any:
        return self._request("GET", path, query, {"Accept": accept}, None)

    def _request(self, verb: str, path: str, query: list[tuple[str, str]], headers: dict[str, str], body: Any) -> Any:
        """A raw request with the endpoint's credentials (the typed client would refuse a body
        with unknown fields): the urllib3 response, not yet read."""
        method, url, sent_headers, sent, post = self.api.param_serialize(
            verb, path, query_params=query, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        return self.api.call_api(method, url, header_params=sent_headers, body=sent, post_params=post).response

    async def post_json(self, path: str, body: Any, *, query: list[tuple[str, str]] | None = None
                        ) -> tuple[int, list[str], Any]:  # fmt: skip
        """POST `body` as JSON; (status, Warning headers, decoded body)."""
        def post() -> tuple[int, list[str], Any]:
            headers = {"Accept": "application/json", "Content-Type": "application/json"}
            resp = self._request("POST", path, query or [], headers, body)
            return int(resp.status), resp.headers.getlist("Warning"), json.loads(resp.data)

        return await asyncio.to_thread(post)

    async def get_json(self, path: str, *, accept: str = "application/json", query: list[tuple[str, str]] | None = None
                       ) -> tuple[int, Any]:  # fmt: skip
        """GET `path`; (status, decoded body)."""
        def get() -> tuple[int, Any]:
            resp = self._get(path, query or [], accept)
            return int(resp.status), json.loads(resp.data)

        return await asyncio.to_thread(get)

    async def watch_lines(self, path: str, query: list[tuple[str, str]], count: int, *, accept: str = "application/json"
                          ) -> list[dict[str, Any]]:  # fmt: skip
        """The first `count` events of a watch (fewer if the server ends it first)."""
        def read() -> list[dict[str, Any]]:
            resp = self._get(path, [("watch", "true"), *query], accept)
            assert resp.status == 200, resp.data
            events: list[dict[str, Any]] = []
            buffer = b""
            try:
                for chunk in resp.stream(1024, decode_content=True):
                    buffer += chunk
                    while b"\n" in buffer and len(events) < count:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            events.append(json.loads(line))
                    if len(events) >= count:
                        break
            finally:
                resp.close()  # not back to the pool: the rest of the stream is unread
            return events

        return await asyncio.to_thread(read)
