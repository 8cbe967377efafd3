"""extender.h2server, the extender's HTTP/2 server side, driven in memory by another
implementation: the `h2` library's client (and raw frames where a client would not send them).

What kube-scheduler's Go client does (tests/realcluster/test_scale.py runs the real one): a
request per stream, headers then body, many at once, flow control both ways. What the RFC
makes of the rest: a stream error resets that stream only, a connection error says GOAWAY and
raises, and no input whatever raises anything else.
"""

from __future__ import annotations

import struct
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharepack.extender import h2server
from sharepack.extender.h2server import ProtocolViolation, Request, ServerConnection

MAX_BODY = 4096


class Pair:
    """A server and an h2 client, connected in memory."""

    def __init__(self, *, max_body: int = MAX_BODY, max_streams: int = 8, client_window: int | None = None) -> None:
        self.server = ServerConnection(max_body=max_body, max_streams=max_streams, max_frame=1 << 20)
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.client.initiate_connection()
        if client_window is not None:
            self.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: client_window})
        self.server.initiate()
        self.requests: list[Request] = []
        self.events: list[h2.events.Event] = []
        self.pump()

    def pump(self) -> None:
        """Deliver what each side has queued until both are quiet."""
        while True:
            to_server = self.client.data_to_send()
            if to_server:
                self.requests += self.server.receive(to_server)
            to_client = self.server.data_to_send()
            if to_client:
                self.events += self.client.receive_data(to_client)
            if not to_server and not to_client:
                return

    def send(self, method: str, path: str, body: bytes = b"", **headers: str) -> int:
        sid = self.client.get_next_available_stream_id()
        extra = [(k.replace("_", "-"), v) for k, v in headers.items()]
        self.client.send_headers(sid, [(":method", method), (":path", path), (":scheme", "https"),
                                       (":authority", "extender"), *extra], end_stream=not body)  # fmt: skip
        if body:
            self.client.send_data(sid, body, end_stream=True)
        self.pump()
        return sid

    def answers(self) -> dict[int, tuple[dict[str, str], bytes]]:
        out: dict[int, tuple[dict[str, str], bytes]] = {}
        for e in self.events:
            if isinstance(e, h2.events.ResponseReceived):
                out[e.stream_id] = (dict(e.headers), b"")  # type: ignore[arg-type]
            elif isinstance(e, h2.events.DataReceived):
                headers, body = out[e.stream_id]
                out[e.stream_id] = (headers, body + e.data)
                self.client.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
        return out

    def resets(self) -> dict[int, int]:
        return {e.stream_id: e.error_code for e in self.events if isinstance(e, h2.events.StreamReset)}

    def goaway(self) -> int | None:
        ends = [e.error_code for e in self.events if isinstance(e, h2.events.ConnectionTerminated)]
        return ends[-1] if ends else None


