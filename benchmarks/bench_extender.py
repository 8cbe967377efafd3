"""Filter and prioritize latency of the extender at 100, 1,000 and 5,000 nodes, as shipped.

    .venv/bin/python benchmarks/bench_extender.py [--nodes 100,1000,5000] [--calls 300] [--config shipped|packed]

`--config shipped` (the default) builds the extender's caches as `sharepack-extender` does with
deploy/'s flags (`common.shipped`): node policy `fragaware`, the tier filter (`--filter-tier-width
1`), directed GPUs, and the CPU-aware ranks (every node's CPU and memory known,
`extender.noderesources`). Nodes as `bench_scheduler.py`'s fleet: 8 GPUs x 10 time-slicing
replicas, agents allocating `packed`, 128 CPUs, a GPU model label, random GPU and CPU use. Pods:
the default trace's mix (`bench_scheduler.pod_mix`: GPUs x replicas of the share, CPU, memory;
CPU-only pods included). `--config packed` is this benchmark before it ran the shipped
configuration: node policy `packed`, no tier, no CPU known, 8 GPUs x 4 replicas, one pod shape.

For each size and verb (/filter, /prioritize): the extender app and a baseline app that only
decodes the same body and echoes it (orjson loads + dumps) run in this process on 127.0.0.1;
one aiohttp client posts the exact body kube-scheduler sends (a pending Pod + NodeNames) and
times each round trip. Reported:

* cold   — the first call for a pod shape after every node changed at once (a freshly loaded
           cache, the fragmentation measure's memo emptied too), reported once: every node is
           simulated (random usage, so few nodes alike);
* alike  — the same cold call on a cluster whose nodes follow 4 usage patterns (empty, full,
           half, a few replicas) and 2 CPU levels: alike nodes share one simulation (`ScoreTemplates`);
* warm   — node states unchanged between calls, one pod repeated (every score memoised);
* churn  — one node's published state changes before every call (as after a bind), one pod
           repeated; `change` is what handling that change took (the watch path, untimed in
           the call: the extender rebuilds the node's scorer and re-scores it for the shapes
           it keeps answers for);
* mix    — node states unchanged, each call a different pod of the trace's mix (shapes the
           caches keep, and shapes they had to drop);
* echo   — the decode-and-echo baseline; `ratio` = warm prioritize p99 / echo p99;
* metrics — what the Prometheus metrics cost per request: warm prioritize through the app's own
           route (request counter + latency histogram) and through the same handler without
           them, the two called alternately so that load on the machine hits both alike.

The caches are loaded through the same path as the watches (`NodeResources.upsert_node` /
`assume`, `ClusterView.replace_states`), then `gc.collect(); gc.freeze()` as the extender does
once its caches are synced.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scheduler import pod_mix  # noqa: E402

from sharepack.common import fragmentation, gpumodels, shipped, state as published  # noqa: E402
from sharepack.common.policies import MigStrategy, NodePolicy, Policy, Sharing  # noqa: E402
from sharepack.common.state import GpuState, NodeState, ResourceState  # noqa: E402
from sharepack.extender.caches import ClusterView  # noqa: E402
from sharepack.extender.noderesources import NodeResources  # noqa: E402
from sharepack.extender.server import Extender  # noqa: E402

SHARED = "nvidia.com/gpu.shared"
GPUS = 8
CPU_MILLI = 128_000  # the fleet's nodes (`sandbox.kubelet.fleet.synthetic_shapes`)
MEMORY_MIB = 1_048_576
MODEL = gpumodels.label_value("NVIDIA A100-SXM4-80GB")
VERBS = ("filter", "prioritize")


@dataclass(frozen=True)
class Config:
    name: str
    replicas: int  # per GPU
    usage: tuple[int, ...]  # allocated replicas per GPU, drawn per GPU (random cluster)
    patterns: tuple[tuple[int, ...], ...]  # per-node usage patterns (alike cluster)
    cpu_known: bool  # nodes' CPU and memory known (`NodeResources`)
    make_view: Callable[[NodeResources | None], ClusterView]
    description: str


SHIPPED = Config(
    "shipped", 10, (0, 0, 0, 2, 5, 8, 10), ((0,) * 8, (10,) * 8, (10,) * 4 + (0,) * 4, (10, 10, 5, 0, 0, 0, 0, 0)), True,
    lambda resources: ClusterView(
        shipped.NODE_POLICY, tier_width=shipped.FILTER_TIER_WIDTH, resources=resources,
        directed=shipped.DIRECTED_GPUS and shipped.NODE_POLICY == NodePolicy.FRAGAWARE,
    ),
    f"shipped: node policy {shipped.NODE_POLICY}, tier width {shipped.FILTER_TIER_WIDTH}, directed GPUs "
    f"{shipped.DIRECTED_GPUS}, nodes' CPU and memory known; {GPUS} GPUs x 10 replicas per node; "
    "pods: the default trace's mix",
)  # fmt: skip
PACKED = Config(
    "packed", 4, (0, 0, 1, 2, 3, 4), ((0,) * 8, (4,) * 8, (4, 4, 4, 4, 0, 0, 0, 0), (4, 4, 2, 0, 0, 0, 0, 0)), False,
    lambda resources: ClusterView(Policy.PACKED),
    f"packed (the old benchmark): node policy packed, no tier, no CPU known; {GPUS} GPUs x 4 replicas per node; "
    "pods: one shape (1 replica, 2 CPUs), the mix row the default trace's",
)  # fmt: skip
CONFIGS = {c.name: c for c in (SHIPPED, PACKED)}


def node_state(config: Config, name: str, rng: random.Random, rv: int, *, alike: bool = False) -> dict[str, Any]:
    pattern = rng.choice(config.patterns) if alike else None
    gpus = []
    for i in range(GPUS):
        allocated = pattern[i] if pattern is not None else rng.choice(config.usage)
        gpus.append(GpuState(f"GPU-{name}-{i}", str(i), "NVIDIA A100-SXM4-80GB", config.replicas, allocated, 0,
                             tuple(f"pod-{name}-{i}-{k}" for k in range(allocated))))  # fmt: skip
    state = NodeState("2026-11-30T03:00:00Z", "0.1.0", shipped.AGENT_POLICY, MigStrategy.NONE,
                      (ResourceState(SHARED, Sharing.TIME_SLICING, False, tuple(gpus)),))  # fmt: skip
    return {"metadata": {"name": name, "resourceVersion": str(rv)}, "status": published.to_status(state)}


def node_object(config: Config, name: str) -> dict[str, Any]:
    allocatable = {
        "cpu": f"{CPU_MILLI}m",
        "memory": f"{MEMORY_MIB}Mi",
        "pods": "1000",
        SHARED: str(GPUS * config.replicas),
    }
    return {
        "metadata": {"name": name, "labels": {gpumodels.PRODUCT_LABEL: MODEL}},
        "status": {"allocatable": allocatable},
    }


def load_view(config: Config, names: list[str], seed: int, *, alike: bool = False) -> ClusterView:
    """A view as the extender's watches fill it: Nodes, the CPU their pods take, then states."""
    rng = random.Random(seed)
    resources = NodeResources() if config.cpu_known else None
    view = config.make_view(resources)
    if resources is not None:
        for name in names:
            resources.upsert_node(node_object(config, name))
            used = rng.choice((0, 64_000)) if alike else rng.randrange(0, CPU_MILLI + 1, 4_000)
            if used:
                resources.assume(f"running-{name}", name, used, 0)
    view.replace_states([node_state(config, name, rng, 1, alike=alike) for name in names])
    return view


