"""Kubernetes API calls as raw JSON bytes, with the server, TLS context and credentials of a
`kubernetes.aio` ApiClient.

For calls on a hot path (the extender's binds: the Binding, and where needed the pod and its
node's pods). The generated methods validate their arguments with pydantic, and the client's
session is made with `trust_env=True` (proxy and netrc lookups per request); neither is needed
to send a body we already hold as JSON and read the answer as bytes. Nor is aiohttp's client
machinery: calls go through `kube.http1`'s kept connections. `benchmarks/bench_apicalls.py`
measures the three against one small local server: 0.69, 0.092 and 0.041 CPU-ms per call
(client and server) on the development machine.

Credentials are asked of the ApiClient (`update_params_for_auth`) at most every `AUTH_TTL_S`
and after any 401, so a rotated service-account token or a refreshed exec credential is used
within seconds. Not for every call: the client's refresh hook re-reads the kubeconfig's
credentials each time it runs (2 % of the extender's CPU at 1,000 nodes, sampled in session 8).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp

from sharepack.kube import http1

JSON = "application/json"
# How long the ApiClient's credentials are reused: far below any token's life (a projected
# service-account token is rotated at 80 % of an hour or more, and the old one stays valid).
AUTH_TTL_S = 10.0


class RawApi:
    """`await api.request(method, path, body)` -> (HTTP status, body bytes).

    Straight to the server through `kube.http1`; through aiohttp where the configuration
    names a proxy (CONNECT and the proxy's own headers are aiohttp's to speak)."""

    def __init__(self, api_client: Any, *, timeout_s: float = 10.0, connections: int = 32) -> None:
        self._api = api_client
        self._timeout_s = timeout_s
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._direct: http1.Client | None = None
        self._prefix = ""  # the server URL's own path ("https://host/k8s/clusters/c-1")
        self._auth: dict[str, str] = {}  # the credentials' headers, asked for until `_auth_until`
        self._auth_until = -math.inf

    def _ssl_context(self) -> Any:
        # The ApiClient's own TLS context (its CA, its client certificate when the kubeconfig
        # names one).
        return self._api.rest_client.ssl_context

    def _open_session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(ssl=self._ssl_context(), limit=self._connections)
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False)
        return self._session

    def _open_direct(self) -> http1.Client:
        config = self._api.configuration
        url = urlsplit(config.host)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"Kubernetes API server URL {config.host!r}: not an http(s) URL with a host")
        tls = url.scheme == "https"
        self._prefix = url.path.rstrip("/")
        self._direct = http1.Client(
            url.hostname, url.port or (443 if tls else 80), ssl_context=self._ssl_context() if tls else None,
            server_hostname=config.tls_server_name or None, limit=self._connections,
        )  # fmt: skip
        return self._direct

    async def request(
        self, method: str, path: str, body: bytes | None = None, *, content_type: str = JSON,
        query: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:  # fmt: skip
        """Send `body` (JSON bytes, or None) to `path` (quoted already); raises OSError,
        aiohttp's errors, `http1.ProtocolError`, and TimeoutError for a call that got no answer."""
        config = self._api.configuration
        headers = {"Accept": JSON, "Content-Type": content_type, **await self._credentials(path, method)}
        target = path + (f"?{urlencode(query)}" if query else "")
        if config.proxy:
            status, raw = await self._through_proxy(method, config.host + target, headers, body)
        else:
            direct = self._direct or self._open_direct()
            async with asyncio.timeout(self._timeout_s):
                status, raw = await direct.request(method, self._prefix + target, headers.items(), body)
        if status == 401:
            self._auth_until = -math.inf  # refused: ask for the credentials again next time
        return status, raw

    async def _credentials(self, path: str, method: str) -> dict[str, str]:
        now = time.monotonic()
        if now >= self._auth_until:
            auth: dict[str, str] = {}
            await self._api.update_params_for_auth(auth, None, ["BearerToken"], path, method, None)
            self._auth, self._auth_until = auth, now + AUTH_TTL_S
        return self._auth

    async def _through_proxy(self, method: str, url: str, headers: dict[str, str], body: bytes | None) -> tuple[int, bytes]:
        config = self._api.configuration
        extra: dict[str, Any] = {"proxy": config.proxy}
        if config.proxy_headers:
            extra["proxy_headers"] = config.proxy_headers
        if config.tls_server_name:
            extra["server_hostname"] = config.tls_server_name
        session = self._session or self._open_session()
        async with session.request(method, url, data=body, headers=headers, **extra) as resp:
            return resp.status, await resp.read()

    async def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
            self._direct = None
        if self._session is not None:
            await self._session.close()
            self._session = None


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
    return f"{path}/{sub}" if sub else path