def raw(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return h2server.frame(kind, flags, stream, payload)


def test_requests_and_replies_round_trip_with_another_implementation() -> None:
    p = Pair()
    a = p.send("POST", "/filter", b'{"NodeNames":["a"]}', content_type="application/json")
    b = p.send("GET", "/healthz")
    assert [(r.stream_id, r.method, r.path, r.body) for r in p.requests] == [
        (a, "POST", "/filter", b'{"NodeNames":["a"]}'), (b, "GET", "/healthz", b"")]  # fmt: skip
    assert p.server.respond(b, 200, "text/plain; charset=utf-8", b"ok\n")
    assert p.server.respond(a, 413, "text/plain", b"")  # a status outside the static table, no body
    p.pump()
    answers = p.answers()
    assert answers[b] == ({":status": "200", "content-type": "text/plain; charset=utf-8", "content-length": "3"}, b"ok\n")
    assert answers[a][0][":status"] == "413" and answers[a][1] == b""
    assert not p.server.streams  # both closed once answered
    # Its dynamic table stays in step with the client's encoder over many requests.
    for i in range(50):
        sid = p.send("POST", f"/bind?{i}", b"x" * i, content_type="application/json", user_agent="kube-scheduler/v1")
        p.server.respond(sid, 200, "application/json", b"{}")
        p.pump()
    assert [r.path for r in p.requests[2:]] == [f"/bind?{i}" for i in range(50)]


def test_the_settings_say_our_limits_and_the_connection_window_opens() -> None:
    p = Pair(max_body=1 << 20)
    remote = p.client.remote_settings
    assert (remote.max_concurrent_streams, remote.initial_window_size, remote.max_frame_size) == (8, 1 << 20, 1 << 20)
    assert p.client.outbound_flow_control_window == 65_535 + 2 * (1 << 20)


def test_a_reply_waits_for_the_clients_windows_and_arrives_whole() -> None:
    p = Pair(client_window=100)
    sid = p.send("POST", "/filter", b"{}")
    body = bytes(range(256)) * 300  # over the stream window (100) and the connection's (65,535)
    p.server.respond(sid, 200, "application/json", body)
    for _ in range(2000):
        p.pump()
        p.answers()  # acknowledges what arrived: the client's window updates flow back
        p.pump()
        if sid not in p.server.streams:
            break
    assert p.answers()[sid][1] == body


def test_ping_is_answered_and_unknown_frames_are_read_past() -> None:
    p = Pair()
    p.client.ping(b"12345678")
    p.pump()
    assert any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678" for e in p.events)
    p.server.receive(raw(0xEE, 0, 1, b"whatever"))  # an extension frame type
    assert p.send("GET", "/a") and p.requests[-1].path == "/a"


def test_headers_in_continuation_frames_padded_data_and_priorities_decode() -> None:
    p = Pair()
    block = hpack.Encoder().encode([(":method", "POST"), (":path", "/bind"), (":scheme", "https"), ("x-long", "v" * 300)])
    first, rest = block[:10], block[10:]
    priority = struct.pack(">IB", 0, 15)
    p.server.receive(raw(h2server.HEADERS, h2server.PADDED | h2server.PRIORITY_FLAG, 1, b"\x03" + priority + first + b"\0\0\0"))
    p.server.receive(raw(h2server.CONTINUATION, 0, 1, rest[:100]))
    assert p.server.receive(raw(h2server.CONTINUATION, h2server.END_HEADERS, 1, rest[100:])) == []
    done = p.server.receive(raw(h2server.DATA, h2server.PADDED | h2server.END_STREAM, 1, b"\x02body\0\0"))
    assert [(r.method, r.path, r.body) for r in done] == [("POST", "/bind", b"body")]


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame in `data`."""
    out, at = [], 0
    while at < len(data):
        length, kind, flags, stream = int.from_bytes(data[at : at + 3], "big"), data[at + 3], data[at + 4], int.from_bytes(data[at + 5 : at + 9], "big")
        out.append((kind, flags, stream, data[at + 9 : at + 9 + length]))
        at += 9 + length
    return out


def resets_in(data: bytes) -> dict[int, int]:
    return {sid: int.from_bytes(body, "big") for kind, _, sid, body in frames(data) if kind == h2server.RST_STREAM}


def started() -> ServerConnection:
    """A server past the client's preface, for raw frames."""
    server = ServerConnection(max_body=MAX_BODY, max_streams=2, max_frame=1 << 20)
    server.initiate()
    server.receive(h2server.PREFACE + raw(h2server.SETTINGS, 0, 0))
    server.data_to_send()
    return server


def request(encoder: hpack.Encoder, sid: int, path: str | None = "/a", *, end: bool = True) -> bytes:
    headers = [(":method", "GET"), (":scheme", "https")] + ([(":path", path)] if path else [])
    return raw(h2server.HEADERS, h2server.END_HEADERS | (h2server.END_STREAM if end else 0), sid, encoder.encode(headers))


def test_a_request_without_a_path_is_reset_alone() -> None:
    server, encoder = started(), hpack.Encoder()
    assert server.receive(request(encoder, 1, None)) == []
    assert resets_in(server.data_to_send()) == {1: h2server.PROTOCOL_ERROR}
    assert [r.path for r in server.receive(request(encoder, 3, "/ok"))] == ["/ok"]


def test_streams_over_the_limit_are_refused_and_a_reset_stream_gets_no_reply() -> None:
    server, encoder = started(), hpack.Encoder()
    got = server.receive(request(encoder, 1) + request(encoder, 3) + request(encoder, 5))
    assert [r.stream_id for r in got] == [1, 3]
    assert resets_in(server.data_to_send()) == {5: h2server.REFUSED_STREAM}
    server.receive(raw(h2server.RST_STREAM, 0, 1, struct.pack(">I", 8)))  # the client gives up on 1 (CANCEL)
    assert not server.respond(1, 200, "application/json", b"{}")
    assert server.respond(3, 200, "application/json", b"{}")
    assert [r.stream_id for r in server.receive(request(encoder, 7))] == [7]  # room again


def test_bodies_over_the_limit_arrive_whole_and_come_out_as_none() -> None:
    p = Pair(max_body=1000, client_window=None)
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, [(":method", "POST"), (":path", "/filter"), (":scheme", "https"), (":authority", "x")])
    sent = 0
    for _ in range(200):  # the server tops the stream's window up as it reads past the body
        size = min(p.client.local_flow_control_window(sid), 5000 - sent)
        if size > 0:
            p.client.send_data(sid, b"z" * size, end_stream=sent + size == 5000)
            sent += size
        p.pump()
        if sent == 5000:
            break
    assert [(r.stream_id, r.body) for r in p.requests] == [(sid, None)]


