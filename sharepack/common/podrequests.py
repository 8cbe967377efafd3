"""A pod's request for managed (GPU) resources, counted the way the kubelet counts it.

The kubelet's device manager allocates devices container by container, init containers first:

* an init container's devices go back to a per-pod "reusable" pool when it ends, and the next
  containers take from that pool before asking the device plugin for more;
* an app container keeps its devices, so they leave the pool;
* a sidecar (an init container with `restartPolicy: Always`) keeps running, so it keeps its
  devices like an app container.

Which is why the effective pod-level count is `max(sum(apps) + sum(sidecars), max(init_i +
sidecars started before i))`, and why node scoring simulates containers in order rather than
one summed request.

For extended resources Kubernetes requires whole numbers and `requests == limits`; a container
that sets only `limits` gets `requests` defaulted to them, so we read `requests`, then `limits`.

`decode_pod` is the only place that touches the raw Pod JSON (the `Pod` the scheduler posts to
the extender, or an object from a watch); everything downstream uses the typed values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sharepack.common import noderoom
from sharepack.common.errors import RequestError

DEFAULT_MANAGED_PREFIXES: tuple[str, ...] = ("nvidia.com/",)
# What the API server writes into spec.schedulerName when a pod names none.
DEFAULT_SCHEDULER_NAME = "default-scheduler"


class ContainerKind(StrEnum):
    INIT = "init"  # runs to completion before the next one; its devices become reusable
    SIDECAR = "sidecar"  # restartable init container: keeps its devices
    APP = "app"


@dataclass(frozen=True, slots=True)
class Container:
    """The typed input: what a container spec says about resources."""

    name: str
    requests: Mapping[str, int] = field(default_factory=dict)
    limits: Mapping[str, int] = field(default_factory=dict)
    kind: ContainerKind = ContainerKind.APP


@dataclass(frozen=True, slots=True)
class Pod:
    """The typed input: the part of a Pod that placement depends on."""

    uid: str
    namespace: str
    name: str
    containers: tuple[Container, ...]
    init_containers: tuple[Container, ...] = ()
    node_name: str = ""  # spec.nodeName: set once bound
    phase: str = ""  # status.phase
    scheduler_name: str = DEFAULT_SCHEDULER_NAME  # spec.schedulerName
    deleting: bool = False  # metadata.deletionTimestamp is set
    # What kube-scheduler counts the pod for (`common.noderoom.pod_requests`): milli-CPU, MiB.
    cpu: int = 0
    memory: int = 0


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    name: str
    kind: ContainerKind
    amounts: tuple[tuple[str, int], ...]  # managed resources only, sorted by name, counts > 0

    def amount(self, resource: str) -> int:
        for name, count in self.amounts:
            if name == resource:
                return count
        return 0


@dataclass(frozen=True, slots=True)
class PodRequest:
    uid: str
    namespace: str
    name: str
    containers: tuple[ContainerRequest, ...]  # kubelet order: init + sidecars, then apps
    # CPU (milli) and memory (MiB) the pod requests: what the CPU-aware ranks count on a node.
    cpu: int = 0
    memory: int = 0
    # What the kubelet (and kube-scheduler) count for the pod, per resource, sorted by name.
    totals: tuple[tuple[str, int], ...] = field(init=False)
    # A string (strings cache their hash) naming everything the simulation depends on: two
    # requests with the same shape score the same on the same node state.
    shape: str = field(init=False)
    # The shape's devices part alone: with the node's `admitted` shapes (what its CPU and memory
    # admit before and after the pod), all a score depends on, so alike nodes share scores
    # across pods that differ only in CPU (`common.scoring.ScoreTemplates`).
    gpu_shape: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "totals", _effective_totals(self.containers))
        parts = [
            f"{c.kind.value[0]}:" + ",".join(f"{r}={n}" for r, n in c.amounts)
            for c in self.containers
        ]
        gpu_shape = "|".join(parts)
        object.__setattr__(self, "gpu_shape", gpu_shape)
        object.__setattr__(self, "shape", f"{gpu_shape}|cpu={self.cpu},mem={self.memory}" if self.cpu or self.memory else gpu_shape)

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.totals)

    def total(self, resource: str) -> int:
        for name, count in self.totals:
            if name == resource:
                return count
        return 0

    @property
    def empty(self) -> bool:
        return not self.totals


def _effective_totals(containers: tuple[ContainerRequest, ...]) -> tuple[tuple[str, int], ...]:
    names = sorted({r for c in containers for r, _ in c.amounts})
    out = []
    for r in names:
        apps = 0
        sidecars = 0
        init_peak = 0
        for c in containers:
            n = c.amount(r)
            if c.kind is ContainerKind.INIT:
                init_peak = max(init_peak, n + sidecars)
            elif c.kind is ContainerKind.SIDECAR:
                sidecars += n
            else:
                apps += n
        total = max(apps + sidecars, init_peak)
        if total > 0:
            out.append((r, total))
    return tuple(out)


Managed = Callable[[str], bool] | Collection[str]


def prefix_matcher(prefixes: Collection[str] = DEFAULT_MANAGED_PREFIXES) -> Callable[[str], bool]:
    frozen = tuple(prefixes)
    return lambda name: name.startswith(frozen)


def _is_managed(managed: Managed) -> Callable[[str], bool]:
    if callable(managed):
        return managed
    names = frozenset(managed)
    return names.__contains__


def pod_request(pod: Pod, managed: Managed | None = None) -> PodRequest:
    """The pod's request for managed resources (default: every `nvidia.com/` resource)."""
    is_managed = prefix_matcher() if managed is None else _is_managed(managed)
    containers = []
    for c in (*pod.init_containers, *pod.containers):
        amounts: dict[str, int] = {}
        for name in {*c.requests, *c.limits}:
            if not is_managed(name):
                continue
            count = c.requests.get(name, c.limits.get(name, 0))
            if count > 0:
                amounts[name] = count
        containers.append(ContainerRequest(c.name, c.kind, tuple(sorted(amounts.items()))))
    return PodRequest(pod.uid, pod.namespace, pod.name, tuple(containers), pod.cpu, pod.memory)


