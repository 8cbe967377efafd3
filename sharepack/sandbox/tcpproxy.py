"""One address in front of several extender replicas, as a Service spreads connections.

kube-proxy balances connections, not requests: each new TCP connection goes to the next
backend that accepts it (round-robin), and the bytes pass through untouched (TLS included). A
backend that refuses the connection (a killed replica, before its endpoint is removed) is
skipped, as an endpoint that failed its readiness probe would be. With `affinity` (the
Service's `sessionAffinity: ClientIP`; every client here is 127.0.0.1) a new connection goes to
the backend of the previous one while that backend accepts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence

CONNECT_TIMEOUT_S = 2.0


class RoundRobinProxy:
    def __init__(self, backends: Sequence[tuple[str, int]], host: str = "127.0.0.1", *, affinity: bool = False) -> None:
        self.backends = list(backends)
        self.affinity = affinity
        self._sticky: int | None = None
        self.host = host
        self.port = 0
        self._next = itertools.cycle(range(len(self.backends)))
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = [0] * len(self.backends)  # accepted per backend
        self.refused = 0  # connections no backend accepted

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        # Closing both ends ends each pipe; cancelling a connection's task instead makes
        # asyncio's stream server log the cancellation as an error.
        for writer in list(self._writers):
            writer.close()
        if self._pipes:
            await asyncio.wait(self._pipes, timeout=5)

    async def _connect(self) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter] | None:
        order = [next(self._next) for _ in range(len(self.backends))]
        if self.affinity and self._sticky is not None:
            order = [self._sticky] + [i for i in order if i != self._sticky]
        for i in order:
            host, port = self.backends[i]
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
                self._sticky = i
                return i, reader, writer
        return None

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        self._writers.add(client_writer)
        try:
            backend = await self._connect()
            if backend is None:
                self.refused += 1
                return
            i, reader, writer = backend
            self._writers.add(writer)
            self.connections[i] += 1
            try:
                await asyncio.gather(_pipe(client_reader, writer), _pipe(reader, client_writer))
            finally:
                writer.close()
                self._writers.discard(writer)
        finally:
            client_writer.close()
            self._writers.discard(client_writer)
            self._pipes.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
