"""Kubernetes API calls as raw JSON bytes over one aiohttp session, with the server, TLS context
and credentials of a `kubernetes.aio` ApiClient.

For calls on a hot path (the extender's binds: the Binding, and where needed the pod and its
node's pods). `benchmarks/bench_apicalls.py`
measures both against a local server: 0.65 against 0.19 CPU-ms per call (client and server) on
the development machine. The generated methods validate their arguments with pydantic,
and the client's session is made with `trust_env=True` (proxy and netrc lookups per request);
neither is needed to send a body we already hold as JSON and read the answer as bytes.

Credentials are asked of the ApiClient for every call (`update_params_for_auth`), so a rotated
service-account token or a refreshed exec credential is used as the generated client would.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

JSON = "application/json"


class RawApi:
    """`await api.request(method, path, body)` -> (HTTP status, body bytes)."""

    def __init__(self, api_client: Any, *, timeout_s: float = 10.0, connections: int = 32) -> None:
        self._api = api_client
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running loop; the ApiClient's own TLS context (its CA,
        # its client certificate when the kubeconfig names one).
        ssl_context = self._api.rest_client.ssl_context
        connector = aiohttp.TCPConnector(ssl=ssl_context, limit=self._connections)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, trust_env=False)
        return self._session

    async def request(
        self, method: str, path: str, body: bytes | None = None, *, content_type: str = JSON,
        query: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:  # fmt: skip
        """Send `body` (JSON bytes, or None) to `path` (quoted already); raises aiohttp's
        errors and TimeoutError for a call that got no answer."""
        session = self._session or self._open()
        config = self._api.configuration
        headers = {"Accept": JSON, "Content-Type": content_type}
        await self._api.update_params_for_auth(headers, None, ["BearerToken"], path, method, None)
        url = config.host + path + (f"?{urlencode(query)}" if query else "")
        extra: dict[str, Any] = {}
        if config.tls_server_name:
            extra["server_hostname"] = config.tls_server_name
        if config.proxy:
            extra["proxy"] = config.proxy
            if config.proxy_headers:
                extra["proxy_headers"] = config.proxy_headers
        async with session.request(method, url, data=body, headers=headers, **extra) as resp:
            return resp.status, await resp.read()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
    return f"{path}/{sub}" if sub else path
