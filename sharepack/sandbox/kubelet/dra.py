"""The kubelet's DRA part (pkg/kubelet/cm/dra and pluginmanager), as the sandbox kubelet does it.

* Plugin registration: a DRA driver creates a socket in `<root>/plugins_registry`; the kubelet
  (fsnotify there, a short poll here) dials it, calls `GetInfo`, accepts plugin type `DRAPlugin`
  serving `v1.DRAPlugin` at the endpoint it names, and answers `NotifyRegistrationStatus`. A
  socket that disappears unregisters its driver.
* Before a pod's containers start: every ResourceClaim the pod uses (`spec.resourceClaims`, and
  the claim kube-scheduler made for DRA-backed extended resources, named in
  `status.extendedResourceClaimStatus`) is read with the node's credentials, must be allocated
  and reserved for the pod, and is prepared with `NodePrepareResources` by each driver that
  allocated devices in it. A driver that is not registered, or a claim's error, fails the start
  (the kubelet retries it; so does the sandbox kubelet).
* After the pod's containers are gone: `NodeUnprepareResources` for the claims prepared for it
  that no other pod of the node still uses.

What is not reproduced: the claim-info checkpoint (a restarted sandbox kubelet forgets what it
prepared), CDI injection (no containers run) and DRA health streaming.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import kubernetes
import orjson

from sharepack.common import draclaims
from sharepack.proto.dra.v1 import api_pb2 as dra_pb2
from sharepack.proto.dra.v1 import api_pb2_grpc as dra_grpc
from sharepack.proto.pluginregistration.v1 import api_pb2 as reg_pb2
from sharepack.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_SERVICES = ("v1.DRAPlugin",)
SCAN_INTERVAL_S = 0.1
RPC_TIMEOUT_S = 10.0


class DraPrepareError(Exception):
    """A pod's claims could not be prepared yet (the kubelet retries)."""


@dataclass(frozen=True, slots=True)
class DraDriver:
    name: str
    endpoint: str
    registration_socket: Path


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    ref: draclaims.ClaimRef
    drivers: tuple[str, ...]
    devices: Mapping[str, tuple[dra_pb2.Device, ...]]  # driver -> what it prepared


