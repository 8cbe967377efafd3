"""/bind binds only what the extender scored, against the real extender process over mutual
TLS: the sandbox scheduler driver schedules through it; a /bind for a pod it never scored, to a
node outside the feasible set, for a pod of another scheduler or for a pod already bound is
refused with the rule in the Binding error, the pod keeps its node (or none), and the refusal is
counted. Two replicas: a bind that reaches the replica that did not score the pod succeeds on
that replica's own re-check, and that re-check refuses what the scheduler would never send."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.scheduling import ExtenderConfig, SchedulerDriver
from tests.security.stack import SHARED, Stack, create_pod, metrics, node_of, stack, start_extender

pytestmark = pytest.mark.timeout(120)

# node-full: every replica taken; node-free: two empty GPUs.
NODES = {"node-full": [(4, 4), (4, 4)], "node-free": [(4, 0), (4, 0)]}
NAMES = list(NODES)


@pytest.fixture
async def served(tmp_short: Path) -> AsyncIterator[Stack]:
    async with stack(tmp_short, NODES) as s:
        for name in NODES:  # what the driver's in-tree filter reads
            s.server.store.create(kinds.NODES, "", {"metadata": {"name": name},
                                                    "status": {"allocatable": {SHARED: "8", "cpu": "8"}}})  # fmt: skip
        yield s


async def filtered(s: Stack, pod: dict[str, Any], *, to: Any = None) -> list[str]:
    """What kube-scheduler sends first: /filter with the candidates; returns the survivors."""
    reply = await s.post("filter", {"Pod": pod, "NodeNames": NAMES, "Nodes": None}, to=to)
    return list(reply["NodeNames"])


async def refusals(s: Stack, *, of: Any = None) -> dict[str, float]:
    prefix = "sharepack_extender_bind_refusals_total"
    return {k: v for k, v in (await metrics(of or s.extender)).items() if k.startswith(prefix)}


async def test_the_scheduler_driver_schedules_and_binds_through_mutual_tls(served: Stack) -> None:
    create_pod(served.server, "trainer", 2)
    api = kubernetes.config.new_client_from_config(config_file=str(served.kubeconfig))  # type: ignore[no-untyped-call]
    try:
        driver = SchedulerDriver(
            api, served.scheduler,
            ExtenderConfig(served.extender.url, ignorable=False, tls=served.tls.client_context()),
        )  # fmt: skip
        decision = await driver.schedule("default", "trainer")
    finally:
        await asyncio.to_thread(api.close)
    assert (decision.node, decision.feasible) == ("node-free", ("node-free",))
    assert node_of(served.server, "trainer") == "node-free"
    assert (await metrics(served.extender))['sharepack_extender_binds_total{result="success"}'] == 1


@dataclass(frozen=True)
class Case:
    replicas: int
    node: str
    error: Callable[[str], str]  # the pod's UID -> the Binding error
    spec: dict[str, Any]
    score: bool = True  # run /filter first, as kube-scheduler does
    bound_to: str = ""  # bound through the API after the filter, before /bind
    forged: int = 0  # > 0: the /filter body claims this many replicas instead of the pod's own


CASES = [
    pytest.param(Case(2, "node-free", lambda uid: "sharepack: bind refused (not-scored): this extender did not filter "
                      f"or prioritize pod default/p (UID {uid}) in the last 660 s", {}, score=False),
                 id="a pod the extender never scored"),
    pytest.param(Case(2, "node-full", lambda uid: "sharepack: bind refused (node-not-feasible): node node-full is not "
                      "among the nodes this extender found feasible for pod default/p", {}),
                 id="a node outside the feasible set"),
    pytest.param(Case(2, "node-free", lambda uid: "sharepack: bind refused (scheduler-not-served): pod default/p names "
                      "schedulerName 'other-scheduler'; this extender serves ['default-scheduler']",
                      {"schedulerName": "other-scheduler"}),
                 id="a pod of another scheduler"),
    pytest.param(Case(2, "node-free", lambda uid: "sharepack: bind refused (already-bound): pod default/p is already "
                      "bound to node node-full", {}, bound_to="node-full"),
                 id="a pod already bound"),
    pytest.param(Case(0, "node-free", lambda uid: "sharepack: bind refused (no-gpu-request): pod default/p requests no "
                      "resource an agent publishes: it is not this extender's to bind", {}, forged=2),
                 id="a pod that requests no GPU, after a forged filter that said it did"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
async def test_bind_refuses_naming_the_rule_and_leaves_the_pod_where_it_was(served: Stack, case: Case) -> None:
    pod = create_pod(served.server, "p", case.replicas, **case.spec)
    if case.score:
        claimed = pod
        if case.forged:
            claimed = {**pod, "spec": {**pod["spec"], "containers": [
                {"name": "main", "resources": {"limits": {SHARED: str(case.forged)}}}]}}
        assert await filtered(served, claimed) == ["node-free"]
    if case.bound_to:
        served.server.store.bind("default", "p", {"target": {"name": case.bound_to}})
    rule = case.error("")[len("sharepack: bind refused ("):].split(")")[0]
    assert await served.bind(pod, case.node) == case.error(pod["metadata"]["uid"])
    assert node_of(served.server, "p") == case.bound_to
    assert await refusals(served) == {f'sharepack_extender_bind_refusals_total{{rule="{rule}"}}': 1}


async def test_a_second_replica_binds_what_the_first_scored_after_its_own_recheck(served: Stack) -> None:
    replica = await start_extender(served.root, served.kubeconfig, served.tls, len(NODES), "--unscored-binds=recheck")
    try:
        scored = create_pod(served.server, "scored", 2)
        assert await filtered(served, scored) == ["node-free"]  # on the first replica
        assert await served.bind(scored, "node-free", to=replica) == ""
        assert node_of(served.server, "scored") == "node-free"

        # The re-check refuses what kube-scheduler would not send, with the reason.
        victim = create_pod(served.server, "victim", 0, nodeSelector={"no-such-label": "x"})
        assert await served.bind(victim, "node-free", to=replica) == (
            "sharepack: bind refused (no-gpu-request): pod default/victim requests no resource an agent publishes: "
            "it is not this extender's to bind")  # fmt: skip
        squeezed = create_pod(served.server, "squeezed", 2)
        error = await served.bind(squeezed, "node-full", to=replica)
        assert error.startswith("sharepack: bind refused (node-not-feasible): node node-full does not pass the "
                                "filter for pod default/squeezed: ")  # fmt: skip
        assert (node_of(served.server, "victim"), node_of(served.server, "squeezed")) == ("", "")
        assert await refusals(served, of=replica) == {
            'sharepack_extender_bind_refusals_total{rule="no-gpu-request"}': 1,
            'sharepack_extender_bind_refusals_total{rule="node-not-feasible"}': 1,
        }
    finally:
        await replica.process.stop()