def restrict(request: PodRequest, keep: Callable[[str], bool]) -> PodRequest:
    """The same request without the resources `keep` rejects (itself when nothing goes)."""
    if all(keep(name) for name, _ in request.totals):
        return request
    containers = tuple(
        ContainerRequest(c.name, c.kind, tuple((r, n) for r, n in c.amounts if keep(r)))
        for c in request.containers
    )
    return PodRequest(request.uid, request.namespace, request.name, containers, request.cpu, request.memory)


# --- the raw Pod JSON -------------------------------------------------------------------------

# resource.Quantity as JSON: a string (or, from hand-written clients, a number). Extended
# resources must be whole; decimal suffixes are accepted because "1k" is a valid whole quantity.
_QUANTITY = re.compile(r"^\+?([0-9]+)(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {
    None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def parse_count(value: Any, *, where: str) -> int:
    """A whole-number quantity; raises RequestError naming `where` otherwise."""
    if isinstance(value, bool):
        raise RequestError(f"invalid quantity at {where}: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise RequestError(f"invalid quantity at {where}: {value!r} is negative")
        return value
    if isinstance(value, float):
        if value < 0 or not value.is_integer():
            raise RequestError(f"invalid quantity at {where}: {value!r} is not a whole number")
        return int(value)
    if isinstance(value, str):
        m = _QUANTITY.match(value.strip())
        if m is None:
            raise RequestError(f"invalid quantity at {where}: {value!r} is not a whole number")
        return int(m.group(1)) * _SUFFIX[m.group(2)]
    raise RequestError(f"invalid quantity at {where}: {value!r}")


def _mapping(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RequestError(f"invalid pod {where}.{key}: not an object" if where else f"invalid pod {key}: not an object")
    return value


def _counts(
    doc: Mapping[str, Any], key: str, where: str, is_managed: Callable[[str], bool]
) -> dict[str, int]:
    # Unmanaged resources (cpu: "500m", memory: "1Gi") are skipped before parsing: they are
    # not whole numbers and not ours to judge.
    return {
        name: parse_count(value, where=f"{where}.{key}[{name}]")
        for name, value in _mapping(doc, key, where).items()
        if is_managed(name)
    }


def _containers(
    spec: Mapping[str, Any], key: str, init: bool, is_managed: Callable[[str], bool]
) -> tuple[Container, ...]:
    raw = spec.get(key)
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RequestError(f"invalid pod spec.{key}: not a list")
    out = []
    for i, c in enumerate(raw):
        where = f"spec.{key}[{i}]"
        if not isinstance(c, Mapping):
            raise RequestError(f"invalid pod {where}: not an object")
        resources = _mapping(c, "resources", where)
        kind = ContainerKind.APP
        if init:
            kind = (
                ContainerKind.SIDECAR if c.get("restartPolicy") == "Always" else ContainerKind.INIT
            )
        out.append(
            Container(
                name=str(c.get("name", "")),
                requests=_counts(resources, "requests", f"{where}.resources", is_managed),
                limits=_counts(resources, "limits", f"{where}.resources", is_managed),
                kind=kind,
            )
        )
    return tuple(out)


def decode_pod(doc: Any, managed: Managed | None = None) -> Pod:
    """A typed Pod from its JSON; raises RequestError naming the bad field.

    Only managed resources are parsed (default: `nvidia.com/`), so a pod's cpu and memory
    quantities never make it undecodable here.
    """
    if not isinstance(doc, Mapping):
        raise RequestError("invalid pod: not an object")
    is_managed = prefix_matcher() if managed is None else _is_managed(managed)
    meta = _mapping(doc, "metadata", "")
    spec = _mapping(doc, "spec", "")
    status = _mapping(doc, "status", "")
    cpu, memory = noderoom.pod_requests(doc)
    return Pod(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        containers=_containers(spec, "containers", False, is_managed),
        init_containers=_containers(spec, "initContainers", True, is_managed),
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or ""),
        scheduler_name=str(spec.get("schedulerName") or DEFAULT_SCHEDULER_NAME),
        deleting=bool(meta.get("deletionTimestamp")),
        cpu=cpu,
        memory=memory,
    )


def decode_pod_request(doc: Any, managed: Managed | None = None) -> PodRequest:
    return pod_request(decode_pod(doc, managed), managed)
