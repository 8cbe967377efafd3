"""`sharepack-agent --mode dra`: the node agent as a DRA kubelet plugin.

Start order follows what the kubelet expects: the DRA service serves on its socket first, then
the registration socket appears in plugins_registry (the kubelet may dial the DRA socket as soon
as it has registered the plugin), then the node's ResourceSlices are published (the scheduler
may allocate from them at once, and the kubelet then calls NodePrepareResources). The slices are
published until the API server takes them (backing off); an API that stays away delays only
new allocations, never claims already prepared.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
from kubernetes.aio import client as kclient

from sharepack.agent import health, responses
from sharepack.agent.dra import kubeapi, registering
from sharepack.agent.dra.preparing import ClaimReader, Preparer
from sharepack.agent.dra.serving import DraService
from sharepack.agent.health import XidLike, XidPolicy
from sharepack.agent.tasks import Supervisor
from sharepack.common import dradevices
from sharepack.common.config import Config
from sharepack.common.inventory import Inventory
from sharepack.common.resources import Resource, build_resources
from sharepack.proto.dra.v1 import api_pb2_grpc as dra_grpc
from sharepack.proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc

log = logging.getLogger(__name__)

BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True, slots=True)
class DraSettings:
    node_name: str
    plugins_registry: Path  # the kubelet's plugins_registry directory
    plugins_dir: Path  # the kubelet's plugins directory: our socket goes in <dir>/gpu.sharepack.io/
    cdi_root: Path  # where the container runtime reads CDI specs
    # `--dra-device-order`: the config policy's order, fixed (`static`), or `fresh-first`,
    # republished whenever a claim is prepared or unprepared (`common.dradevices.republished`).
    device_order: str = dradevices.STATIC_ORDER


async def _serve(socket: Path, add: object) -> grpc.aio.Server:
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)  # a stale socket from a previous run
    server = grpc.aio.server()
    add(server)  # type: ignore[operator]
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


class DraPlugin:
    def __init__(self, settings: DraSettings, config: Config, inventory: Inventory, reader: ClaimReader) -> None:
        self.settings = settings
        self.resources: tuple[Resource, ...] = build_resources(inventory, config)
        self.static_devices = dradevices.slice_devices(self.resources, config.allocation_policy)
        self._by_name = dradevices.by_name(self.static_devices)  # to count what prepared claims hold
        self.fresh_first = settings.device_order == dradevices.FRESH_FIRST
        # The devices as published, in the allocator's order.
        self.devices = dradevices.republished(self.static_devices, {}) if self.fresh_first else self.static_devices
        for name in dradevices.mig_resources(self.resources):
            log.warning("DRA mode does not publish MIG resource %s (partitionable devices are not supported yet)", name)
        self.preparer = Preparer(
            settings.node_name, self.static_devices, self.resources, responses.options_from(config),
            settings.cdi_root, reader, on_change=self._claims_changed,
        )  # fmt: skip
        self.dra_socket = registering.dra_socket(settings.plugins_dir)
        self.registration_socket = registering.registration_socket(settings.plugins_registry)
        self.registration = registering.RegistrationService(self.dra_socket)
        self._servers: list[tuple[grpc.aio.Server, Path]] = []
        self.unhealthy: set[str] = set()  # physical GPU keys with a critical XID
        self.generation = 0  # the pool generation last published (0: not yet)
        self._dirty = asyncio.Event()
        log.info("DRA driver %s on node %s: %d device(s) in %s order", dradevices.DRIVER, settings.node_name,
                 len(self.devices), settings.device_order if self.fresh_first else config.allocation_policy)  # fmt: skip

    def _claims_changed(self) -> None:
        """`fresh-first`: reorder the slice for the devices the prepared claims now hold (the
        allocator meets free GPUs first); republished at once when the order changed. Claims the
        scheduler allocated but the kubelet has not asked to prepare yet are not counted: the
        order is as current as the kubelet's calls."""
        if not self.fresh_first:
            return
        held = dradevices.held_per_gpu(
            self._by_name, (d.device for devices in self.preparer.prepared.values() for d in devices)
        )
        devices = dradevices.republished(self.static_devices, held)
        if devices != self.devices:
            self.devices = devices
            self._dirty.set()

    async def start(self) -> None:
        service = DraService(self.preparer)
        server = await _serve(self.dra_socket, lambda s: dra_grpc.add_DRAPluginServicer_to_server(service, s))
        self._servers.append((server, self.dra_socket))
        server = await _serve(
            self.registration_socket,
            lambda s: registration_grpc.add_RegistrationServicer_to_server(self.registration, s),
        )
        self._servers.append((server, self.registration_socket))
        log.info("serving DRA on %s, registration on %s", self.dra_socket, self.registration_socket)

    async def stop(self, grace: float = 2.0) -> None:
        # The registration socket goes first: the kubelet unregisters the plugin when it vanishes.
        for server, socket in reversed(self._servers):
            socket.unlink(missing_ok=True)
            await server.stop(grace)
        self._servers.clear()

    def readiness(self) -> tuple[bool, str]:
        """Ready once the kubelet registered the driver and the node's slices are published."""
        if not self.registration.registered.is_set():
            return False, self.registration.last_error or "not registered with the kubelet yet"
        if not self.generation:
            return False, "ResourceSlices not published yet"
        return True, f"registered; {len(self.devices)} device(s) published (generation {self.generation})"

    def handle_xid(self, event: XidLike, policy: XidPolicy) -> None:
        """A critical XID taints every device of its GPU (of every GPU when the event names
        none, as upstream does) at the next publication; health is not recovered here."""
        if not policy.is_critical(event.xid):
            log.info("xid %d on %s ignored (not a device failure)", event.xid, event.uuid or "an unknown GPU")
            return
        keys = {d.device.physical_key for d in self.devices if not event.uuid or event.uuid == d.device.physical_key}
        new = keys - self.unhealthy
        if new:
            log.warning("xid %d: tainting the devices of GPU(s) %s as unhealthy", event.xid, ", ".join(sorted(new)),
                        extra={"xid": event.xid, "gpu": event.uuid})  # fmt: skip
            self.unhealthy |= new
            self._dirty.set()

    async def publish_forever(self, api: kclient.ApiClient) -> None:
        """Publish now, and again whenever health (or, `fresh-first`, the order) changes."""
        while True:
            self._dirty.clear()
            self.generation = await self.publish(api)
            await self._dirty.wait()

    async def publish(self, api: kclient.ApiClient, *, devices: Sequence[dradevices.DraDevice] | None = None) -> int:
        """Publish until the API server takes it; returns the pool generation."""
        backoff = BACKOFF_INITIAL_S
        while True:
            try:
                return await kubeapi.publish_slices(
                    api, self.settings.node_name, self.devices if devices is None else devices,
                    unhealthy=frozenset(self.unhealthy),
                )
            except Exception as e:  # noqa: BLE001 - logged; the API may come back
                log.warning("publishing ResourceSlices failed: %s; trying again in %.1fs", e, backoff)
                await asyncio.sleep(random.uniform(backoff / 2, backoff))
                backoff = min(backoff * 2, BACKOFF_MAX_S)


