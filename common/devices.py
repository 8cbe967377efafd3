"""Device IDs as the kubelet sees them, and the physical GPU each one belongs to.

A replica (one time-sliced or MPS share) of a device is named `<device-id>::<n>`, as upstream's
`AnnotatedID` does. The physical key of a replica is the part before `::`. MIG instances are
grouped by their parent GPU, which the ID alone does not tell: callers pass a `group_of` mapping
(see `common.resources.Resource.group_of`) for that.
"""

from __future__ import annotations

REPLICA_SEPARATOR = "::"


def replica_id(base: str, n: int) -> str:
    if not base or REPLICA_SEPARATOR in base:
        raise ValueError(f"invalid device id for a replica: {base!r}")
    if n < 0:
        raise ValueError(f"invalid replica number for {base}: {n}")
    return f"{base}{REPLICA_SEPARATOR}{n}"


def split_replica(device_id: str) -> tuple[str, int | None]:
    """`"GPU-x::3"` -> `("GPU-x", 3)`; an ID without `::` -> `(id, None)`."""
    base, sep, suffix = device_id.partition(REPLICA_SEPARATOR)
    if not sep:
        return device_id, None
    # isascii() keeps out digits int() would accept but a kubelet ID never carries ("٣").
    if not base or not (suffix.isascii() and suffix.isdigit()):
        raise ValueError(f"invalid replica id: {device_id!r}: want <device-id>::<number>")
    return base, int(suffix)


def physical_key(device_id: str) -> str:
    """The part before `::` (the whole ID for an unreplicated device)."""
    return device_id.partition(REPLICA_SEPARATOR)[0]


def device_order(device_id: str) -> tuple[str, int, str]:
    """Sort key that orders replicas of one device by replica number (2 before 10).

    This is the deterministic tie-break among a GPU's candidates: the base ID, then the replica
    number (an unreplicated device sorts as -1), then the raw ID so malformed suffixes still
    order totally.
    """
    base, sep, suffix = device_id.partition(REPLICA_SEPARATOR)
    n = int(suffix) if sep and suffix.isascii() and suffix.isdigit() else -1
    return base, n, device_id
