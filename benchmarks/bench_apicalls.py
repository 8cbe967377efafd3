"""CPU per Kubernetes API call: the generated `kubernetes.aio` methods against `kube.rawapi`.

    .venv/bin/python benchmarks/bench_apicalls.py [--calls 300]

One aiohttp server in this process answers every call with a small Pod; each client reads a pod
and creates a Binding `--calls` times, alternately, and the process CPU per call (client and
server together, so the server's share is in both) is printed with the ratio. What /bind's four
calls cost the extender's event loop (`extender.binding.ApiBinder`).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from kubernetes.aio import client

from sharepack.kube import rawapi

POD = orjson.dumps({
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d", "uid": "u"},
    "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu.shared": "2"}}}]},
})  # fmt: skip
BINDING: Any = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n"}}


async def answer(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=POD, content_type="application/json")


async def cpu_per_call(call: Callable[[], Awaitable[Any]], calls: int) -> float:
    t0 = time.process_time()
    for _ in range(calls):
        await call()
    return (time.process_time() - t0) * 1e3 / calls


async def main(calls: int) -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    conf = client.Configuration(host=f"http://127.0.0.1:{port}")
    conf.api_key = {"BearerToken": "token"}
    conf.api_key_prefix = {"BearerToken": "Bearer"}
    api: Any = client.ApiClient(conf)
    core = client.CoreV1Api(api)
    raw = rawapi.RawApi(api)

    async def generated() -> None:
        for resp in (
            await core.read_namespaced_pod_without_preload_content("p", "d", _request_timeout=10),
            await core.create_namespaced_pod_binding_without_preload_content("p", "d", BINDING, _request_timeout=10),
        ):
            await resp.read()
            resp.release()

    async def ours() -> None:
        await raw.request("GET", rawapi.pod_path("d", "p"))
        await raw.request("POST", rawapi.pod_path("d", "p", "binding"), orjson.dumps(BINDING))

    try:
        await generated()
        await ours()
        a, b = [], []
        for _ in range(5):  # alternately, so that load from elsewhere hits both alike
            a.append(await cpu_per_call(generated, calls // 5))
            b.append(await cpu_per_call(ours, calls // 5))
        gen, own = sorted(a)[2] / 2, sorted(b)[2] / 2
        print(f"CPU per API call (client + server): generated kubernetes.aio {gen:.3f} ms, kube.rawapi {own:.3f} ms, "
              f"ratio {gen / own:.1f}")  # fmt: skip
    finally:
        await raw.close()
        await api.close()
        await runner.cleanup()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--calls", type=int, default=300)
    asyncio.run(main(p.parse_args().calls))
