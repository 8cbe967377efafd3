"""List-then-watch of Kubernetes objects, kept in a local cache, surviving API outages: the one
reflector of the agent (its pods, its Node, its ConfigMap) and the extender (every NodeGpuState,
every bound pod).

A `Reflector` lists (which gives a resourceVersion), then watches from that version, applying
ADDED / MODIFIED / DELETED to its cache; a watch that ends is resumed from the last version seen
(bookmarks advance it too); a 410 Gone (the version is too old), `resync_s` passing, or any
error means list again, errors after an exponential back-off with jitter while the API is
unreachable. A handler that raises is logged and the cache is rebuilt by listing again.

Objects stay plain dicts, parsed from the raw response with orjson: decoding every pod into
client models costs far more than the consumers' own work (benchmarks/bench_reflector.py
measures it against `kubernetes.informer.SharedInformer`, which does decode, and is why we do
not use it). `list_call` is a `*_without_preload_content` method of the `kubernetes.aio`
client (bound to its resource and selectors with `functools.partial`), which returns the raw
aiohttp response; everything runs on the event loop, so handlers need no locking.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
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
    """`on_list(cache)` after every list, `on_event(type, obj)` after every change a watch
    brings, `on_change(cache)` after both (any may be None).

    `keep_cache=False`: the objects are handed to the handlers and not kept (`cache` stays
    empty between lists), for a consumer that keeps its own decoded view of them: at 5,000
    nodes the raw pods alone would double the extender's memory."""

    def __init__(
        self,
        list_call: ListCall,
        *,
        what: str,
        on_change: Callable[[Mapping[Key, Obj]], None] | None = None,
        on_list: Callable[[Mapping[Key, Obj]], None] | None = None,
        on_event: Callable[[str, Obj], None] | None = None,
        watch_timeout_s: float = 300,
        resync_s: float = 0.0,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
        keep_cache: bool = True,
        list_timeout_s: float = 60.0,
    ) -> None:
        self.what = what
        self.keep_cache = keep_cache
        # A list the server accepted but never answers must not stall the reflector for good;
        # 60 s is far above a 5,000-node list (seconds) and still ends a hung one.
        self.list_timeout_s = list_timeout_s
        self._list_call = list_call
        self._on_change = on_change
        self._on_list = on_list
        self._on_event = on_event
        self.watch_timeout_s = watch_timeout_s
        self.resync_s = resync_s  # 0: never list again while the watch holds
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.cache: dict[Key, Obj] = {}
        self.synced = asyncio.Event()  # set after the first successful list
        self.lists = 0  # successful lists: initial, resync, after a 410 or an error
        self.errors = 0  # failures that led to a back-off (a 410 is not one)

    async def run(self) -> None:
        """Forever: list, watch, and recover from whatever the API does."""
        backoff = 0.0
        while True:
            try:
                version = await self._list()
                listed_at = time.monotonic()
                backoff = 0.0
                while not self.resync_s or time.monotonic() - listed_at < self.resync_s:
                    version = await self._watch(version, listed_at)
            except WatchGone:
                log.info("watch of %s: resource version too old; listing again", self.what)
            except Exception as e:  # noqa: BLE001 - logged; a watch must outlive any API trouble
                self.errors += 1
                backoff = min(max(backoff * 2, self.backoff_initial_s), self.backoff_max_s)
                expected = isinstance(e, aiohttp.ClientError | OSError | TimeoutError | ApiUnavailable | ValueError)
                log.log(
                    logging.WARNING if expected else logging.ERROR,
                    "watch of %s failed: %s; listing again in %.1fs", self.what, e or type(e).__name__, backoff,
                    exc_info=None if expected else e,
                )
                await asyncio.sleep(random.uniform(backoff / 2, backoff))

    async def _list(self) -> str:
        response = await self._list_call(_request_timeout=self.list_timeout_s)
        try:
            body = await response.read()
        finally:
            response.release()
        if response.status >= 300:
            raise ApiUnavailable(f"list answered {response.status}: {body[:200]!r}")
        doc = orjson.loads(body)
        self.cache = {key_of(item): item for item in doc.get("items") or []}
        self.lists += 1
        if self._on_list is not None:
            self._on_list(self.cache)
        if self._on_change is not None:
            self._on_change(self.cache)
        if not self.keep_cache:
            self.cache = {}
        self.synced.set()
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def _timeout(self, listed_at: float) -> int:
        # Jitter: many agents restarted together must not all reconnect in the same second.
        timeout = self.watch_timeout_s + random.uniform(0, self.watch_timeout_s / 5)
        if self.resync_s:
            timeout = min(timeout, self.resync_s - (time.monotonic() - listed_at))
        return max(1, int(timeout))

    async def _watch(self, version: str, listed_at: float) -> str:
        """One watch request; returns the version to resume from when the server ends it."""
        timeout = self._timeout(listed_at)
        response = await self._list_call(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _request_timeout=timeout * 2 + 30,
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
        if self.keep_cache:
            key = key_of(obj)
            if kind == "DELETED":
                self.cache.pop(key, None)
            else:
                self.cache[key] = obj
        if self._on_event is not None:
            self._on_event(kind, obj)
        if self._on_change is not None:
            self._on_change(self.cache)
        return version
