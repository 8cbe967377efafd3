"""Periodic bookmarks and outages, which only the sandbox server can stage (the watch protocol
itself is in test_protocol, run on both servers)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch

from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer


def _pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}


def _collect(api: client.ApiClient, count: int, **kwargs: Any) -> list[tuple[str, str]]:
    """The first `count` events of a pod watch, as (type, name)."""
    core = client.CoreV1Api(api)
    w = watch.Watch()
    out: list[tuple[str, str]] = []
    for event in w.stream(core.list_pod_for_all_namespaces, timeout_seconds=5, **kwargs):
        out.append((event["type"], event["object"].metadata.name))
        if len(out) == count:
            w.stop()
    return out


async def test_bookmarks_carry_the_current_version(api: client.ApiClient, server: FakeApiServer) -> None:
    raw = await asyncio.to_thread(
        client.CoreV1Api(api).list_pod_for_all_namespaces,
        watch=True, allow_watch_bookmarks=True, timeout_seconds=1, _preload_content=False,
    )
    first = await asyncio.to_thread(raw.readline)
    raw.release_conn()
    event = json.loads(first)
    assert event["type"] == "BOOKMARK"
    assert event["object"]["metadata"]["resourceVersion"] == str(server.store.rv)


# -- outages -----------------------------------------------------------------------------------


async def test_an_unavailable_server_answers_503_and_recovers(api: client.ApiClient, server: FakeApiServer) -> None:
    core = client.CoreV1Api(api)
    await asyncio.to_thread(core.create_node, {"metadata": {"name": "n1"}})
    await server.pause("unavailable")
    with pytest.raises(client.ApiException) as info:
        await asyncio.to_thread(core.read_node, "n1")
    assert info.value.status == 503
    await server.resume()
    assert (await asyncio.to_thread(core.read_node, "n1")).metadata.name == "n1"


async def test_a_refusing_server_drops_connections_and_keeps_its_data(
    api: client.ApiClient, server: FakeApiServer
) -> None:
    core = client.CoreV1Api(api)
    await asyncio.to_thread(core.create_node, {"metadata": {"name": "n1"}})
    port = server.port
    await server.pause("refuse")
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        await asyncio.to_thread(core.read_node, "n1", _request_timeout=1)
    await server.resume()
    assert server.port == port
    assert (await asyncio.to_thread(core.read_node, "n1")).metadata.name == "n1"


async def test_a_pause_ends_open_watches(api: client.ApiClient, server: FakeApiServer) -> None:
    core = client.CoreV1Api(api)
    await asyncio.to_thread(core.create_node, {"metadata": {"name": "n1"}})

    def watch_nodes() -> int:
        count = 0
        for _ in watch.Watch().stream(core.list_node, timeout_seconds=30):
            count += 1
        return count

    watching = asyncio.create_task(asyncio.to_thread(watch_nodes))
    # Until the watch is registered with the store: it then ends only because of the pause.
    async with asyncio.timeout(30):
        while not server.store.watchers[kinds.NODES]:
            await asyncio.sleep(0.01)
    await server.pause("unavailable")
    assert await asyncio.wait_for(watching, 30) == 1
    await server.resume()


async def test_injected_failures_hit_only_matching_requests(api: client.ApiClient, server: FakeApiServer) -> None:
    core = client.CoreV1Api(api)
    await asyncio.to_thread(core.create_node, {"metadata": {"name": "n1"}})
    server.fail_next("GET", "/nodes/n1", 500)
    with pytest.raises(client.ApiException) as info:
        await asyncio.to_thread(core.read_node, "n1")
    assert info.value.status == 500
    assert (await asyncio.to_thread(core.read_node, "n1")).metadata.name == "n1"
    assert [r.status for r in server.requests if r.path.endswith("/nodes/n1")] == [500, 200]
