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
    """Sort key among one GPU's candidates: base ID, then ID length, then text.

    For replicas of one device (no leading zeros, as `replica_id` writes them) a shorter ID is a
    smaller replica number, so this is replica-number order (`x::2` before `x::10`) and the bare
    ID sorts first; it also orders any other text totally without parsing it.
    """
    return physical_key(device_id), len(device_id), device_id
