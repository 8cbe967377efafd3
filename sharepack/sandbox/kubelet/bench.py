"""How long the fake kubelet takes to admit a one-container pod against the stub plugin.

    python -m sharepack.sandbox.kubelet.bench [--devices 64] [--rounds 500] [--size 2]

Each round admits a pod (GetPreferredAllocation + Allocate over real unix sockets, plus the
kubelet's bookkeeping) and removes it again. Reports p50 / p99 / max in milliseconds: the fake's
own overhead, to subtract when the agent is measured through it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sharepack.sandbox.kubelet.devicemanager import ContainerSpec, FakeKubelet, PodSpec
from sharepack.sandbox.kubelet.stubplugin import RESOURCE, StubPlugin, dev


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(devices: int, rounds: int, size: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="klb", dir="/tmp"))
    try:
        async with FakeKubelet(root) as kubelet:
            plugin = StubPlugin(kubelet.device_plugin_dir, devices=[dev(f"dev-{n}") for n in range(devices)])
            await plugin.start()
            try:
                await plugin.register(kubelet.socket_path)
                await kubelet.wait_for_resource(RESOURCE)
                samples: list[float] = []
                for n in range(rounds):
                    pod = PodSpec(uid=f"u{n}", name=f"p{n}", containers=(ContainerSpec("main", {RESOURCE: size}),))
                    start = time.perf_counter()
                    await kubelet.admit_pod(pod)
                    samples.append((time.perf_counter() - start) * 1000)
                    await kubelet.remove_pod(pod.uid)
                    plugin.calls.clear()
            finally:
                await plugin.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "p50_ms": statistics.median(samples),
        "p99_ms": _quantile(samples, 0.99),
        "max_ms": max(samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--size", type=int, default=2)
    args = parser.parse_args()
    figures = asyncio.run(measure(args.devices, args.rounds, args.size))
    print(" ".join(f"{k}={v:.3f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
