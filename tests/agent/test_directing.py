"""The agent's side of directed GPUs: which pod a GetPreferredAllocation is for, and whether its
directions are honoured or the node's policy answers (agent.directing)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest

from sharepack.agent import options, registering
from sharepack.agent.directing import Director, Fallback
from sharepack.agent.errors import OptionsError
from sharepack.common import directions
from sharepack.common.directions import ContainerDirections, Directions
from sharepack.common.resources import Resource, build_resources
from sharepack.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from tests.agent.harness import config, fake_kubelet, gpu_uuid, plain_gpus, running_agent, time_slicing

NODE = "node-a"
RES = "nvidia.com/gpu"
G0, G1 = gpu_uuid(0), gpu_uuid(1)


def resource() -> Resource:
    (r,) = build_resources(plain_gpus(2), config(time_slicing(4)))
    return r


ALL = [f"{g}::{n}" for g in (G0, G1) for n in range(4)]


def annotation(node: str, *containers: tuple[str, list[str]]) -> str:
    return directions.encode(
        Directions(node, tuple(ContainerDirections(name, {RES: tuple(keys)}) for name, keys in containers))
    )


def pod(name: str, *amounts: tuple[str, int], ann: str | None = None, phase: str = "Pending",
        init: tuple[tuple[str, int], ...] = (), created: str = "", rv: str = "") -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if created:
        meta["creationTimestamp"] = created
    if rv:
        meta["resourceVersion"] = rv
    if ann is not None:
        meta["annotations"] = {directions.ANNOTATION: ann}

    def spec(cs: tuple[tuple[str, int], ...]) -> list[dict[str, Any]]:
        return [{"name": c, "resources": {"limits": {RES: str(n)}}} for c, n in cs]

    return {
        "metadata": meta,
        "spec": {"nodeName": NODE, "containers": spec(amounts), "initContainers": spec(init)},
        "status": {"phase": phase},
    }


def director(pods: list[dict[str, Any]], listed: set[tuple[str, str]] | None = None, wait_s: float = 0.0) -> Director:
    d = Director(NODE, wait_s=wait_s)
    d.feed(lambda: pods, lambda: listed or set())
    return d


async def test_the_pending_pods_directed_gpus_are_honoured() -> None:
    d = director([pod("p", ("main", 2), ann=annotation(NODE, ("main", [G1, G1])))])
    chosen = await d.choose(resource(), ALL, [], 2)
    assert chosen == [f"{G1}::0", f"{G1}::1"]
    assert d.counters.honoured == 1 and sum(d.counters.fallbacks.values()) == 0


async def test_a_pods_containers_are_directed_one_after_another_with_reused_devices_kept() -> None:
    # The init container takes two on GPU 0; the app reuses one and takes one more, on GPU 1.
    ann = annotation(NODE, ("init", [G0, G0]), ("main", [G1]))
    d = director([pod("p", ("main", 2), init=(("init", 2),), ann=ann)])
    assert await d.choose(resource(), ALL, [], 2) == [f"{G0}::0", f"{G0}::1"]
    assert await d.choose(resource(), ALL, [f"{G0}::0"], 2) == [f"{G0}::0", f"{G1}::0"]
    assert d.counters.honoured == 2


@pytest.mark.parametrize(
    ("pods", "reason"),
    [
        pytest.param([pod("p", ("main", 1))], Fallback.NO_DIRECTIONS, id="no annotation"),
        pytest.param([pod("p", ("main", 1), ann="{oops")], Fallback.MALFORMED, id="an unreadable annotation"),
        pytest.param([pod("p", ("main", 1), ann=annotation("node-b", ("main", [G0])))], Fallback.OTHER_NODE,
                     id="directions for another node"),
        pytest.param([pod("p", ("main", 1), ann=annotation(NODE, ("main", [G0]))),
                      pod("q", ("main", 1), ann=annotation(NODE, ("main", [G1])))], Fallback.AMBIGUOUS,
                     id="two pending pods with the same request"),
        pytest.param([pod("p", ("main", 2), ann=annotation(NODE, ("main", [G0, G0])))], Fallback.NO_POD,
                     id="no pending pod asks for this size"),
        pytest.param([pod("p", ("main", 1), ann=annotation(NODE, ("main", [G0])), phase="Running")],
                     Fallback.NO_POD, id="a running pod is not pending"),
        pytest.param([pod("p", ("main", 1), ann=annotation(NODE, ("ghost", [G0])))], Fallback.MISMATCHED,
                     id="directions for a container the pod does not have"),
        pytest.param([pod("p", ("main", 1), init=(("init", 1),), ann=annotation(NODE, ("main", [G0]), ("init", [G1])))],
                     Fallback.MISMATCHED, id="directions out of the kubelet's order"),
    ],
)  # fmt: skip
async def test_the_nodes_policy_answers_when_the_request_cannot_be_matched_to_directions(
    pods: list[dict[str, Any]], reason: Fallback, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sharepack.agent.directing")
    d = director(pods)
    assert await d.choose(resource(), ALL, [], 1) is None
    assert d.counters.honoured == 0
    assert {r: n for r, n in d.counters.fallbacks.items() if n} == {reason: 1}
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"directed allocation not used ({reason}): ")


async def test_a_pod_cannot_steer_another_pods_gpus_with_made_up_containers() -> None:
    """Issue 24.1: an older pending pod (its image never pulls) whose annotation directs eight
    containers it does not have to GPU 1 used to answer the kubelet's request for the victim,
    which the extender directed to GPU 0: the victim got GPU 1. Directions that do not fit their
    pod steer nothing now; the victim's own are honoured."""
    t0, t1 = "2026-12-01T10:00:00Z", "2026-12-01T10:00:05Z"
    forged = annotation(NODE, *((f"made-up-{i}", [G1]) for i in range(8)))
    attacker = pod("attacker", ("main", 0), ann=forged, created=t0, rv="5")
    victim = pod("victim", ("main", 1), ann=annotation(NODE, ("main", [G0])), created=t1, rv="9")
    d = director([attacker, victim])
    assert await d.choose(resource(), ALL, [], 1) == [f"{G0}::0"]
    assert d.counters.honoured == 1
    assert d.holders() == {f"{G0}::0": "uid-victim"}


