"""Who may call what on the extender's mutual-TLS port (issue 24, item 5): a certificate from the
client CA is not enough; its subject's common name must be the scheduler's for the verbs
(`--scheduler-client-cn`) and the explain client's for /explain (`--explain-client-cn`). Others
get 403 naming their subject, and no handler runs. The real extender process, over real TLS."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from sharepack.extender import authorizing
from sharepack.extender.__main__ import parse_args
from sharepack.sandbox.controlplane import certificates
from tests.security.stack import Stack, create_pod, metrics, node_of, stack, start_extender

pytestmark = pytest.mark.timeout(120)

NODES = {"node-0": [(4, 0), (4, 0)]}


@pytest.fixture
async def served(tmp_short: Path) -> AsyncIterator[Stack]:
    async with stack(tmp_short, NODES) as s:
        yield s


def context(s: Stack, cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(s.tls.ca_cert))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


async def call(url: str, ctx: ssl.SSLContext, verb: str, body: Any) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/{verb}", data=orjson.dumps(body), ssl=ctx) as resp:
        return resp.status, await resp.text()


async def handled(s: Stack) -> float:
    """Requests that reached a verb handler, whatever their answer."""
    return sum(v for k, v in (await metrics(s.extender)).items() if k.startswith("sharepack_extender_requests_total"))


def filter_body(pod: dict[str, Any]) -> dict[str, Any]:
    return {"Pod": pod, "NodeNames": list(NODES), "Nodes": None}


async def test_a_certificate_of_the_client_ca_with_another_name_may_call_no_verb_and_not_explain(served: Stack) -> None:
    """The issue's case: any certificate the client CA signed called every verb, /bind included."""
    other = served.authority.issue("operator", "alice", organizations=("ops",))
    ctx = context(served, other.cert, other.key)
    pod = create_pod(served.server, "trainer", 2)
    before = await handled(served)
    bind = {"PodName": "trainer", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "node-0"}
    for verb, body in (("filter", filter_body(pod)), ("prioritize", filter_body(pod)), ("bind", bind)):
        status, text = await call(served.extender.url, ctx, verb, body)
        assert (status, text) == (403, f"forbidden: client certificate subject 'O=ops,CN=alice' may not call /{verb}: "
                                       "it answers CN kube-scheduler (--scheduler-client-cn)\n")  # fmt: skip
    status, text = await call(served.extender.url, ctx, "explain", filter_body(pod))
    assert (status, text) == (403, "forbidden: client certificate subject 'O=ops,CN=alice' may not call /explain: "
                                   "it answers CN sharepack-explain (--explain-client-cn)\n")  # fmt: skip
    assert await handled(served) == before  # no verb handler ran
    assert node_of(served.server, "trainer") == ""


async def test_the_explain_certificate_may_explain_but_not_filter_or_bind(served: Stack) -> None:
    tls = served.tls
    ctx = context(served, tls.explain_cert, tls.explain_key)
    pod = create_pod(served.server, "trainer", 2)
    status, text = await call(served.extender.url, ctx, "explain", filter_body(pod))
    assert status == 200, text
    assert [n["node"] for n in orjson.loads(text)["nodes"]] == ["node-0"]
    # The guard would refuse this bind anyway (never scored); the point is that no verb runs.
    bind = {"PodName": "trainer", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "node-0"}
    for verb, body in (("filter", filter_body(pod)), ("bind", bind)):
        status, text = await call(served.extender.url, ctx, verb, body)
        assert status == 403 and text.startswith(f"forbidden: client certificate subject 'CN={certificates.EXPLAIN_CLIENT_NAME}'")


async def test_the_schedulers_certificate_may_call_the_verbs_but_not_explain(served: Stack) -> None:
    pod = create_pod(served.server, "trainer", 2)
    assert (await served.post("filter", filter_body(pod)))["NodeNames"] == ["node-0"]
    assert await served.bind(pod, "node-0") == ""
    assert node_of(served.server, "trainer") == "node-0"
    async with served.scheduler.post(f"{served.extender.url}/explain", data=orjson.dumps(filter_body(pod))) as resp:
        assert resp.status == 403
        assert (await resp.text()).startswith(f"forbidden: client certificate subject 'CN={certificates.CLIENT_NAME}'")


