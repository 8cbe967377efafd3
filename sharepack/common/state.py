"""The published per-node state: the `status` of a `NodeGpuState` object (schema version 1).

The agent builds it from PodResources + its own view; the extender and the trace simulator read
it. Readers reject schema versions they do not know rather than guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sharepack.common.errors import StateSchemaError
from sharepack.common.policies import MigStrategy, Policy, Sharing

GROUP = "sharepack.io"
VERSION = "v1alpha1"
KIND = "NodeGpuState"
PLURAL = "nodegpustates"
SCHEMA_VERSION = 1
# Three agent heartbeats (--state-heartbeat-seconds, 60 s by default): one lost or late write
# does not make a live node unknown; a dead agent's node is unknown within three minutes. The
# extender's --state-max-age-seconds default and `sharepack status` both count from it.
STALE_AFTER_S = 180.0
# Devices of one resource on one physical GPU: replicas of a shared GPU, MIG slices, or 1. The
# CRD's schema (`maximum` on total, allocated and unhealthy) and the agent's config (replicas)
# hold to it, and readers reject more: a state is one agent's word, and counts from it size
# lists in the extender.
MAX_DEVICES_PER_GPU = 1024


@dataclass(frozen=True, slots=True)
class GpuState:
    key: str  # physical key: GPU UUID (MIG: the parent GPU's UUID)
    index: str
    product: str
    total: int  # devices of this resource on this GPU
    allocated: int  # held by pods
    unhealthy: int
    pods: tuple[str, ...] = ()  # UIDs of pods holding devices of this GPU

    @property
    def free(self) -> int:
        return max(self.total - self.allocated - self.unhealthy, 0)


@dataclass(frozen=True, slots=True)
class ResourceState:
    name: str  # e.g. "nvidia.com/gpu.shared"
    sharing: Sharing
    fail_requests_greater_than_one: bool
    gpus: tuple[GpuState, ...]


@dataclass(frozen=True, slots=True)
class NodeState:
    observed_at: str  # RFC 3339, UTC
    agent_version: str
    allocation_policy: Policy
    mig_strategy: MigStrategy
    resources: tuple[ResourceState, ...]
    schema_version: int = SCHEMA_VERSION

    def resource(self, name: str) -> ResourceState | None:
        for res in self.resources:
            if res.name == name:
                return res
        return None


def to_status(state: NodeState) -> dict[str, Any]:
    """The JSON-ready `status` document."""
    return {
        "schemaVersion": state.schema_version,
        "observedAt": state.observed_at,
        "agentVersion": state.agent_version,
        "allocationPolicy": str(state.allocation_policy),
        "migStrategy": str(state.mig_strategy),
        "resources": [
            {
                "name": r.name,
                "sharing": str(r.sharing),
                "failRequestsGreaterThanOne": r.fail_requests_greater_than_one,
                "gpus": [
                    {
                        "key": g.key,
                        "index": g.index,
                        "product": g.product,
                        "total": g.total,
                        "allocated": g.allocated,
                        "unhealthy": g.unhealthy,
                        "pods": list(g.pods),
                    }
                    for g in r.gpus
                ],
            }
            for r in state.resources
        ],
    }


def _field(doc: Mapping[str, Any], name: str, kind: type, where: str) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise StateSchemaError(f"invalid NodeGpuState {where}.{name}: {value!r}")
    return value


def _enum(cls: Any, doc: Mapping[str, Any], name: str, where: str) -> Any:
    raw = _field(doc, name, str, where)
    try:
        return cls(raw)
    except ValueError:
        raise StateSchemaError(f"invalid NodeGpuState {where}.{name}: {raw!r}") from None


def _check_counts(g: GpuState, where: str) -> None:
    """The agent counts each device once (held, unhealthy, or free); more is not a state."""
    gpu = f"{where} (GPU {g.key})"
    for name, value in (("total", g.total), ("allocated", g.allocated), ("unhealthy", g.unhealthy)):
        if not 0 <= value <= MAX_DEVICES_PER_GPU:
            raise StateSchemaError(f"invalid NodeGpuState {gpu}: {name} {value} is outside 0..{MAX_DEVICES_PER_GPU}")
    if g.allocated + g.unhealthy > g.total:
        raise StateSchemaError(f"invalid NodeGpuState {gpu}: allocated {g.allocated} + unhealthy {g.unhealthy} "
                               f"> total {g.total}")  # fmt: skip


def from_status(doc: Any, *, source: str = "status") -> NodeState:
    """Decode a `status` document; raises StateSchemaError naming the bad field and `source`."""
    if not isinstance(doc, Mapping):
        raise StateSchemaError(f"invalid NodeGpuState {source}: not an object")
    version = doc.get("schemaVersion")
    if version != SCHEMA_VERSION:
        raise StateSchemaError(
            f"unsupported NodeGpuState schemaVersion in {source}: {version!r} "
            f"(this reader knows {SCHEMA_VERSION})"
        )
    resources = []
    for i, r in enumerate(_field(doc, "resources", list, source)):
        where = f"{source}.resources[{i}]"
        if not isinstance(r, Mapping):
            raise StateSchemaError(f"invalid NodeGpuState {where}: not an object")
        gpus = []
        for j, g in enumerate(_field(r, "gpus", list, where)):
            # The watch path decodes every write of every node: a well-formed GPU (plain types and
            # possible counts, checked inline) skips the per-field checks below, which name the
            # bad field or count.
            if type(g) is dict:
                key, total, allocated, unhealthy = g.get("key"), g.get("total"), g.get("allocated"), g.get("unhealthy")
                pods = g.get("pods", ())
                if (
                    type(key) is str and type(total) is int and type(allocated) is int
                    and type(unhealthy) is int and type(pods) in (list, tuple)
                    and 0 <= allocated and 0 <= unhealthy and allocated + unhealthy <= total <= MAX_DEVICES_PER_GPU
                ):  # fmt: skip
                    gpus.append(
                        GpuState(key, str(g.get("index", "")), str(g.get("product", "")), total, allocated,
                                 unhealthy, tuple(map(str, pods)))  # fmt: skip
                    )
                    continue
            gwhere = f"{where}.gpus[{j}]"
            if not isinstance(g, Mapping):
                raise StateSchemaError(f"invalid NodeGpuState {gwhere}: not an object")
            pods = _field(g, "pods", list, gwhere) if "pods" in g else []
            gpu = GpuState(
                key=_field(g, "key", str, gwhere),
                index=str(g.get("index", "")),
                product=str(g.get("product", "")),
                total=_field(g, "total", int, gwhere),
                allocated=_field(g, "allocated", int, gwhere),
                unhealthy=_field(g, "unhealthy", int, gwhere),
                pods=tuple(str(p) for p in pods),
            )
            _check_counts(gpu, gwhere)
            gpus.append(gpu)
        resources.append(
            ResourceState(
                name=_field(r, "name", str, where),
                sharing=_enum(Sharing, r, "sharing", where),
                fail_requests_greater_than_one=bool(r.get("failRequestsGreaterThanOne", False)),
                gpus=tuple(gpus),
            )
        )
    return NodeState(
        observed_at=str(doc.get("observedAt", "")),
        agent_version=str(doc.get("agentVersion", "")),
        allocation_policy=_enum(Policy, doc, "allocationPolicy", source),
        mig_strategy=_enum(MigStrategy, doc, "migStrategy", source),
        resources=tuple(resources),
    )


def observed_epoch(observed_at: str) -> float | None:
    """`observedAt` (RFC 3339) as POSIX seconds; None when missing or unreadable."""
    if not observed_at:
        return None
    try:
        when = datetime.fromisoformat(observed_at.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None  # a time without a zone cannot be compared with ours
    return when.timestamp()
