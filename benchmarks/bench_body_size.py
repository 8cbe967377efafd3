"""How big a /filter body kube-scheduler sends at 5,000 nodes, and what decoding it costs: the
figures behind the extender's `--max-body-bytes` default (sharepack/extender/server.py).

    .venv/bin/python benchmarks/bench_body_size.py [--nodes 5000]

Two bodies, as kube-scheduler writes them (`ExtenderArgs`): a pending GPU pod with

* `NodeNames` (`nodeCacheCapable: true`, what deploy/ ships): one name per candidate;
* `Nodes.items` (`nodeCacheCapable: false`): one whole Node object per candidate, shaped as a
  kubelet reports a GPU node (labels of the GPU feature discovery kind, four conditions, two
  addresses, the kubelet's default 50 images with two names each, nodeInfo, capacity and
  allocatable with GPU resources).

For each: the body's size, the largest node count whose body fits the default limit, and the
peak of Python allocations while `extender.protocol.decode_args` decodes it (tracemalloc; the
process's RSS grows by more: the body itself, aiohttp's buffer).
"""

from __future__ import annotations

import argparse
import tracemalloc
from typing import Any

import orjson

from sharepack.extender import protocol
from sharepack.extender.server import DEFAULT_MAX_BODY_BYTES

MIB = 1024 * 1024


def pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "trainer-7f9c6d5b8-x2k4q", "namespace": "ml-team", "uid": "0b5e7c44-7a1e-4c1b-9d3e-6f2a8c9d1e0f",
                     "labels": {"app": "trainer", "pod-template-hash": "7f9c6d5b8"}},
        "spec": {"schedulerName": "default-scheduler", "containers": [{
            "name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "resources": {"limits": {"nvidia.com/gpu.shared": "2", "cpu": "4", "memory": "16Gi"},
                          "requests": {"nvidia.com/gpu.shared": "2", "cpu": "4", "memory": "16Gi"}}}]},
        "status": {"phase": "Pending"},
    }  # fmt: skip


def node_name(i: int) -> str:
    return f"gpu-node-{i:05d}.us-east-1.compute.internal"


def node(i: int) -> dict[str, Any]:
    name = node_name(i)
    images = [{"names": [f"registry.example.com/team-{k}/image-{k}@sha256:{(i * 50 + k):064x}",
                         f"registry.example.com/team-{k}/image-{k}:v1.{k}.0"],
               "sizeBytes": 1_000_000_000 + k} for k in range(50)]  # fmt: skip
    conditions = [{"type": t, "status": "False" if t != "Ready" else "True", "reason": f"Kubelet{t}",
                   "message": f"kubelet reports {t}", "lastHeartbeatTime": "2026-12-01T03:00:00Z",
                   "lastTransitionTime": "2026-11-01T03:00:00Z"}
                  for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")]  # fmt: skip
    resources = {"cpu": "96", "memory": "1056499652Ki", "ephemeral-storage": "1844187764Ki", "pods": "110",
                 "hugepages-1Gi": "0", "hugepages-2Mi": "0", "nvidia.com/gpu": "8", "nvidia.com/gpu.shared": "32"}
    return {
        "metadata": {
            "name": name, "uid": f"{i:08x}-0000-4000-8000-000000000000", "resourceVersion": str(1000000 + i),
            "creationTimestamp": "2026-11-01T03:00:00Z",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/zone": "us-east-1a",
                       "topology.kubernetes.io/region": "us-east-1", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                       "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559", "nvidia.com/cuda.driver.major": "550",
                       "sharepack.io/config": "default"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24", "providerID": f"aws:///us-east-1a/i-{i:017x}"},
        "status": {
            "capacity": resources, "allocatable": resources, "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 256 % 256}.{i % 256}"},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": f"{i:032x}", "systemUUID": f"{i:032x}", "bootID": f"{i:032x}",
                         "kernelVersion": "6.8.0-1015-aws", "osImage": "Ubuntu 24.04.1 LTS",
                         "containerRuntimeVersion": "containerd://1.7.22", "kubeletVersion": "v1.37.2",
                         "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        },
    }  # fmt: skip


def names_body(n: int) -> bytes:
    return orjson.dumps({"Pod": pod(), "Nodes": None, "NodeNames": [node_name(i) for i in range(n)]})


def nodes_body(n: int) -> bytes:
    return orjson.dumps({"Pod": pod(), "Nodes": {"items": [node(i) for i in range(n)]}, "NodeNames": None})


def decode_peak(body: bytes) -> int:
    tracemalloc.start()
    try:
        protocol.decode_args(body)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    n = ap.parse_args().nodes
    limit = DEFAULT_MAX_BODY_BYTES
    print(f"--max-body-bytes default: {limit} ({limit / MIB:.1f} MiB)")
    for label, build in (("NodeNames (nodeCacheCapable: true)", names_body),
                         ("Nodes.items (nodeCacheCapable: false)", nodes_body)):  # fmt: skip
        body = build(n)
        per_node = (len(body) - len(build(0))) / n
        fits = int((limit - len(build(0))) // per_node)
        print(f"{label}: {n} nodes = {len(body)} bytes ({len(body) / MIB:.2f} MiB), {per_node:.0f} bytes/node; "
              f"limit / body = {limit / len(body):.1f}; fits up to {fits} nodes; "
              f"decode peak {decode_peak(body) / MIB:.1f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
