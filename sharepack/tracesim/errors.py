"""Errors raised by the trace simulator.

    common.errors.SharepackError
    └── SimulationError
        ├── TraceError          a pod or node list that cannot be read or makes no sense
        └── PolicyError         an unknown policy name, or one that needs a module not yet present

Messages are lowercase "what: why", naming the bad value and where it came from.
"""

from __future__ import annotations

from sharepack.common.errors import SharepackError


class SimulationError(SharepackError):
    pass


class TraceError(SimulationError):
    pass


class PolicyError(SimulationError):
    pass