def one_pod() -> dict[str, Any]:
    """The old benchmark's pod."""
    return {
        "metadata": {"name": "trainer-0", "namespace": "default", "uid": "8f0c6a1e-0000-4000-8000-000000000001",
                     "resourceVersion": "4711", "labels": {"app": "trainer"}},
        "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                                 "resources": {"limits": {SHARED: "1", "cpu": "2"}, "requests": {SHARED: "1", "cpu": "2"}}}],
                 "schedulerName": "default-scheduler", "restartPolicy": "Always"},
        "status": {"phase": "Pending"},
    }  # fmt: skip


def trace_pods(config: Config, count: int, prefix: str) -> list[dict[str, Any]]:
    """`count` pending pods of the default trace's mix, each with its own UID (as kube-scheduler
    sends them: the extender keeps a request per UID for /bind)."""
    pods = pod_mix(count, config.replicas, prefix=prefix)
    for i, p in enumerate(pods):
        p["metadata"]["uid"] = f"{prefix}-{i:08d}-0000-4000-8000-000000000000"
        p["status"] = {"phase": "Pending"}
    return pods


def fixed_pod(config: Config) -> dict[str, Any]:
    """The pod of the warm, churn and cold rows: shipped, the mix's first pod with GPUs."""
    if config is PACKED:
        return one_pod()
    return next(p for p in trace_pods(config, 50, "fixed") if "limits" in p["spec"]["containers"][0]["resources"])


