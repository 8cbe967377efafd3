"""Errors of the node agent, and the one place where errors become gRPC status codes.

    SharepackError                    (common.errors)
    ├── AllocationError               no preferred allocation possible      -> RESOURCE_EXHAUSTED
    ├── RequestError                  Allocate request the node rejects     -> INVALID_ARGUMENT
    ├── ConfigError / ResourceError   bad config, unbuildable resources     (startup / SIGHUP only)
    └── AgentError
        ├── OptionsError              bad command line or environment
        ├── ServingError              a plugin socket could not be served or dialled
        ├── RegistrationError         the kubelet could not be reached or refused us
        └── TaskExited                a long-lived task returned although it should not

Messages are lowercase "what: why" and name the bad value and where it came from.
"""

from __future__ import annotations

import grpc

from sharepack.common.errors import AllocationError, RequestError, SharepackError


class AgentError(SharepackError):
    pass


class OptionsError(AgentError):
    pass


class ServingError(AgentError):
    pass


class RegistrationError(AgentError):
    pass


class TaskExited(AgentError):
    pass


def grpc_status(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code a DevicePlugin call answers with when it fails with `exc`.

    The kubelet only logs the code and message and fails the pod's admission, so the code is for
    humans reading kubelet logs and events: the message says which device and why.
    """
    if isinstance(exc, RequestError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, AllocationError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.INTERNAL
