"""Publishing figures (a benchmark, not a test): sandbox API server + fake kubelet + agent +
`run_publication` at the default `PublishSettings`, over real HTTP and unix sockets.

    .venv/bin/python benchmarks/bench_publishing.py [--burst 100] [--spaced 40] [--gpus 8] [--replicas 16]

Prints
* burst: `--burst` pods started back to back through the fake kubelet (one replica each of a
  time-sliced `nvidia.com/gpu`): NodeGpuState writes, the time until every pod's UID is
  published, and writes per second over that time;
* latency from a pod start (the kubelet's admission returns) to the first published
  NodeGpuState that lists the pod's UID, p50 / p99 / max, for the burst and for `--spaced` pods
  started 0.1-0.6 s apart.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sharepack.agent import publishing  # noqa: E402
from sharepack.common import state as schema  # noqa: E402
from sharepack.sandbox.apiserver import resources as kinds  # noqa: E402
from tests.publishing.harness import Node, config, gpus, node, time_slicing  # noqa: E402


class Seen:
    """When each pod UID first appears in a published NodeGpuState (from the store's watch)."""

    def __init__(self, n: Node) -> None:
        self.first: dict[str, float] = {}
        self._store = n.server.store
        self._watcher = self._store.watch(kinds.NODE_GPU_STATES, None, lambda _o: True, str(self._store.rv))
        self.updated = asyncio.Event()

    async def run(self) -> None:
        while True:
            event = await self._watcher.queue.get()
            if event is None:
                return
            now = time.monotonic()
            status = event["object"].get("status")
            if not status:
                continue
            for res in schema.from_status(status).resources:
                for g in res.gpus:
                    for uid in g.pods:
                        self.first.setdefault(uid, now)
            self.updated.set()

    def close(self) -> None:
        self._store.unwatch(self._watcher)

    async def until(self, uids: set[str], timeout: float = 30.0) -> float:
        async with asyncio.timeout(timeout):
            while not uids <= self.first.keys():
                self.updated.clear()
                await self.updated.wait()
        return max(self.first[u] for u in uids)


def percentiles(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    return f"p50 {statistics.median(ms):.0f} ms, p99 {p99:.0f} ms, max {ms[-1]:.0f} ms (n={len(ms)})"


async def main(args: argparse.Namespace) -> None:
    settings = publishing.PublishSettings()
    print(f"settings: debounce {settings.debounce_s}s, min interval {settings.min_interval_s}s, "
          f"PodResources poll {settings.poll_interval_s}s; {args.gpus} GPUs x {args.replicas} replicas")
    async with node(config(time_slicing(args.replicas, "packed")), gpus(args.gpus), settings=settings) as n:
        seen = Seen(n)
        watcher = asyncio.create_task(seen.run())
        try:
            await n.wait_state(lambda s: True, timeout=5)
            await asyncio.sleep(1.0)  # a quiet node: the first write's min interval has passed

            # -- burst ------------------------------------------------------------------
            t0 = time.monotonic()
            writes_before = len(n.server.writes("nodegpustates"))
            started: dict[str, float] = {}
            for i in range(args.burst):
                uid = await n.start_pod(f"burst-{i}")
                started[uid] = time.monotonic()
            admitted = time.monotonic() - t0
            done = await seen.until(set(started))
            span = done - t0
            writes = len(n.server.writes("nodegpustates")) - writes_before
            print(f"burst of {args.burst} pod starts: admitted in {admitted:.2f}s, all published after "
                  f"{span:.2f}s, {writes} writes -> {writes / span:.1f} writes/s")
            print(f"  pod start -> published: {percentiles([seen.first[u] - t for u, t in started.items()])}")
            for name in list(n.started):
                await n.stop_pod(name)
            await n.wait_state(lambda s: not any(g.pods for r in s.resources for g in r.gpus), timeout=5)

            # -- spaced -----------------------------------------------------------------
            rng = random.Random(7)
            spaced: dict[str, float] = {}
            for i in range(args.spaced):
                await asyncio.sleep(rng.uniform(0.1, 0.6))
                uid = await n.start_pod(f"spaced-{i}")
                spaced[uid] = time.monotonic()
            await seen.until(set(spaced))
            print(f"{args.spaced} spaced pod starts (0.1-0.6 s apart):")
            print(f"  pod start -> published: {percentiles([seen.first[u] - t for u, t in spaced.items()])}")
        finally:
            seen.close()
            watcher.cancel()
            await asyncio.wait([watcher])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--spaced", type=int, default=40)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=16)
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(main(parser.parse_args()))
