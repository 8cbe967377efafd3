"""Agent latencies over real unix sockets, on the NVML simulator (no GPU, no cluster).

    .venv/bin/python benchmarks/bench_agent.py [--machine dgx-a100] [--rounds 2000] [--xids 40]

Prints, as the kubelet sees them:
* GetPreferredAllocation + Allocate round trip (one replica of a time-sliced resource, 8 GPUs x
  4 replicas, packed policy): p50 / p99 over `--rounds` calls from a gRPC client on the
  plugin's socket;
* time from an XID injected into the simulator to the ListAndWatch message that reports the
  devices unhealthy (the agent's thread waits in NVML; the stream is read by a plain client);
* time from a kubelet restart (sockets deleted, kubelet.sock re-created) until the resource is
  registered again and its device list arrived (the fake kubelet's view).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sharepack.agent import nvml, registering  # noqa: E402
from sharepack.agent.health import XidPolicy  # noqa: E402
from sharepack.agent.running import Agent, Settings  # noqa: E402
from sharepack.common.config import load_config  # noqa: E402
from sharepack.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc  # noqa: E402
from sharepack.sandbox.kubelet.devicemanager import FakeKubelet  # noqa: E402

CONFIG = """
version: v1
flags:
  plugin:
    sharedDevicesAllocationPolicy: packed
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def show(name: str, samples_s: list[float]) -> None:
    ms = [s * 1000 for s in samples_s]
    print(
        f"{name}: n={len(ms)} p50={pct(ms, 0.50):.3f} ms p99={pct(ms, 0.99):.3f} ms "
        f"mean={statistics.fmean(ms):.3f} ms max={max(ms):.3f} ms"
    )


async def bench(machine: str, rounds: int, xids: int, restarts_n: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="spb-", dir="/tmp"))
    lib = nvml.load_library(machine)
    inventory = nvml.read_inventory(lib)
    watcher = nvml.XidWatcher(lib)
    kubelet = FakeKubelet(root)
    await kubelet.start()
    config = load_config(file_text=CONFIG, file_source="bench", env={}, flags={})
    settings = Settings(
        kubelet_socket=kubelet.socket_path, xid_policy=XidPolicy(), drain_grace_s=0.1, recovery_after_s=0.02
    )
    agent = Agent(settings, config, inventory, wait_for_xid=watcher.wait)
    run = asyncio.create_task(agent.run())
    try:
        await kubelet.wait_for_resource("nvidia.com/gpu", timeout=10)
        path = agent.server_sockets()["nvidia.com/gpu"]
        ids = [d.id for d in agent.resources[0].devices]
        async with grpc.aio.insecure_channel(registering.unix_target(path)) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            for _ in range(50):  # warm up the channel and the code paths
                await _round_trip(stub, ids)
            samples = []
            for _ in range(rounds):
                started = time.perf_counter()
                await _round_trip(stub, ids)
                samples.append(time.perf_counter() - started)
            show("GetPreferredAllocation+Allocate round trip", samples)

            stream = stub.ListAndWatch(api_pb2.Empty())
            first = await stream.read()
            assert isinstance(first, api_pb2.ListAndWatchResponse)
            latencies = []
            gpus = [g.uuid for g in inventory.gpus]
            for n in range(xids):
                if n:
                    await stream.read()  # the GPU hit last healed (recovery after a quiet 20 ms)
                started = time.perf_counter()
                lib.inject_xid(gpus[n % len(gpus)], 79)  # type: ignore[attr-defined]
                update = await stream.read()
                latencies.append(time.perf_counter() - started)
                assert isinstance(update, api_pb2.ListAndWatchResponse)
            stream.cancel()
            show("injected XID -> ListAndWatch update", latencies)

        restarts = []
        for _ in range(restarts_n):
            started = time.perf_counter()
            await kubelet.restart()
            await kubelet.wait_for_resource("nvidia.com/gpu", timeout=10)
            restarts.append(time.perf_counter() - started)
        show("kubelet restart -> re-registered with devices", restarts)
    finally:
        agent.request_stop()
        await run
        watcher.close()
        nvml.shutdown(lib)
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _round_trip(stub: api_pb2_grpc.DevicePluginAsyncStub, ids: list[str]) -> None:
    preferred = await stub.GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=1)
            ]
        )
    )
    chosen = list(preferred.container_responses[0].deviceIDs)
    await stub.Allocate(
        api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)])
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine", default="dgx-a100")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--xids", type=int, default=40)
    parser.add_argument("--restarts", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(bench(args.machine, args.rounds, args.xids, args.restarts))


if __name__ == "__main__":
    main()
