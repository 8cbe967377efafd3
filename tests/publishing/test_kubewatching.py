"""agent.kubewatching.Reflector against the sandbox API server, through the real aio client."""

from __future__ import annotations

import asyncio
import functools
import logging
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import pytest
from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig

from agent.kubewatching import Key, Obj, Reflector
from sandbox import apiserver_resources as kinds
from sandbox.apiserver import FakeApiServer


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
        assert follow.reflector.relists == 1
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
        assert follow.reflector.relists == 2
    finally:
        await _stop(task)


async def test_an_outage_is_survived_and_what_changed_meanwhile_is_seen(
    setup: tuple[FakeApiServer, kclient.ApiClient], caplog: pytest.LogCaptureFixture
) -> None:
    server, api = setup
    caplog.set_level(logging.WARNING, logger="agent.kubewatching")
    follow = Follow(api, backoff_initial_s=0.05, backoff_max_s=0.1)
    task = await _running(follow)
    try:
        lists = follow.reflector.relists
        await server.pause("refuse")
        _pod(server, "during")
        # The outage outlasts a retry: two failed attempts to list again, logged.
        async with asyncio.timeout(30):
            while sum("watch of pods on node-0 failed" in r.getMessage() for r in caplog.records) < 2:
                await asyncio.sleep(0.01)
        assert follow.names() == set() and follow.reflector.relists == lists
        await server.resume()
        await follow.until(lambda: follow.names() == {"during"})
        assert follow.reflector.relists == lists + 1  # one list brought the change made meanwhile
    finally:
        await _stop(task)