async def test_directions_naming_more_devices_than_the_container_requests_are_not_believed() -> None:
    greedy = pod("p", ("main", 1), ann=annotation(NODE, ("main", [G1, G1, G1])))
    d = director([greedy])
    assert await d.choose(resource(), ALL, [], 3) is None
    assert await d.choose(resource(), ALL, [], 1) is None  # its real request: the node's policy
    assert d.counters.honoured == 0 and d.counters.fallbacks[Fallback.MISMATCHED] == 1


async def test_a_directed_gpu_without_enough_available_devices_falls_back() -> None:
    d = director([pod("p", ("main", 2), ann=annotation(NODE, ("main", [G1, G1])))])
    available = [*ALL[:4], f"{G1}::3"]  # GPU 1 has one free replica, two are directed
    assert await d.choose(resource(), available, [], 2) is None
    assert d.counters.fallbacks[Fallback.UNAVAILABLE] == 1
    # The pod's container was identified and answered: the next request is not it again.
    assert await d.choose(resource(), ALL, [], 2) is None
    assert d.counters.fallbacks[Fallback.NO_POD] == 1


async def test_a_pod_podresources_lists_before_we_answered_for_it_is_not_pending() -> None:
    # e.g. allocated before an agent restart, still Pending while its image is pulled.
    old = pod("old", ("main", 1), ann=annotation(NODE, ("main", [G0])))
    new = pod("new", ("main", 1), ann=annotation(NODE, ("main", [G1])))
    d = director([old, new], listed={("default", "old")})
    assert await d.choose(resource(), ALL, [], 1) == [f"{G1}::0"]


async def test_an_answered_pod_leaves_the_way_for_the_next_one() -> None:
    pods = [pod("p1", ("main", 1), ann=annotation(NODE, ("main", [G0])))]
    d = director(pods)
    assert await d.choose(resource(), ALL, [], 1) == [f"{G0}::0"]
    pods.append(pod("p2", ("main", 1), ann=annotation(NODE, ("main", [G1]))))  # p1 still Pending
    assert await d.choose(resource(), ALL, [], 1) == [f"{G1}::0"]
    assert d.counters.honoured == 2


