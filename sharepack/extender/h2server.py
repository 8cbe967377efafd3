"""The server side of one HTTP/2 connection (RFC 9113), without I/O: bytes in, requests out,
replies in, bytes out. `extender.http2` runs it on the TLS port.

Only what the extender's callers need: requests with a body, each answered once with a status,
a content type and a body. No server push, no trailers sent, no priorities (PRIORITY frames
and flags are read past); a request's trailers are read and dropped.

Why not the `h2` library: it implements every corner of the protocol in pure Python, with an
event object per frame, a state machine transition per stream event and every header checked
twice, and cost the extender about 0.1 ms of CPU per request (`benchmarks/bench_transport.py`,
`docs/scale.md`), as much as TLS and the event loop together. Here a request is a HEADERS
frame and a DATA frame, a reply a HEADERS frame and DATA frames; the header compression (HPACK)
both ways is `extender.headerblocks`.

Errors, as the RFC assigns them: a frame that breaks the connection's rules (a bad preface,
a frame too large for our SETTINGS, a SETTINGS, PING or WINDOW_UPDATE of the wrong size or
value, a header block that does not decode or goes on too long, a frame on a stream the client
never opened, a window overflowed) queues GOAWAY with the error and raises `ProtocolViolation`;
the caller sends it and closes. A request that breaks a stream's rules (no `:method` or `:path`,
more streams than `MAX_CONCURRENT_STREAMS`) is reset alone (RST_STREAM) and the connection
goes on. Only clients whose certificate the extender's CA signed get this far (mutual TLS is
checked in the handshake), but none of them can make it hold more than `max_header_bytes` per
header block and twice `max_body` over the bodies still arriving.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from sharepack.extender import headerblocks

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 section 6) and flags.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# Error codes (section 7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x5, 0x6, 0x7, 0x9, 0xB

# SETTINGS identifiers (section 6.5.2).
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = range(1, 7)

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
MAX_WINDOW = 2**31 - 1
MAX_FRAME_LIMIT = 2**24 - 1

_HEAD = struct.Struct(">IBI")  # length (24 bits) and type in the first word, flags, stream id
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")


class ProtocolViolation(Exception):
    """The client broke the protocol: GOAWAY is queued; send it and close the connection."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"HTTP/2 error {code:#x}: {message}")
        self.code = code


@dataclass(slots=True)
class Request:
    stream_id: int
    method: str
    path: str
    body: bytes | None  # None: over the size limit (answer 413)


@dataclass(slots=True)
class _Stream:
    method: str = ""
    path: str = ""
    body: bytearray = field(default_factory=bytearray)
    too_large: bool = False
    ended: bool = False  # the client's side is closed: the request is whole
    unacked: int = 0  # body bytes received since the stream's window was last topped up
    send_window: int = 0
    pending: memoryview | None = None  # reply data waiting on a flow-control window


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload) << 8 | kind, flags, stream_id) + payload


