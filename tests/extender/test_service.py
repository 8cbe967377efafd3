"""The whole extender process against the sandbox API server, through the real kubernetes client:
informers (list + watch, reconnect), /bind creating the Binding, assumptions and predictions."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from kubernetes import config

from sharepack.common import state as published
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.extender.__main__ import Options, Service, parse_args, run
from sharepack.extender.metrics import parse_text
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer

SHARED = "nvidia.com/gpu.shared"


def now_rfc3339() -> str:
    # Fresh, as a live agent writes it: older than --state-max-age-seconds would be stale.
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(gpus: list[tuple[int, int, tuple[str, ...]]]) -> dict[str, Any]:
    return published.to_status(NodeState(
        now_rfc3339(), "0.1.0", Policy.PACKED, MigStrategy.NONE,
        (ResourceState(SHARED, Sharing.TIME_SLICING, False,
                       tuple(GpuState(f"GPU-{i}", str(i), "A100", t, a, 0, pods)
                             for i, (t, a, pods) in enumerate(gpus))),),
    ))  # fmt: skip


def publish(server: FakeApiServer, node: str, gpus: list[tuple[int, int, tuple[str, ...]]]) -> None:
    """What a node's agent does: create its NodeGpuState once, then write its status."""
    store, rt = server.store, kinds.NODE_GPU_STATES
    if ("", node) not in store.objects[rt]:
        store.create(rt, "", {"apiVersion": f"{published.GROUP}/{published.VERSION}",
                              "kind": published.KIND, "metadata": {"name": node}})  # fmt: skip
    obj = store.get(rt, "", node)
    obj["status"] = status(gpus)
    store.update(rt, "", node, obj, "status")


def create_pod(server: FakeApiServer, name: str, n: int = 1) -> str:
    pod = server.store.create(kinds.PODS, "default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "cuda",
                                 "resources": {"limits": {SHARED: str(n)}, "requests": {SHARED: str(n)}}}]},
    })  # fmt: skip
    return str(pod["metadata"]["uid"])


@pytest.fixture
async def service(server: FakeApiServer, tmp_short: Path) -> AsyncIterator[Service]:
    publish(server, "node-a", [(4, 1, ("old",)), (4, 0, ())])
    publish(server, "node-b", [(4, 0, ()), (4, 0, ())])
    kubeconfig = server.write_kubeconfig(tmp_short / "kubeconfig")
    api = config.new_client_from_config(config_file=str(kubeconfig))
    svc = Service(Options(listen="127.0.0.1:0", kubeconfig=str(kubeconfig), assume_ttl_s=30.0), api=api)
    for informer in svc.informers:
        informer.backoff_initial_s = 0.05
        informer.watch_timeout_s = 5.0
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()
        api.close()