async def test_of_several_pending_pods_the_one_the_kubelet_admits_first_is_directed() -> None:
    """A burst bound three one-replica pods to the node: the kubelet admits them in the order
    they were bound (its watch's order: lowest resourceVersion first), whenever each was
    created, and finishes a started pod first."""
    t0, t1 = "2026-12-01T10:00:00Z", "2026-12-01T10:00:01Z"
    pods = [
        pod("late", ("main", 1), ann=annotation(NODE, ("main", [G1])), created=t0, rv="10"),
        pod("second", ("main", 1), ann=annotation(NODE, ("main", [G0])), created=t0, rv="9"),
        pod("first", ("main", 1), ann=annotation(NODE, ("init", [G0]), ("main", [G1])), created=t1, rv="8",
            init=(("init", 1),)),
    ]  # fmt: skip
    d = director(pods)
    assert await d.choose(resource(), ALL, [], 1) == [f"{G0}::0"]  # first's init container
    # first is in progress: its app container goes before second, whatever their order.
    assert await d.choose(resource(), ALL[1:], [], 1) == [f"{G1}::0"]
    assert await d.choose(resource(), ALL[1:], [], 1) == [f"{G0}::1"]  # second
    assert await d.choose(resource(), ALL[1:], [], 1) == [f"{G1}::0"]  # late
    assert d.counters.honoured == 4


async def test_look_alike_pods_created_in_one_order_and_bound_in_the_other_keep_their_own_gpus() -> None:
    """The chaos soak's misses: `older` was created first, failed to schedule, and was bound
    after `newer`. The kubelet admits `newer` first (bind order), so the first request is
    newer's; ordering by creation time used to hand it older's GPU, and the two swapped."""
    older = pod("older", ("main", 1), ann=annotation(NODE, ("main", [G1])), created="2026-12-01T10:00:00Z", rv="41")
    newer = pod("newer", ("main", 1), ann=annotation(NODE, ("main", [G0])), created="2026-12-01T10:00:03Z", rv="40")
    d = director([older, newer])
    assert await d.choose(resource(), ALL, [], 1) == [f"{G0}::0"]
    assert await d.choose(resource(), ALL[1:], [], 1) == [f"{G1}::0"]
    assert d.holders() == {f"{G0}::0": "uid-newer", f"{G1}::0": "uid-older"}


async def test_a_pod_seen_first_goes_first_though_written_after_its_binding() -> None:
    """The watch brought `first` before `second`; an update to `first` since (a label, say)
    gave it the higher resourceVersion. The order the Director first saw them in still holds."""
    pods = [pod("first", ("main", 1), ann=annotation(NODE, ("main", [G1])), rv="50")]
    d = director(pods)
    assert await d.choose(resource(), ALL, [], 2) is None  # a look at the pods: first is seen
    pods[0] = pod("first", ("main", 1), ann=annotation(NODE, ("main", [G1])), rv="60")
    pods.append(pod("second", ("main", 1), ann=annotation(NODE, ("main", [G0])), rv="55"))
    assert await d.choose(resource(), ALL, [], 1) == [f"{G1}::0"]
    assert await d.choose(resource(), [x for x in ALL if x != f"{G1}::0"], [], 1) == [f"{G0}::0"]
    assert d.counters.honoured == 2


async def test_the_devices_directed_to_pods_still_to_come_are_spoken_for() -> None:
    pods = [
        pod("undirected", ("main", 1), rv="1"),
        pod("next", ("main", 1), ann=annotation(NODE, ("main", [G1])), rv="2"),
        pod("pair", ("main", 2), ann=annotation(NODE, ("main", [G0, G1])), rv="3"),
        pod("forged", ("main", 1), ann=annotation(NODE, ("ghost", [G0, G0, G0])), rv="4"),  # believed nowhere
    ]
    d = director(pods)
    kept = d.spoken_for(resource(), ALL)
    assert sorted(kept) == sorted([f"{G0}::3", f"{G1}::3", f"{G1}::2"])
    assert await d.choose(resource(), ALL, [], 1) is None  # undirected: the node's policy
    assert await d.choose(resource(), ALL, [], 1) == [f"{G1}::0"]  # next
    assert sorted(d.spoken_for(resource(), ALL[:4] + ALL[5:])) == sorted([f"{G0}::3", f"{G1}::3"])  # pair's


