"""A ResourceClaim's allocation, as this node's DRA driver reads it (resource.k8s.io/v1 JSON).

The kubelet's NodePrepareResources names a claim (namespace, name, UID) and nothing else: the
driver reads the claim and prepares the devices of `status.allocation.devices.results` that name
its own driver and its own pool (the node). Results of other drivers in the same claim are theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sharepack.common.errors import ClaimError


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    request: str  # the claim's request name, e.g. "container-0-request-0"
    pool: str
    device: str  # the device's name in the pool's slices
    share_id: str | None = None  # set by the allocator for devices that allow several claims


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


def _field(doc: Mapping[str, Any], key: str, where: str) -> Any:
    value = doc.get(key)
    if value is None:
        raise ClaimError(f"claim {where}: no {key}")
    return value


def allocated_devices(claim: Mapping[str, Any], ref: ClaimRef, *, driver: str, pool: str) -> tuple[AllocatedDevice, ...]:
    """The devices `claim` holds from `driver`'s `pool`, in allocation order. Raises ClaimError
    when the object is not the claim the kubelet named (another UID: deleted and re-created), is
    not allocated, or is malformed; each message names the claim."""
    if not isinstance(claim, Mapping):
        raise ClaimError(f"claim {ref}: not an object")
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise ClaimError(f"claim {ref}: the API server has uid {meta.get('uid')!r}, not the one the kubelet named")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"claim {ref}: not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    if not isinstance(results, list):
        raise ClaimError(f"claim {ref}: status.allocation.devices.results is not a list")
    out = []
    for i, result in enumerate(results):
        where = f"{ref} results[{i}]"
        if not isinstance(result, Mapping):
            raise ClaimError(f"claim {where}: not an object")
        if result.get("driver") != driver:
            continue
        result_pool = str(_field(result, "pool", where))
        if result_pool != pool:
            raise ClaimError(f"claim {where}: device from pool {result_pool!r}, not this node's {pool!r}")
        share = result.get("shareID")
        out.append(AllocatedDevice(
            request=str(_field(result, "request", where)),
            pool=result_pool,
            device=str(_field(result, "device", where)),
            share_id=None if share is None else str(share),
        ))
    return tuple(out)


def pod_claim_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceClaim names a pod uses, as the kubelet resolves them: `spec.resourceClaims`
    naming a claim directly, or made from a template (the name in `status.resourceClaimStatuses`;
    none yet: skipped), plus the claim kube-scheduler made for DRA-backed extended resources
    (`status.extendedResourceClaimStatus`)."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    generated = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
    names: list[str] = []
    for claim in spec.get("resourceClaims") or []:
        name = claim.get("resourceClaimName") or generated.get(claim.get("name"))
        if name:
            names.append(str(name))
    extended = status.get("extendedResourceClaimStatus") or {}
    if extended.get("resourceClaimName"):
        names.append(str(extended["resourceClaimName"]))
    return tuple(dict.fromkeys(names))


def dra_backed_requests(pod: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """(container name, resource name) pairs the extended-resource claim serves: the kubelet's
    device manager and its node-fit check leave those to DRA."""
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    return frozenset(
        (str(m.get("containerName")), str(m.get("resourceName"))) for m in extended.get("requestMappings") or []
    )
