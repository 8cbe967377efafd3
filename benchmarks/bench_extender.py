"""Prioritize latency of the extender at 100, 1,000 and 5,000 nodes (nodeCacheCapable: true).

    .venv/bin/python benchmarks/bench_extender.py [--nodes 100,1000,5000] [--calls 300]

For each size: the extender app and a baseline app that only decodes the same body and echoes
it (orjson loads + dumps) run in this process on 127.0.0.1; one aiohttp client posts the exact
body kube-scheduler sends (a pending Pod + NodeNames) and times each round trip. Reported:

* warm   — node states unchanged between calls (every score memoised);
* churn  — one node's published state changes before every call (as after a bind): its scorer
           is rebuilt and re-scored for recently seen pod shapes when the change arrives, so
           the request finds it memoised;
* cold   — the first call for a pod shape after every node changed at once, reported once:
           every node is simulated (random usage, so no two nodes alike);
* alike  — the same cold call on a cluster whose nodes follow 4 usage patterns (empty, full,
           half, a few replicas): alike nodes share one simulation (`ScoreTemplates`);
* echo   — the decode-and-echo baseline; `ratio` = extender p99 / echo p99;
* metrics — what the Prometheus metrics cost per request: warm prioritize through the app's own
           route (request counter + latency histogram) and through the same handler without
           them, the two called alternately so that load on the machine hits both alike.

The caches are loaded through the same path as the watch (`ClusterView.replace_states`), then
`gc.collect(); gc.freeze()` as the extender does once its caches are synced.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from sharepack.common import state as published
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.extender.caches import ClusterView
from sharepack.extender.server import Extender

SHARED = "nvidia.com/gpu.shared"


PATTERNS = ((0,) * 8, (4,) * 8, (4, 4, 4, 4, 0, 0, 0, 0), (4, 4, 2, 0, 0, 0, 0, 0))


def node_state(name: str, rng: random.Random, rv: int, *, alike: bool = False) -> dict[str, Any]:
    pattern = rng.choice(PATTERNS) if alike else None
    gpus = []
    for i in range(8):
        allocated = pattern[i] if pattern is not None else rng.choice([0, 0, 1, 2, 3, 4])
        gpus.append(GpuState(f"GPU-{name}-{i}", str(i), "NVIDIA A100-SXM4-40GB", 4, allocated, 0,
                             tuple(f"pod-{name}-{i}-{k}" for k in range(allocated))))  # fmt: skip
    state = NodeState("2026-11-30T03:00:00Z", "0.1.0", Policy.PACKED, MigStrategy.NONE,
                      (ResourceState(SHARED, Sharing.TIME_SLICING, False, tuple(gpus)),))  # fmt: skip
    return {"metadata": {"name": name, "resourceVersion": str(rv)}, "status": published.to_status(state)}


def pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "trainer-0", "namespace": "default", "uid": "8f0c6a1e-0000-4000-8000-000000000001",
                     "resourceVersion": "4711", "labels": {"app": "trainer"}},
        "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                                 "resources": {"limits": {SHARED: "1", "cpu": "2"}, "requests": {SHARED: "1", "cpu": "2"}}}],
                 "schedulerName": "default-scheduler", "restartPolicy": "Always"},
        "status": {"phase": "Pending"},
    }  # fmt: skip


async def echo(request: web.Request) -> web.Response:
    return web.Response(body=orjson.dumps(orjson.loads(await request.read())), content_type="application/json")


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


async def timed_posts(http: aiohttp.ClientSession, url: str, body: bytes, calls: int,
                      before: Any = None) -> list[float]:  # fmt: skip
    out = []
    for i in range(calls):
        if before is not None:
            before(i)
        t0 = time.perf_counter()
        async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        out.append(time.perf_counter() - t0)
    return out


async def bench(n: int, calls: int) -> dict[str, float]:
    rng = random.Random(n)
    names = [f"gpu-node-{i:05d}" for i in range(n)]
    objects = [node_state(name, rng, 1) for name in names]
    view = ClusterView(Policy.PACKED)
    view.replace_states(objects)
    alike = ClusterView(Policy.PACKED)
    alike.replace_states([node_state(name, rng, 1, alike=True) for name in names])
    gc.collect()
    gc.freeze()

    extender = Extender(view)
    app = extender.app()
    app.router.add_post("/echo", echo)
    app.router.add_post("/unmetered/prioritize", extender.prioritize)  # the handler, no metrics
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    alike_app = Extender(alike).app()
    alike_runner = web.AppRunner(alike_app, access_log=None)
    await alike_runner.setup()
    alike_site = web.TCPSite(alike_runner, "127.0.0.1", 0)
    await alike_site.start()
    alike_port = alike_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    body = orjson.dumps({"Pod": pod(), "Nodes": None, "NodeNames": names})
    result: dict[str, float] = {"nodes": n, "body_kib": len(body) / 1024}
    try:
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{port}"
            cold = await timed_posts(http, base + "/prioritize", body, 1)
            result["cold_ms"] = cold[0] * 1e3
            cold = await timed_posts(http, f"http://127.0.0.1:{alike_port}/prioritize", body, 1)
            result["alike_ms"] = cold[0] * 1e3
            await timed_posts(http, base + "/echo", body, 5)
            warm = await timed_posts(http, base + "/prioritize", body, calls)
            rv = [1]

            def change_one(i: int) -> None:
                rv[0] += 1
                view.upsert_state(node_state(names[i % n], rng, rv[0]))

            churn = await timed_posts(http, base + "/prioritize", body, calls, before=change_one)
            base_echo = await timed_posts(http, base + "/echo", body, calls)
            metered, unmetered = [], []
            for _ in range(calls):
                metered += await timed_posts(http, base + "/prioritize", body, 1)
                unmetered += await timed_posts(http, base + "/unmetered/prioritize", body, 1)
    finally:
        await runner.cleanup()
        await alike_runner.cleanup()
        gc.unfreeze()
    pairs = (("warm", warm), ("churn", churn), ("echo", base_echo), ("metered", metered), ("unmetered", unmetered))
    for label, samples in pairs:
        result[f"{label}_p50_ms"] = pct(samples, 0.50) * 1e3
        result[f"{label}_p99_ms"] = pct(samples, 0.99) * 1e3
        result[f"{label}_mean_ms"] = statistics.fmean(samples) * 1e3
    result["ratio_p50"] = result["warm_p50_ms"] / result["echo_p50_ms"]
    result["ratio_p99"] = result["warm_p99_ms"] / result["echo_p99_ms"]
    result["metrics_p50"] = result["metered_p50_ms"] / result["unmetered_p50_ms"]
    result["metrics_p99"] = result["metered_p99_ms"] / result["unmetered_p99_ms"]
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="100,1000,5000")
    p.add_argument("--calls", type=int, default=300)
    a = p.parse_args()
    print(f"{'nodes':>6} {'KiB':>6} {'cold':>7} {'alike':>6} | {'warm p50':>8} {'p99':>7} | {'churn p50':>9} {'p99':>7} |"
          f" {'echo p50':>8} {'p99':>7} | {'ratio p50':>9} {'p99':>5}   (ms)")  # fmt: skip
    for n in (int(x) for x in a.nodes.split(",")):
        r = asyncio.run(bench(n, a.calls))
        print(f"{n:>6} {r['body_kib']:>6.1f} {r['cold_ms']:>7.2f} {r['alike_ms']:>6.2f} | {r['warm_p50_ms']:>8.3f} {r['warm_p99_ms']:>7.3f} |"
              f" {r['churn_p50_ms']:>9.3f} {r['churn_p99_ms']:>7.3f} | {r['echo_p50_ms']:>8.3f} {r['echo_p99_ms']:>7.3f} |"
              f" {r['ratio_p50']:>9.2f} {r['ratio_p99']:>5.2f}", flush=True)  # fmt: skip
        print(f"{'':>6} metrics: with p50 {r['metered_p50_ms']:.3f} p99 {r['metered_p99_ms']:.3f} |"
              f" without p50 {r['unmetered_p50_ms']:.3f} p99 {r['unmetered_p99_ms']:.3f} |"
              f" ratio p50 {r['metrics_p50']:.3f} p99 {r['metrics_p99']:.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
