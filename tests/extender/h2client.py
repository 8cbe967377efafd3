"""A small HTTP/2 client for the tests (the h2 library's client side over asyncio streams):
concurrent requests on one connection, request bodies sent as flow control allows, and a
receive window the test may keep small to make the server wait for it."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.settings


@dataclass
class Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    reset: bool = False


class H2Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, window: int | None) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        if window is not None:  # a small receive window: the server must wait for our updates
            self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.answers: dict[int, Answer] = {}
        self.done: dict[int, asyncio.Future[Answer]] = {}
        self.window_opened = asyncio.Event()
        self.terminated: h2.events.ConnectionTerminated | None = None
        self.closed = asyncio.Event()
        self._flush()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, port: int, ctx: ssl.SSLContext | None = None, *, window: int | None = None) -> H2Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        return cls(reader, writer, window)

    def alpn(self) -> str | None:
        obj = self.writer.get_extra_info("ssl_object")
        return obj.selected_alpn_protocol() if obj is not None else None

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(65536):
                for event in self.conn.receive_data(data):
                    self._on(event)
                self._flush()
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            for f in self.done.values():
                if not f.done():
                    f.set_exception(ConnectionError("the connection closed"))

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            a = self.answers[event.stream_id]
            a.headers = {k: v for k, v in event.headers}  # type: ignore[misc]
            a.status = int(a.headers[":status"])
        elif isinstance(event, h2.events.DataReceived):
            self.answers[event.stream_id].body += event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.done[event.stream_id].set_result(self.answers[event.stream_id])
        elif isinstance(event, h2.events.StreamReset):
            self.answers[event.stream_id].reset = True
            self.done[event.stream_id].set_result(self.answers[event.stream_id])
        elif isinstance(event, h2.events.WindowUpdated):
            self.window_opened.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.terminated = event

    async def request(self, method: str, path: str, body: bytes = b"") -> Answer:
        sid = self.start(method, path, len(body), end=not body)
        if body:
            await self.send(sid, body, end=True)
        return await self.done[sid]

    def start(self, method: str, path: str, length: int, *, end: bool = False) -> int:
        """Open a stream with the request's headers; its body follows with `send`."""
        sid = self.conn.get_next_available_stream_id()
        self.answers[sid] = Answer()
        self.done[sid] = asyncio.get_running_loop().create_future()
        headers = [(":method", method), (":path", path), (":scheme", "https"), (":authority", "extender"),
                   ("content-type", "application/json"), ("content-length", str(length))]  # fmt: skip
        self.conn.send_headers(sid, headers, end_stream=end)
        self._flush()
        return sid

    async def send(self, sid: int, body: bytes, *, end: bool) -> None:
        """Send (part of) the stream's body as flow control allows; `end` ends the request."""
        if not body:
            if end:
                self.conn.end_stream(sid)
            self._flush()
            return
        view = memoryview(body)
        while len(view):
            size = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size, len(view))
            if size <= 0:
                self._flush()
                self.window_opened.clear()
                await self.window_opened.wait()
                continue
            self.conn.send_data(sid, view[:size].tobytes(), end_stream=end and size == len(view))
            view = view[size:]
        self._flush()

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
            await self.writer.wait_closed()
