"""Preparing and unpreparing claims: the logic behind the kubelet's NodePrepareResources and
NodeUnprepareResources (serving.py only translates protobuf).

Prepare reads the claim from the API server (the kubelet names it, nothing more), takes the
devices of its allocation that this driver's pool (the node) holds, checks each is one this node
publishes, and writes the claim's CDI spec. Both calls are idempotent, as the kubelet retries
them: preparing a prepared claim answers the same devices, unpreparing an unknown one succeeds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sharepack.agent.dra import cdi
from sharepack.agent.responses import ResponseOptions
from sharepack.common import draclaims, dradevices
from sharepack.common.errors import ClaimError
from sharepack.common.resources import Resource

log = logging.getLogger(__name__)


class ClaimReader(Protocol):
    async def read_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The ResourceClaim as JSON; raises ClaimError when it cannot be read."""
        ...


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


class Preparer:
    def __init__(
        self,
        node: str,
        devices: Sequence[dradevices.DraDevice],
        resources: Sequence[Resource],
        options: ResponseOptions,
        cdi_root: Path,
        reader: ClaimReader,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.node = node
        self._on_change = on_change  # told after a claim is newly prepared or unprepared
        self._devices = dradevices.by_name(devices)
        self._resources = {r.name: r for r in resources}
        self._options = options
        self._cdi_root = cdi_root
        self._reader = reader
        self._prepared: dict[str, tuple[PreparedDevice, ...]] = {}
        self._lock = asyncio.Lock()

    @property
    def prepared(self) -> Mapping[str, tuple[PreparedDevice, ...]]:
        return dict(self._prepared)

    async def prepare(self, ref: draclaims.ClaimRef) -> tuple[PreparedDevice, ...]:
        async with self._lock:
            done = self._prepared.get(ref.uid)
            if done is not None:
                return done
            claim = await self._reader.read_claim(ref.namespace, ref.name)
            allocated = draclaims.allocated_devices(claim, ref, driver=dradevices.DRIVER, pool=self.node)
            requests: dict[str, tuple[Resource, list[str]]] = {}
            for a in allocated:
                device = self._devices.get(a.device)
                if device is None:
                    raise ClaimError(f"claim {ref}: device {a.device!r} is not one this node publishes")
                resource = self._resources[device.resource]
                held = requests.setdefault(a.request, (resource, []))
                if held[0].name != resource.name:
                    raise ClaimError(f"claim {ref}: request {a.request} mixes {held[0].name} and {resource.name}")
                held[1].append(device.device.id)
            spec = cdi.claim_spec(ref.uid, {r: (res, ids) for r, (res, ids) in requests.items()}, self._options)
            await asyncio.to_thread(cdi.write_spec, self._cdi_root, ref.uid, spec)
            first: set[str] = set()
            out = []
            for a in allocated:
                # One CDI device per request: named on the request's first device only, so a
                # container is handed it once.
                ids = () if a.request in first else (cdi.device_id(ref.uid, a.request),)
                first.add(a.request)
                out.append(PreparedDevice(a.request, a.pool, a.device, ids, a.share_id))
            prepared = self._prepared[ref.uid] = tuple(out)
            log.info("prepared claim %s: %s", ref, ", ".join(d.device for d in prepared) or "no devices of ours")
            if self._on_change is not None:
                self._on_change()
            return prepared

    async def unprepare(self, ref: draclaims.ClaimRef) -> None:
        async with self._lock:
            removed = await asyncio.to_thread(cdi.remove_spec, self._cdi_root, ref.uid)
            if self._prepared.pop(ref.uid, None) is not None or removed:
                log.info("unprepared claim %s", ref)
                if self._on_change is not None:
                    self._on_change()
