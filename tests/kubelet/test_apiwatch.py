"""The sandbox's list-and-watch (`sandbox.apiwatch.reflect`, the fake kubelets' pod source)
behaves as the kubelet's own reflector: a watch the server ends resumes without a list, and a
list hands new pods over oldest first. A relist at every watch timeout once handed pods bound in
that gap over in name order, and the agent's Director, which follows the kubelet's order,
answered for the wrong pods (the chaos soak's swapped predictions)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sharepack.sandbox import apiwatch
from sharepack.sandbox.apiwatch import ApiSession, reflect

PODS = "/api/v1/namespaces/default/pods"


async def _create(api: ApiSession, name: str) -> None:
    await api.send("POST", PODS, {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}})


class Seen:
    def __init__(self, api: ApiSession) -> None:
        self.events: list[tuple[str, str]] = []
        self.lists = 0
        get = api.get

        async def counted(path: str, params: Any = None) -> dict[str, Any]:
            self.lists += 1
            return await get(path, params)

        api.get = counted  # type: ignore[method-assign]

    async def handler(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append((kind, obj["metadata"]["name"]))

    async def until(self, name: str) -> None:
        async with asyncio.timeout(20):
            while ("ADDED", name) not in self.events:
                await asyncio.sleep(0.01)


async def test_a_watch_the_server_ends_resumes_from_its_version_without_a_list(
    sandbox_api: ApiSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = sandbox_api
    monkeypatch.setattr(apiwatch, "WATCH_TIMEOUT_S", 1)
    seen = Seen(api)
    task = asyncio.create_task(reflect(api, PODS, {}, seen.handler))
    try:
        await _create(api, "first")
        await seen.until("first")
        await asyncio.sleep(2.5)  # the server ends the watch twice meanwhile
        await _create(api, "second")
        await seen.until("second")
    finally:
        task.cancel()
        await asyncio.wait([task])
    assert seen.lists == 1, f"listed {seen.lists} times: a watch's timeout must not relist"
    assert seen.events == [("ADDED", "first"), ("ADDED", "second")], seen.events


async def test_a_list_hands_new_pods_over_oldest_first(sandbox_api: ApiSession) -> None:
    api = sandbox_api
    await _create(api, "z-older")
    await asyncio.sleep(1.1)  # creationTimestamp counts whole seconds
    await _create(api, "a-newer")
    seen = Seen(api)
    task = asyncio.create_task(reflect(api, PODS, {}, seen.handler))
    try:
        await seen.until("a-newer")
        await seen.until("z-older")
    finally:
        task.cancel()
        await asyncio.wait([task])
    assert seen.events == [("ADDED", "z-older"), ("ADDED", "a-newer")], "a list's pods in creation order, not by name"
