"""Watches (event order, resource versions, selectors, 410 Gone, bookmarks) and outages."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch

from sandbox import apiserver_resources as kinds
from sandbox.apiserver import FakeApiServer


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


async def test_a_watch_from_a_version_replays_then_follows(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await asyncio.to_thread(core.create_namespaced_pod, "default", _pod("before"))
    rv = (await asyncio.to_thread(core.list_pod_for_all_namespaces)).metadata.resource_version
    await asyncio.to_thread(core.create_namespaced_pod, "default", _pod("a"))
    await asyncio.to_thread(core.patch_namespaced_pod, "a", "default", {"metadata": {"labels": {"x": "1"}}})
    watching = asyncio.create_task(asyncio.to_thread(_collect, api, 4, resource_version=rv))
    await asyncio.to_thread(core.delete_namespaced_pod, "a", "default")
    await asyncio.to_thread(core.create_namespaced_pod, "default", _pod("b"))
    got = await watching
    assert got == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a"), ("ADDED", "b")]


async def test_a_watch_without_a_version_starts_with_the_current_objects(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    for name in ("p1", "p2"):
        await asyncio.to_thread(core.create_namespaced_pod, "default", _pod(name))
    got = await asyncio.to_thread(_collect, api, 2)
    assert got == [("ADDED", "p1"), ("ADDED", "p2")]


async def test_a_selector_watch_sees_objects_enter_and_leave(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    rv = (await asyncio.to_thread(core.list_pod_for_all_namespaces)).metadata.resource_version
    await asyncio.to_thread(core.create_namespaced_pod, "default", _pod("p"))
    await asyncio.to_thread(core.patch_namespaced_pod, "p", "default", {"metadata": {"labels": {"on": "1"}}})
    await asyncio.to_thread(core.patch_namespaced_pod, "p", "default", {"metadata": {"labels": {"on": "2"}}})
    got = await asyncio.to_thread(_collect, api, 2, resource_version=rv, label_selector="on=1")
    assert got == [("ADDED", "p"), ("DELETED", "p")]


async def test_binding_shows_up_in_a_node_watch(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    rv = (await asyncio.to_thread(core.list_pod_for_all_namespaces)).metadata.resource_version
    await asyncio.to_thread(core.create_namespaced_pod, "default", _pod("p"))
    binding = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "node-0"}}
    await asyncio.to_thread(core.create_namespaced_pod_binding, "p", "default", binding, _preload_content=False)
    got = await asyncio.to_thread(_collect, api, 1, resource_version=rv, field_selector="spec.nodeName=node-0")
    assert got == [("ADDED", "p")]


async def test_a_compacted_version_answers_410_gone(api: client.ApiClient, server: FakeApiServer) -> None:
    core = client.CoreV1Api(api)
    rv = (await asyncio.to_thread(core.list_pod_for_all_namespaces)).metadata.resource_version
    await asyncio.to_thread(core.create_namespaced_pod, "default", _pod("p"))
    server.store.compact()
    with pytest.raises(client.ApiException) as info:
        await asyncio.to_thread(_collect, api, 1, resource_version=rv)
    assert info.value.status == 410


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
