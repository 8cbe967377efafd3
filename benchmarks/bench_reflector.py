"""Why the agent and the extender use kube.reflecting, not `kubernetes.informer.SharedInformer`.

    .venv/bin/python benchmarks/bench_reflector.py [--nodes 5000] [--pods-per-node 4] [--outage 2]

The sandbox API server in this process holds what the extender caches at `--nodes`: one
NodeGpuState per node (8 GPUs) and `--pods-per-node` GPU pods bound to each node. Measured:

* pods, initial sync: SharedInformer (the blocking client's `list_pod_for_all_namespaces`, every
  pod decoded into V1Pod models) vs kube.reflecting.Reflector (the aio client's raw response,
  parsed with orjson); wall time from start to a full cache, and the CPU time of this process.
* NodeGpuStates: SharedInformer over `list_cluster_custom_object` (the client returns a dict,
  and SharedInformer reads `.items` of the response), vs the Reflector.
* an outage: the API server refuses connections for `--outage` seconds after both are synced;
  how many times each tries again meanwhile (SharedInformer re-watches at once after an error;
  the Reflector backs off).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client as sync_client
from kubernetes import config as sync_config
from kubernetes.aio import client as aio_client
from kubernetes.informer import SharedInformer

from sharepack.common import state as published
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.kube import clients
from sharepack.kube.reflecting import Reflector
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer

SHARED = "nvidia.com/gpu.shared"


def fill(server: FakeApiServer, nodes: int, pods_per_node: int) -> None:
    store = server.store
    for n in range(nodes):
        name = f"node-{n}"
        uids = []
        for p in range(pods_per_node):
            pod = store.create(kinds.PODS, "default", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-pod-{p}", "namespace": "default", "labels": {"app": "trainer"}},
                "spec": {"nodeName": name, "containers": [{
                    "name": "main", "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                    "resources": {"limits": {SHARED: "1", "cpu": "1", "memory": "1Gi"}},
                }]},
            })  # fmt: skip
            uids.append(pod["metadata"]["uid"])
        gpus = tuple(GpuState(f"GPU-{name}-{i}", str(i), "NVIDIA A100-SXM4-40GB", 4, 1 if i < len(uids) else 0, 0,
                              (uids[i],) if i < len(uids) else ()) for i in range(8))  # fmt: skip
        state = NodeState("2026-12-01T12:00:00Z", "0.1.0", Policy.PACKED, MigStrategy.NONE,
                          (ResourceState(SHARED, Sharing.TIME_SLICING, False, gpus),))  # fmt: skip
        store.create(kinds.NODE_GPU_STATES, "", {"apiVersion": f"{published.GROUP}/{published.VERSION}",
                                                 "kind": published.KIND, "metadata": {"name": name}})  # fmt: skip
        obj = store.get(kinds.NODE_GPU_STATES, "", name)
        obj["status"] = published.to_status(state)
        store.update(kinds.NODE_GPU_STATES, "", name, obj, "status")


class Errors:
    def __init__(self) -> None:
        self.count = 0
        self.last = ""
        self.lock = threading.Lock()

    def __call__(self, exc: Any) -> None:
        with self.lock:
            self.count += 1
            self.last = f"{type(exc).__name__}: {exc}"[:160]


async def shared_informer_sync(list_func: Any, want: int, errors: Errors, deadline_s: float) -> tuple[SharedInformer, float, float]:
    informer = SharedInformer(list_func)  # type: ignore[no-untyped-call]
    informer.add_event_handler("ERROR", errors)  # type: ignore[no-untyped-call]
    t0, c0 = time.perf_counter(), time.process_time()
    informer.start()  # type: ignore[no-untyped-call]
    end = time.monotonic() + deadline_s
    while len(informer.cache.list_keys()) < want and time.monotonic() < end:
        await asyncio.sleep(0.01)
    return informer, time.perf_counter() - t0, time.process_time() - c0


async def reflector_sync(list_call: Any, what: str) -> tuple[Reflector, asyncio.Task[None], float, float]:
    reflector = Reflector(list_call, what=what, watch_timeout_s=60, backoff_initial_s=0.2, backoff_max_s=10.0)
    t0, c0 = time.perf_counter(), time.process_time()
    task = asyncio.create_task(reflector.run(), name=f"bench-{what}")
    await reflector.synced.wait()
    return reflector, task, time.perf_counter() - t0, time.process_time() - c0


async def main(nodes: int, pods_per_node: int, outage_s: float) -> None:
    server = FakeApiServer()
    await server.start()
    t0 = time.perf_counter()
    fill(server, nodes, pods_per_node)
    pods = nodes * pods_per_node
    print(f"sandbox API server: {nodes} NodeGpuStates, {pods} bound pods (filled in {time.perf_counter() - t0:.1f} s)")
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        kubeconfig = server.write_kubeconfig(Path(d) / "kubeconfig")
        api = sync_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        aio = clients.aio_client_like(api)
        core, custom = sync_client.CoreV1Api(api), sync_client.CustomObjectsApi(api)
        acore, acustom = aio_client.CoreV1Api(aio), aio_client.CustomObjectsApi(aio)
        started: list[SharedInformer] = []
        tasks: list[asyncio.Task[None]] = []
        try:
            print(f"\n{'':34}{'wall s':>9}{'cpu s':>9}{'cached':>9}")
            ours_pods, task, wall, cpu = await reflector_sync(
                functools.partial(acore.list_pod_for_all_namespaces_without_preload_content, field_selector="spec.nodeName!="),
                "pods",
            )  # fmt: skip
            tasks.append(task)
            print(f"{'pods: kube.reflecting':34}{wall:9.2f}{cpu:9.2f}{len(ours_pods.cache):9d}")
            pod_errors = Errors()
            theirs, s_wall, s_cpu = await shared_informer_sync(core.list_pod_for_all_namespaces, pods, pod_errors, 600)
            started.append(theirs)
            print(f"{'pods: SharedInformer (V1Pod)':34}{s_wall:9.2f}{s_cpu:9.2f}{len(theirs.cache.list_keys()):9d}"
                  f"   {s_wall / wall:.0f}x the wall time, {s_cpu / cpu:.0f}x the CPU")  # fmt: skip

            ours_states, task, wall, cpu = await reflector_sync(
                functools.partial(acustom.list_cluster_custom_object_without_preload_content,
                                  published.GROUP, published.VERSION, published.PLURAL), "nodegpustates",
            )  # fmt: skip
            tasks.append(task)
            print(f"{'nodegpustates: kube.reflecting':34}{wall:9.2f}{cpu:9.2f}{len(ours_states.cache):9d}")
            state_errors = Errors()
            states, s_wall, s_cpu = await shared_informer_sync(
                functools.partial(custom.list_cluster_custom_object, published.GROUP, published.VERSION, published.PLURAL),
                nodes, state_errors, 10,
            )  # fmt: skip
            started.append(states)
            print(f"{'nodegpustates: SharedInformer':34}{s_wall:9.2f}{s_cpu:9.2f}{len(states.cache.list_keys()):9d}"
                  f"   {state_errors.count} errors in 10 s, last: {state_errors.last}")  # fmt: skip

            ours_errors = ours_pods.errors
            pod_errors.count = 0
            await server.pause("refuse")
            await asyncio.sleep(outage_s)
            theirs_tries = pod_errors.count
            ours_tries = ours_pods.errors - ours_errors
            await server.resume()
            print(f"\nAPI server refusing connections for {outage_s:.0f} s: retries on the pod watch: "
                  f"SharedInformer {theirs_tries}, kube.reflecting {ours_tries}")  # fmt: skip
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.stop()  # ends the informers' watches, so stop() can join their threads
            for informer in started:
                informer.stop()  # type: ignore[no-untyped-call]
            await aio.close()  # type: ignore[no-untyped-call]
            api.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods-per-node", type=int, default=4)
    p.add_argument("--outage", type=float, default=2.0)
    a = p.parse_args()
    # Counted through the handlers instead: SharedInformer logs a traceback for every retry.
    logging.getLogger("kubernetes.informer").setLevel(logging.CRITICAL)
    logging.getLogger("sharepack.kube.reflecting").setLevel(logging.ERROR)
    asyncio.run(main(a.nodes, a.pods_per_node, a.outage))