class ServerConnection:
    """One connection's protocol state. `receive(data)` returns the requests completed by
    `data`; `respond` queues a reply; `data_to_send` takes what is queued."""

    def __init__(
        self, *, max_body: int, max_streams: int, max_frame: int, max_header_bytes: int = 64 << 10,
    ) -> None:  # fmt: skip
        self.max_body = max_body
        self.max_streams = max_streams
        self.max_frame = max_frame  # what we accept, as our SETTINGS say
        self.max_header_bytes = max_header_bytes
        self.streams: dict[int, _Stream] = {}
        self.last_stream = 0  # the highest stream the client opened
        self.goaway_received = False
        self._out: list[bytes | memoryview] = []
        self._in = bytearray()
        self._preface = False
        self._settled = False  # the client's first SETTINGS has arrived
        self._decoder = headerblocks.Decoder(max_list=max_header_bytes)
        self._encoder = headerblocks.ReplyEncoder()
        self._block: tuple[int, int, bytearray] | None = None  # (stream, flags, fragments) awaiting CONTINUATION
        # Flow control. What we receive: the stream windows our SETTINGS give (`max_body`) and
        # the connection's, opened to twice that; both are topped up as data arrives.
        self._recv_window = DEFAULT_WINDOW + 2 * max_body
        self._recv_unacked = 0
        # What we send: as the client's SETTINGS and WINDOW_UPDATEs allow.
        self._send_window = DEFAULT_WINDOW
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_FRAME
        self._buffered = 0  # body bytes held over every stream still arriving

    # -- output -----------------------------------------------------------------------------

    def initiate(self) -> None:
        """Our SETTINGS and the connection window's opening: the server's preface."""
        settings = b"".join(_SETTING.pack(k, v) for k, v in (
            (MAX_CONCURRENT_STREAMS, self.max_streams), (INITIAL_WINDOW_SIZE, self.max_body),
            (MAX_FRAME_SIZE, self.max_frame), (MAX_HEADER_LIST_SIZE, self.max_header_bytes),
        ))  # fmt: skip
        self._out.append(frame(SETTINGS, 0, 0, settings))
        self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(2 * self.max_body)))

    def data_to_send(self) -> bytes:
        out, self._out = self._out, []
        return b"".join(out)  # frames' headers and payloads (reply bodies as memoryviews)

    def close(self, code: int = NO_ERROR) -> None:
        """GOAWAY: no new stream will be served."""
        self._out.append(frame(GOAWAY, 0, 0, _U32.pack(self.last_stream) + _U32.pack(code)))

    def reset(self, stream_id: int, code: int) -> None:
        """A stream error: the stream is forgotten (opened or not) and the client told why."""
        self._drop(stream_id)
        self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(code)))

    def respond(self, stream_id: int, status: int, content_type: str, body: bytes) -> bool:
        """Queue the stream's reply; False when the stream is gone (the client reset it)."""
        s = self.streams.get(stream_id)
        if s is None:
            return False
        block = self._encoder.encode(status, content_type, len(body))
        self._out.append(frame(HEADERS, END_HEADERS | (0 if body else END_STREAM), stream_id, block))
        if body:
            s.pending = memoryview(body)
            self._send(stream_id, s)
        else:
            self._drop(stream_id)
        return True

    def _send(self, stream_id: int, s: _Stream) -> None:
        data = s.pending
        assert data is not None
        while len(data):
            size = min(self._send_window, s.send_window, self._peer_max_frame, len(data))
            if size <= 0:
                s.pending = data
                return  # a WINDOW_UPDATE or SETTINGS resumes it
            last = size == len(data)
            self._out.append(_HEAD.pack(size << 8 | DATA, END_STREAM if last else 0, stream_id))
            self._out.append(data[:size])  # joined once, in `data_to_send`
            self._send_window -= size
            s.send_window -= size
            data = data[size:]
        s.pending = None
        self._drop(stream_id)

    def _resume(self) -> None:
        for stream_id, s in list(self.streams.items()):
            if s.pending is not None:
                self._send(stream_id, s)

    def _drop(self, stream_id: int) -> None:
        s = self.streams.pop(stream_id, None)
        if s is not None and not s.ended:
            self._buffered -= len(s.body)

    # -- input ------------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Request]:
        """Requests completed by `data`. Raises `ProtocolViolation` (GOAWAY queued)."""
        try:
            return self._receive(data)
        except ProtocolViolation as e:
            self.close(e.code)
            raise

    def _receive(self, data: bytes) -> list[Request]:
        if not self._preface:
            self._in += data
            head = bytes(self._in[: len(PREFACE)])
            if not PREFACE.startswith(head):
                raise ProtocolViolation(PROTOCOL_ERROR, "not the HTTP/2 client preface")
            if len(head) < len(PREFACE):
                return []
            self._preface = True
            data, self._in = bytes(self._in[len(PREFACE) :]), bytearray()
        # Whole frames are read from `data` itself (most reads end on a frame's end); only a
        # frame cut by the read waits, copied, for the rest.
        buf: bytes | bytearray = data
        if self._in:
            self._in += data
            buf = self._in
        done: list[Request] = []
        at, end = 0, len(buf)
        while end - at >= 9:
            word, flags, stream_id = _HEAD.unpack_from(buf, at)
            length, kind = word >> 8, word & 0xFF
            stream_id &= 0x7FFFFFFF
            if length > self.max_frame:
                raise ProtocolViolation(FRAME_SIZE_ERROR, f"a frame of {length} bytes, over our {self.max_frame}")
            if end - at - 9 < length:
                break
            payload = buf[at + 9 : at + 9 + length]
            at += 9 + length
            request = self._frame(kind, flags, stream_id, payload if type(payload) is bytes else bytes(payload))
            if request is not None:
                done.append(request)
        self._in = bytearray(buf[at:]) if at < end else bytearray()
        if self._recv_unacked >= (DEFAULT_WINDOW + 2 * self.max_body) // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._recv_unacked)))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0
        return done

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> Request | None:
        if not self._settled and kind != SETTINGS:
            raise ProtocolViolation(PROTOCOL_ERROR, "the client's preface must end with SETTINGS")
        if self._block is not None and (kind != CONTINUATION or stream_id != self._block[0]):
            raise ProtocolViolation(PROTOCOL_ERROR, "a header block interrupted")
        if kind == DATA:
            return self._data(flags, stream_id, payload)
        if kind == HEADERS:
            return self._headers(flags, stream_id, payload)
        if kind == CONTINUATION:
            return self._continuation(flags, stream_id, payload)
        if kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if stream_id or len(payload) != 8:
                raise ProtocolViolation(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR, "a malformed PING")
            if not flags & ACK:
                self._out.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            if not stream_id or len(payload) != 4:
                raise ProtocolViolation(PROTOCOL_ERROR if not stream_id else FRAME_SIZE_ERROR, "a malformed RST_STREAM")
            self._known(stream_id)
            self._drop(stream_id)
        elif kind == PRIORITY:
            if not stream_id or len(payload) != 5:
                raise ProtocolViolation(PROTOCOL_ERROR if not stream_id else FRAME_SIZE_ERROR, "a malformed PRIORITY")
        elif kind == GOAWAY:
            if stream_id:
                raise ProtocolViolation(PROTOCOL_ERROR, "GOAWAY on a stream")
            self.goaway_received = True
        elif kind == PUSH_PROMISE:
            raise ProtocolViolation(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # Unknown frame types are ignored (section 5.5).
        return None

    def _known(self, stream_id: int) -> None:
        """A frame other than HEADERS or PRIORITY may name only a stream the client opened."""
        if stream_id > self.last_stream:
            raise ProtocolViolation(PROTOCOL_ERROR, f"a frame on stream {stream_id}, which was never opened")

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise ProtocolViolation(PROTOCOL_ERROR, "padding as long as the frame")
        return payload[1 : len(payload) - payload[0]]

    def _data(self, flags: int, stream_id: int, payload: bytes) -> Request | None:
        if not stream_id:
            raise ProtocolViolation(PROTOCOL_ERROR, "DATA on the connection")
        self._known(stream_id)
        size = len(payload)  # padding included: flow control counts the whole frame
        self._recv_window -= size
        if self._recv_window < 0:
            raise ProtocolViolation(FLOW_CONTROL_ERROR, "DATA over the connection's window")
        self._recv_unacked += size
        s = self.streams.get(stream_id)
        if s is None:
            return None  # closed or reset: read past (section 5.1)
        if s.ended:
            self.reset(stream_id, STREAM_CLOSED)
            return None
        data = self._unpad(flags, payload)
        if flags & END_STREAM and not s.body and not s.too_large and len(data) <= self.max_body:
            return self._ended(stream_id, s, data)  # the common request: its body in one frame
        if not s.too_large:
            # Per request the limit; per connection twice that, over every request still
            # arriving (HTTP/1.1 reads one body at a time; here many may arrive at once).
            if len(s.body) + len(data) > self.max_body or self._buffered + len(data) > 2 * self.max_body:
                s.too_large = True
                self._buffered -= len(s.body)
                s.body = bytearray()
            else:
                s.body += data
                self._buffered += len(data)
        if flags & END_STREAM:
            return self._ended(stream_id, s)
        # The stream's window is topped up as its body arrives (a body over the limit goes on
        # arriving, unread, until the request ends and is answered 413). The client's share
        # of what is held is bounded above, so the window is not enforced per stream.
        s.unacked += size
        if s.unacked >= max(self.max_body // 2, 1):
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(s.unacked)))
            s.unacked = 0
        return None

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> Request | None:
        if not stream_id:
            raise ProtocolViolation(PROTOCOL_ERROR, "HEADERS on the connection")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise ProtocolViolation(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            block = block[5:]
        if flags & END_HEADERS:
            return self._header_block(stream_id, flags, block)
        self._block = (stream_id, flags, bytearray(block))
        self._check_block_size(len(block))
        return None

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> Request | None:
        if self._block is None:
            raise ProtocolViolation(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        block = self._block[2]
        block += payload
        self._check_block_size(len(block))
        if not flags & END_HEADERS:
            return None
        opened_id, opened_flags, _ = self._block
        self._block = None
        return self._header_block(opened_id, opened_flags, bytes(block))

    def _check_block_size(self, size: int) -> None:
        if size > self.max_header_bytes:
            raise ProtocolViolation(ENHANCE_YOUR_CALM, f"a header block over {self.max_header_bytes} bytes")

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> Request | None:
        try:  # always decoded: the dynamic table must follow the client's encoder
            headers = self._decoder.decode(bytes(block))
        except headerblocks.BlockError as e:
            raise ProtocolViolation(COMPRESSION_ERROR, f"a header block that does not decode: {e}") from e
        end = bool(flags & END_STREAM)
        s = self.streams.get(stream_id)
        if s is not None:  # trailers: they must end the request
            if s.ended or not end:
                self.reset(stream_id, PROTOCOL_ERROR)
                return None
            return self._ended(stream_id, s)
        if stream_id <= self.last_stream:
            return None  # a stream closed or reset: read past
        if stream_id % 2 == 0:
            raise ProtocolViolation(PROTOCOL_ERROR, f"stream {stream_id}: clients open odd streams")
        self.last_stream = stream_id
        if self.goaway_received or len(self.streams) >= self.max_streams:
            self.reset(stream_id, REFUSED_STREAM)
            return None
        method = path = None
        for name, value in headers:
            if name == b":method":
                method = value.decode("ascii", "replace") if method is None else ""
            elif name == b":path":
                path = value.decode("ascii", "replace") if path is None else ""
        if not method or not path:  # missing, empty or given twice: a malformed request
            self.reset(stream_id, PROTOCOL_ERROR)
            return None
        s = self.streams[stream_id] = _Stream(method, path, send_window=self._peer_initial_window)
        return self._ended(stream_id, s) if end else None

    def _ended(self, stream_id: int, s: _Stream, whole: bytes | None = None) -> Request:
        s.ended = True
        body = whole if whole is not None else None if s.too_large else bytes(s.body)
        self._buffered -= len(s.body)
        s.body = bytearray()
        return Request(stream_id, s.method, s.path, body)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ProtocolViolation(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolViolation(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise ProtocolViolation(FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        for at in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, at)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolViolation(FLOW_CONTROL_ERROR, f"an initial window of {value}")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for s in self.streams.values():
                    s.send_window += delta
                    if s.send_window > MAX_WINDOW:
                        raise ProtocolViolation(FLOW_CONTROL_ERROR, "a stream's window over 2^31-1")
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= MAX_FRAME_LIMIT:
                    raise ProtocolViolation(PROTOCOL_ERROR, f"a maximum frame size of {value}")
                self._peer_max_frame = value
            elif key == ENABLE_PUSH and value > 1:
                raise ProtocolViolation(PROTOCOL_ERROR, f"ENABLE_PUSH {value}")
            # HEADER_TABLE_SIZE: our replies never use the dynamic table; the rest bind pushes
            # and the header lists we send, neither of which we make big.
        self._settled = True
        self._out.append(frame(SETTINGS, ACK, 0))
        self._resume()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(FRAME_SIZE_ERROR, "a WINDOW_UPDATE not 4 bytes long")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise ProtocolViolation(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ProtocolViolation(FLOW_CONTROL_ERROR, "the connection's window over 2^31-1")
            self._resume()
            return
        self._known(stream_id)
        s = self.streams.get(stream_id)
        if s is None:
            return
        if not increment:
            self.reset(stream_id, PROTOCOL_ERROR)
            return
        s.send_window += increment
        if s.send_window > MAX_WINDOW:
            self.reset(stream_id, FLOW_CONTROL_ERROR)
            return
        if s.pending is not None:
            self._send(stream_id, s)
