"""`sharepack status` and `sharepack explain` as an operator runs them: the CLI process against the
sandbox API server holding NodeGpuStates, Nodes and Pods, and `explain` against a real extender
process watching the same API server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from sharepack.common import state as published
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer

SHARED = "nvidia.com/gpu.shared"
ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 30.0

Gpu = tuple[int, int, int]  # total, allocated, unhealthy


def status_doc(gpus: list[Gpu], *, age_s: float = 0.0, pods: tuple[str, ...] = ()) -> dict[str, Any]:
    observed = datetime.fromtimestamp(time.time() - age_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return published.to_status(NodeState(
        observed, "0.1.0", Policy.PACKED, MigStrategy.NONE,
        (ResourceState(SHARED, Sharing.TIME_SLICING, False,
                       tuple(GpuState(f"GPU-{i}", str(i), "A100", t, a, u, pods if i == 0 else ())
                             for i, (t, a, u) in enumerate(gpus))),),
    ))  # fmt: skip


MAX_AGE_S = 5.0  # the extender's --state-max-age-seconds here
HEARTBEAT_S = 0.5  # how often the live agents of a test rewrite their states
NODES = ["node-a", "node-b", "node-c", "node-d", "node-e"]


def publish(server: FakeApiServer, node: str, status: dict[str, Any]) -> None:
    store, rt = server.store, kinds.NODE_GPU_STATES
    if ("", node) not in store.objects[rt]:
        store.create(rt, "", {"apiVersion": f"{published.GROUP}/{published.VERSION}",
                              "kind": published.KIND, "metadata": {"name": node}})  # fmt: skip
    obj = store.get(rt, "", node)
    obj["status"] = status
    store.update(rt, "", node, obj, "status")


def cluster(server: FakeApiServer) -> None:
    """node-a: no whole GPU free, 2 stranded; node-b: one whole GPU, 2 stranded; node-c: stale;
    node-d: written by an agent too new for us."""
    for name in ("node-a", "node-b", "node-c", "node-d", "node-e"):
        server.store.create(kinds.NODES, "", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    publish(server, "node-a", status_doc([(4, 4, 0), (4, 1, 1)], pods=("uid-running",)))
    publish(server, "node-b", status_doc([(4, 0, 0), (4, 2, 0)]))
    publish(server, "node-c", status_doc([(4, 0, 0), (4, 0, 0)], age_s=3600))
    publish(server, "node-d", {**status_doc([(4, 0, 0)]), "schemaVersion": 99})


EXPECTED_STATUS = (
    "node-a  nvidia.com/gpu.shared  GPU0 \u2588\u2588\u2588\u2588 4/4   GPU1 \u2588x\u2591\u2591 1/4\n"
    "node-b  nvidia.com/gpu.shared  GPU0 \u2591\u2591\u2591\u2591 0/4   GPU1 \u2588\u2588\u2591\u2591 2/4\n"
    "node-c  nvidia.com/gpu.shared  GPU0 \u2591\u2591\u2591\u2591 0/4   GPU1 \u2591\u2591\u2591\u2591 0/4  (stale: observed 60m ago)\n"
    "node-d  unreadable: unsupported NodeGpuState schemaVersion in NodeGpuState node-d status: 99 (this reader knows 1)\n"
    "\n"
    "1 whole GPU free of 4, 4 stranded replicas, 1 stale node, 1 unreadable node (2 fresh nodes counted)\n"
)


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    srv = FakeApiServer(bookmark_interval=0.2)
    await srv.start()
    try:
        cluster(srv)
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
def kubeconfig(server: FakeApiServer, tmp_short: Path) -> Path:
    return server.write_kubeconfig(tmp_short / "kubeconfig")


async def sharepack(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sharepack.cli", *args, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), DEADLINE_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# --- status -------------------------------------------------------------------------------------


async def test_status_draws_the_bars_and_the_totals(kubeconfig: Path) -> None:
    code, out, err = await sharepack("--kubeconfig", str(kubeconfig), "status")
    assert (code, err) == (0, "")
    assert out == EXPECTED_STATUS


async def test_status_reads_the_kubeconfig_from_the_environment_as_kubectl_does(kubeconfig: Path) -> None:
    code, out, _ = await sharepack("status", env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    assert (code, out) == (0, EXPECTED_STATUS)


async def test_status_as_json(kubeconfig: Path) -> None:
    code, out, _ = await sharepack("--kubeconfig", str(kubeconfig), "status", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["totals"] == {
        "nodes": 4, "freshNodes": 2, "staleNodes": 1, "unreadableNodes": 1, "gpus": 4, "wholeGpusFree": 1,
        "strandedReplicas": 4,
    }  # fmt: skip
    by_name = {n["name"]: n for n in doc["nodes"]}
    assert [n["name"] for n in doc["nodes"]] == ["node-a", "node-b", "node-c", "node-d"]
    a = by_name["node-a"]
    assert (a["wholeGpusFree"], a["strandedReplicas"], a["used"], a["total"], a["stale"]) == (0, 2, 5, 8, False)
    assert a["resources"][0]["gpus"][1] == {
        "index": "1", "key": "GPU-1", "product": "A100", "allocated": 1, "unhealthy": 1, "total": 4,
    }  # fmt: skip
    assert by_name["node-c"]["stale"] is True and by_name["node-c"]["ageSeconds"] >= 3600
    assert by_name["node-d"] == {
        "name": "node-d",
        "error": "unsupported NodeGpuState schemaVersion in NodeGpuState node-d status: 99 (this reader knows 1)",
    }


async def test_stale_after_zero_counts_every_readable_node(kubeconfig: Path) -> None:
    code, out, _ = await sharepack("status", "-o", "json", "--stale-after", "0", "--kubeconfig", str(kubeconfig))
    assert code == 0
    totals = json.loads(out)["totals"]
    assert (totals["staleNodes"], totals["wholeGpusFree"], totals["gpus"]) == (0, 3, 6)


async def test_status_watch_redraws_on_a_change(server: FakeApiServer, kubeconfig: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sharepack.cli", "--kubeconfig", str(kubeconfig), "status", "--watch", "-o", "json",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(DEADLINE_S):
            first = json.loads(await proc.stdout.readline())
            assert first["totals"]["wholeGpusFree"] == 1
            publish(server, "node-b", status_doc([(4, 1, 0), (4, 2, 0)]))  # its whole GPU gets a pod
            while True:
                doc = json.loads(await proc.stdout.readline())
                if doc["totals"]["wholeGpusFree"] == 0:
                    break
            assert doc["totals"]["strandedReplicas"] == 2 + 3 + 2
    finally:
        proc.terminate()
        await proc.wait()


async def test_a_missing_kubeconfig_is_one_line_naming_it(tmp_short: Path) -> None:
    missing = tmp_short / "nope"
    code, out, err = await sharepack("--kubeconfig", str(missing), "status")
    assert (code, out) == (1, "")
    assert err.startswith(f"sharepack: cannot load kubeconfig {missing}: ") and err.count("\n") == 1


async def test_an_unreachable_api_server_is_one_line(server: FakeApiServer, kubeconfig: Path) -> None:
    await server.pause("unavailable")
    code, _, err = await sharepack("--kubeconfig", str(kubeconfig), "status")
    assert code == 1
    assert err.startswith("sharepack: cannot read nodegpustates: 503") and err.count("\n") == 1


def test_the_cli_is_installed_as_sharepack_and_as_a_kubectl_plugin() -> None:
    scripts = {e.name: e.value for e in metadata.entry_points(group="console_scripts") if e.value.startswith("sharepack.cli.")}
    assert scripts == {"sharepack": "sharepack.cli.__main__:main", "kubectl-sharepack": "sharepack.cli.__main__:main"}


# --- explain ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def extender(server: FakeApiServer, kubeconfig: Path, tmp_short: Path) -> AsyncIterator[str]:
    # The extender judges a state stale by its own clock, from when it saw the state change: a
    # short max age lets a test make node-c stale by refreshing every other node after it.
    port = free_port()
    log = (tmp_short / "extender.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sharepack.extender", "--listen", f"127.0.0.1:{port}", "--kubeconfig", str(kubeconfig),
        "--insecure-http", f"--state-max-age-seconds={MAX_AGE_S}",
        # Every feasible node passes (no best tier): what explain says of each node's knowledge.
        "--node-policy", "packed", "--filter-tier-width=0", cwd=ROOT, stdout=log, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(DEADLINE_S):
            while True:  # serving, and its state list is in (an empty answer: no resource known yet)
                try:
                    async with http.post(f"{url}/explain", data=explain_args(["node-b"])) as resp:
                        nodes = (await resp.json())["nodes"] if resp.status == 200 else []
                        if nodes and nodes[0]["knowledge"] == "published":
                            break
                except aiohttp.ClientError:
                    pass
                assert proc.returncode is None, (tmp_short / "extender.log").read_text()
                await asyncio.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        await proc.wait()
        log.close()


def explain_args(nodes: list[str]) -> bytes:
    pod = {"metadata": {"name": "probe", "namespace": "default", "uid": "uid-probe"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {SHARED: "1"}}}]}}  # fmt: skip
    return json.dumps({"Pod": pod, "NodeNames": nodes}).encode()


def create_pod(server: FakeApiServer, name: str, replicas: int, node: str = "", affinity: dict[str, Any] | None = None) -> None:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda",
                                            "resources": {"limits": {SHARED: str(replicas), "cpu": "1"}}}]}  # fmt: skip
    if node:
        spec["nodeName"] = node
    if affinity:
        spec["affinity"] = affinity
    server.store.create(kinds.PODS, "default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec,
    })  # fmt: skip


def refresh_all_but_node_c(server: FakeApiServer) -> None:
    """Every readable node but node-c writes its state again (a new observedAt), as a live
    agent's heartbeat does; node-c's agent has gone quiet."""
    for node in ("node-a", "node-b", "node-d"):
        status = server.store.get(kinds.NODE_GPU_STATES, "", node)["status"]
        publish(server, node, {**status, "observedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")})


async def explained(extender: str) -> dict[str, str]:
    """Node -> what the extender knows of it now (its /explain, as the CLI asks it)."""
    async with aiohttp.ClientSession() as http, http.post(f"{extender}/explain", data=explain_args(NODES)) as resp:
        return {n["node"]: n["knowledge"] for n in (await resp.json())["nodes"]} if resp.status == 200 else {}


@contextlib.asynccontextmanager
async def live_agents(server: FakeApiServer) -> AsyncIterator[None]:
    """Every agent but node-c's beats (a new observedAt every HEARTBEAT_S, as live agents do)
    until the block ends: however slow the machine, no live node ages past the max age."""

    async def beat() -> None:
        while True:
            refresh_all_but_node_c(server)
            await asyncio.sleep(HEARTBEAT_S)

    beating = asyncio.create_task(beat())
    try:
        yield
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating


@contextlib.asynccontextmanager
async def only_node_c_silent(server: FakeApiServer, extender: str) -> AsyncIterator[None]:
    """`live_agents`, entered once the extender sees node-c stale (a condition, not a sleep)."""
    async with live_agents(server):
        async with asyncio.timeout(MAX_AGE_S + DEADLINE_S):
            while (await explained(extender)).get("node-c") != "stale":
                await asyncio.sleep(0.1)
        yield


async def test_explain_a_pending_pod_lists_every_node_best_first(server: FakeApiServer, kubeconfig: Path, extender: str) -> None:
    create_pod(server, "trainer", 3)
    async with only_node_c_silent(server, extender):
        await pending_pod_explained(kubeconfig, extender)


async def pending_pod_explained(kubeconfig: Path, extender: str) -> None:
    code, out, err = await sharepack("--kubeconfig", str(kubeconfig), "explain", "trainer", "--extender-url", extender, "-o", "json")
    assert (code, err) == (0, "")
    answer = json.loads(out)
    assert (answer["pod"]["name"], answer["phase"], answer["boundTo"], answer["request"]) == ("trainer", "Pending", "", {SHARED: 3})
    by_node = {n["node"]: (n["filter"], n["knowledge"]) for n in answer["nodes"]}
    assert by_node == {
        "node-a": ("fail", "published"),  # 2 replicas free, on one GPU
        "node-b": ("pass", "published"),
        "node-c": ("pass", "stale"),
        "node-d": ("pass", "unreadable"),
        "node-e": ("pass", "unknown"),
    }
    scores = {n["node"]: n["score"] for n in answer["nodes"]}
    assert scores["node-b"] > 0 and scores["node-c"] == scores["node-d"] == scores["node-e"] == 0

    code, text, _ = await sharepack("--kubeconfig", str(kubeconfig), "explain", "trainer", "--extender-url", extender)
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == f"pod default/trainer (pending) requests {SHARED}=3"
    assert lines[1].split() == ["NODE", "FILTER", "SCORE", "STATE", "REASON"]
    assert [line.split()[:4] for line in lines[2:6]] == [
        ["node-b", "pass", str(scores["node-b"]), "published"],
        ["node-c", "pass", "0", "stale"],
        ["node-d", "pass", "0", "unreadable"],
        ["node-e", "pass", "0", "unknown"],
    ]
    reason = next(n["reason"] for n in answer["nodes"] if n["node"] == "node-a")
    assert lines[6] == f"node-a  fail              -  published   {reason}"


async def test_explain_a_bound_pod_marks_its_node(server: FakeApiServer, kubeconfig: Path, extender: str) -> None:
    create_pod(server, "running", 1, node="node-a")
    code, text, _ = await sharepack("--kubeconfig", str(kubeconfig), "explain", "running", "--extender-url", extender)
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == f"pod default/running (bound to node-a) requests {SHARED}=1"
    assert lines[1] == "(* node-a already counts this pod, so it is judged with the pod on it)"
    assert any(line.startswith("node-a *  pass") for line in lines), text


async def test_explain_lists_nodes_the_pods_gpu_model_affinity_rules_out(
    server: FakeApiServer, kubeconfig: Path, extender: str
) -> None:
    """kube-scheduler's NodeAffinity filter runs before the extender: explain says so for the
    nodes whose `nvidia.com/gpu.product` label the pod does not allow, and asks about the rest."""
    node = server.store.get(kinds.NODES, "", "node-b")
    server.store.update(kinds.NODES, "", "node-b", {**node, "metadata": {**node["metadata"], "labels": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}})  # fmt: skip
    term = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}]}
    create_pod(server, "a100-only", 1, affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}})  # fmt: skip
    code, out, err = await sharepack("--kubeconfig", str(kubeconfig), "explain", "a100-only", "--extender-url", extender, "-o", "json")
    assert (code, err) == (0, "")
    by_node = {n["node"]: n["filter"] for n in json.loads(out)["nodes"]}
    assert by_node == {"node-a": "affinity", "node-b": "pass", "node-c": "affinity", "node-d": "affinity", "node-e": "affinity"}
    code, text, _ = await sharepack("--kubeconfig", str(kubeconfig), "explain", "a100-only", "--extender-url", extender)
    line = next(line for line in text.splitlines() if line.startswith("node-a "))
    assert line.split()[:3] == ["node-a", "affinity", "-"] and "GPU model (no nvidia.com/gpu.product label) not among" in line


async def test_explain_of_a_missing_pod_or_extender_is_one_line(server: FakeApiServer, kubeconfig: Path) -> None:
    code, _, err = await sharepack("--kubeconfig", str(kubeconfig), "explain", "ghost", "--extender-url", "http://127.0.0.1:1")
    assert code == 1
    assert err.startswith("sharepack: cannot read pod default/ghost: 404") and err.count("\n") == 1
    create_pod(server, "trainer", 1)
    url = f"http://127.0.0.1:{free_port()}"
    code, _, err = await sharepack("--kubeconfig", str(kubeconfig), "explain", "trainer", "--extender-url", url)
    assert code == 1
    assert err.startswith(f"sharepack: cannot reach the extender at {url}/explain: ") and err.count("\n") == 1


async def test_explain_reaches_the_extender_through_the_api_servers_service_proxy(
    server: FakeApiServer, kubeconfig: Path, extender: str, tmp_short: Path
) -> None:
    """Without --extender-url the CLI calls services/<name>:http/proxy/explain on the API server
    with the kubeconfig's credentials, as the API server's service proxy expects. The sandbox API
    server has no proxy: a front server here plays it, handing every other path to the sandbox."""
    proxy_path = "/api/v1/namespaces/sharepack-system/services/sharepack-extender:http/proxy/explain"
    proxied: list[str] = []
    no_endpoints = False

    async def front(request: web.Request) -> web.Response:
        body = await request.read()
        async with aiohttp.ClientSession() as http:
            if request.path == proxy_path:
                proxied.append(request.headers.get("Authorization", ""))
                if no_endpoints:  # what the API server answers while no extender pod is ready
                    return web.Response(status=503, text='no endpoints available for service "sharepack-extender"')
                target = f"{extender}/explain"
            else:
                target = f"{server.url}{request.path_qs}"
            async with http.request(request.method, target, data=body,
                                    headers={"Content-Type": request.content_type}) as resp:  # fmt: skip
                return web.Response(status=resp.status, body=await resp.read(), content_type=resp.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", front)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        doc = yaml.safe_load(kubeconfig.read_text())
        doc["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{port}"
        fronted = tmp_short / "fronted-kubeconfig"
        fronted.write_text(yaml.safe_dump(doc))
        create_pod(server, "trainer", 3)
        async with live_agents(server):  # node-a stays fresh, so its verdict is its own
            code, out, err = await sharepack("--kubeconfig", str(fronted), "explain", "trainer", "-o", "json")
        assert (code, err) == (0, "")
        assert proxied == ["Bearer sandbox"]
        assert {n["node"]: n["filter"] for n in json.loads(out)["nodes"]}["node-a"] == "fail"
        no_endpoints = True
        code, out, err = await sharepack("--kubeconfig", str(fronted), "explain", "trainer")
        assert (code, out) == (1, "")
        assert err == (f"sharepack: extender through the API server ({proxy_path}): "
                       '503 no endpoints available for service "sharepack-extender"\n')  # fmt: skip
    finally:
        await runner.cleanup()
