"""CPU per Kubernetes API call: the generated `kubernetes.aio` methods, an aiohttp session, and `kube.rawapi`.

    .venv/bin/python benchmarks/bench_apicalls.py [--calls 300]

A small asyncio server in this process answers every call with a small Pod (parsing the
request's head and body, nothing more, so that the clients' own cost is most of what is
measured); each client reads a pod and creates a Binding `--calls` times, the three
alternately, and the process CPU per call (client and server together) is printed with the
ratios to `kube.rawapi`. What /bind's API calls cost the extender's event loop
(`extender.binding.ApiBinder`): `kube.rawapi` sends them through `kube.http1`, and through an
aiohttp session as it did before (and still does behind a proxy).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from kubernetes.aio import client

from sharepack.kube import rawapi

POD = orjson.dumps({
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d", "uid": "u"},
    "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu.shared": "2"}}}]},
})  # fmt: skip
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(POD), POD)
BINDING: Any = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n"}}


class Answering(asyncio.Protocol):
    """Answers each request (a head, then Content-Length bytes of body) with ANSWER."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in self.buf[:end].split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            assert self.transport is not None
            self.transport.write(ANSWER)


async def cpu_per_call(call: Callable[[], Awaitable[Any]], calls: int) -> float:
    t0 = time.process_time()
    for _ in range(calls):
        await call()
    return (time.process_time() - t0) * 1e3 / calls


async def main(calls: int) -> None:
    server = await asyncio.get_running_loop().create_server(Answering, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conf = client.Configuration(host=f"http://127.0.0.1:{port}")
    conf.api_key = {"BearerToken": "token"}
    conf.api_key_prefix = {"BearerToken": "Bearer"}
    api: Any = client.ApiClient(conf)
    core = client.CoreV1Api(api)
    raw = rawapi.RawApi(api)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32), trust_env=False)
    headers = {"Accept": rawapi.JSON, "Content-Type": rawapi.JSON, "Authorization": "Bearer token"}

    async def generated() -> None:
        for resp in (
            await core.read_namespaced_pod_without_preload_content("p", "d", _request_timeout=10),
            await core.create_namespaced_pod_binding_without_preload_content("p", "d", BINDING, _request_timeout=10),
        ):
            await resp.read()
            resp.release()

    async def through_aiohttp() -> None:
        base = conf.host
        for method, path, body in (("GET", rawapi.pod_path("d", "p"), None),
                                   ("POST", rawapi.pod_path("d", "p", "binding"), orjson.dumps(BINDING))):  # fmt: skip
            async with session.request(method, base + path, data=body, headers=headers) as resp:
                await resp.read()

    async def ours() -> None:
        await raw.request("GET", rawapi.pod_path("d", "p"))
        await raw.request("POST", rawapi.pod_path("d", "p", "binding"), orjson.dumps(BINDING))

    clients = {"generated kubernetes.aio": generated, "aiohttp session": through_aiohttp, "kube.rawapi": ours}
    try:
        for call in clients.values():
            await call()
        runs: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(5):  # alternately, so that load from elsewhere hits all alike
            for name, call in clients.items():
                runs[name].append(await cpu_per_call(call, calls // 5) / 2)
        medians = {name: sorted(r)[2] for name, r in runs.items()}
        own = medians["kube.rawapi"]
        print("CPU per API call (client + server): " + ", ".join(
            f"{name} {ms:.3f} ms" + ("" if name == "kube.rawapi" else f" (x{ms / own:.2f})") for name, ms in medians.items()))  # fmt: skip
    finally:
        await raw.close()
        await session.close()
        await api.close()
        server.close()
        await server.wait_closed()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--calls", type=int, default=300)
    asyncio.run(main(p.parse_args().calls))
