"""A client of the kubelet's PodResources API (`v1.PodResourcesLister`) over its unix socket.

* `List`: which devices each pod holds. The kubelet sends one `ContainerDevices` entry per
  (device, NUMA node), per container; `statebuilding.group_pod_devices` folds them per pod.
* `GetAllocatableResources`: the devices the kubelet would hand out (healthy ones).
* Responses on big nodes exceed gRPC's default 4 MiB receive limit: we allow 16 MiB, as upstream
  clients do.
* The kubelet rate-limits the API (100 qps, burst 10) and answers `RESOURCE_EXHAUSTED` beyond:
  we back off exponentially (with jitter) and retry a few times before giving up on this call;
  the next call waits out the remaining back-off first.
* The socket is re-created on every kubelet restart; a gRPC channel to a unix path reconnects
  by itself, so one client lives as long as the agent.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc
import grpc.aio

from sharepack.agent.errors import AgentError
from sharepack.common.statebuilding import PodDevices, group_pod_devices
from sharepack.proto.podresources.v1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from sharepack.proto.podresources.v1.api_pb2_grpc import PodResourcesListerAsyncStub

log = logging.getLogger(__name__)

MAX_RECEIVE_BYTES = 16 * 1024 * 1024
T = TypeVar("T")


class PodResourcesError(AgentError):
    """The PodResources API could not be read (kubelet away, rate limit not clearing, ...)."""


class PodResourcesClient:
    def __init__(
        self,
        socket: Path,
        *,
        timeout: float = 5.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 2.0,
        attempts: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket = socket
        self._timeout = timeout
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._attempts = attempts
        self._clock = clock
        self._backoff = 0.0
        self._not_before = 0.0
        self._channel: grpc.aio.Channel | None = None
        self._stub: PodResourcesListerAsyncStub | None = None
        self.rate_limited = 0  # RESOURCE_EXHAUSTED answers seen (for tests and metrics)

    def _lister(self) -> PodResourcesListerAsyncStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket}",
                options=[("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)],
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    async def close(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close(None)

    async def __aenter__(self) -> PodResourcesClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def list(self) -> tuple[PodDevices, ...]:
        """Every pod holding devices, its devices grouped per resource."""
        response: api_pb2.ListPodResourcesResponse = await self._call(
            "List", lambda: self._lister().List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)
        )
        pods = []
        for pod in response.pod_resources:
            entries = [
                (dev.resource_name, tuple(dev.device_ids))
                for container in pod.containers
                for dev in container.devices
            ]
            if entries:
                pods.append(group_pod_devices(pod.namespace, pod.name, entries))
        return tuple(pods)

    async def allocatable(self) -> Mapping[str, frozenset[str]]:
        """Resource name -> device IDs the kubelet would hand out now."""
        response: api_pb2.AllocatableResourcesResponse = await self._call(
            "GetAllocatableResources",
            lambda: self._lister().GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self._timeout
            ),
        )
        grouped: dict[str, set[str]] = {}
        for dev in response.devices:
            grouped.setdefault(dev.resource_name, set()).update(dev.device_ids)
        return {name: frozenset(ids) for name, ids in grouped.items()}

    async def _call(self, method: str, call: Callable[[], Awaitable[T]]) -> T:
        for attempt in range(1, self._attempts + 1):
            wait = self._not_before - self._clock()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                result = await call()
            except grpc.aio.AioRpcError as e:
                # gRPC also says RESOURCE_EXHAUSTED for a response over the receive limit:
                # retrying that would only fail again.
                if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or "larger than max" in (e.details() or ""):
                    raise PodResourcesError(
                        f"podresources {method} at {self.socket}: {e.code().name}: {e.details()}"
                    ) from e
                self.rate_limited += 1
                self._backoff = min(max(self._backoff * 2, self._backoff_initial), self._backoff_max)
                # Full jitter keeps several callers from retrying in lockstep.
                self._not_before = self._clock() + random.uniform(self._backoff / 2, self._backoff)
                log.debug("podresources %s rate limited (attempt %d); backing off %.3fs", method, attempt, self._backoff)
                continue
            self._backoff = 0.0
            return result
        raise PodResourcesError(
            f"podresources {method} at {self.socket}: still rate limited after {self._attempts} attempts"
        )
