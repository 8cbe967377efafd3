"""End to end: API server + fake kubelet + agent + publication, over real sockets."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from sharepack.common.policies import Policy
from sharepack.sandbox.apiserver import resources as kinds
from tests.publishing.harness import NODE, config, gpus, held, node, pods_of, time_slicing


async def test_pods_started_through_the_kubelet_are_published_one_by_one() -> None:
    # How fast is benchmarks/bench_publishing.py's claim; here only what gets published.
    async with node(config(time_slicing(4)), gpus(2)) as n:
        first = await n.wait_state(lambda s: s.resource("nvidia.com/gpu") is not None)
        assert [(g.total, g.allocated) for g in first.resources[0].gpus] == [(4, 0), (4, 0)]
        uids: list[str] = []
        delays = "sharepack_agent_state_publish_delay_seconds_count"
        for i in range(3):
            measured = n.agent.metrics.value(delays)
            uid = await n.start_pod(f"p{i}")
            state = await n.wait_state(lambda s, uid=uid: uid in pods_of(s))
            # The store has the write before the writer resumes to time it: wait for the count.
            async with asyncio.timeout(30):
                while n.agent.metrics.value(delays) <= measured:
                    await asyncio.sleep(0.01)
            uids.append(uid)
            assert pods_of(state) == set(uids) and sum(held(state).values()) == i + 1
        # each pod was waited for before the next started: one write at least for each
        assert n.agent.metrics.value("sharepack_agent_state_writes_total") >= 3
        state = await n.wait_state(lambda s: pods_of(s) == set(uids))
        # distributed: 3 single replicas over 2 GPUs -> 2 + 1
        assert sorted(held(state).values()) == [1, 2]
        assert state.allocation_policy is Policy.DISTRIBUTED


async def test_stopped_pods_release_their_counts() -> None:
    async with node(config(time_slicing(2)), gpus(2)) as n:
        for i in range(3):
            await n.start_pod(f"p{i}")
        await n.wait_state(lambda s: sum(held(s).values()) == 3)
        await n.stop_pod("p0")
        await n.stop_pod("p1")
        state = await n.wait_state(lambda s: sum(held(s).values()) == 1)
        assert pods_of(state) == set(n.started.values())


async def test_the_object_is_owned_by_the_node_and_only_status_is_written() -> None:
    async with node(config(time_slicing(2)), gpus(1)) as n:
        await n.wait_state(lambda s: True)
        obj = n.server.store.get(kinds.NODE_GPU_STATES, "", NODE)
        node_uid = n.server.store.get(kinds.NODES, "", NODE)["metadata"]["uid"]
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid}
        ]
        assert obj["status"]["summary"] == {
            "freeGpus": 1, "gpus": 1, "replicasUsed": 0, "replicasTotal": 2, "replicas": "0/2",
        }
        creates = [r for r in n.server.writes("nodegpustates") if r.method == "POST"]
        assert len(creates) == 1
        assert all(r.path.endswith("/status") for r in n.server.writes("nodegpustates") if r.method == "PUT")


async def test_a_burst_of_pod_starts_is_coalesced_into_few_writes() -> None:
    async with node(config(time_slicing(8)), gpus(4)) as n:
        await n.wait_state(lambda s: True)
        before = len(n.server.writes("nodegpustates"))
        started = time.monotonic()
        uids = {await n.start_pod(f"p{i}") for i in range(24)}
        await n.wait_state(lambda s: pods_of(s) == uids)
        elapsed = time.monotonic() - started
        writes = len(n.server.writes("nodegpustates")) - before
        # At most one write per min_interval (0.5 s), plus the first one after the debounce. A
        # slow machine only stretches `elapsed`, which loosens the bound: no false failure.
        assert writes <= int(elapsed / 0.5) + 2, (writes, elapsed)


async def test_no_write_happens_when_nothing_changed() -> None:
    async with node(config(time_slicing(2)), gpus(1)) as n:
        await n.wait_state(lambda s: True)
        before = len(n.server.writes("nodegpustates"))
        await n.polls.wait(4)  # PodResources polls that find nothing new
        assert len(n.server.writes("nodegpustates")) == before


@pytest.mark.parametrize("mode", ["refuse", "unavailable"], ids=["nothing listening", "answering 503"])
async def test_an_api_outage_does_not_stop_allocation_and_the_state_catches_up(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sharepack.agent.publishing")
    async with node(config(time_slicing(4)), gpus(2)) as n:
        await n.wait_state(lambda s: True)
        # pods exist in the API before the outage; the kubelet starts them during it
        uids = []
        await n.server.pause(mode)  # type: ignore[arg-type]
        for i in range(3):
            uids.append(await n.start_pod(f"p{i}"))  # the fake store still accepts direct writes
        assert len(n.kubelet.admissions()) == 3, "the device plugin kept allocating"
        # The outage outlasts a retry: the publisher failed to write twice, and goes on trying.
        async with asyncio.timeout(30):
            while sum("cannot publish NodeGpuState" in r.getMessage() for r in caplog.records) < 2:
                await asyncio.sleep(0.01)
        assert n.published() is not None and not pods_of(n.published())  # type: ignore[arg-type]
        await n.server.resume()
        state = await n.wait_state(lambda s: pods_of(s) == set(uids))
        assert sum(held(state).values()) == 3
        if mode == "unavailable":  # answered 503; a refused reconnect may just wait out the outage
            assert n.agent.metrics.value("sharepack_agent_state_write_errors_total") >= 1


async def test_a_deleted_object_is_written_again() -> None:
    async with node(config(time_slicing(2)), gpus(1)) as n:
        await n.wait_state(lambda s: True)
        n.server.store.delete(kinds.NODE_GPU_STATES, "", NODE)
        await n.start_pod("p0")
        state = await n.wait_state(lambda s: sum(held(s).values()) == 1)
        assert state.resources[0].gpus[0].allocated == 1


async def test_devices_of_a_pod_the_kubelet_rejects_after_allocate_are_not_kept() -> None:
    from sharepack.sandbox.kubelet.pods import AdmissionError, ContainerSpec, PodSpec

    async with node(config(time_slicing(2)), gpus(1)) as n:
        await n.wait_state(lambda s: True)
        # The device manager allocates the GPU replica, then the node-fit check fails on the
        # other extended resource: the agent answered Allocate, but no pod holds the device.
        bad = PodSpec(uid="rejected", name="rejected", containers=(
            ContainerSpec("main", {"nvidia.com/gpu": 1, "example.com/widget": 1}),
        ))
        with pytest.raises(AdmissionError):
            await n.kubelet.admit_pod(bad)
        assert n.agent.snapshot().allocations, "the agent did allocate"
        await n.polls.wait(2)  # past the pending window: polls that do not list the pod
        state = n.published()
        assert state is not None and sum(held(state).values()) == 0
        uid = await n.start_pod("good")
        state = await n.wait_state(lambda s: uid in pods_of(s))
        assert sum(held(state).values()) == 1


async def test_a_restarted_publisher_does_not_rewrite_an_unchanged_state() -> None:
    from sharepack.agent import publishing
    from sharepack.agent.podresources import PodResourcesClient

    async with node(config(time_slicing(2)), gpus(1)) as n:
        uid = await n.start_pod("p0")
        await n.wait_state(lambda s: uid in pods_of(s))
        writes = len(n.server.writes("nodegpustates"))
        async with PodResourcesClient(n.kubelet.pod_resources_socket) as pr:
            second = publishing.Publisher(n.agent, n.api, NODE, pr)
            task = asyncio.create_task(second.run())
            try:
                # It reads PodResources, builds the same state, reads the object and adopts it.
                async with asyncio.timeout(30):
                    while second.published is None:
                        await asyncio.sleep(0.01)
                await n.polls.wait(2)  # and, polling on, still finds nothing to write
            finally:
                task.cancel()
                await asyncio.wait([task])
        assert second.published is not None and second.writes == 0
        assert len(n.server.writes("nodegpustates")) == writes


async def test_api_errors_that_are_not_outages_are_retried_too() -> None:
    async with node(config(time_slicing(2)), gpus(1)) as n:
        await n.wait_state(lambda s: True)
        n.server.fail_next("PUT", "/nodegpustates/node-0/status", 403, times=2)
        uid = await n.start_pod("p0")
        await n.wait_state(lambda s: uid in pods_of(s))
        statuses = [r.status for r in n.server.requests if r.method == "PUT" and r.path.endswith("/status")]
        assert statuses[-3:] == [403, 403, 200]


async def test_an_object_edited_by_someone_else_is_rewritten_at_resync() -> None:
    import dataclasses

    from tests.publishing.harness import FAST

    async with node(config(time_slicing(2)), gpus(1), settings=dataclasses.replace(FAST, resync_s=0.3)) as n:
        await n.wait_state(lambda s: True)
        obj = n.server.store.get(kinds.NODE_GPU_STATES, "", NODE)
        obj["status"]["allocationPolicy"] = "spread"
        n.server.store.update(kinds.NODE_GPU_STATES, "", NODE, obj, "status")
        assert n.published() is not None and n.published().allocation_policy is Policy.SPREAD  # type: ignore[union-attr]
        await n.wait_state(lambda s: s.allocation_policy is Policy.DISTRIBUTED)


async def test_a_state_deleted_by_hand_is_written_again_at_once_not_at_resync() -> None:
    """The agent watches its own object: with the resync ten minutes away, only the watch can
    bring it back."""
    import dataclasses

    from tests.publishing.harness import FAST

    async with node(config(time_slicing(2)), gpus(1), settings=dataclasses.replace(FAST, resync_s=600)) as n:
        uid = await n.start_pod("p0")
        await n.wait_state(lambda s: uid in pods_of(s))
        n.server.store.delete(kinds.NODE_GPU_STATES, "", NODE)
        assert n.published() is None
        restored = await n.wait_state(lambda s: uid in pods_of(s))
        assert restored.resources[0].gpus[0].allocated == 1


async def test_a_status_edited_by_someone_else_is_rewritten_at_once_not_at_resync() -> None:
    import dataclasses

    from tests.publishing.harness import FAST

    async with node(config(time_slicing(2)), gpus(1), settings=dataclasses.replace(FAST, resync_s=600)) as n:
        await n.wait_state(lambda s: True)
        obj = n.server.store.get(kinds.NODE_GPU_STATES, "", NODE)
        obj["status"]["allocationPolicy"] = "spread"
        n.server.store.update(kinds.NODE_GPU_STATES, "", NODE, obj, "status")
        await n.wait_state(lambda s: s.allocation_policy is Policy.DISTRIBUTED)


async def test_unhealthy_devices_are_published() -> None:
    from dataclasses import dataclass

    from tests.publishing.harness import gpu_uuid

    @dataclass(frozen=True)
    class Xid:
        uuid: str
        xid: int = 48  # double-bit ECC error: critical
        mig_gi: int | None = None
        mig_ci: int | None = None

    async with node(config(time_slicing(4)), gpus(2)) as n:
        await n.wait_state(lambda s: True)
        n.agent.handle_xid(Xid(gpu_uuid(1)))
        state = await n.wait_state(lambda s: s.resources[0].gpus[1].unhealthy == 4)
        assert [(g.total, g.allocated, g.unhealthy, g.free) for g in state.resources[0].gpus] == [
            (4, 0, 0, 4), (4, 0, 4, 0),
        ]


async def test_devices_a_finished_init_container_still_holds_are_published() -> None:
    from sharepack.sandbox.kubelet.pods import ContainerSpec, PodSpec

    async with node(config(time_slicing(4, "packed")), gpus(2)) as n:
        await n.wait_state(lambda s: True)
        pod = n.server.store.create(kinds.PODS, "default", {
            "metadata": {"name": "init"}, "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "i"}]},
        })
        uid = pod["metadata"]["uid"]
        # init asks 3 replicas, the app reuses 1: the kubelet keeps all 3 for the pod, though
        # PodResources lists only the app container's one.
        await n.kubelet.admit_pod(PodSpec(
            uid=uid, name="init", init_containers=(ContainerSpec("init", {"nvidia.com/gpu": 3}),),
            containers=(ContainerSpec("app", {"nvidia.com/gpu": 1}),),
        ))
        await n.polls.wait(2)  # past the pending window: what remains is the attribution
        state = await n.wait_state(lambda s: uid in pods_of(s))
        assert sum(held(state).values()) == 3
        assert sorted(held(state).values()) == [0, 3]
