"""kube.http1: the extender's HTTP/1.1 client, against a scripted server on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharepack.kube import http1
from sharepack.sandbox.controlplane import certificates


# One request's head as the server read it, and the writer to answer it on.
Handler = Callable[[bytes, bytes, asyncio.StreamWriter, int], Awaitable[bool]]


class Scripted:
    """A server that reads each request (head and Content-Length body) and lets `handler`
    answer it; the handler returns False to close the connection without a word more."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.heads: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        served = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                self.heads.append(head)
                served += 1
                if not await self.handler(head, body, writer, served):
                    return
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ssl_context)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self._writers:
            w.close()
        await self.server.wait_closed()


def answer(body: bytes, *, status: int = 200, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def chunked(body: bytes, size: int) -> bytes:
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for i in range(0, len(body), size):
        part = body[i : i + size]
        out += f"{len(part):x};ext=1\r\n".encode() + part + b"\r\n"
    return out + b"0\r\nX-Trailer: t\r\n\r\n"


@contextlib.asynccontextmanager
async def serving(handler: Handler, **client_kwargs: object) -> AsyncIterator[tuple[Scripted, http1.Client]]:
    server = Scripted(handler)
    port = await server.start()
    client = http1.Client("127.0.0.1", port, **client_kwargs)  # type: ignore[arg-type]
    try:
        yield server, client
    finally:
        client.close()
        await server.stop()


async def echo_path(head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
    path = head.split(b" ")[1]
    writer.write(answer(path + b"|" + body))
    return True


async def test_answers_reuse_one_connection_and_the_request_is_well_formed() -> None:
    async with serving(echo_path) as (server, client):
        for i in range(3):
            status, body = await client.request("POST", f"/p/{i}?q=1", [("Authorization", "Bearer t")], b"{}")
            assert (status, body) == (200, f"/p/{i}?q=1|{{}}".encode())
        assert (server.connections, client.connections) == (1, 1)
        head = server.heads[0].decode()
        assert head.startswith("POST /p/0?q=1 HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{client.port}\r\n" in head
        assert "Authorization: Bearer t\r\n" in head and "Content-Length: 2\r\n" in head
        # A GET without a body says no length at all.
        await client.request("GET", "/g", [])
        assert "Content-Length" not in server.heads[-1].decode()


async def test_concurrent_requests_take_connections_of_their_own() -> None:
    async def slow(head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
        await asyncio.sleep(0.05)
        return await echo_path(head, body, writer, served)

    async with serving(slow, limit=4) as (server, client):
        got = await asyncio.gather(*(client.request("GET", f"/{i}", []) for i in range(8)))
        assert [b for _, b in got] == [f"/{i}|".encode() for i in range(8)]
        assert server.connections == 4  # the limit: the rest waited for a free connection


async def test_chunked_answer_with_extensions_and_trailers() -> None:
    payload = bytes(range(256)) * 40

    async def handler(head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
        data = chunked(payload, 1000)
        for i in range(0, len(data), 7):  # in small writes: the parser sees every split
            writer.write(data[i : i + 7])
            await writer.drain()
        return True

    async with serving(handler) as (server, client):
        assert await client.request("GET", "/", []) == (200, payload)
        assert await client.request("GET", "/", []) == (200, payload)
        assert server.connections == 1


async def test_an_answer_read_until_close_and_connection_close_are_not_reused() -> None:
    async def handler(head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
        if head.startswith(b"GET /eof"):
            writer.write(b"HTTP/1.1 200 OK\r\n\r\nto the end")
            return False
        writer.write(answer(b"bye", extra="Connection: close\r\n"))
        return True

    async with serving(handler) as (server, client):
        assert await client.request("GET", "/eof", []) == (200, b"to the end")
        assert await client.request("GET", "/close", []) == (200, b"bye")
        assert await client.request("GET", "/close", []) == (200, b"bye")
        assert server.connections == 3


async def test_no_body_for_204_and_head() -> None:
    async def handler(head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
        status = 204 if head.startswith(b"GET") else 200
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 5\r\n\r\n".encode())
        return True

    async with serving(handler) as (server, client):
        assert await client.request("GET", "/", []) == (204, b"")
        assert await client.request("HEAD", "/", []) == (200, b"")
        assert server.connections == 1


async def test_a_kept_connection_the_server_dropped_is_retried_once_on_a_new_one() -> None:
    async def handler(head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
        if served == 2:
            return False  # the idle-timeout race: the request read, the connection closed unanswered
        writer.write(answer(b"ok"))
        return True

    async with serving(handler) as (server, client):
        assert await client.request("POST", "/a", [], b"1") == (200, b"ok")
        assert await client.request("POST", "/b", [], b"2") == (200, b"ok")
        assert server.connections == 2
        assert [h.split(b" ")[1] for h in server.heads] == [b"/a", b"/b", b"/b"]


async def test_a_new_connection_closed_unanswered_is_not_retried() -> None:
    async def handler(head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
        return False

    async with serving(handler) as (server, client):
        with pytest.raises(http1.ConnectionClosed) as e:
            await client.request("POST", "/a", [], b"1")
        assert not e.value.answered
        assert len(server.heads) == 1


async def test_an_answer_cut_short_raises_and_is_never_retried() -> None:
    async def handler(head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
        if served == 1:
            writer.write(answer(b"first"))
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
        return False

    async with serving(handler) as (server, client):
        await client.request("POST", "/a", [], b"")
        with pytest.raises(http1.ConnectionClosed) as e:
            await client.request("POST", "/b", [], b"")
        assert e.value.answered
        assert len(server.heads) == 2  # not sent again: the server had begun to answer


@pytest.mark.parametrize(
    "reply, message",
    [
        (b"SPDY/3 200 OK\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd", "chunk not followed by CRLF"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab", "longer than its Content-Length"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "malformed header line"),
        (b"HTTP/1.1 100 Continue\r\n\r\n", "unexpected interim answer"),
    ],
)
async def test_malformed_answers_raise_and_drop_the_connection(reply: bytes, message: str) -> None:
    requests = 0

    async def handler(head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
        nonlocal requests
        requests += 1
        writer.write(reply if requests == 1 else answer(b"fine"))
        return True

    async with serving(handler) as (server, client):
        with pytest.raises(http1.ProtocolError, match=message):
            await client.request("GET", "/", [])
        assert await client.request("GET", "/", []) == (200, b"fine")
        assert server.connections == 2


async def test_an_endless_head_is_refused() -> None:
    async def handler(head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (http1.MAX_HEAD // 4))
        return True

    async with serving(handler) as (_, client):
        with pytest.raises(http1.ProtocolError, match="head longer than"):
            await client.request("GET", "/", [])


async def test_a_cancelled_request_does_not_leave_its_connection_for_the_next() -> None:
    async def handler(head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
        if head.startswith(b"GET /1 "):
            await asyncio.sleep(0.3)  # answered after the client gave up: must not reach request 2
            writer.write(answer(b"late"))
        else:
            writer.write(answer(b"fresh"))
        return True

    async with serving(handler) as (server, client):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await client.request("GET", "/1", [])
        assert await client.request("GET", "/2", []) == (200, b"fresh")
        assert server.connections == 2


async def test_over_tls_with_the_server_name_checked() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        tls = certificates.write_tls_files(Path(d))
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(tls.server_cert, tls.server_key)
        client_ctx = ssl.create_default_context(cafile=str(tls.ca_cert))
        server = Scripted(echo_path)
        port = await server.start(server_ctx)
        good = http1.Client("127.0.0.1", port, ssl_context=client_ctx)
        bad = http1.Client("127.0.0.1", port, ssl_context=client_ctx, server_hostname="elsewhere.example")
        try:
            assert await good.request("GET", "/tls", []) == (200, b"/tls|")
            assert f"Host: 127.0.0.1:{port}\r\n" in server.heads[0].decode()
            with pytest.raises(ssl.SSLCertVerificationError):
                await bad.request("GET", "/tls", [])
        finally:
            good.close()
            bad.close()
            await server.stop()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=300), size=st.integers(1, 64), cuts=st.lists(st.integers(0, 2000), max_size=12))
def test_chunked_answers_parse_the_same_however_the_bytes_arrive(body: bytes, size: int, cuts: list[int]) -> None:
    data = chunked(body, size)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    parsed = http1._Answer(head_only=False)
    for a, b in zip(points, points[1:], strict=False):
        parsed.feed(data[a:b])
    assert parsed.done and parsed.status == 200 and parsed.body == body


async def test_a_line_break_in_a_header_or_the_target_is_refused_before_anything_is_sent() -> None:
    async with serving(echo_path) as (server, client):
        with pytest.raises(ValueError, match="line break in the request's head"):
            await client.request("GET", "/", [("authorization", "Bearer t\r\nX-Injected: 1")])
        with pytest.raises(ValueError, match="line break"):
            await client.request("GET", "/a HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET /b", [])
        assert server.connections == 0 and not server.heads
