"""List and watch over aiohttp for the sandbox's own controllers (the kubelets' pod loops, the
scheduler driver), with the credentials of a kubernetes client configuration.

The kubernetes client blocks a thread per watch, which cannot be cancelled; a sandbox runs a
few watches per node, so they go over one aiohttp session instead. Semantics as client-go's
reflector: list, then watch from the list's resourceVersion with bookmarks; on 410 Gone or a
broken stream, list again and report what vanished meanwhile as DELETED.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import aiohttp
import orjson

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], Awaitable[None]]
WATCH_TIMEOUT_S = 60
RETRY_S = 0.5


class ApiSession:
    """An aiohttp session speaking to the API server a kubernetes client configuration names."""

    def __init__(self, configuration: Any) -> None:
        self.base = str(configuration.host).rstrip("/")
        self._headers: dict[str, str] = {}
        token = (configuration.api_key or {}).get("authorization") or (configuration.api_key or {}).get("BearerToken")
        if token:
            prefix = (configuration.api_key_prefix or {}).get("authorization", "")
            self._headers["Authorization"] = f"{prefix} {token}".strip() if prefix else str(token)
        self._ssl: ssl.SSLContext | bool = False
        if self.base.startswith("https"):
            context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            if configuration.cert_file:
                context.load_cert_chain(configuration.cert_file, configuration.key_file)
            if not configuration.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._ssl = context
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def of(cls, api_client: Any) -> ApiSession:
        return cls(api_client.configuration)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        async with self.session.get(self.base + path, params=params, ssl=self._ssl) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise WatchError(resp.status, body.decode(errors="replace")[:300])
            result: dict[str, Any] = orjson.loads(body)
            return result

    async def send(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
        ok: Iterable[int] = (),
    ) -> dict[str, Any]:  # fmt: skip
        """One write (POST, PUT, PATCH, DELETE); the decoded answer, `{}` for a status in `ok`
        (e.g. 404 on a delete). Any other non-2xx status raises WatchError."""
        data = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else None
        async with self.session.request(method, self.base + path, data=data, headers=headers, ssl=self._ssl) as resp:
            raw = await resp.read()
            if resp.status in ok:
                return {}
            if resp.status >= 300:
                raise WatchError(resp.status, f"{method} {path}: {raw.decode(errors='replace')[:300]}")
            result: dict[str, Any] = orjson.loads(raw) if raw else {}
            return result

    async def watch(
        self, path: str, params: Mapping[str, str], resource_version: str
    ) -> Any:  # an async iterator of events
        query = {
            **params, "watch": "1", "resourceVersion": resource_version,
            "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_TIMEOUT_S),
        }  # fmt: skip
        timeout = aiohttp.ClientTimeout(total=None, sock_read=WATCH_TIMEOUT_S + 30)
        async with self.session.get(self.base + path, params=query, ssl=self._ssl, timeout=timeout) as resp:
            if resp.status != 200:
                raise WatchError(resp.status, (await resp.text())[:300])
            async for line in resp.content:
                if line.strip():
                    yield orjson.loads(line)


class WatchError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _created(obj: Mapping[str, Any]) -> str:
    """The object's `creationTimestamp` (RFC 3339 in UTC: sorts as text)."""
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


async def reflect(api: ApiSession, path: str, params: Mapping[str, str], handler: Handler) -> None:
    """Forever: every object of the list as ADDED (or MODIFIED when seen before), then the
    watch's events; objects gone across a relist as DELETED. Handler errors are logged and the
    loop goes on, as a controller's work queue would retry them.

    As the kubelet's own reflector (client-go's) does: a watch the server ends (its timeout)
    resumes from the last resourceVersion, without a list; only an error lists again. A list
    hands the objects over oldest first (`creationTimestamp`), as the kubelet's pod config hands
    a batch of additions to its admission. Relisting at every watch timeout delivered pods bound
    in that gap in name order, not in the order they were bound, which no kubelet does (and the
    agent's Director, which follows the kubelet's order, then answered for the wrong pods)."""
    known: dict[str, dict[str, Any]] = {}

    async def deliver(kind: str, obj: dict[str, Any]) -> None:
        try:
            await handler(kind, obj)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("handling %s of %s failed", kind, (obj.get("metadata") or {}).get("name"))

    async def follow(rv: str) -> str | None:
        """One watch's events, delivered; the version to resume from when the server ended the
        watch (its timeout), None after an ERROR event (410 Gone and the like: relist)."""
        async for event in api.watch(path, params, rv):
            kind, obj = str(event.get("type")), event.get("object") or {}
            if kind == "ERROR":
                return None
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if kind == "BOOKMARK":
                continue
            if kind == "DELETED":
                known.pop(_uid(obj), None)
            else:
                known[_uid(obj)] = obj
            await deliver(kind, obj)
        return rv

    while True:
        try:
            listed = await api.get(path, params)
            rv = str(listed["metadata"]["resourceVersion"])
            items = sorted(listed.get("items") or [], key=_created)
            seen = {_uid(o): o for o in items}
            for uid, obj in list(known.items()):
                if uid not in seen:
                    del known[uid]
                    await deliver("DELETED", obj)
            for uid, obj in seen.items():
                kind = "MODIFIED" if uid in known else "ADDED"
                known[uid] = obj
                await deliver(kind, obj)
            resume: str | None = rv
            while resume is not None:
                began = time.monotonic()
                resume = await follow(resume)
                if resume is not None and time.monotonic() - began < RETRY_S:
                    await asyncio.sleep(RETRY_S)  # a server ending watches at once is no timeout
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, OSError, WatchError, asyncio.TimeoutError, KeyError, ValueError) as e:
            log.debug("watch of %s broke (%s): listing again", path, e)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.sleep(RETRY_S)
