"""An API server outage in the middle of a stream, through the real processes.

Pods bound before the outage are admitted while the API server is away (the kubelet and the
agent talk over unix sockets, not through the API): admission must not depend on the API. The
agent cannot publish meanwhile; once the API is back its NodeGpuState catches up with every pod,
the extender's caches recover, and the extender's predictions for the pods it bound before the
outage still match what the agent did.

Both outage kinds the sandbox API server offers: 503 for every request, and nothing listening at
all; and on the real control plane, kube-apiserver stopped (its port closed) with kube-scheduler
binding the pods.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import Counter
from typing import Any

import kubernetes
import pytest

from sharepack.common import podrequests, scoring
from sharepack.common import state as gpustate
from sharepack.common.policies import Policy
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.drivers import demo
from sharepack.sandbox.apiserver.server import PauseMode
from sharepack.sandbox.drivers.demo import SHARED_RESOURCE, Sandbox, Workload
from sharepack.sandbox.kubelet.pods import Admission
from sharepack.sandbox.kubelet.nodes import SimulatedNode, pod_spec_from_api
from tests.conftest import real_binaries
from tests.scenario.harness import (
    MACHINE,
    REPLICAS,
    WAIT_S,
    eventually,
    extender_metrics,
    kubelet_gpus,
    kubelet_held,
    node_states,
    pod_body,
    pods_on,
    published_allocated,
    read_pod,
    short_root,
    wait_settled,
    wait_stack_ready,
)

pytestmark = pytest.mark.timeout(150)

POLICY = Policy.PACKED
OUTAGES: tuple[PauseMode, ...] = ("unavailable", "refuse")
PER_OUTAGE = 2  # pods bound before each outage, admitted during it
FAILED_WRITES = 4  # the outage lasts until the agent has failed this many writes (backing off)


async def schedule(box: Sandbox, name: str, replicas: int) -> dict[str, Any]:
    """Create the pod and let the scheduler driver bind it (filter, prioritize, extender /bind)."""
    core: Any = kubernetes.client.CoreV1Api(box.api)
    await asyncio.to_thread(core.create_namespaced_pod, demo.NAMESPACE, pod_body(name, replicas))
    decision = await box.driver.schedule(demo.NAMESPACE, name)
    assert decision.node == box.nodes[0].name, decision
    return await read_pod(box, name)


async def admit(node: SimulatedNode, doc: dict[str, Any]) -> Admission:
    """The kubelet's part: admission only (GetPreferredAllocation + Allocate against the agent).

    Not `SimulatedNode.sync_pods`: it lists the node's pods from the API, which is away, and it
    would admit the pods admitted here a second time once the API is back.
    """
    return await node.kubelet.admit_pod(pod_spec_from_api(doc))


async def set_running(box: Sandbox, doc: dict[str, Any]) -> None:
    core: Any = kubernetes.client.CoreV1Api(box.api)
    meta = doc["metadata"]
    await asyncio.to_thread(
        core.patch_namespaced_pod_status, meta["name"], meta["namespace"], {"status": {"phase": "Running"}}
    )


def stored_pods(box: Sandbox) -> set[str]:
    """The pods the stored NodeGpuState lists, read in-process (the API server is paused)."""
    obj = box.api_server.store.get(kinds.NODE_GPU_STATES, "", box.nodes[0].name)
    return pods_on(gpustate.from_status(obj["status"], source="store"))


def publish_failures(box: Sandbox) -> int:
    """The agent's own account of failed NodeGpuState writes (its log)."""
    text = box.nodes[0].agent_log.read_text(errors="replace")
    return sum(1 for line in text.splitlines() if "cannot publish NodeGpuState" in line)


async def extender_post(box: Sandbox, verb: str, body: dict[str, Any]) -> Any:
    async with box.session.post(f"{box.extender_url}/{verb}", json=body) as resp:
        assert resp.status == 200, f"{verb}: HTTP {resp.status}: {await resp.text()}"
        return await resp.json()


