"""Directed GPUs: the physical GPUs the extender chose for a pod, handed to the node's agent.

At bind the extender predicts, on the node's effective state, which physical GPUs each container
of the pod lands on (`scoring.container_placements`, the loop that also scores the node) and
writes them into the pod's annotation `sharepack.io/gpus`. When the kubelet then asks the node's
agent for a preferred allocation, the agent answers with devices on exactly those GPUs if they
are all available, and falls back to its own policy otherwise. So the prediction the extender
counts with is the placement the pod gets, and an extender could choose the GPU itself, not
only the node.

The annotation, one line of JSON (version 1):

    {"v": 1, "node": "gpu-node-7",
     "containers": [{"name": "main", "gpus": {"nvidia.com/gpu.shared": ["GPU-8f0c...", "GPU-8f0c..."]}}]}

* `node`: the node the placement was computed for; an agent ignores directions for another
  node (a pod re-bound after a failed bind carries the new node's).
* `containers`, in the kubelet's order (init containers, then app containers): per resource,
  the physical GPU key of each device the container takes *beyond what it reuses* from the
  pod's init containers, one entry per device. The kubelet asks the device plugin for
  `size` = the container's whole request with the reused devices as `must_include`, so a
  container matches a request when `len(must_include) + len(keys) == size`. Containers that
  take nothing new are left out: the kubelet never asks for them.

Only the extender's service account may write the annotation (deploy/base/extender/
gpu-directions-policy.yaml), and readers believe it only where it fits the pod (`mismatch`): a pod's
author cannot steer other pods' GPUs by naming containers it does not have.

This module is the only reader and writer of that format (extender and agent both use it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

from sharepack.common import devices
from sharepack.common.errors import DirectionsError
from sharepack.common.podrequests import PodRequest

ANNOTATION = "sharepack.io/gpus"
VERSION = 1


@dataclass(frozen=True, slots=True)
class ContainerDirections:
    name: str
    gpus: Mapping[str, tuple[str, ...]]  # resource -> physical GPU key per new device, sorted


@dataclass(frozen=True, slots=True)
class Directions:
    node: str
    containers: tuple[ContainerDirections, ...]  # kubelet order


def from_placements(node: str, placements: Sequence[tuple[str, Mapping[str, Sequence[str]]]]) -> Directions:
    """Directions from `scoring.container_placements` (container name, resource -> GPU keys)."""
    return Directions(
        node,
        tuple(
            ContainerDirections(name, MappingProxyType({r: tuple(sorted(k)) for r, k in gpus.items() if k}))
            for name, gpus in placements
            if any(gpus.values())
        ),
    )


def placement(d: Directions) -> dict[str, tuple[str, ...]]:
    """The pod's whole placement (`scoring.Placement`): every container's GPUs per resource."""
    out: dict[str, list[str]] = {}
    for c in d.containers:
        for resource, keys in c.gpus.items():
            out.setdefault(resource, []).extend(keys)
    return {r: tuple(sorted(k)) for r, k in out.items()}


def encode(d: Directions) -> str:
    doc = {
        "v": VERSION,
        "node": d.node,
        "containers": [{"name": c.name, "gpus": {r: list(k) for r, k in c.gpus.items()}} for c in d.containers],
    }
    return orjson.dumps(doc).decode()


def _fail(where: str, why: str) -> DirectionsError:
    return DirectionsError(f"invalid {ANNOTATION} annotation of {where}: {why}")


def decode(text: str, *, where: str) -> Directions:
    """Parse an annotation value; raises DirectionsError naming `where` (the pod) and the fault."""
    try:
        doc: Any = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise _fail(where, f"not JSON ({e}): {text[:80]!r}") from None
    if not isinstance(doc, dict):
        raise _fail(where, f"want an object, got {type(doc).__name__}")
    if doc.get("v") != VERSION:
        raise _fail(where, f"unknown version {doc.get('v')!r} (this build reads {VERSION})")
    node = doc.get("node")
    if not isinstance(node, str) or not node:
        raise _fail(where, f"node must be a non-empty string, got {node!r}")
    raw = doc.get("containers")
    if not isinstance(raw, list):
        raise _fail(where, f"containers must be a list, got {type(raw).__name__}")
    containers = []
    for i, c in enumerate(raw):
        name = c.get("name") if isinstance(c, dict) else None
        gpus = c.get("gpus") if isinstance(c, dict) else None
        if not isinstance(name, str) or not isinstance(gpus, dict):
            raise _fail(where, f"containers[{i}] must have a string name and a gpus object")
        out: dict[str, tuple[str, ...]] = {}
        for resource, keys in gpus.items():
            if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
                raise _fail(where, f"containers[{i}].gpus[{resource!r}] must be a list of GPU keys")
            out[resource] = tuple(sorted(keys))
        containers.append(ContainerDirections(name, MappingProxyType(out)))
    return Directions(node, tuple(containers))


def mismatch(d: Directions, request: PodRequest) -> str | None:
    """Why `d` cannot be directions the extender wrote for the pod `request` describes; None
    when they fit. The extender directs a pod's own containers, in the kubelet's order, each
    once, and names per resource at most as many devices as the container requests of it
    (fewer where it reuses an init container's). Anything else was not written for this pod:
    readers then ignore the directions and the node's policy answers."""
    order = {c.name: i for i, c in enumerate(request.containers)}
    last = -1
    for c in d.containers:
        i = order.get(c.name)
        if i is None:
            return f"container {c.name!r} is not one of the pod's containers"
        if i <= last:
            return f"container {c.name!r} is named twice or out of the pod's order"
        last = i
        for resource, keys in c.gpus.items():
            wanted = request.containers[i].amount(resource)
            if not keys or len(keys) > wanted:
                return f"container {c.name!r} is directed to {len(keys)} {resource} device(s) but requests {wanted}"
    return None


def choose_devices(
    keys: Sequence[str],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    group_of: Mapping[str, str],
) -> list[str] | str:
    """The devices to answer for directed GPUs `keys` (one per new device): `must_include`,
    then on each directed GPU as many available devices as it is directed, in the order the
    agent's own loop breaks ties in (`devices.device_order`). `group_of`: device ID -> physical
    key (MIG instances group by parent GPU). A string saying why when they do not fit:
    the caller falls back to its own policy."""
    if len(must_include) + len(keys) != size:
        return (
            f"directions name {len(keys)} new device(s) but the request is for {size} "
            f"with {len(must_include)} already chosen"
        )
    chosen = list(must_include)
    taken = set(must_include)
    free: dict[str, list[str]] = {}
    for d in sorted(available, key=devices.device_order):
        key = group_of.get(d)
        if key is not None and d not in taken:
            free.setdefault(key, []).append(d)
    for key, n in sorted(Counter(keys).items()):
        have = free.get(key, [])
        if len(have) < n:
            return f"GPU {key} has {len(have)} of the {n} directed device(s) available"
        chosen.extend(have[:n])
    return chosen


def of_pod(obj: Any, node: str) -> Directions | None:
    """A pod's (JSON) `sharepack.io/gpus` directions when they are for `node`; None when it has
    none or they name another node. Raises DirectionsError when they do not decode."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    annotations = meta.get("annotations")
    text = annotations.get(ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(text, str):
        return None
    d = decode(text, where=f"pod {meta.get('namespace')}/{meta.get('name')}")
    return d if d.node == node else None