@pytest.mark.parametrize(("data", "code"), [
    (raw(h2server.WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), h2server.PROTOCOL_ERROR),
    (raw(h2server.PING, 0, 0, b"short"), h2server.FRAME_SIZE_ERROR),
    (raw(h2server.SETTINGS, 0, 0, b"\0\x04\x80\0\0\0"), h2server.FLOW_CONTROL_ERROR),  # initial window 2^31
    (raw(h2server.SETTINGS, 0, 0, b"\0\x05\0\0\0\x01"), h2server.PROTOCOL_ERROR),  # max frame size 1
    (raw(h2server.DATA, 0, 9, b"x"), h2server.PROTOCOL_ERROR),  # a stream never opened
    (raw(h2server.HEADERS, h2server.END_HEADERS, 2, b"\x82"), h2server.PROTOCOL_ERROR),  # an even stream
    (raw(h2server.HEADERS, h2server.END_HEADERS, 1, b"\xff\xff\xff"), h2server.COMPRESSION_ERROR),
    (raw(h2server.PUSH_PROMISE, 0, 1, b"\0\0\0\x02"), h2server.PROTOCOL_ERROR),
    (raw(h2server.HEADERS, 0, 1, b"\x82") + raw(h2server.PING, 0, 0, b"8 bytes!"), h2server.PROTOCOL_ERROR),
    (raw(h2server.HEADERS, 0, 1, b"") + raw(h2server.CONTINUATION, 0, 1, b"\0" * 70_000), h2server.ENHANCE_YOUR_CALM),
    ((2 << 20).to_bytes(3, "big") + b"\0\0\0\0\0\x01", h2server.FRAME_SIZE_ERROR),  # over our 1 MiB
])  # fmt: skip
def test_connection_errors_say_goaway_with_their_code(data: bytes, code: int) -> None:
    p = Pair()
    with pytest.raises(ProtocolViolation) as e:
        p.server.receive(data)
    assert e.value.code == code
    p.events += p.client.receive_data(p.server.data_to_send())
    assert p.goaway() == code


def test_the_connection_window_is_enforced() -> None:
    server, encoder = started(), hpack.Encoder()  # max_body 4,096: a connection window of 65,535 + 8,192
    server.receive(request(encoder, 1, "/c", end=False))
    # Raw, as a client honouring the window would not send it; in one read, before the server
    # has read the first frame and opened the window again.
    chunk = raw(h2server.DATA, 0, 1, b"z" * 40_000)
    with pytest.raises(ProtocolViolation) as e:
        server.receive(chunk + chunk)
    assert e.value.code == h2server.FLOW_CONTROL_ERROR


def test_the_client_preface_is_required() -> None:
    server = ServerConnection(max_body=10, max_streams=1, max_frame=16384)
    with pytest.raises(ProtocolViolation):
        server.receive(b"GET / HTTP/1.1\r\n\r\n")
    server = ServerConnection(max_body=10, max_streams=1, max_frame=16384)
    with pytest.raises(ProtocolViolation):
        server.receive(h2server.PREFACE + raw(h2server.PING, 0, 0, b"8 bytes!"))  # not SETTINGS first


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.lists(st.integers(min_value=1, max_value=50), max_size=8))
def test_no_input_raises_anything_but_a_protocol_violation(garbage: bytes, cuts: list[int]) -> None:
    """After a valid start, any bytes in any pieces: requests, or GOAWAY and ProtocolViolation."""
    p = Pair()
    p.send("POST", "/filter", b"{}")
    at = 0
    for cut in [*cuts, len(garbage)]:
        piece, at = garbage[at : at + cut], at + cut
        try:
            p.server.receive(piece)
        except ProtocolViolation:
            return
        p.server.data_to_send()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.binary(max_size=3000), st.integers(min_value=1, max_value=700)), min_size=1, max_size=6),
       st.integers(min_value=1, max_value=97))  # fmt: skip
def test_any_framing_of_requests_gives_the_same_requests(bodies: list[tuple[bytes, int]], piece: int) -> None:
    """Bodies in frames of any size, the bytes delivered in pieces of any size, streams
    interleaved: each request comes out whole, with its own body."""
    p = Pair(max_body=1 << 16)
    sids = []
    for _body, _ in bodies:
        sid = p.client.get_next_available_stream_id()
        p.client.send_headers(sid, [(":method", "POST"), (":path", f"/s{sid}"), (":scheme", "https"), (":authority", "x")])
        sids.append(sid)
    for (body, size), sid in zip(bodies, sids, strict=True):
        chunks = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
        for k, chunk in enumerate(chunks):
            p.client.send_data(sid, chunk, end_stream=k == len(chunks) - 1)
    wire = p.client.data_to_send()
    got: list[Any] = []
    for i in range(0, len(wire), piece):
        got += p.server.receive(wire[i : i + piece])
    assert sorted((r.path, r.body) for r in got) == sorted((f"/s{sid}", body) for (body, _), sid in zip(bodies, sids, strict=True))
