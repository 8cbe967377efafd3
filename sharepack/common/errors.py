"""Errors raised by the pure core.

    SharepackError
    ├── AllocationError        a request that the devices on offer cannot satisfy
    ├── RequestError           an Allocate request the node's own rules reject
    ├── ConfigError            a config (file, env, flags) that fails validation; lists every problem
    ├── ResourceError          resources that cannot be built from an inventory + config
    ├── StateSchemaError       a published NodeGpuState this reader does not understand
    ├── DraSchemaError         a ResourceSlice or ResourceClaim of our driver this reader does not understand
    ├── DirectionsError        a pod's sharepack.io/gpus annotation this reader does not understand
    └── ClaimError             a ResourceClaim this node's DRA driver cannot prepare

Messages are lowercase "what: why", naming the bad value and where it came from.
"""

from __future__ import annotations

from collections.abc import Sequence


class SharepackError(Exception):
    pass


class AllocationError(SharepackError):
    pass


class RequestError(SharepackError):
    pass


class ResourceError(SharepackError):
    pass


class StateSchemaError(SharepackError):
    pass


class DraSchemaError(SharepackError):
    pass


class DirectionsError(SharepackError):
    pass


class ConfigError(SharepackError):
    """Every problem found in one config, reported together."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid config from {source}:\n{lines}")


class ClaimError(SharepackError):
    """A ResourceClaim that cannot be prepared: not allocated, malformed, or naming devices this
    node does not publish."""
