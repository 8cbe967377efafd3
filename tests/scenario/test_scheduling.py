"""sandbox.scheduling: the scheduler driver calls an extender as kube-scheduler does. The extender
here is a local HTTP server whose answers each test sets; the API server is the sandbox's."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes
import pytest
from aiohttp import web

from sharepack.sandbox.apiserver.server import FakeApiServer
from sharepack.sandbox.scheduling import ExtenderConfig, SchedulerDriver

RESOURCE = "nvidia.com/gpu.shared"
Answer = Callable[[dict[str, Any]], web.Response]


@dataclass
class Cluster:
    server: FakeApiServer
    api: Any
    extender_url: str
    session: aiohttp.ClientSession
    answers: dict[str, Answer] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def driver(self, **extender: Any) -> SchedulerDriver:
        return SchedulerDriver(self.api, self.session, ExtenderConfig(self.extender_url, **extender), seed=0)

    async def pod(self, name: str, count: int) -> None:
        body = {
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {RESOURCE: str(count)}}}]},
        }
        await asyncio.to_thread(kubernetes.client.CoreV1Api(self.api).create_namespaced_pod, "default", body)

    async def node_of(self, name: str) -> str | None:
        pod = await asyncio.to_thread(kubernetes.client.CoreV1Api(self.api).read_namespaced_pod, name, "default")
        return str(pod.spec.node_name) if pod.spec.node_name else None


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with FakeApiServer() as server:
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            api = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(server.write_kubeconfig(Path(d) / "kubeconfig"))
            )
        core: Any = kubernetes.client.CoreV1Api(api)
        for name, count in (("small", "1"), ("big-a", "8"), ("big-b", "8")):
            node = {"metadata": {"name": name}, "status": {"allocatable": {RESOURCE: count, "cpu": "8"}}}
            await asyncio.to_thread(core.create_node, node)
        holder: list[Cluster] = []

        async def handle(request: web.Request) -> web.Response:
            verb = request.match_info["verb"]
            holder[0].calls.append(verb)
            return holder[0].answers[verb](await request.json())

        app = web.Application()
        app.router.add_post("/{verb}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session:
                holder.append(Cluster(server, api, f"http://127.0.0.1:{port}", session))
                yield holder[0]
        finally:
            await runner.cleanup()
            api.close()


def keep_all(args: dict[str, Any]) -> web.Response:
    return web.json_response({"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""})


def prefer(node: str) -> Answer:
    return lambda args: web.json_response([{"Host": n, "Score": 10 if n == node else 1} for n in args["NodeNames"]])


def failing(args: dict[str, Any]) -> web.Response:
    return web.Response(status=500, text="extender broke")


async def test_nodes_without_enough_of_the_resource_never_reach_the_extender(cluster: Cluster) -> None:
    cluster.answers |= {"filter": keep_all, "prioritize": prefer("big-b")}
    await cluster.pod("p", 2)
    decision = await cluster.driver(bind=False).schedule("default", "p")
    assert decision.node == "big-b"
    assert decision.feasible == ("big-a", "big-b")
    # score x weight x 10, as kube-scheduler adds an extender's priority
    assert decision.scores == {"big-a": 1 * 5 * 10, "big-b": 10 * 5 * 10}
    assert await cluster.node_of("p") == "big-b"


async def test_nodes_the_extender_filters_out_are_not_chosen_and_their_reasons_are_kept(cluster: Cluster) -> None:
    def only_big_a(args: dict[str, Any]) -> web.Response:
        return web.json_response({"NodeNames": ["big-a"], "FailedNodes": {"big-b": "no whole GPU"}})

    cluster.answers |= {"filter": only_big_a, "prioritize": prefer("big-b")}
    await cluster.pod("p", 2)
    decision = await cluster.driver(bind=False).schedule("default", "p")
    assert decision.node == "big-a"
    assert cluster.calls == ["filter"]  # one node left: the scheduler skips prioritize


async def test_a_prioritize_error_is_ignored_even_when_the_extender_is_not_ignorable(cluster: Cluster) -> None:
    cluster.answers |= {"filter": keep_all, "prioritize": failing}
    await cluster.pod("p", 2)
    decision = await cluster.driver(bind=False, ignorable=False).schedule("default", "p")
    assert decision.node in ("big-a", "big-b"), decision.reason
    assert decision.scores == {"big-a": 0, "big-b": 0}


@pytest.mark.parametrize("ignorable", [True, False], ids=["ignorable: scheduled without it", "not ignorable: not placed"])
async def test_a_filter_error_follows_the_ignorable_setting(cluster: Cluster, ignorable: bool) -> None:
    cluster.answers |= {"filter": failing}
    await cluster.pod("p", 2)
    decision = await cluster.driver(bind=False, ignorable=ignorable).schedule("default", "p")
    if ignorable:
        assert decision.node in ("big-a", "big-b")
    else:
        assert decision.node is None
        assert "extender failed: extender filter: HTTP 500: extender broke" in decision.reason


async def test_an_infeasible_pod_names_each_node_and_why(cluster: Cluster) -> None:
    await cluster.pod("p", 9)
    decision = await cluster.driver(bind=False).schedule("default", "p")
    assert decision.node is None
    assert decision.reason == (
        f"0/3 nodes are available: big-a: Insufficient {RESOURCE}; big-b: Insufficient {RESOURCE}; "
        f"small: Insufficient {RESOURCE}"
    )
    assert cluster.calls == []


async def test_binding_goes_through_the_extenders_bind_verb_when_it_has_one(cluster: Cluster) -> None:
    bound: list[dict[str, Any]] = []

    def bind(args: dict[str, Any]) -> web.Response:
        bound.append(args)
        return web.json_response({"Error": ""})

    cluster.answers |= {"filter": keep_all, "prioritize": prefer("big-a"), "bind": bind}
    await cluster.pod("p", 2)
    decision = await cluster.driver(bind=True).schedule("default", "p")
    assert decision.node == "big-a"
    assert [(b["PodName"], b["PodNamespace"], b["Node"]) for b in bound] == [("p", "default", "big-a")]
    assert await cluster.node_of("p") is None  # our fake extender did not bind it