async def until(svc: Service, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for a cache change that makes `cond` true (woken by the view, not by polling)."""
    changed = asyncio.Event()
    svc.view.on_change = changed.set
    try:
        async with asyncio.timeout(timeout):
            while not cond():
                changed.clear()
                await changed.wait()
    finally:
        svc.view.on_change = None


async def call(svc: Service, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        data = orjson.dumps(body) if body is not None else None
        async with http.request(method, f"http://127.0.0.1:{svc.port}{path}", data=data) as resp:
            raw = await resp.read()
            try:
                return resp.status, orjson.loads(raw)
            except orjson.JSONDecodeError:
                return resp.status, raw.decode()


def allocated(svc: Service, node: str) -> list[int]:
    return [g.allocated for g in svc.view.scorers[node].state.resources[0].gpus]


async def synced(svc: Service) -> None:
    for informer in svc.informers:
        await asyncio.wait_for(informer.synced.wait(), 30)


async def test_the_caches_list_and_become_ready(service: Service) -> None:
    await synced(service)
    assert (await call(service, "GET", "/readyz"))[0] == 200
    await until(service, lambda: set(service.view.scorers) == {"node-a", "node-b"})
    assert allocated(service, "node-a") == [1, 0]


async def test_bind_creates_the_binding_and_counts_the_pod_at_once(server: FakeApiServer, service: Service) -> None:
    await synced(service)
    await until(service, lambda: "node-a" in service.view.scorers)
    uid = create_pod(server, "trainer-0")
    pod = server.store.get(kinds.PODS, "default", "trainer-0")
    status_code, scores = await call(service, "POST", "/prioritize", {"Pod": pod, "NodeNames": ["node-a", "node-b"]})
    assert status_code == 200
    assert max(scores, key=lambda p: p["Score"])["Host"] == "node-a"

    code, reply = await call(service, "POST", "/bind",
                             {"PodName": "trainer-0", "PodNamespace": "default", "PodUID": uid, "Node": "node-a"})
    assert (code, reply) == (200, {"Error": ""})
    assert server.store.get(kinds.PODS, "default", "trainer-0")["spec"]["nodeName"] == "node-a"
    assert allocated(service, "node-a") == [2, 0]  # counted before any watch event
    assert service.view.assumed[uid].placement == {SHARED: ("GPU-0",)}

    # The agent reports the pod where predicted: the assumption settles as a match.
    publish(server, "node-a", [(4, 2, ("old", uid)), (4, 0, ())])
    await until(service, lambda: uid not in service.view.assumed)
    assert allocated(service, "node-a") == [2, 0]
    _, text = await call(service, "GET", "/metrics")
    samples = parse_text(text)
    assert samples['sharepack_extender_predictions_total{outcome="match"}'] == 1
    assert samples['sharepack_extender_binds_total{result="success"}'] == 1


async def test_bind_reads_the_pod_from_the_api_and_refuses_what_it_cannot_bind(
    server: FakeApiServer, service: Service
) -> None:
    await synced(service)
    await until(service, lambda: "node-b" in service.view.scorers)
    uid = create_pod(server, "fresh", n=2)
    pod = server.store.get(kinds.PODS, "default", "fresh")
    # node-b alone: the shipped tier (the best node only) passes one of several.
    code, _ = await call(service, "POST", "/filter", {"Pod": pod, "NodeNames": ["node-b"]})
    assert code == 200
    code, reply = await call(service, "POST", "/bind",
                             {"PodName": "fresh", "PodNamespace": "default", "PodUID": uid, "Node": "node-b"})
    assert (code, reply["Error"]) == (200, "")
    assert sum(allocated(service, "node-b")) == 2
    # Binding it again: the pod as the API has it is bound; refused before the API is asked.
    code, reply = await call(service, "POST", "/bind",
                             {"PodName": "fresh", "PodNamespace": "default", "PodUID": uid, "Node": "node-a"})
    assert (code, reply["Error"]) == (
        200, "sharepack: bind refused (already-bound): pod default/fresh is already bound to node node-b")
    code, reply = await call(service, "POST", "/bind",
                             {"PodName": "ghost", "PodNamespace": "default", "PodUID": "x", "Node": "node-a"})
    assert code == 200 and reply["Error"].startswith("sharepack: bind refused (pod-unreadable): reading pod "
                                                     "default/ghost failed: API answered 404")  # fmt: skip
    assert server.store.get(kinds.PODS, "default", "fresh")["spec"]["nodeName"] == "node-b"


async def test_a_bind_the_api_refuses_leaves_nothing_counted(server: FakeApiServer, service: Service) -> None:
    """The pod is counted before the Binding is written (as kube-scheduler assumes before it
    binds); when the write fails, the count goes again."""
    await synced(service)
    await until(service, lambda: "node-a" in service.view.scorers)
    before = allocated(service, "node-a")
    uid = create_pod(server, "refused")
    pod = server.store.get(kinds.PODS, "default", "refused")
    await call(service, "POST", "/prioritize", {"Pod": pod, "NodeNames": ["node-a"]})
    binder = service.extender.binder
    assert binder is not None
    binder = getattr(binder, "_inner", binder)  # the one writing the Binding, under directing
    during: list[list[int]] = []
    write = binder.bind

    async def observed_bind(args: Any, annotations: Any = None) -> None:
        during.append(allocated(service, "node-a"))
        await write(args, annotations)

    binder.bind = observed_bind  # type: ignore[method-assign]
    server.fail_next("POST", "binding", 500)
    code, reply = await call(service, "POST", "/bind",
                             {"PodName": "refused", "PodNamespace": "default", "PodUID": uid, "Node": "node-a"})
    assert code == 200 and "500" in reply["Error"]
    assert [sum(a) for a in during] == [sum(before) + 1]  # counted while the write was in flight
    assert uid not in service.view.assumed
    assert allocated(service, "node-a") == before


async def test_a_pod_bound_by_the_scheduler_itself_is_assumed_from_the_pod_watch(
    server: FakeApiServer, service: Service
) -> None:
    await synced(service)
    uid = create_pod(server, "self-bound")
    server.store.bind("default", "self-bound", {"target": {"name": "node-b"}})
    await until(service, lambda: uid in service.view.assumed)
    assert sum(allocated(service, "node-b")) == 1
    server.store.delete(kinds.PODS, "default", "self-bound")
    await until(service, lambda: uid not in service.view.assumed)
    assert sum(allocated(service, "node-b")) == 0


async def eventually(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll a condition the informer threads change (they do not wake the loop themselves)."""
    try:
        async with asyncio.timeout(timeout):
            while not cond():
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"not within {timeout} s: {what}")


