"""A small HTTP/1.1 client for one server: keep-alive connections on asyncio protocols, nothing
else (no proxies, redirects, cookies or compression).

`kube.rawapi` sends the extender's binds through it. A Binding is one short request and one
short answer; through aiohttp's request and response objects, URL and header machinery a
call cost twice the CPU it does here (benchmarks/bench_apicalls.py: 0.092 against 0.041 ms,
client and server), and /bind runs for every GPU pod kube-scheduler schedules.

What it does speak: Content-Length and chunked answers, an answer that ends at connection
close, `Connection: close`, and one retry on a new connection when a kept-alive one was closed
before any byte of its answer arrived (the server's idle timeout racing our request: Go's
transport retries the same case). A malformed answer raises `ProtocolError` and its
connection is dropped; so is a connection whose request was cancelled or timed out.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import cast

# An answer's head larger than this is not an API server's: refuse it rather than buffer on.
MAX_HEAD = 64 * 1024


class ProtocolError(Exception):
    """The server's bytes are not an HTTP/1.1 answer we can read."""


class ConnectionClosed(ConnectionError):
    """The connection ended before the answer did."""

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered  # some of the answer had arrived: never retried


class _Answer:
    """Parses one answer from the bytes fed to it; `done` once the body is complete."""

    def __init__(self, head_only: bool) -> None:
        self._head_only = head_only  # the answer to a HEAD has no body whatever its headers say
        self._buf = bytearray()
        self.status = 0
        self.keep_alive = True
        self._length: int | None = None  # Content-Length, or None
        self._chunked = False
        self._until_close = False
        self._body = bytearray()
        self._chunk_left = -1  # -1: a chunk-size line comes next
        self.done = False

    def feed(self, data: bytes) -> None:
        self._buf += data
        if not self.status:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD:
                    raise ProtocolError(f"answer head longer than {MAX_HEAD} bytes")
                return
            self._head(bytes(self._buf[:end]))
            del self._buf[: end + 4]
        self._read_body()

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.1 status line: {lines[0][:100]!r}")
        self.status = int(parts[1])
        if 100 <= self.status < 200:
            raise ProtocolError(f"unexpected interim answer {self.status}")
        if parts[0] == b"HTTP/1.0":
            self.keep_alive = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise ProtocolError(f"malformed header line: {line[:100]!r}")
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                if not value.isdigit() or (self._length is not None and self._length != int(value)):
                    raise ProtocolError(f"bad Content-Length: {value[:40]!r}")
                self._length = int(value)
            elif name == b"transfer-encoding":
                if value.lower() != b"chunked":
                    raise ProtocolError(f"unsupported Transfer-Encoding: {value[:40]!r}")
                self._chunked = True
            elif name == b"connection" and value.lower() == b"close":
                self.keep_alive = False
        if self._head_only or self.status in (204, 304):
            self._length, self._chunked = 0, False
        elif self._chunked:
            self._length = None  # RFC 9112 6.3: chunked wins over a Content-Length
        elif self._length is None:
            self._until_close = True
            self.keep_alive = False

    def _read_body(self) -> None:
        if self._chunked:
            self._read_chunks()
        elif self._length is not None:
            self._body += self._buf
            self._buf.clear()
            if len(self._body) > self._length:
                raise ProtocolError(f"answer longer than its Content-Length {self._length}")
            self.done = len(self._body) == self._length
        else:  # until close
            self._body += self._buf
            self._buf.clear()

    def _read_chunks(self) -> None:
        buf = self._buf
        while not self.done:
            if self._chunk_left == -1:
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise ProtocolError("chunk-size line too long")
                    return
                size = bytes(buf[:end]).partition(b";")[0].strip()
                try:
                    self._chunk_left = int(size, 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size: {size[:40]!r}") from None
                del buf[: end + 2]
                if self._chunk_left == 0:
                    self._chunk_left = -2  # the trailer section: lines until an empty one
            if self._chunk_left == -2:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                del buf[: end + 2]
                self.done = end == 0
                continue
            if len(buf) < self._chunk_left + 2:
                return
            if buf[self._chunk_left : self._chunk_left + 2] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            self._body += buf[: self._chunk_left]
            del buf[: self._chunk_left + 2]
            self._chunk_left = -1

    def closed(self) -> bytes:
        """The body when the connection ended: complete only for an answer read until close."""
        if self._until_close and self.status:
            self.done = True
        if not self.done:
            raise ConnectionClosed("connection closed before the answer was complete",
                                   answered=bool(self.status or self._buf))  # fmt: skip
        return bytes(self._body)

    @property
    def body(self) -> bytes:
        return bytes(self._body)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._answer: _Answer | None = None
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's transports do not derive from asyncio's classes.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, request: bytes, head_only: bool) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None and self._waiter is None
        self._answer = _Answer(head_only)
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self._waiter

    def data_received(self, data: bytes) -> None:
        answer, waiter = self._answer, self._waiter
        if answer is None or waiter is None:
            self._fail(ProtocolError(f"bytes from the server with no request outstanding: {data[:60]!r}"))
            return
        try:
            answer.feed(data)
        except ProtocolError as e:
            self._fail(e)
            return
        if answer.done:
            self._settle(answer.status, answer.body)
            if not answer.keep_alive and self.transport is not None:
                self.transport.close()

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        answer = self._answer
        if answer is None or self._waiter is None:
            return
        try:
            body = answer.closed()
        except ConnectionClosed as e:
            if exc is not None:
                e.__cause__ = exc
            self._fail(e)
        else:
            self._settle(answer.status, body)

    def _settle(self, status: int, body: bytes) -> None:
        waiter, self._waiter, self._answer = self._waiter, None, None
        if waiter is not None and not waiter.done():
            waiter.set_result((status, body))

    def _fail(self, e: Exception) -> None:
        waiter, self._waiter, self._answer = self._waiter, None, None
        if self.transport is not None:
            self.transport.close()
        self.lost = True
        if waiter is not None and not waiter.done():
            waiter.set_exception(e)

    @property
    def idle(self) -> bool:
        return not self.lost and self._waiter is None and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Client:
    """Requests to one server (`host`, `port`; TLS when `ssl_context`), at most `limit` at a
    time, over connections kept between them."""

    def __init__(
        self, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None, limit: int = 32,
    ) -> None:  # fmt: skip
        self.host, self.port = host, port
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self.connections = 0  # opened so far

    async def request(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of one request; `target` is the path and query, quoted already.
        Raises OSError (ConnectionClosed among them) or ProtocolError; ValueError, before
        anything is sent, for a line break in `target` or a header."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header()}"]
        lines += [f"{name}: {value}" for name, value in headers]
        for line in lines:
            if "\r" in line or "\n" in line:  # it would end the head early: a header of the caller's choosing
                raise ValueError(f"a line break in the request's head: {line[:100]!r}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        request = head + body if body else head
        async with self._slots:
            conn, reused = await self._connection()
            try:
                return await self._exchange(conn, request, method == "HEAD")
            except ConnectionClosed as e:
                if not reused or e.answered:
                    raise
            # The server closed a kept-alive connection as we wrote to it: nothing was read,
            # so nothing was done; once more, on a new connection.
            conn, _ = await self._connection(reuse=False)
            return await self._exchange(conn, request, method == "HEAD")

    async def _exchange(self, conn: _Connection, request: bytes, head_only: bool) -> tuple[int, bytes]:
        self._busy.add(conn)
        ok = False
        try:
            answer = await conn.send(request, head_only)
            ok = True
            return answer
        finally:
            self._busy.discard(conn)
            if ok and conn.idle:
                self._idle.append(conn)
            else:
                conn.close()  # failed, cancelled or timed out mid-answer: its bytes are unknown

    async def _connection(self, *, reuse: bool = True) -> tuple[_Connection, bool]:
        while reuse and self._idle:
            conn = self._idle.pop()
            if conn.idle:
                return conn, True
        loop = asyncio.get_running_loop()
        name = (self._server_hostname or self.host) if self._ssl is not None else None
        _, conn = await loop.create_connection(_Connection, self.host, self.port, ssl=self._ssl, server_hostname=name)
        self.connections += 1
        return conn, False

    def _host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self._ssl is not None else 80
        return host if self.port == default else f"{host}:{self.port}"

    def close(self) -> None:
        for conn in (*self._idle, *self._busy):
            conn.close()
        self._idle.clear()
