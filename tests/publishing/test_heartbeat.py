"""Heartbeat: an unchanged state is rewritten every `heartbeat_s` with a fresh `observedAt`, so a
reader can tell a quiet node from a dead agent (the extender's `--state-max-age-seconds`)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from agent import publishing
from agent.podresources import PodResourcesClient
from common import statebuilding
from common.state import NodeState, from_status
from sandbox import apiserver_resources as kinds
from tests.publishing.harness import FAST, NODE, Node, config, gpus, node, time_slicing


def age(state: NodeState) -> float:
    return (datetime.now(UTC) - datetime.fromisoformat(state.observed_at)).total_seconds()


async def next_states(n: Node, count: int, *, timeout: float) -> list[NodeState]:
    """The next `count` states written to the node's object (from the store's watch)."""
    store = n.server.store
    watcher = store.watch(kinds.NODE_GPU_STATES, None, lambda _o: True, str(store.rv))
    found: list[NodeState] = []
    try:
        async with asyncio.timeout(timeout):
            while len(found) < count:
                event = await watcher.queue.get()
                assert event is not None
                if event["type"] == "MODIFIED" and event["object"].get("status"):
                    found.append(from_status(event["object"]["status"]))
    finally:
        store.unwatch(watcher)
    return found


@pytest.mark.parametrize(
    ("heartbeat_s", "writes_expected"),
    [(0.3, True), (0.0, False)],
    ids=["an unchanged state is rewritten every heartbeat", "heartbeat 0 writes only on change"],
)
async def test_an_unchanged_state_is_rewritten_every_heartbeat(heartbeat_s: float, writes_expected: bool) -> None:
    settings = dataclasses.replace(FAST, heartbeat_s=heartbeat_s, min_interval_s=0.1)
    async with node(config(time_slicing(2)), gpus(1), settings=settings) as n:
        first = await n.wait_state(lambda s: True)
        if not writes_expected:
            with pytest.raises(TimeoutError):
                await next_states(n, 1, timeout=1.0)
            return
        beats = await next_states(n, 2, timeout=3.0)
        assert all(statebuilding.same_content(b, first) for b in beats), "nothing changed but the time"
        assert all(age(b) < 2.0 for b in beats), [b.observed_at for b in beats]


@pytest.mark.parametrize(
    ("object_age_s", "writes"),
    [(0.0, 0), (3600.0, 1)],
    ids=["a fresh object is not rewritten", "an object older than a heartbeat is rewritten at once"],
)
async def test_a_restarted_publisher_refreshes_an_old_observed_at(object_age_s: float, writes: int) -> None:
    async with node(config(time_slicing(2)), gpus(1)) as n:
        await n.wait_state(lambda s: True)
        obj = n.server.store.get(kinds.NODE_GPU_STATES, "", NODE)
        when = datetime.now(UTC) - timedelta(seconds=object_age_s)
        obj["status"]["observedAt"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        n.server.store.update(kinds.NODE_GPU_STATES, "", NODE, obj, "status")
        # A second publisher, as after an agent restart (the first one writes only on change).
        async with PodResourcesClient(n.kubelet.pod_resources_socket) as pr:
            second = publishing.Publisher(n.agent, n.api, NODE, pr, dataclasses.replace(FAST, heartbeat_s=60.0))
            task = asyncio.create_task(second.run())
            try:
                if writes:
                    (state,) = await next_states(n, 1, timeout=3.0)
                    assert age(state) < 5.0, state.observed_at
                    # The store tells its watchers before the PUT's answer reaches the publisher.
                    async with asyncio.timeout(2.0):
                        while second.writes < 1:
                            await asyncio.sleep(0.01)
                else:
                    await asyncio.sleep(1.0)  # it reads PodResources, builds the same state, reads the object
            finally:
                task.cancel()
                await asyncio.wait([task])
        assert second.published is not None and second.writes == writes


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2026-11-30T03:00:00Z", 60.0), ("", None), ("then", None), (None, None)],
    ids=["rfc3339", "empty", "not a time", "missing"],
)
def test_age_of_an_observed_at(text: object, expected: float | None) -> None:
    now = datetime(2026, 11, 30, 3, 1, 0, tzinfo=UTC)
    assert publishing.age_s(text, now) == expected