def args_body(pod: dict[str, Any], names: list[str]) -> bytes:
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


async def echo(request: web.Request) -> web.Response:
    return web.Response(body=orjson.dumps(orjson.loads(await request.read())), content_type="application/json")


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


async def timed_posts(http: aiohttp.ClientSession, url: str, bodies: list[bytes], calls: int,
                      before: Any = None) -> list[float]:  # fmt: skip
    out = []
    for i in range(calls):
        if before is not None:
            before(i)
        t0 = time.perf_counter()
        async with http.post(url, data=bodies[i % len(bodies)], headers={"Content-Type": "application/json"}) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        out.append(time.perf_counter() - t0)
    return out


class Served:
    """An app on 127.0.0.1 in this process."""

    def __init__(self, app: web.Application) -> None:
        self.runner = web.AppRunner(app, access_log=None)
        self.url = ""

    async def __aenter__(self) -> Served:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


async def cold_call(config: Config, names: list[str], verb: str, body: bytes, *, alike: bool) -> float:
    """One call of `verb` on a freshly loaded view (no shape seen, no measure memoised)."""
    fragmentation._MEASURES.clear()
    fragmentation._BY_ID.clear()
    view = load_view(config, names, len(names), alike=alike)
    gc.collect()
    gc.freeze()
    try:
        async with Served(Extender(view).app()) as site, aiohttp.ClientSession() as http:
            return (await timed_posts(http, f"{site.url}/{verb}", [body], 1))[0]
    finally:
        gc.unfreeze()