async def test_the_nodes_policy_leaves_the_gpus_directed_to_pods_still_to_come() -> None:
    """The soak's cascades: an undirected pod (bound while the extender's view trailed) took,
    by `packed`, the GPU the extender had just directed the next pod to, which then fell back
    too. The policy now answers around such devices when the others are enough."""
    packed = config(time_slicing(4), **{"shared-devices-allocation-policy": "packed"})
    async with fake_kubelet() as kubelet, running_agent(kubelet, packed, plain_gpus(2)) as agent:
        pods = [
            pod("undirected", ("main", 1), rv="1"),
            pod("next", ("main", 4), ann=annotation(NODE, ("main", [G0, G0, G0, G0])), rv="2"),
        ]
        agent.director = director(pods)
        path = agent.server_sockets()[RES]
        async with grpc.aio.insecure_channel(registering.unix_target(Path(path))) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)

            async def preferred(available: list[str], size: int) -> list[str]:
                reply = await stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=size)
                ]))  # fmt: skip
                return list(reply.container_responses[0].deviceIDs)

            (first,) = await preferred(ALL, 1)
            assert first.startswith(G1)  # packed alone would take GPU 0's first replica
            assert sorted(await preferred([x for x in ALL if x != first], 4)) == ALL[:4]  # next: GPU 0 whole
            # With too little left elsewhere, the policy takes what the kubelet offers.
            pods.append(pod("late", ("main", 2), rv="3"))
            pods.append(pod("after", ("main", 4), ann=annotation(NODE, ("main", [G1, G1, G1, G1])), rv="4"))
            assert len(await preferred(ALL[4:], 2)) == 2


async def test_it_waits_for_the_pod_watch_to_catch_up_with_the_kubelet() -> None:
    pods: list[dict[str, Any]] = []
    d = director(pods, wait_s=30.0)

    async def bound_later() -> None:
        await asyncio.sleep(0.05)
        pods.append(pod("p", ("main", 1), ann=annotation(NODE, ("main", [G1]))))

    late = asyncio.create_task(bound_later())
    assert await d.choose(resource(), ALL, [], 1) == [f"{G1}::0"]
    await late


async def test_unfed_it_answers_nothing_and_counts_nothing() -> None:
    d = Director(NODE)
    assert await d.choose(resource(), ALL, [], 1) is None
    assert d.counters.honoured == 0 and sum(d.counters.fallbacks.values()) == 0


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        pytest.param([], {}, True, id="on by default"),
        pytest.param(["--directed-gpus=false"], {}, False, id="off by flag"),
        pytest.param(["--directed-gpus", "TRUE"], {"SHAREPACK_DIRECTED_GPUS": "false"}, True, id="flag beats env"),
        pytest.param([], {"SHAREPACK_DIRECTED_GPUS": "false"}, False, id="off by env"),
    ],
)
def test_the_directed_gpus_option(argv: list[str], env: dict[str, str], expected: bool) -> None:
    assert options.parse(argv, env).directed_gpus is expected


def test_a_bad_directed_gpus_value_names_where_it_came_from() -> None:
    with pytest.raises(OptionsError) as info:
        options.parse([], {"SHAREPACK_DIRECTED_GPUS": "sometimes"})
    assert "invalid --directed-gpus option: sometimes (from env SHAREPACK_DIRECTED_GPUS; want true or false)" in str(info.value)


async def test_a_directed_allocation_is_published_under_its_pods_uid_before_podresources_lists_it() -> None:
    """The publisher counts devices it just allocated before PodResources names their pod; with
    directions it knows the pod, so the extender settles its assumption instead of counting the
    pod twice (once assumed, once as an anonymous allocation)."""
    from sharepack.common.policies import MigStrategy, Policy
    from sharepack.common.statebuilding import build_node_state

    d = director([pod("p", ("main", 2), ann=annotation(NODE, ("main", [G1, G1])))])
    chosen = await d.choose(resource(), ALL, [], 2)
    assert chosen is not None and d.holders() == dict.fromkeys(chosen, "uid-p")

    def state(holders: dict[str, str] | None) -> list[tuple[int, tuple[str, ...]]]:
        built = build_node_state(
            resources=[resource()], unhealthy=(), pods=(), pod_uids={},
            allocation_policy=Policy.PACKED, mig_strategy=MigStrategy.NONE, agent_version="t",
            observed_at="2026-12-01T00:00:00Z", recently_allocated={RES: chosen}, recent_holders=holders,
        )  # fmt: skip
        return [(g.allocated, g.pods) for g in built.resources[0].gpus]

    assert state(None) == [(0, ()), (2, ())]  # counted, no one named
    assert state(d.holders()) == [(0, ()), (2, ("uid-p",))]
