"""List-then-watch of Kubernetes objects, kept in a local cache, surviving API outages.

The agent needs three small views of the API: the pods bound to its node (namespace/name ->
UID), its own Node (labels), and one ConfigMap. Each is a `Reflector`: list (which gives a
resourceVersion), then watch from that version, applying ADDED / MODIFIED / DELETED to the cache;
a watch that ends is resumed from the last version seen (bookmarks advance it too); a 410 Gone
(the version is too old) or any error means list again, after an exponential back-off while the
API is unreachable. Objects stay plain dicts: the agent reads a handful of fields, and decoding
every pod into client models would cost more than the rest of the loop.

`list_call` is a `*_without_preload_content` method of the `kubernetes.aio` client (bound to
its selectors with `functools.partial`), which returns the raw aiohttp response.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import orjson

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)
ListCall = Callable[..., Awaitable[aiohttp.ClientResponse]]


class WatchGone(Exception):
    """The server no longer has the version we watch from: list again."""


class ApiUnavailable(Exception):
    """A non-success answer (after which we back off and list again)."""


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class Reflector:
    def __init__(
        self,
        list_call: ListCall,
        *,
        what: str,
        on_change: Callable[[Mapping[Key, Obj]], None],
        on_event: Callable[[str, Obj], None] | None = None,
        watch_timeout_s: int = 300,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
    ) -> None:
        self.what = what
        self._list_call = list_call
        self._on_change = on_change
        self._on_event = on_event
        self._watch_timeout_s = watch_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self.cache: dict[Key, Obj] = {}
        self.synced = asyncio.Event()  # set after the first successful list
        self.relists = 0

    async def run(self) -> None:
        """Forever: list, watch, and recover from whatever the API does."""
        backoff = 0.0
        while True:
            try:
                version = await self._list()
                backoff = 0.0
                while True:
                    version = await self._watch(version)
            except WatchGone:
                log.info("watch of %s: resource version too old; listing again", self.what)
            except Exception as e:  # noqa: BLE001 - logged; a watch must outlive any API trouble
                backoff = min(max(backoff * 2, self._backoff_initial_s), self._backoff_max_s)
                expected = isinstance(e, aiohttp.ClientError | OSError | TimeoutError | ApiUnavailable | ValueError)
                log.log(
                    logging.WARNING if expected else logging.ERROR,
                    "watch of %s failed: %s; listing again in %.1fs", self.what, e or type(e).__name__, backoff,
                    exc_info=None if expected else e,
                )
                await asyncio.sleep(random.uniform(backoff / 2, backoff))

    async def _list(self) -> str:
        response = await self._list_call()
        try:
            body = await response.read()
        finally:
            response.release()
        if response.status >= 300:
            raise ApiUnavailable(f"list answered {response.status}: {body[:200]!r}")
        doc = orjson.loads(body)
        self.cache = {key_of(item): item for item in doc.get("items") or []}
        self.relists += 1
        self.synced.set()
        self._on_change(self.cache)
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, version: str) -> str:
        """One watch request; returns the version to resume from when the server ends it."""
        response = await self._list_call(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout_s + random.randint(0, self._watch_timeout_s // 5),
            _request_timeout=self._watch_timeout_s * 2 + 30,
        )
        try:
            if response.status >= 300:
                body = await response.read()
                if response.status == 410:
                    raise WatchGone()
                raise ApiUnavailable(f"watch answered {response.status}: {body[:200]!r}")
            while True:
                line = await response.content.readline()
                if not line:
                    return version
                if not line.strip():
                    continue
                version = self._apply(orjson.loads(line), version)
        finally:
            response.release()

    def _apply(self, event: Mapping[str, Any], version: str) -> str:
        kind = str(event.get("type"))
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise WatchGone()
            raise ApiUnavailable(f"watch error event: {obj.get('message')!r}")
        meta = obj.get("metadata") or {}
        version = str(meta.get("resourceVersion") or version)
        if kind == "BOOKMARK":
            return version
        key = key_of(obj)
        if kind == "DELETED":
            self.cache.pop(key, None)
        else:
            self.cache[key] = obj
        if self._on_event is not None:
            self._on_event(kind, obj)
        self._on_change(self.cache)
        return version