async def run(
    settings: DraSettings,
    config: Config,
    inventory: Inventory,
    api: kclient.ApiClient,
    stop: asyncio.Event,
    *,
    wait_for_xid: health.WaitForXid | None = None,
    xid_policy: XidPolicy | None = None,
    on_start: Callable[[DraPlugin], None] | None = None,
) -> None:
    """Serve and publish until `stop` is set or a long-lived task fails. `on_start`: told the
    plugin (for the readiness probe)."""
    plugin = DraPlugin(settings, config, inventory, kubeapi.ApiClaimReader(api))
    if on_start is not None:
        on_start(plugin)
    policy = xid_policy or XidPolicy()
    await plugin.start()
    tasks = Supervisor("dra")
    try:
        tasks.spawn("resourceslice-publication", plugin.publish_forever(api))
        if wait_for_xid is not None and not policy.checks_off:
            log.info("watching XID events: %s", policy.describe())
            tasks.spawn("xid-watch", health.watch_xids(wait_for_xid, lambda e: plugin.handle_xid(e, policy)))
        stopped = asyncio.ensure_future(stop.wait())
        failed = asyncio.ensure_future(tasks.wait())
        try:
            await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (stopped, failed):
                future.cancel()
            await asyncio.gather(stopped, failed, return_exceptions=True)
        if failed.done() and not failed.cancelled() and failed.exception() is None:
            raise failed.result()
    finally:
        await tasks.stop()
        await plugin.stop()
