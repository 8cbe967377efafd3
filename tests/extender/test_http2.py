"""extender.http2: HTTP/2 on the verbs' TLS port, which kube-scheduler's Go client picks by ALPN.

Against the real extender process (tests/security/stack.py: mutual TLS, the sandbox API server):
the same answers as HTTP/1.1, many requests on one connection (one handshake), the same
authorization. In process (`H2Connection` over plain TCP, HTTP/2 with prior knowledge): the body
limit, a reply larger than the client's flow-control window, a malformed frame, the idle timeout.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from sharepack.extender import h2server, http2
from sharepack.extender.http2 import H2Connection, Reply
from tests.extender.h2client import H2Client
from tests.security.stack import Stack, create_pod, metrics, node_of, stack

pytestmark = pytest.mark.timeout(120)

NODES = {"node-0": [(4, 0), (4, 0)], "node-1": [(4, 4), (4, 4)]}


@pytest.fixture
async def served(tmp_short: Path) -> AsyncIterator[Stack]:
    async with stack(tmp_short, NODES) as s:
        yield s


def h2_context(s: Stack, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(s.tls.ca_cert))
    ctx.load_cert_chain(str(cert or s.tls.client_cert), str(key or s.tls.client_key))
    ctx.set_alpn_protocols(["h2", "http/1.1"])  # as Go's client offers them
    return ctx


def filter_body(pod: dict[str, Any]) -> bytes:
    return orjson.dumps({"Pod": pod, "NodeNames": list(NODES), "Nodes": None})


async def handshakes(s: Stack) -> float:
    return (await metrics(s.extender)).get("sharepack_extender_tls_handshakes", 0.0)


async def test_a_client_offering_h2_gets_it_and_the_same_answers_as_http1(served: Stack) -> None:
    pods = [create_pod(served.server, f"p{i}", 2) for i in range(12)]
    client = await H2Client.connect(served.extender.port, h2_context(served))
    try:
        assert client.alpn() == "h2"
        health = await client.request("GET", "/healthz")
        assert (health.status, bytes(health.body)) == (200, b"ok\n")
        before = await handshakes(served)
        # Concurrent filters on the one connection, as kube-scheduler's binds run concurrently.
        answers = await asyncio.gather(*(client.request("POST", "/filter", filter_body(p)) for p in pods))
        assert await handshakes(served) == before  # no new connection for any of them
        assert [a.status for a in answers] == [200] * len(pods)
        assert all(a.headers["content-type"] == "application/json" for a in answers)
        for pod, answer in zip(pods, answers, strict=True):
            async with served.scheduler.post(f"{served.extender.url}/filter", data=filter_body(pod)) as resp:
                assert orjson.loads(answer.body) == orjson.loads(await resp.read())
            assert orjson.loads(answer.body)["NodeNames"] == ["node-0"]  # node-1 is full
        meta = pods[0]["metadata"]
        bound = await client.request("POST", "/bind", orjson.dumps(
            {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": "node-0"}))  # fmt: skip
        assert (bound.status, orjson.loads(bound.body)) == (200, {"Error": ""})
        assert node_of(served.server, meta["name"]) == "node-0"
        counted = await metrics(served.extender)
        assert counted['sharepack_extender_requests_total{code="200",verb="filter"}'] >= len(pods)
        assert counted['sharepack_extender_connections_total{protocol="h2"}'] == 1
    finally:
        await client.close()


async def test_over_h2_the_verbs_answer_only_the_schedulers_certificate(served: Stack) -> None:
    tls = served.tls
    explain = await H2Client.connect(served.extender.port, h2_context(served, tls.explain_cert, tls.explain_key))
    try:
        pod = create_pod(served.server, "victim", 2)
        meta = pod["metadata"]
        refused = await explain.request("POST", "/bind", orjson.dumps(
            {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": "node-0"}))  # fmt: skip
        assert refused.status == 403
        assert bytes(refused.body).startswith(b"forbidden: client certificate subject 'CN=sharepack-explain' may not call /bind")
        assert node_of(served.server, "victim") == ""
        allowed = await explain.request("POST", "/explain", filter_body(pod))
        assert allowed.status == 200 and "node-0" in {n["node"] for n in orjson.loads(allowed.body)["nodes"]}
        assert (await explain.request("GET", "/nothing-here")).status == 404
        assert (await explain.request("GET", "/filter")).status == 405
        # Routes are matched exactly, before and apart from the decision: no other spelling
        # of the path reaches the handler (403 for the route itself, 404 for the rest).
        body = orjson.dumps({"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": "node-0"})
        for spelling, status in (("/bind?x=1", 403), ("//bind", 404), ("/%62ind", 404), ("/./bind", 404), ("/bind/", 404)):
            assert (await explain.request("POST", spelling, body)).status == status, spelling
        assert node_of(served.server, "victim") == ""
        handled = await metrics(served.extender)
        assert not any(k.startswith("sharepack_extender_requests_total") and 'verb="bind"' in k for k in handled)
    finally:
        await explain.close()


async def test_http1_clients_are_still_served_on_the_same_port(served: Stack) -> None:
    ctx = h2_context(served)
    ctx.set_alpn_protocols(["http/1.1"])
    async with aiohttp.ClientSession() as http, http.get(f"{served.extender.url}/healthz", ssl=ctx) as resp:
        assert (resp.status, resp.version.major, await resp.text()) == (200, 1, "ok\n")
    counted = await metrics(served.extender)
    assert counted.get('sharepack_extender_connections_total{protocol="http/1.1"}', 0) >= 1
    assert counted.get('sharepack_extender_connections_total{protocol="h2"}', 0) == 0


async def test_without_http2_the_port_offers_only_http1(tmp_short: Path) -> None:
    async with stack(tmp_short, NODES, "--no-http2") as s:
        client = await H2Client.connect(s.extender.port, h2_context(s))
        try:
            assert client.alpn() is None  # no protocol agreed: a Go client then speaks HTTP/1.1
        finally:
            await client.close()


# --- in process: the protocol's limits ----------------------------------------------------------


async def serve_h2(respond: Callable[[str, str, bytes | None, Any], Awaitable[Reply]], max_body: int = 1024) -> tuple[asyncio.AbstractServer, int]:
    live = http2.Connections()
    server = await asyncio.get_running_loop().create_server(lambda: H2Connection(respond, max_body, live), "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


async def echo(method: str, path: str, body: bytes | None, peercert: Any) -> Reply:
    if body is None:
        return Reply(413, b"too large\n", "text/plain")
    return Reply(200, orjson.dumps({"method": method, "path": path, "size": len(body)}))


async def test_the_settings_bound_streams_and_open_the_windows_to_the_body_limit() -> None:
    """At most 128 requests in flight; a large filter body in one frame, sent whole."""
    server, port = await serve_h2(echo, max_body=1 << 20)
    client = await H2Client.connect(port)
    try:
        assert (await client.request("GET", "/a")).status == 200  # our SETTINGS have arrived by now
        remote = client.conn.remote_settings
        assert (remote.max_concurrent_streams, remote.max_frame_size, remote.initial_window_size) == (
            http2.MAX_STREAMS, http2.MAX_FRAME_BYTES, 1 << 20)  # fmt: skip
        assert client.conn.outbound_flow_control_window >= 2 << 20  # the connection's window opened too
    finally:
        await client.close()
        server.close()


async def test_a_body_over_the_limit_is_answered_413_and_the_connection_goes_on() -> None:
    server, port = await serve_h2(echo, max_body=1024)
    client = await H2Client.connect(port)
    try:
        big = await client.request("POST", "/filter", b"x" * 5000)
        assert (big.status, bytes(big.body)) == (413, b"too large\n")
        small = await client.request("POST", "/filter?x=1", b"y" * 1024)
        assert orjson.loads(small.body) == {"method": "POST", "path": "/filter?x=1", "size": 1024}
    finally:
        await client.close()
        server.close()


async def test_bodies_arriving_at_once_are_held_to_twice_the_limit_per_connection() -> None:
    server, port = await serve_h2(echo, max_body=1024)
    client = await H2Client.connect(port)
    try:
        streams = [client.start("POST", "/bind", 900) for _ in range(3)]
        for sid in streams:  # every body arrives before any ends: 2,700 bytes held at once
            await client.send(sid, b"z" * 900, end=False)
        for sid in streams:
            await client.send(sid, b"", end=True)
        answers = [await client.done[sid] for sid in streams]
        assert [a.status for a in answers] == [200, 200, 413]
        assert (await client.request("POST", "/bind", b"z" * 1000)).status == 200  # freed once answered
    finally:
        await client.close()
        server.close()


async def test_a_reply_larger_than_the_clients_window_arrives_whole() -> None:
    payload = bytes(range(256)) * 1000  # 256 KB, over a 1 KiB stream window and the 64 KiB connection one

    async def large(method: str, path: str, body: bytes | None, peercert: Any) -> Reply:
        return Reply(200, payload)

    server, port = await serve_h2(large)
    client = await H2Client.connect(port, window=1024)
    try:
        answers = await asyncio.gather(*(client.request("POST", "/filter", b"{}") for _ in range(3)))
        assert [bytes(a.body) for a in answers] == [payload] * 3
        assert answers[0].headers["content-length"] == str(len(payload))
    finally:
        await client.close()
        server.close()


async def test_a_malformed_frame_closes_that_connection_only() -> None:
    server, port = await serve_h2(echo)
    bad = await H2Client.connect(port)
    try:
        assert (await bad.request("GET", "/a")).status == 200
        bad.send_raw(b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00")  # WINDOW_UPDATE of 0 on the connection
        await asyncio.wait_for(bad.closed.wait(), 10)
        assert bad.terminated is not None and bad.terminated.error_code != 0  # GOAWAY before the close
        good = await H2Client.connect(port)
        assert (await good.request("GET", "/b")).status == 200
        await good.close()
    finally:
        await bad.close()
        server.close()


async def test_an_idle_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http2, "IDLE_TIMEOUT_S", 0.2)
    server, port = await serve_h2(echo)
    client = await H2Client.connect(port)
    try:
        assert (await client.request("GET", "/a")).status == 200
        await asyncio.wait_for(client.closed.wait(), 10)
        assert client.terminated is not None and client.terminated.error_code == 0  # a polite GOAWAY
    finally:
        await client.close()
        server.close()


async def test_shutdown_lets_a_request_in_flight_finish() -> None:
    release = asyncio.Event()

    async def slow(method: str, path: str, body: bytes | None, peercert: Any) -> Reply:
        await release.wait()
        return Reply(200, b"done")

    live = http2.Connections()
    server = await asyncio.get_running_loop().create_server(lambda: H2Connection(slow, 1024, live), "127.0.0.1", 0)
    client = await H2Client.connect(int(server.sockets[0].getsockname()[1]))
    try:
        pending = asyncio.ensure_future(client.request("POST", "/bind", b"{}"))
        while not any(c.in_flight() for c in live.live):
            await asyncio.sleep(0.01)
        stopping = asyncio.ensure_future(live.shutdown(10))
        await asyncio.sleep(0.1)
        assert not stopping.done()
        release.set()
        assert bytes((await pending).body) == b"done"
        await stopping
        await asyncio.wait_for(client.closed.wait(), 10)
    finally:
        await client.close()
        server.close()


async def test_after_the_clients_goaway_the_last_answer_closes_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that says GOAWAY still gets the answers it waits for; then the server closes
    at once, not after the idle timeout."""
    monkeypatch.setattr(http2, "IDLE_TIMEOUT_S", 60.0)
    release = asyncio.Event()

    async def slow(method: str, path: str, body: bytes | None, peercert: Any) -> Reply:
        await release.wait()
        return Reply(200, b"done")

    server, port = await serve_h2(slow)
    client = await H2Client.connect(port)
    try:
        pending = asyncio.ensure_future(client.request("POST", "/bind", b"{}"))
        await asyncio.sleep(0.1)
        # GOAWAY (last stream 1, NO_ERROR), raw: the h2 library's client reads nothing after its own.
        client.send_raw(h2server.frame(h2server.GOAWAY, 0, 0, (1).to_bytes(4, "big") + (0).to_bytes(4, "big")))
        await asyncio.sleep(0.1)
        assert not client.closed.is_set()  # the request is still running
        release.set()
        assert bytes((await pending).body) == b"done"
        await asyncio.wait_for(client.closed.wait(), 5)
    finally:
        await client.close()
        server.close()