async def bench(config: Config, n: int, calls: int) -> dict[str, float]:
    names = [f"gpu-node-{i:05d}" for i in range(n)]
    body = args_body(fixed_pod(config), names)
    mix = [args_body(p, names) for p in trace_pods(config, calls, "mix")]
    result: dict[str, float] = {"nodes": n, "body_kib": len(body) / 1024}
    for verb in VERBS:
        result[f"{verb}_cold_ms"] = await cold_call(config, names, verb, body, alike=False) * 1e3
        result[f"{verb}_alike_ms"] = await cold_call(config, names, verb, body, alike=True) * 1e3

    rng = random.Random(n)
    view = load_view(config, names, n)
    gc.collect()
    gc.freeze()
    extender = Extender(view)
    app = extender.app()
    app.router.add_post("/echo", echo)

    async def unmetered_prioritize(request: web.Request) -> web.Response:
        # The verb's own work, without the route's metrics and authorization around it.
        reply = await extender.prioritize_reply(await request.read())
        return web.Response(status=reply.status, body=reply.body, headers={"Content-Type": reply.content_type})

    app.router.add_post("/unmetered/prioritize", unmetered_prioritize)
    samples: dict[str, list[float]] = {}
    try:
        async with Served(app) as site, aiohttp.ClientSession() as http:
            base = site.url
            await timed_posts(http, base + "/echo", [body], 5)
            rv = [1]

            changes: list[float] = []

            def change_one(i: int) -> None:
                rv[0] += 1
                obj = node_state(config, names[i % n], rng, rv[0])
                t0 = time.perf_counter()
                view.upsert_state(obj)
                changes.append(time.perf_counter() - t0)

            for verb in VERBS:
                url = f"{base}/{verb}"
                await timed_posts(http, url, [body], 1)  # the shape seen once: its caches kept
                samples[f"{verb}_warm"] = await timed_posts(http, url, [body], calls)
                samples[f"{verb}_churn"] = await timed_posts(http, url, [body], calls, before=change_one)
                samples[f"{verb}_change"], changes[:] = list(changes), []
                samples[f"{verb}_mix"] = await timed_posts(http, url, mix, calls)
            samples["echo"] = await timed_posts(http, base + "/echo", [body], calls)
            metered: list[float] = []
            unmetered: list[float] = []
            for _ in range(calls):
                metered += await timed_posts(http, base + "/prioritize", [body], 1)
                unmetered += await timed_posts(http, base + "/unmetered/prioritize", [body], 1)
            samples["metered"], samples["unmetered"] = metered, unmetered
    finally:
        gc.unfreeze()
    for label, values in samples.items():
        result[f"{label}_p50_ms"] = pct(values, 0.50) * 1e3
        result[f"{label}_p99_ms"] = pct(values, 0.99) * 1e3
        result[f"{label}_mean_ms"] = statistics.fmean(values) * 1e3
    result["ratio_p50"] = result["prioritize_warm_p50_ms"] / result["echo_p50_ms"]
    result["ratio_p99"] = result["prioritize_warm_p99_ms"] / result["echo_p99_ms"]
    result["metrics_p50"] = result["metered_p50_ms"] / result["unmetered_p50_ms"]
    result["metrics_p99"] = result["metered_p99_ms"] / result["unmetered_p99_ms"]
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="100,1000,5000")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--config", choices=sorted(CONFIGS), default=SHIPPED.name)
    a = p.parse_args()
    config = CONFIGS[a.config]
    print(f"configuration: {config.description}")
    print(f"{'nodes':>6} {'verb':>10} {'KiB':>6} {'cold':>7} {'alike':>6} | {'warm p50':>8} {'p99':>7} |"
          f" {'churn p50':>9} {'p99':>7} {'change p99':>10} | {'mix p50':>7} {'p99':>7}   (ms)")  # fmt: skip
    for n in (int(x) for x in a.nodes.split(",")):
        r = asyncio.run(bench(config, n, a.calls))
        for verb in VERBS:
            print(f"{n:>6} {verb:>10} {r['body_kib']:>6.1f} {r[f'{verb}_cold_ms']:>7.2f} {r[f'{verb}_alike_ms']:>6.2f} |"
                  f" {r[f'{verb}_warm_p50_ms']:>8.3f} {r[f'{verb}_warm_p99_ms']:>7.3f} |"
                  f" {r[f'{verb}_churn_p50_ms']:>9.3f} {r[f'{verb}_churn_p99_ms']:>7.3f} {r[f'{verb}_change_p99_ms']:>10.3f} |"
                  f" {r[f'{verb}_mix_p50_ms']:>7.3f} {r[f'{verb}_mix_p99_ms']:>7.3f}", flush=True)  # fmt: skip
        print(f"{'':>6} echo p50 {r['echo_p50_ms']:.3f} p99 {r['echo_p99_ms']:.3f} | warm prioritize / echo:"
              f" ratio p50 {r['ratio_p50']:.2f} p99 {r['ratio_p99']:.2f}", flush=True)  # fmt: skip
        print(f"{'':>6} metrics: with p50 {r['metered_p50_ms']:.3f} p99 {r['metered_p99_ms']:.3f} |"
              f" without p50 {r['unmetered_p50_ms']:.3f} p99 {r['unmetered_p99_ms']:.3f} |"
              f" ratio p50 {r['metrics_p50']:.3f} p99 {r['metrics_p99']:.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