async def outage(box: Sandbox, mode: PauseMode, docs: list[dict[str, Any]]) -> tuple[list[Admission], float, float]:
    """Pause the API, admit `docs`, see the agent fail to publish them, resume; returns the
    admissions, the outage's length and the seconds from resume until the published state lists
    every pod."""
    node = box.nodes[0]
    uids = {d["metadata"]["uid"] for d in docs}
    failures = publish_failures(box)
    paused_at = time.monotonic()
    await box.api_server.pause(mode)
    admissions = [await admit(node, d) for d in docs]

    # The extender answers from its caches: scheduling does not stop with the API.
    reply = await extender_post(box, "filter", {"Pod": docs[0], "NodeNames": [node.name], "Nodes": None})
    assert reply.get("NodeNames") == [node.name] and not reply.get("Error"), reply
    ranked = await extender_post(box, "prioritize", {"Pod": docs[0], "NodeNames": [node.name], "Nodes": None})
    assert [e["Host"] for e in ranked] == [node.name], ranked

    # The agent noticed the change and could not write it, a few times (backing off in
    # between): that is the outage we test.
    async def agent_failed_to_publish() -> bool:
        if mode == "unavailable":
            rejected = [
                r for r in box.api_server.requests
                if r.at >= paused_at and r.status == 503 and "nodegpustates" in r.path
                and r.method in ("PUT", "POST", "PATCH")
            ]  # fmt: skip
            if not rejected:
                return False
        return publish_failures(box) >= failures + FAILED_WRITES

    await eventually(agent_failed_to_publish, f"the agent to fail a NodeGpuState write ({mode})")
    assert stored_pods(box) & uids == set(), "published during the outage: the outage did not happen"

    outage_s = time.monotonic() - paused_at
    await box.api_server.resume()
    resumed_at = time.monotonic()

    async def caught_up() -> bool:
        return uids <= pods_on((await node_states(box))[node.name])

    await eventually(caught_up, f"the NodeGpuState to list the pods admitted during the outage ({mode})")
    return admissions, outage_s, time.monotonic() - resumed_at


