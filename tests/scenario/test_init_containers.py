"""Pods with several containers and init containers, through the real kubelet path.

The kubelet gives a pod's init container devices, lets later containers of the pod reuse them,
and keeps every one of them allocated to the pod until the pod ends, reused or not. Its
PodResources `List` shows app containers and sidecars, never plain init containers. So when an
init container asks for more replicas than the app containers reuse, the surplus is held (the
kubelet offers it to no one) yet appears in no PodResources entry.

Found by this scenario: an agent that built `allocated` from PodResources alone published fewer
replicas than the kubelet holds, so `common.scoring` (which counts the surplus, like the kubelet)
was fed free replicas that did not exist and predicted placements the agent could not make. The
agent now recovers them from its own Allocate log; the last test below pins that.
"""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest

from sharepack.common import podrequests, scoring
from sharepack.common.policies import Policy
from sharepack.sandbox.drivers import demo
from sharepack.sandbox.drivers.demo import SHARED_RESOURCE, Sandbox, Workload
from tests.conftest import real_binaries
from sharepack.sandbox.kubelet.nodes import SimulatedNode
from tests.scenario.harness import (
    MACHINE,
    REPLICAS,
    eventually,
    kubelet_gpus,
    kubelet_held,
    node_states,
    published_allocated,
    read_pod,
    short_root,
    wait_settled,
    wait_stack_ready,
)

pytestmark = pytest.mark.timeout(240)  # the first test of each plane pays for its sandbox

POLICY = Policy.PACKED


def container(name: str, replicas: int, *, sidecar: bool = False) -> dict[str, Any]:
    limits = {SHARED_RESOURCE: str(replicas)}
    c: dict[str, Any] = {"name": name, "image": "busybox", "resources": {"limits": limits}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def pod(name: str, apps: Sequence[int], inits: Sequence[int] = (), sidecars: Sequence[int] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container(f"app{i}", n) for i, n in enumerate(apps)]}
    init = [container(f"init{i}", n) for i, n in enumerate(inits)]
    init += [container(f"side{i}", n, sidecar=True) for i, n in enumerate(sidecars)]
    if init:
        spec["initContainers"] = init
    meta = {"name": name, "namespace": demo.NAMESPACE}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


async def place(box: Sandbox, body: dict[str, Any]) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Schedule and admit one pod; (predicted from the state before it, held by the kubelet,
    allocated per GPU as published afterwards minus before), each as replicas per GPU."""
    node = box.nodes[0]
    before = (await node_states(box))[node.name]
    core: Any = kubernetes.client.CoreV1Api(box.api)
    name = body["metadata"]["name"]
    await asyncio.to_thread(core.create_namespaced_pod, demo.NAMESPACE, body)
    decision = await box.schedule(name)
    assert decision.node == node.name, decision
    assert await node.sync_pods() == []
    doc = await read_pod(box, name)
    uid = doc["metadata"]["uid"]
    after = await box.wait_published(node.name, uid)
    predicted = scoring.score_node(before, podrequests.decode_pod_request(doc), POLICY)
    return (
        Counter(predicted.placement.get(SHARED_RESOURCE, ())),
        kubelet_gpus(node, uid),
        published_allocated(after) - published_allocated(before),
    )


async def allocatable_again(box: Sandbox, node: SimulatedNode) -> None:
    """The restarted agent's devices are in the Node's status again (the kubelet posts them
    with its next status; kube-scheduler, on the real control plane, schedules from that)."""
    core: Any = kubernetes.client.CoreV1Api(box.api)
    want = str(len(node.kubelet.healthy(SHARED_RESOURCE)))
    await node.sync_status()

    async def posted() -> bool:
        obj = await asyncio.to_thread(core.read_node, node.name)
        return bool((obj.status.allocatable or {}).get(SHARED_RESOURCE) == want)

    await eventually(posted, "the Node's allocatable to list the restarted agent's devices")


AGREEING = {
    "two-app-containers": pod("apps", [1, 2]),
    "init-fully-reused": pod("init-reused", [1, 1], inits=[2]),
    "init-smaller-than-app": pod("init-small", [3], inits=[1]),
    "sidecar-and-app": pod("sidecar", [1], sidecars=[2]),
}
Placed = tuple[Counter[str], Counter[str], Counter[str]]


@dataclass(frozen=True, slots=True)
class Record:
    agreeing: Mapping[str, Placed]
    settled: tuple[int, int]  # the extender's (match, mismatch) after the agreeing pods
    big_init: Placed
    published: Counter[str]  # replicas per GPU published once a later pod is published
    held: Counter[str]  # replicas per GPU the kubelet holds then
    restarted: Counter[str]  # published after an agent restart and one more pod
    held_restarted: Counter[str]  # the kubelet then


async def scenario(control_plane: str) -> Record:
    """One sandbox (one node, 16 replicas): the agreeing pods, then a pod whose init container
    holds more than its app reuses (last: it skews the published state) and a pod after it."""
    root = short_root("spini-")
    try:
        async with Sandbox(POLICY, 1, MACHINE, Workload(REPLICAS, ()), root, control_plane=control_plane) as box:
            await wait_stack_ready(box)
            agreeing = {case: await place(box, body) for case, body in AGREEING.items()}
            settled = await wait_settled(box, len(AGREEING))
            # init asks 3, the app reuses 1: the kubelet holds 3 replicas of one GPU for the pod.
            big_init = await place(box, pod("big-init", [1], inits=[3]))
            # The agent's first write may count replicas it just allocated before PodResources
            # lists them; a later pod's publication comes from a later PodResources read, so the
            # state then is what the agent believes for good.
            await place(box, pod("next", [1]))
            node = box.nodes[0]
            state = (await node_states(box))[node.name]
            published, held = published_allocated(state), kubelet_held(node)
            # The agent restarts: the init container's surplus is known only from the Allocate
            # log it keeps beside the sockets. A pod after the restart makes it publish.
            await node.restart_agent()
            await allocatable_again(box, node)
            await place(box, pod("after-restart", [1]))
            restarted = published_allocated((await node_states(box))[node.name])
            return Record(agreeing, settled, big_init, published, held, restarted, kubelet_held(node))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=demo.CONTROL_PLANES)
def record(request: pytest.FixtureRequest) -> Record:
    """The scenario once per control plane (on the real one, kube-scheduler binds and the
    kubelet admits each pod from its own pod watch)."""
    if request.param == demo.REAL:
        real_binaries()
    return asyncio.run(scenario(str(request.param)))


@pytest.mark.parametrize("case", AGREEING)
def test_multi_container_pods_whose_devices_are_all_listed_are_predicted_and_published(
    record: Record, case: str
) -> None:
    predicted, held, published = record.agreeing[case]
    assert sum(held.values()) > 0
    assert predicted == held == published, f"predicted {predicted}, kubelet {held}, published {published}"


def test_the_extender_matched_every_agreeing_prediction(record: Record) -> None:
    assert record.settled == (len(AGREEING), 0)


def test_scoring_counts_a_finished_init_containers_replicas_like_the_kubelet(record: Record) -> None:
    predicted, held, _ = record.big_init
    assert sum(held.values()) == 3
    assert predicted == held


def test_replicas_held_only_by_a_finished_init_container_are_published(record: Record) -> None:
    assert record.published == record.held


def test_a_restarted_agent_still_publishes_a_finished_init_containers_replicas(record: Record) -> None:
    assert sum(record.held_restarted.values()) == sum(record.held.values()) + 1
    assert record.restarted == record.held_restarted