async def test_the_informers_relist_after_an_api_outage_and_see_what_changed_during_it(
    server: FakeApiServer, service: Service
) -> None:
    await synced(service)
    lists = [i.lists for i in service.informers]
    errors = [i.errors for i in service.informers]
    await server.pause("refuse")
    # The outage outlasts a retry: every informer fails to reconnect at least twice.
    await eventually(lambda: all(i.errors >= e + 2 for i, e in zip(service.informers, errors)),
                     "two failed reconnects per informer")  # fmt: skip
    # Changes the watches cannot deliver: only a relist can find them.
    publish(server, "node-a", [(4, 3, ("new",)), (4, 0, ())])
    server.store.delete(kinds.NODE_GPU_STATES, "", "node-b")
    publish(server, "node-c", [(4, 0, ())])
    assert sorted(service.view.scorers) == ["node-a", "node-b"] and allocated(service, "node-a") == [1, 0]
    assert [i.lists for i in service.informers] == lists, "no list succeeds while the api is down"
    await server.resume()
    await until(service, lambda: sorted(service.view.scorers) == ["node-a", "node-c"])
    assert allocated(service, "node-a") == [3, 0]
    await eventually(lambda: all(i.lists == n + 1 for i, n in zip(service.informers, lists)),
                     "one relist per informer")  # fmt: skip
    # Then the watches are back: a later change arrives as an event, without another list.
    publish(server, "node-d", [(4, 0, ())])
    await until(service, lambda: "node-d" in service.view.scorers)
    assert [i.lists for i in service.informers] == [n + 1 for n in lists]


async def test_without_api_the_extender_serves_every_node_as_unknown() -> None:
    svc = Service(Options(listen="127.0.0.1:0"), api=None)
    await svc.start()
    try:
        assert (await call(svc, "GET", "/readyz"))[0] == 200
        code, reply = await call(svc, "POST", "/filter", {"Pod": {"spec": {"containers": [
            {"name": "c", "resources": {"limits": {SHARED: "1"}}}]}}, "NodeNames": ["n1", "n2"]})  # fmt: skip
        assert (code, reply["NodeNames"]) == (200, ["n1", "n2"])
    finally:
        await svc.stop()


def test_flags() -> None:
    opts = parse_args(["--listen", "127.0.0.1:9999", "--node-policy", "distributed", "--url-prefix", "/sp",
                       "--log-format", "json"])  # fmt: skip
    assert (opts.host_port, opts.node_policy, opts.url_prefix) == (("127.0.0.1", 9999), Policy.DISTRIBUTED, "/sp")
    with pytest.raises(SystemExit):
        parse_args(["--node-policy", "spreadd"])
    with pytest.raises(SystemExit):
        parse_args(["--tls-cert-file", "x"])
    with pytest.raises(SystemExit):
        parse_args(["--listen", "nope"])


