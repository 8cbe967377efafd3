"""HTTP/2 on the verbs' TLS port, for kube-scheduler's client.

kube-scheduler's extender client is Go's `http.Transport` as client-go configures it: it offers
`h2` in ALPN and, over HTTP/1.1, keeps at most two idle connections. Its binds run concurrently
(each waits on the API server's Binding), so over HTTP/1.1 every burst of binds opened new
connections, each a mutual-TLS handshake: 0.4-0.6 per pod, 1.8-2.0 ms of the extender's CPU
each (benchmarks/bench_transport.py). Over HTTP/2 it multiplexes every call on one connection.

aiohttp serves HTTP/1.1 only, so the TLS port picks the protocol by ALPN as each connection
completes its handshake (`AlpnServer`): `h2` gets `H2Connection` here, anything else aiohttp's
handler. Both answer through the same `Responder` (method, path, body, client certificate ->
`Reply`): routing, authorization, metrics and the verbs are the Extender's, written once. The
protocol's frames, streams and flow control are `extender.h2server`'s.

What this side enforces, as aiohttp does on HTTP/1.1: a request body over `max_body_bytes` is
answered 413 and not read further (so is one that would take the bodies arriving on one
connection over twice that); at most `MAX_STREAMS` requests in flight per connection (the
SETTINGS the client must honour; more are refused with RST_STREAM, as are new ones while that
many the client reset still run); a connection with
no request in flight for `IDLE_TIMEOUT_S` is closed; a malformed frame closes the connection
(with GOAWAY), never the server. A reply larger than the client's flow-control window (a filter
that fails every one of thousands of nodes) is sent as the window opens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sharepack.extender import h2server

log = logging.getLogger(__name__)

ALPN_PROTOCOLS = ("h2", "http/1.1")
MAX_STREAMS = 128
IDLE_TIMEOUT_S = 75.0  # aiohttp's keep-alive default for HTTP/1.1
MAX_FRAME_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"


# (method, path with its query, body or None when over the size limit, peer certificate) -> Reply
Responder = Callable[[str, str, bytes | None, Any], Awaitable[Reply]]


class Connections:
    """The server's live HTTP/2 connections, for a graceful stop: the requests in flight get up
    to `timeout` to finish and send their replies, then each connection says GOAWAY and closes
    (aiohttp's runner gives HTTP/1.1 the same)."""

    def __init__(self) -> None:
        self.live: set[H2Connection] = set()

    async def shutdown(self, timeout: float) -> None:
        tasks = {t for c in self.live for t in c.in_flight()}
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for c in list(self.live):
            c.close()


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection (`extender.h2server`): requests in, each answered by `respond` in
    its own task."""

    def __init__(self, respond: Responder, max_body_bytes: int, registry: Connections | None = None) -> None:
        self._respond = respond
        self._registry = registry
        # A filter's body at 5,000 nodes is 0.2 MiB: in one frame, with windows that let the
        # client send it whole, rather than 16 KiB frames waiting on window updates.
        self._conn = h2server.ServerConnection(max_body=max_body_bytes, max_streams=MAX_STREAMS, max_frame=MAX_FRAME_BYTES)
        self._transport: asyncio.Transport | None = None
        self._peercert: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()  # looked up once, not per request

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport (TLS)
        self._peercert = transport.get_extra_info("peercert")
        if self._registry is not None:
            self._registry.live.add(self)
        self._conn.initiate()
        self._flush()
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        try:
            requests = self._conn.receive(data)
        except h2server.ProtocolViolation as e:
            log.info("closing an HTTP/2 connection after a protocol error: %s", e)
            self._flush()  # GOAWAY is queued
            self._close()
            return
        for request in requests:
            self._answer(request)
        self._flush()
        self._close_if_gone_away()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._registry is not None:
            self._registry.live.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        # Requests in flight run to their end (a bind must not stop between its API calls);
        # their replies go nowhere.

    # -- requests --------------------------------------------------------------------------

    def _answer(self, request: h2server.Request) -> None:
        if len(self._tasks) >= MAX_STREAMS:
            # Requests the client reset are still running (a bind finishes its API calls):
            # refuse more than the streams the client may have open.
            self._conn.reset(request.stream_id, h2server.REFUSED_STREAM)
            return
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        task = self._loop.create_task(self._reply(request))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._arm_idle()
            self._close_if_gone_away()

    def _close_if_gone_away(self) -> None:
        """The client said GOAWAY and every request it sent is answered: close, as it expects."""
        if self._conn.goaway_received and not self._conn.streams and not self._tasks:
            self._close()

    async def _reply(self, request: h2server.Request) -> None:
        try:
            reply = await self._respond(request.method, request.path, request.body, self._peercert)
        except Exception:
            log.exception("HTTP/2 request %s %s failed", request.method, request.path)
            reply = Reply(500, b"internal error\n", "text/plain; charset=utf-8")
        if self._transport is None:
            return  # the connection is gone
        if self._conn.respond(request.stream_id, reply.status, reply.content_type, reply.body):
            self._flush()

    # -- the connection ----------------------------------------------------------------------

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def _arm_idle(self) -> None:
        if self._idle is None and self._transport is not None:
            self._idle = self._loop.call_later(IDLE_TIMEOUT_S, self._on_idle)

    def _on_idle(self) -> None:
        self._idle = None
        if not self._conn.streams and not self._tasks:
            self.close()
        else:
            self._arm_idle()

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def in_flight(self) -> set[asyncio.Task[None]]:
        return set(self._tasks)

    def close(self) -> None:
        """GOAWAY, then close."""
        if self._transport is not None:
            self._conn.close()
            self._flush()
        self._close()


class AlpnServer(asyncio.Protocol):
    """The TLS port's protocol until the handshake is done: then the one ALPN chose takes the
    connection over (`transport.set_protocol`), so no call goes through this one after."""

    def __init__(
        self, http1: Callable[[], asyncio.Protocol], respond: Responder, max_body_bytes: int,
        registry: Connections | None = None,
        on_protocol: Callable[[str], None] | None = None,  # told "h2" or "http/1.1" per connection
    ) -> None:
        self._http1 = http1
        self._respond = respond
        self._max_body = max_body_bytes
        self._registry = registry
        self._on_protocol = on_protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ssl_object = transport.get_extra_info("ssl_object")
        chosen = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        h2_chosen = chosen == "h2"
        inner = H2Connection(self._respond, self._max_body, self._registry) if h2_chosen else self._http1()
        if self._on_protocol is not None:
            self._on_protocol("h2" if h2_chosen else "http/1.1")
        transport.set_protocol(inner)
        inner.connection_made(transport)
