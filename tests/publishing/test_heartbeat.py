"""Heartbeat: an unchanged state is rewritten every `heartbeat_s` with a fresh `observedAt`, so a
reader can tell a quiet node from a dead agent (the extender's `--state-max-age-seconds`)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from sharepack.agent import publishing
from sharepack.agent.podresources import PodResourcesClient
from sharepack.common import statebuilding
from sharepack.common.state import NodeState, from_status
from sharepack.sandbox.apiserver import resources as kinds
from tests.publishing.harness import FAST, NODE, Node, config, gpus, node, time_slicing


def observed(state: NodeState) -> datetime:
    return datetime.fromisoformat(state.observed_at)


def whole_second(when: datetime) -> datetime:
    # observedAt has whole seconds (RFC 3339 as the API writes it)
    return when.replace(microsecond=0)


async def next_states(n: Node, count: int, *, timeout: float = 30.0) -> list[NodeState]:
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
        writes = len(n.server.writes("nodegpustates"))
        if not writes_expected:
            # Polls (every 0.25 s) spanning well over a second, i.e. several would-be heartbeats.
            await n.polls.wait(6)
            assert len(n.server.writes("nodegpustates")) == writes
            return
        beats = await next_states(n, 2)
        assert all(statebuilding.same_content(b, first) for b in beats), "nothing changed but the time"
        # Each beat is stamped when written: never older than the one before it, never ahead.
        times = [observed(s) for s in (first, *beats)]
        assert times == sorted(times) and times[-1] <= datetime.now(UTC), [s.observed_at for s in beats]


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
        restarted_at = datetime.now(UTC)
        async with PodResourcesClient(n.kubelet.pod_resources_socket) as pr:
            second = publishing.Publisher(n.agent, n.api, NODE, pr, dataclasses.replace(FAST, heartbeat_s=60.0))
            task = asyncio.create_task(second.run())
            try:
                if writes:
                    (state,) = await next_states(n, 1)
                    assert observed(state) >= whole_second(restarted_at), (state.observed_at, restarted_at)
                    # The store tells its watchers before the PUT's answer reaches the publisher.
                    async with asyncio.timeout(30):
                        while second.writes < 1:
                            await asyncio.sleep(0.01)
                else:
                    # It reads PodResources, builds the same state, reads the object and adopts it.
                    async with asyncio.timeout(30):
                        while second.published is None:
                            await asyncio.sleep(0.01)
                    await n.polls.wait(2)
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