async def test_pods_are_admitted_during_an_api_outage_and_published_once_it_ends() -> None:
    root = short_root("spout-")
    try:
        async with Sandbox(POLICY, 1, MACHINE, Workload(REPLICAS, ()), root) as box:
            await wait_stack_ready(box)
            node = box.nodes[0]
            bound = 0
            catch_up: dict[str, tuple[float, float]] = {}
            for mode in OUTAGES:
                # Bound while the API is up (the kubelet's pod informer already has them)...
                docs = [await schedule(box, f"{mode}-{i}", 1) for i in range(PER_OUTAGE)]
                bound += len(docs)
                # ...admitted while it is away.
                admissions, down, up = await outage(box, mode, docs)
                catch_up[mode] = (down, up)
                for doc, adm in zip(docs, admissions, strict=True):
                    assert len(adm.held(SHARED_RESOURCE)) == 1
                    await set_running(box, doc)  # the kubelet reports once it can

            # Counts caught up exactly: the published state is what the kubelet holds.
            state = (await node_states(box))[node.name]
            assert published_allocated(state) == kubelet_held(node)
            assert pods_on(state) == {a.pod.uid for a in node.kubelet.admissions()}

            # After the outages the stream goes on: the extender's caches recovered, and its
            # prediction for a new pod is the agent's placement.
            doc = await schedule(box, "after", REPLICAS)
            bound += 1
            predicted = scoring.score_node(state, podrequests.decode_pod_request(doc), POLICY)
            await admit(node, doc)
            assert Counter(predicted.placement[SHARED_RESOURCE]) == kubelet_gpus(node, doc["metadata"]["uid"])

            match, mismatch = await wait_settled(box, bound)
            assert (match, mismatch) == (bound, 0)
            metrics = await extender_metrics(box)
            assert metrics["sharepack_extender_assumed_pods"] == 0  # every bound pod was reported

            async def pod_cache_recovered() -> bool:  # it watches pods again: it saw "after"
                return (await extender_metrics(box)).get("sharepack_extender_cache_pods") == bound

            await eventually(pod_cache_recovered, "the extender's pod cache to hold every bound pod")
            for kind, (down, up) in catch_up.items():
                print(f"\n{kind}: API away {down:.1f} s, published {up:.1f} s after resume", end="")
                assert up < WAIT_S
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_on_the_real_control_plane_pods_admitted_while_kube_apiserver_is_down_are_published_after() -> None:
    """The same outage with the real kube-apiserver stopped (nothing listens; etcd keeps the
    data) and kube-scheduler binding: pods bound before it are admitted during it, the agent
    fails to publish them, and once kube-apiserver is back the state catches up exactly, the
    extender's caches recover and its predictions match."""
    real_binaries()
    root = short_root("spoutr-")
    try:
        async with Sandbox(POLICY, 1, MACHINE, Workload(REPLICAS, ()), root, control_plane=demo.REAL) as box:
            assert box.real is not None
            await wait_stack_ready(box)
            node = box.nodes[0]
            # The kubelet's pod watch would admit the pods as soon as they are bound; the test
            # admits them itself, once kube-apiserver is down.
            await node.stop_watching_pods()
            docs = [await scheduled_by_kube_scheduler(box, f"down-{i}", 1) for i in range(PER_OUTAGE)]
            uids = {d["metadata"]["uid"] for d in docs}
            failures = publish_failures(box)
            await box.real.stop_apiserver()
            for doc in docs:
                assert await node.api.admit(doc) is None  # its status is written once the API is back
            assert all(len(node.kubelet.admission(u).held(SHARED_RESOURCE)) == 1 for u in uids)
            reply = await extender_post(box, "filter", {"Pod": docs[0], "NodeNames": [node.name], "Nodes": None})
            assert reply.get("NodeNames") == [node.name] and not reply.get("Error"), reply

            async def agent_failed_to_publish() -> bool:
                return publish_failures(box) >= failures + FAILED_WRITES

            await eventually(agent_failed_to_publish, "the agent to fail NodeGpuState writes")
            await box.real.start_apiserver()
            node.watch_pods()

            async def caught_up() -> bool:
                return uids <= pods_on((await node_states(box))[node.name])

            await eventually(caught_up, "the NodeGpuState to list the pods admitted during the outage")
            state = (await node_states(box))[node.name]
            assert published_allocated(state) == kubelet_held(node)

            # The stream goes on: kube-scheduler (maybe after taking its lease back) binds a new
            # pod through the extender, whose caches recovered; the prediction is the placement.
            doc = await scheduled_by_kube_scheduler(box, "after", REPLICAS)
            predicted = scoring.score_node(state, podrequests.decode_pod_request(doc), POLICY)
            uid = doc["metadata"]["uid"]

            async def admitted() -> bool:
                return any(a.pod.uid == uid for a in node.kubelet.admissions())

            await eventually(admitted, "the kubelet to admit the pod bound after the outage", timeout=60)
            assert Counter(predicted.placement[SHARED_RESOURCE]) == kubelet_gpus(node, uid)
            match, mismatch = await wait_settled(box, PER_OUTAGE + 1)
            assert (match, mismatch) == (PER_OUTAGE + 1, 0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def scheduled_by_kube_scheduler(box: Sandbox, name: str, replicas: int) -> dict[str, Any]:
    core: Any = kubernetes.client.CoreV1Api(box.api)
    await asyncio.to_thread(core.create_namespaced_pod, demo.NAMESPACE, pod_body(name, replicas))
    decision = await box.schedule(name)
    assert decision.node == box.nodes[0].name, decision
    return await read_pod(box, name)