@pytest.mark.parametrize(("argv", "named"), [
    pytest.param(["--listen", "127.0.0.1:99999"], "'127.0.0.1:99999'", id="a port over 65535"),
    pytest.param(["--resync", "0"], "--resync option: 0.0", id="a zero resync period"),
    pytest.param(["--assume-ttl", "nan"], "--assume-ttl option: nan", id="a nan assume ttl"),
    pytest.param(["--max-body-bytes", "-1"], "--max-body-bytes option: -1", id="a negative body limit"),
    pytest.param(["--tls-cert-file", "/nonexistent/tls.crt", "--tls-private-key-file", "/nonexistent/tls.key",
                  "--client-ca-file", "/nonexistent/ca.crt"],
                 "/nonexistent/tls.crt, /nonexistent/tls.key: No such file", id="missing certificate files"),
    pytest.param(["--metrics-listen", "9400"], "invalid --metrics-listen option: '9400'", id="a metrics port without host"),
    pytest.param(["--scheduler-name", ""], "invalid --scheduler-name option: ''", id="an empty scheduler name"),
    pytest.param(["--unscored-binds", "allow"], "invalid choice: 'allow'", id="an unknown unscored-binds mode"),
])  # fmt: skip
def test_a_bad_flag_is_a_usage_error_naming_the_value(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


async def test_an_address_in_use_is_an_error_exit_not_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    first = Service(Options(listen="127.0.0.1:0", in_cluster=False), api=None)
    await first.start()
    try:
        listen = f"127.0.0.1:{first.port}"
        assert await run(Options(listen=listen, in_cluster=False)) == 1
        assert f"cannot serve on --listen {listen}" in caplog.text
    finally:
        await first.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
async def test_https_with_the_given_certificate(tmp_short: Path) -> None:
    crt, key = tmp_short / "tls.crt", tmp_short / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    svc = Service(Options(listen="127.0.0.1:0", tls_cert_file=str(crt), tls_private_key_file=str(key)), api=None)
    await svc.start()
    try:
        ctx = ssl.create_default_context(cafile=str(crt))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://localhost:{svc.port}/healthz", ssl=ctx) as resp:
                assert resp.status == 200
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"http://localhost:{svc.port}/healthz") as resp:
                    await resp.read()
    finally:
        await svc.stop()




async def test_a_watch_too_old_for_the_server_history_relists_without_an_error(
    server: FakeApiServer, service: Service
) -> None:
    await synced(service)
    await until(service, lambda: "node-b" in service.view.scorers)
    states = service.informers[0]
    lists, errors = states.lists, states.errors
    # No await in between: the informer cannot see these before its watch is cut.
    create_pod(server, "bump")  # moves the server past the informer's resource version
    server.store.compact()
    server.store.close_watches()
    publish(server, "node-d", [(4, 0, ())])
    await until(service, lambda: "node-d" in service.view.scorers)
    assert states.lists == lists + 1  # 410 Gone: listed again
    assert states.errors == errors


async def test_a_restarted_extender_counts_pods_bound_before_it_started(server: FakeApiServer, tmp_short: Path) -> None:
    publish(server, "node-a", [(4, 1, ("old",)), (4, 0, ())])
    uid = create_pod(server, "earlier", n=2)
    server.store.bind("default", "earlier", {"target": {"name": "node-a"}})
    kubeconfig = server.write_kubeconfig(tmp_short / "kubeconfig")
    api = config.new_client_from_config(config_file=str(kubeconfig))
    svc = Service(Options(listen="127.0.0.1:0"), api=api)
    await svc.start()
    try:
        await synced(svc)
        await until(svc, lambda: uid in svc.view.assumed)
        assert svc.view.assumed[uid].placement == {SHARED: ("GPU-0", "GPU-0")}
        assert allocated(svc, "node-a") == [3, 0]
    finally:
        await svc.stop()
        api.close()
