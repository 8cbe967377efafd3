"""HTTP/2 on the verbs' TLS port, for kube-scheduler's client.

kube-scheduler's extender client is Go's `http.Transport` as client-go configures it: it offers
`h2` in ALPN and, over HTTP/1.1, keeps at most two idle connections. Its binds run concurrently
(each waits on the API server's Binding), so over HTTP/1.1 every burst of binds opened new
connections, each a mutual-TLS handshake: 0.4-0.6 per pod, 1.8-2.0 ms of the extender's CPU
each (benchmarks/bench_transport.py). Over HTTP/2 it multiplexes every call on one connection.

aiohttp serves HTTP/1.1 only, so the TLS port picks the protocol by ALPN as each connection
completes its handshake (`AlpnServer`): `h2` gets `H2Connection` here, anything else aiohttp's
handler. Both answer through the same `Responder` (method, path, body, client certificate ->
`Reply`): routing, authorization, metrics and the verbs are the Extender's, written once.

What this side enforces, as aiohttp does on HTTP/1.1: a request body over `max_body_bytes` is
answered 413 and not read further (so is one that would take the bodies arriving on one
connection over twice that); at most `MAX_STREAMS` requests in flight per connection (the
SETTINGS the client must honour; more is a protocol error the library answers); a connection with
no request in flight for `IDLE_TIMEOUT_S` is closed; a malformed frame closes the connection
(with GOAWAY), never the server. A reply larger than the client's flow-control window (a filter
that fails every one of thousands of nodes) is sent as the window opens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

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


@dataclass(slots=True)
class _Stream:
    method: str = ""
    path: str = ""
    body: bytearray = field(default_factory=bytearray)
    too_large: bool = False
    pending: memoryview | None = None  # reply data the flow-control window has not let out yet


class Connections:
    """The server's live HTTP/2 connections, for a graceful stop: the requests in flight get up
    to `timeout` to finish and send their replies, then each connection says GOAWAY and closes
    (aiohttp's runner gives HTTP/1.1 the same). The library sends nothing after its GOAWAY, so
    it comes last."""

    def __init__(self) -> None:
        self.live: set[H2Connection] = set()

    async def shutdown(self, timeout: float) -> None:
        tasks = {t for c in self.live for t in c.in_flight()}
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for c in list(self.live):
            c.close()


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection: requests in, each answered by `respond` in its own task."""

    def __init__(self, respond: Responder, max_body_bytes: int, registry: Connections | None = None) -> None:
        self._respond = respond
        self._registry = registry
        self._max_body = max_body_bytes
        self._conn = h2.connection.H2Connection(
            # Our own headers are three constants: checking them on every reply is waste
            # (a fifth of the library's time per request); the client's are checked.
            h2.config.H2Configuration(
                client_side=False, header_encoding=None, validate_outbound_headers=False, normalize_outbound_headers=False
            )
        )
        self._transport: asyncio.Transport | None = None
        self._peercert: Any = None
        self._streams: dict[int, _Stream] = {}
        self._buffered = 0  # request body bytes held over every stream still arriving
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport (TLS)
        self._peercert = transport.get_extra_info("peercert")
        if self._registry is not None:
            self._registry.live.add(self)
        conn = self._conn
        conn.initiate_connection()
        conn.update_settings({
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
            # A filter's body at 5,000 nodes is 0.2 MiB: in one frame, with windows that let the
            # client send it whole, rather than 16 KiB frames waiting on window updates, each a
            # round of the library's pure-Python frame handling (0.64 against 0.25 ms per filter).
            h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME_BYTES,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: self._max_body,
        })  # fmt: skip
        conn.increment_flow_control_window(2 * self._max_body)  # the buffer cap, `_on_event`
        self._flush()
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            log.info("closing an HTTP/2 connection after a protocol error: %s", e)
            self._flush()  # the library has queued its GOAWAY
            self._close()
            return
        for event in events:
            self._on_event(event)
        self._flush()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._registry is not None:
            self._registry.live.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        self._streams.clear()
        # Requests in flight run to their end (a bind must not stop between its API calls);
        # their replies go nowhere.

    # -- frames ----------------------------------------------------------------------------

    def _on_event(self, event: h2.events.Event) -> None:
        conn = self._conn
        if isinstance(event, h2.events.RequestReceived):
            s = self._streams[event.stream_id] = _Stream()
            for name, value in event.headers or ():
                if name == b":method":
                    s.method = value.decode("ascii", "replace")
                elif name == b":path":
                    s.path = value.decode("ascii", "replace")
            if event.stream_ended is not None:
                self._answer(event.stream_id)
        elif isinstance(event, h2.events.DataReceived):
            if event.flow_controlled_length:
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            receiving = self._streams.get(event.stream_id)
            if receiving is not None and not receiving.too_large:
                data = event.data or b""
                # Per request the limit; per connection twice that, over every request still
                # arriving (HTTP/1.1 reads one body at a time; here 128 may arrive at once).
                if len(receiving.body) + len(data) > self._max_body or self._buffered + len(data) > 2 * self._max_body:
                    receiving.too_large = True
                    self._buffered -= len(receiving.body)
                    receiving.body = bytearray()
                else:
                    receiving.body += data
                    self._buffered += len(data)
            if event.stream_ended is not None:
                self._answer(event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            pass  # answered with the headers or data that ended it (`stream_ended` above)
        elif isinstance(event, h2.events.StreamReset):
            reset = self._streams.get(event.stream_id)
            if reset is not None:
                self._buffered -= len(reset.body)
            self._done(event.stream_id)
        elif isinstance(event, h2.events.WindowUpdated):
            self._send_pending(event.stream_id)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._close()

    def _answer(self, stream_id: int) -> None:
        s = self._streams.get(stream_id)
        if s is None:
            return
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        body = None if s.too_large else bytes(s.body)
        self._buffered -= len(s.body)
        s.body = bytearray()
        task = asyncio.get_running_loop().create_task(self._reply(stream_id, s, body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reply(self, stream_id: int, s: _Stream, body: bytes | None) -> None:
        try:
            reply = await self._respond(s.method, s.path, body, self._peercert)
        except Exception:
            log.exception("HTTP/2 request %s %s failed", s.method, s.path)
            reply = Reply(500, b"internal error\n", "text/plain; charset=utf-8")
        if self._transport is None or self._streams.get(stream_id) is not s:
            return  # the connection or the stream is gone
        headers = [
            (b":status", str(reply.status).encode()),
            (b"content-type", reply.content_type.encode()),
            (b"content-length", str(len(reply.body)).encode()),
        ]
        try:
            self._conn.send_headers(stream_id, headers, end_stream=not reply.body)
            if reply.body:
                s.pending = memoryview(reply.body)
                self._send_stream(stream_id, s)
            else:
                self._done(stream_id)
        except h2.exceptions.H2Error as e:  # the client reset or closed it meanwhile
            log.debug("HTTP/2 stream %d: reply not sent: %s", stream_id, e)
            self._done(stream_id)
        self._flush()

    def _send_stream(self, stream_id: int, s: _Stream) -> None:
        """Send as much of the stream's reply as both flow-control windows allow."""
        conn = self._conn
        data = s.pending
        while data is not None and len(data):
            size = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size, len(data))
            if size <= 0:
                s.pending = data
                return  # `WindowUpdated` resumes it
            conn.send_data(stream_id, data[:size].tobytes(), end_stream=size == len(data))
            data = data[size:]
        s.pending = None
        self._done(stream_id)

    def _send_pending(self, stream_id: int) -> None:
        waiting = [(i, s) for i, s in self._streams.items() if s.pending is not None]
        for i, s in waiting:
            if stream_id in (0, i):
                try:
                    self._send_stream(i, s)
                except h2.exceptions.H2Error as e:
                    log.debug("HTTP/2 stream %d: reply not sent: %s", i, e)
                    self._done(i)

    def _done(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)
        if not self._streams:
            self._arm_idle()

    # -- the connection ----------------------------------------------------------------------

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def _arm_idle(self) -> None:
        if self._idle is None and self._transport is not None:
            self._idle = asyncio.get_running_loop().call_later(IDLE_TIMEOUT_S, self._on_idle)

    def _on_idle(self) -> None:
        self._idle = None
        if not self._streams and not self._tasks:
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
            self._conn.close_connection()
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
