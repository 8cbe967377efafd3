"""Allocate-time checks of a container's device request, with upstream's error texts.

The kubelet shows these texts to users verbatim (`UnexpectedAdmissionError ... invalid request:
...`), so they match upstream NVIDIA k8s-device-plugin `ValidateRequest` word for word; the
resource name is therefore not part of the message (the agent logs it alongside).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from sharepack.common.errors import RequestError

INVALID_REQUEST = "invalid request"


def validate_allocate(
    resource_name: str,
    requested: Sequence[str],
    known: Collection[str],
    *,
    replicated: bool,
    fail_requests_greater_than_one: bool,
) -> None:
    """Raise `RequestError` when the node's own rules reject an Allocate request.

    * every requested ID must be a device of the resource (checked first, as upstream does);
    * a replicated (time-sliced or MPS) resource with `fail_requests_greater_than_one` takes at
      most one device per container. The caller resolves the effective flag: upstream leaves it
      false for time-slicing when unset and forces it true for MPS (config's job, not ours).

    `resource_name` is in the signature for the callers' logs; upstream's texts omit it.
    """
    for device_id in requested:
        if device_id not in known:
            raise RequestError(f"{INVALID_REQUEST}: unknown device: {device_id}")
    if replicated and fail_requests_greater_than_one and len(requested) > 1:
        raise RequestError(
            f"{INVALID_REQUEST}: maximum request size for shared resources is 1; "
            f"found {len(requested)}"
        )