async def test_probes_answer_any_certificate_the_ca_signed(served: Stack) -> None:
    other = served.authority.issue("prober", "prometheus")
    async with aiohttp.ClientSession() as http:
        for path in ("/healthz", "/readyz", "/metrics"):
            async with http.get(f"{served.extender.url}{path}", ssl=context(served, other.cert, other.key)) as resp:
                assert resp.status == 200, path


async def test_the_names_follow_the_flags_and_the_url_prefix(served: Stack) -> None:
    alice = served.authority.issue("alice", "alice")
    replica = await start_extender(served.root, served.kubeconfig, served.tls, len(NODES), "--url-prefix=/sp",
                                   "--scheduler-client-cn=alice", "--explain-client-cn=alice")  # fmt: skip
    try:
        pod = create_pod(served.server, "p", 1)
        ctx = context(served, alice.cert, alice.key)
        assert (await call(f"{replica.url}/sp", ctx, "filter", filter_body(pod)))[0] == 200
        assert (await call(f"{replica.url}/sp", ctx, "explain", filter_body(pod)))[0] == 200
        status, text = await call(f"{replica.url}/sp", served.tls.client_context(), "filter", filter_body(pod))
        assert (status, text) == (403, "forbidden: client certificate subject 'CN=kube-scheduler' may not call "
                                       "/sp/filter: it answers CN alice (--scheduler-client-cn)\n")  # fmt: skip
    finally:
        await replica.process.stop()


def test_the_flags_default_to_the_documented_names_and_refuse_an_empty_one(capsys: pytest.CaptureFixture[str]) -> None:
    opts = parse_args(["--insecure-http"])
    assert opts.scheduler_client_cns == authorizing.DEFAULT_SCHEDULER_CNS == (certificates.CLIENT_NAME,)
    assert opts.explain_client_cns == authorizing.DEFAULT_EXPLAIN_CNS == (certificates.EXPLAIN_CLIENT_NAME,)
    assert parse_args(["--scheduler-client-cn=a", "--scheduler-client-cn=b"]).scheduler_client_cns == ("a", "b")
    with pytest.raises(SystemExit):
        parse_args(["--explain-client-cn="])
    assert "invalid --explain-client-cn option: ''" in capsys.readouterr().err



ODD_PATHS = ["/bind", "//bind", "/%62ind", "/bind/", "/bind?x=1", "/./bind", "/x/../bind", "/BIND", "http://x/bind",
             "/bind%00", "/bind#x", "/bind;x", "/%2Fbind"]


@pytest.mark.parametrize("prefix", ["", "/sp"], ids=["no prefix", "url prefix /sp"])
async def test_no_spelling_of_a_verbs_path_reaches_its_handler_without_the_name(prefix: str) -> None:
    """The decision follows the route the router matched: every spelling that reaches a handler
    is refused without the scheduler's name (no certificate here: plain HTTP, no subject)."""
    ran: list[str] = []

    async def verb(request: web.Request) -> web.Response:
        ran.append(request.path)
        return web.Response(text="ran")

    app = web.Application()
    app.middlewares.append(authorizing.Authorizer(frozenset({"kube-scheduler"}), frozenset({"x"}), prefix).middleware())
    for name in (*authorizing.VERBS, *authorizing.READ_ONLY):
        app.router.add_post(f"{prefix}/{name}", verb)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        for path in ODD_PATHS:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            target = path.replace("/bind", f"{prefix}/bind", 1) if not path.startswith("http") else f"http://x{prefix}/bind"
            writer.write(f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
            status = (await reader.read()).split(b"\r\n", 1)[0]
            writer.close()
            assert status.split()[1] in (b"403", b"404", b"400"), (target, status)
    finally:
        await runner.cleanup()
    assert ran == []