class DraManager:
    def __init__(self, root: Path, api: Any) -> None:
        """`api`: kubernetes.client.ApiClient with the node's credentials."""
        self.registry_dir = root / "plugins_registry"
        self.plugins_dir = root / "plugins"
        self._api = api
        self._drivers: dict[str, DraDriver] = {}
        self._tried: set[Path] = set()
        self._prepared: dict[str, tuple[PreparedClaim, ...]] = {}  # pod UID -> its claims
        self._changed = asyncio.Event()

    # -- registration ------------------------------------------------------------------------

    def start_dirs(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self.plugins_dir.mkdir(parents=True, exist_ok=True)

    @property
    def drivers(self) -> Mapping[str, DraDriver]:
        return dict(self._drivers)

    def prepared(self, pod_uid: str) -> tuple[PreparedClaim, ...]:
        return self._prepared.get(pod_uid, ())

    async def wait_for_driver(self, name: str, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while name not in self._drivers:
                self._changed.clear()
                await self._changed.wait()

    async def run(self) -> None:
        """Until cancelled: register the plugins whose sockets appear, forget those that go."""
        self.start_dirs()
        while True:
            await self.scan()
            await asyncio.sleep(SCAN_INTERVAL_S)

    async def scan(self) -> None:
        sockets = {p for p in self.registry_dir.glob("*.sock")}
        for name, driver in list(self._drivers.items()):
            if driver.registration_socket not in sockets:
                log.info("DRA driver %s unregistered: its registration socket is gone", name)
                del self._drivers[name]
                self._changed.set()
        self._tried &= sockets
        for socket in sorted(sockets - self._tried):
            self._tried.add(socket)
            await self._register(socket)

    async def _register(self, socket: Path) -> None:
        try:
            async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
                stub = reg_grpc.RegistrationStub(channel)
                info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=RPC_TIMEOUT_S)
                error = self._validate(info)
                await stub.NotifyRegistrationStatus(
                    reg_pb2.RegistrationStatus(plugin_registered=not error, error=error), timeout=RPC_TIMEOUT_S
                )
        except grpc.aio.AioRpcError as e:
            log.warning("plugin socket %s: registration failed: %s", socket, e.details())
            self._tried.discard(socket)  # try again at the next scan
            return
        if not error:
            self._drivers[info.name] = DraDriver(info.name, info.endpoint, socket)
            log.info("DRA driver %s registered at %s", info.name, info.endpoint)
            self._changed.set()

    @staticmethod
    def _validate(info: reg_pb2.PluginInfo) -> str:
        if info.type != DRA_PLUGIN_TYPE:
            return f"plugin type {info.type!r} is not handled here (only {DRA_PLUGIN_TYPE})"
        if not info.name:
            return "empty driver name"
        if not any(s in SUPPORTED_SERVICES for s in info.supported_versions):
            return (f"none of services supported by the plugin ({list(info.supported_versions)}) "
                    f"are supported by the kubelet ({list(SUPPORTED_SERVICES)})")  # fmt: skip
        if not info.endpoint:
            return "empty endpoint"
        return ""

    # -- claims ------------------------------------------------------------------------------

    async def _read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        resource: Any = kubernetes.client.ResourceV1Api(self._api)
        try:
            response = await asyncio.to_thread(
                resource.read_namespaced_resource_claim, name, namespace, _preload_content=False
            )
        except kubernetes.client.ApiException as e:
            raise DraPrepareError(f"reading ResourceClaim {namespace}/{name}: {e.status} {e.reason}") from None
        # Raw JSON: the generated models would drop the fields they do not know.
        doc: dict[str, Any] = orjson.loads(response.data)
        return doc

    async def prepare_pod(self, pod: Mapping[str, Any]) -> tuple[PreparedClaim, ...]:
        """Prepare every claim of `pod`; raises DraPrepareError (nothing prepared is kept then
        except what drivers keep: preparing again is idempotent)."""
        meta = pod.get("metadata") or {}
        uid, namespace = str(meta.get("uid")), str(meta.get("namespace"))
        if uid in self._prepared:
            return self._prepared[uid]
        prepared = []
        for name in draclaims.pod_claim_names(pod):
            claim = await self._read_claim(namespace, name)
            claim_meta = claim.get("metadata") or {}
            ref = draclaims.ClaimRef(namespace, name, str(claim_meta.get("uid")))
            status = claim.get("status") or {}
            if not status.get("allocation"):
                raise DraPrepareError(f"claim {ref}: not allocated")
            if not any(r.get("uid") == uid for r in status.get("reservedFor") or []):
                raise DraPrepareError(f"claim {ref}: not reserved for pod {namespace}/{meta.get('name')}")
            results = ((status["allocation"].get("devices") or {}).get("results")) or []
            drivers = tuple(sorted({str(r.get("driver")) for r in results}))
            devices: dict[str, tuple[dra_pb2.Device, ...]] = {}
            for driver in drivers:
                devices[driver] = await self._call_prepare(driver, ref)
            prepared.append(PreparedClaim(ref, drivers, devices))
        self._prepared[uid] = done = tuple(prepared)
        return done

    def _driver(self, name: str) -> DraDriver:
        driver = self._drivers.get(name)
        if driver is None:
            raise DraPrepareError(f"DRA driver {name} is not registered")
        return driver

    async def _call_prepare(self, name: str, ref: draclaims.ClaimRef) -> tuple[dra_pb2.Device, ...]:
        driver = self._driver(name)
        request = dra_pb2.NodePrepareResourcesRequest(claims=[dra_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)])
        try:
            async with grpc.aio.insecure_channel(f"unix://{driver.endpoint}") as channel:
                answer = await dra_grpc.DRAPluginStub(channel).NodePrepareResources(request, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            raise DraPrepareError(f"NodePrepareResources of claim {ref} on driver {name}: {e.details()}") from None
        if ref.uid not in answer.claims:
            raise DraPrepareError(f"NodePrepareResources of claim {ref} on driver {name}: no answer for the claim")
        result = answer.claims[ref.uid]
        if result.error:
            raise DraPrepareError(f"NodePrepareResources of claim {ref} on driver {name}: {result.error}")
        return tuple(result.devices)

    async def unprepare_pod(self, pod_uid: str) -> None:
        """After the pod's containers are gone. Errors are logged; the claims stay recorded, so a
        later call tries again."""
        claims = self._prepared.get(pod_uid, ())
        # A claim several pods share is unprepared with the last of them, as the kubelet does.
        still_used = {c.ref.uid for uid, cs in self._prepared.items() if uid != pod_uid for c in cs}
        failed = False
        for claim in claims:
            if claim.ref.uid in still_used:
                continue
            for name in claim.drivers:
                try:
                    await self._call_unprepare(name, claim.ref)
                except DraPrepareError as e:
                    failed = True
                    log.warning("%s; trying again later", e)
        if not failed:
            self._prepared.pop(pod_uid, None)

    async def _call_unprepare(self, name: str, ref: draclaims.ClaimRef) -> None:
        driver = self._driver(name)
        request = dra_pb2.NodeUnprepareResourcesRequest(claims=[dra_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)])
        try:
            async with grpc.aio.insecure_channel(f"unix://{driver.endpoint}") as channel:
                answer = await dra_grpc.DRAPluginStub(channel).NodeUnprepareResources(request, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            raise DraPrepareError(f"NodeUnprepareResources of claim {ref} on driver {name}: {e.details()}") from None
        error = answer.claims[ref.uid].error if ref.uid in answer.claims else "no answer for the claim"
        if error:
            raise DraPrepareError(f"NodeUnprepareResources of claim {ref} on driver {name}: {error}")


def claim_devices(claims: Sequence[PreparedClaim]) -> list[str]:
    """`driver/pool/device` of every prepared device, for tests and the demo."""
    return [f"{driver}/{d.pool_name}/{d.device_name}" for c in claims for driver, ds in c.devices.items() for d in ds]
