"""kube.reflecting.Reflector against the sandbox API server, through the real aio client."""

from __future__ import annotations

import asyncio
import functools
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig

from sharepack.kube.reflecting import Key, Obj, Reflector
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer


def _pod(server: FakeApiServer, name: str, node: str = "node-0") -> None:
    server.store.create(kinds.PODS, "default", {
        "metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
    })


class Follow:
    """A reflector over pods on node-0, with a way to await a condition on its cache."""

    def __init__(self, api: kclient.ApiClient, **kwargs: float) -> None:
        core = kclient.CoreV1Api(api)
        self.changed = asyncio.Event()
        self.reflector = Reflector(
            functools.partial(core.list_pod_for_all_namespaces_without_preload_content,
                              field_selector="spec.nodeName=node-0"),
            what="pods on node-0", on_change=self._on_change, **kwargs,  # type: ignore[arg-type]
        )

    def _on_change(self, _cache: Mapping[Key, Obj]) -> None:
        self.changed.set()

    def names(self) -> set[str]:
        return {name for _, name in self.reflector.cache}

    async def until(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture
async def setup() -> AsyncIterator[tuple[FakeApiServer, kclient.ApiClient]]:
    server = FakeApiServer()
    await server.start()
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        api = await kconfig.new_client_from_config(config_file=str(server.write_kubeconfig(Path(d) / "kc")))
        try:
            yield server, api
        finally:
            await api.close()
            await server.stop()


async def _running(follow: Follow) -> asyncio.Task[None]:
    task = asyncio.create_task(follow.reflector.run(), name="reflector-under-test")
    await asyncio.wait_for(follow.reflector.synced.wait(), 30)
    return task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait([task])


async def test_the_cache_follows_adds_updates_and_deletes(setup: tuple[FakeApiServer, kclient.ApiClient]) -> None:
    server, api = setup
    _pod(server, "before")
    _pod(server, "elsewhere", node="node-1")
    follow = Follow(api)
    task = await _running(follow)
    try:
        assert follow.names() == {"before"}
        _pod(server, "after")
        await follow.until(lambda: follow.names() == {"before", "after"})
        server.store.delete(kinds.PODS, "default", "before")
        await follow.until(lambda: follow.names() == {"after"})
        assert follow.reflector.lists == 1
    finally:
        await _stop(task)


async def test_a_too_old_version_means_listing_again(setup: tuple[FakeApiServer, kclient.ApiClient]) -> None:
    server, api = setup
    follow = Follow(api)
    task = await _running(follow)
    try:
        # The watch ends, and before the reflector resumes, the history it needs is compacted.
        server.store.close_watches()
        _pod(server, "missed")
        server.store.compact()
        await follow.until(lambda: follow.names() == {"missed"})
        assert follow.reflector.lists == 2
    finally:
        await _stop(task)


async def test_an_outage_is_survived_and_what_changed_meanwhile_is_seen(
    setup: tuple[FakeApiServer, kclient.ApiClient],
) -> None:
    server, api = setup
    follow = Follow(api, backoff_initial_s=0.05, backoff_max_s=0.1)
    task = await _running(follow)
    try:
        lists, errors = follow.reflector.lists, follow.reflector.errors
        await server.pause("refuse")
        _pod(server, "during")
        # The outage outlasts a retry: two failed attempts to list again (a condition, not a sleep).
        async with asyncio.timeout(30):
            while follow.reflector.errors < errors + 2:
                await asyncio.sleep(0.01)
        assert follow.names() == set() and follow.reflector.lists == lists
        await server.resume()
        await follow.until(lambda: follow.names() == {"during"})
        assert follow.reflector.lists == lists + 1  # one list brought the change made meanwhile
    finally:
        await _stop(task)


async def test_resync_lists_again_while_the_watch_holds(setup: tuple[FakeApiServer, kclient.ApiClient]) -> None:
    """The extender's periodic relist: with `resync_s` the watch is cut at the resync time and
    the reflector lists again, with no error."""
    server, api = setup
    follow = Follow(api, resync_s=1.0)
    task = await _running(follow)
    try:
        await follow.until(lambda: follow.reflector.lists >= 2, timeout=10)
        assert follow.reflector.errors == 0
    finally:
        await _stop(task)


def _all_pods(api: kclient.ApiClient, **kwargs: Any) -> Reflector:
    core = kclient.CoreV1Api(api)
    return Reflector(functools.partial(core.list_pod_for_all_namespaces_without_preload_content), what="pods", **kwargs)


async def _started(reflector: Reflector) -> asyncio.Task[None]:
    task = asyncio.create_task(reflector.run(), name="reflector-under-test")
    await asyncio.wait_for(reflector.synced.wait(), 30)
    return task


async def _until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_on_list_gets_the_whole_cache_and_on_event_each_change(
    setup: tuple[FakeApiServer, kclient.ApiClient],
) -> None:
    server, api = setup
    _pod(server, "listed")
    seen: list[tuple[str, str]] = []
    reflector = _all_pods(
        api, on_list=lambda cache: seen.append(("LIST", ",".join(n for _, n in sorted(cache)))),
        on_event=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
    )  # fmt: skip
    task = await _started(reflector)
    try:
        _pod(server, "watched")
        server.store.delete(kinds.PODS, "default", "listed")
        # A pod's deletion is written first (deletionTimestamp set), then removed, as the real
        # API server does: a MODIFIED before the DELETED.
        await _until(lambda: ("DELETED", "listed") in seen)
        assert seen == [("LIST", "listed"), ("ADDED", "watched"), ("MODIFIED", "listed"), ("DELETED", "listed")]
    finally:
        await _stop(task)


async def test_a_failing_handler_is_repaired_by_listing_again(setup: tuple[FakeApiServer, kclient.ApiClient]) -> None:
    server, api = setup
    failures = [RuntimeError("handler bug")]

    def on_event(kind: str, obj: Obj) -> None:
        if failures:
            raise failures.pop()

    reflector = _all_pods(api, on_event=on_event, backoff_initial_s=0.01)
    task = await _started(reflector)
    try:
        _pod(server, "first")
        await _until(lambda: reflector.lists >= 2)
        assert reflector.errors == 1 and {n for _, n in reflector.cache} == {"first"}
    finally:
        await _stop(task)


async def test_without_keep_cache_the_handlers_get_everything_and_nothing_is_kept(
    setup: tuple[FakeApiServer, kclient.ApiClient],
) -> None:
    server, api = setup
    _pod(server, "listed")
    listed: list[set[str]] = []
    events: list[str] = []
    reflector = _all_pods(
        api, on_list=lambda cache: listed.append({n for _, n in cache}), on_event=lambda k, o: events.append(k),
        keep_cache=False,
    )  # fmt: skip
    task = await _started(reflector)
    try:
        _pod(server, "watched")
        await _until(lambda: bool(events))
        assert (listed, events, reflector.cache) == ([{"listed"}], ["ADDED"], {})
    finally:
        await _stop(task)


async def test_a_list_is_bounded_in_time_and_retried() -> None:
    calls: list[dict[str, Any]] = []

    async def list_call(**kwargs: Any) -> Any:
        calls.append(kwargs)
        raise TimeoutError("the server accepted the list and never answered")

    reflector = Reflector(list_call, what="pods", list_timeout_s=7.0, backoff_initial_s=0.01)
    task = asyncio.create_task(reflector.run(), name="reflector-under-test")
    try:
        await _until(lambda: reflector.errors >= 2)
    finally:
        await _stop(task)
    assert calls[:2] == [{"_request_timeout": 7.0}] * 2
    assert not reflector.synced.is_set()
