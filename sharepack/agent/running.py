"""The Agent: the node's device-plugin servers, their health, and their lifecycle.

One `Agent` owns, for the node's current `Config` and `Inventory`:
* one `serving.PluginServer` per resource (socket `nvidia-<name>.sock` next to `kubelet.sock`),
  each registered with the kubelet in the background (retried until the kubelet answers);
* the kubelet watcher: a kubelet restart re-creates `kubelet.sock` and deletes our sockets ->
  every server restarts and registers again;
* the XID watcher (NVML, in a worker thread) and, if configured, the recovery timer;
* the record of what it allocated.

Interface for the publisher and the per-node config watcher (publish engineer):

    snap = agent.snapshot()           # Snapshot: version, config, resources, unhealthy device IDs,
                                      # allocations (resource, device IDs, monotonic time)
    snap = await agent.wait_changed(after=snap.version)   # blocks until something changed
    async for snap in agent.changes(): ...                 # the same, as an iterator (first item now)
    await agent.apply_config(new_config)   # rebuild resources; restart + re-register the servers
                                           # when they changed (else swap the config in place);
                                           # raises ResourceError and keeps serving the old config
    ok = await agent.reload()              # SIGHUP: re-read config via the loader given at
                                           # construction; logs a clear error and keeps the old
                                           # config when the new one is bad

Changes that bump the version: start, config applied, a device becoming unhealthy or healthy,
an Allocate answered, servers restarted after a kubelet restart.

Lifecycle: `await agent.run()` starts everything and returns once `agent.request_stop()` was
called (graceful drain), or raises the first failure of a long-lived task. Other long-lived
tasks (publication) join the same supervisor with `agent.supervise(name, coro)`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharepack.agent import allocationlog, health, registering, responses
from sharepack.agent import metrics as agent_metrics
from sharepack.agent.directing import Director
from sharepack.agent.health import HealthBook, WaitForXid, XidLike, XidPolicy
from sharepack.agent.metrics import AgentMetrics
from sharepack.agent.responses import ContainerResponse, ResponseOptions
from sharepack.agent.serving import PluginServer
from sharepack.agent.tasks import Supervisor
from sharepack.common import requests
from sharepack.common.config import Config
from sharepack.common.errors import ConfigError, RequestError, ResourceError
from sharepack.common.inventory import Inventory
from sharepack.common.resources import Device, Resource, build_resources

log = logging.getLogger(__name__)

ALLOCATIONS_KEPT = 4096


@dataclass(frozen=True, slots=True)
class Settings:
    """Process-level settings: fixed for the agent's life (a config reload does not change them)."""

    kubelet_socket: Path
    xid_policy: XidPolicy = field(default_factory=XidPolicy)
    recovery_after_s: float = 0.0  # > 0: a device quiet this long becomes healthy again
    watch_interval_s: float = 0.1
    drain_grace_s: float = 1.0
    stream_grace_s: float = 0.5  # a lost ListAndWatch stream not replaced by then: register again
    keep_allocation_log: bool = True  # on disk beside the sockets (agent.allocationlog)
    xid_wait_ms: int = 500

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_socket.parent


@dataclass(frozen=True, slots=True)
class Allocation:
    resource: str
    device_ids: tuple[str, ...]
    at: float  # monotonic seconds
    wall: float = 0.0  # wall-clock seconds, for the log on disk


@dataclass(frozen=True, slots=True)
class Snapshot:
    version: int
    config: Config
    resources: tuple[Resource, ...]
    unhealthy: frozenset[str]
    allocations: tuple[Allocation, ...]

    def healthy(self, device_id: str) -> bool:
        return device_id not in self.unhealthy


class _ResourcePlugin:
    """`serving.PluginLogic` for one resource of one config generation."""

    def __init__(self, agent: Agent, resource: Resource) -> None:
        self._agent = agent
        self._resource = resource
        self._known = frozenset(d.id for d in resource.devices)

    @property
    def resource(self) -> Resource:
        return self._resource

    def device_health(self) -> Sequence[tuple[Device, bool]]:
        book = self._agent._book
        return [(d, book.is_healthy(d.uuid)) for d in self._resource.devices]

    async def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        agent = self._agent
        # Directed GPUs (the extender's choice for the pod being admitted) first; full GPUs keep
        # the topology-aware path, which the extender's counts cannot replay.
        if agent.director is not None and not self._resource.full_gpu:
            chosen = await agent.director.choose(self._resource, available, must_include, size)
            if chosen is not None:
                return chosen
            # The node's policy answers: around the devices other pods' directions ask for,
            # when the rest are enough.
            kept = agent.director.spoken_for(self._resource, available)
            rest = [d for d in available if d not in kept or d in must_include]
            if kept and len(set(rest) | set(must_include)) >= size:
                available = rest
        return responses.preferred_allocation(
            self._resource, agent.config.allocation_policy, agent._pair_scores,
            available, must_include, size,
        )

    @property
    def policy(self) -> str:
        """The policy that picks this resource's devices (the `policy` label of allocations)."""
        if self._resource.full_gpu:
            return agent_metrics.TOPOLOGY
        return str(self._agent.config.allocation_policy)

    def allocate(self, requested: Sequence[str]) -> ContainerResponse:
        count = self._agent.metrics.allocations
        try:
            answer = self._allocate(requested)
        except RequestError:
            count.labels(self._resource.name, self.policy, agent_metrics.REJECTED).inc()
            raise
        except Exception:
            count.labels(self._resource.name, self.policy, agent_metrics.ERROR).inc()
            raise
        count.labels(self._resource.name, self.policy, agent_metrics.SUCCESS).inc()
        return answer

    def _allocate(self, requested: Sequence[str]) -> ContainerResponse:
        try:
            requests.validate_allocate(
                self._resource.name, requested, self._known,
                replicated=self._resource.replicated,
                fail_requests_greater_than_one=self._resource.fail_requests_greater_than_one,
            )
        except RequestError as e:
            # Upstream's wrapping: the kubelet shows this text in the pod's admission error.
            raise RequestError(f'invalid allocation request for "{self._resource.name}": {e}') from e
        answer = responses.container_response(
            self._resource, requested, self._agent._response_options,
            response_id=self._agent._response_id(),
        )
        self._agent._record_allocation(self._resource.name, requested)
        return answer


class Agent:
    def __init__(
        self,
        settings: Settings,
        config: Config,
        inventory: Inventory,
        *,
        wait_for_xid: WaitForXid | None = None,
        config_loader: Callable[[], Config] | None = None,
        clock: Callable[[], float] = time.monotonic,
        response_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        metrics: AgentMetrics | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or AgentMetrics()
        self.inventory = inventory
        self.config = config
        self.resources: tuple[Resource, ...] = build_resources(inventory, config)
        self._wait_for_xid = wait_for_xid
        self._config_loader = config_loader
        self._clock = clock
        self._response_id = response_id
        # aligned_allocation looks pairs up in either order: the inventory's (a < b) keys serve.
        self._pair_scores = inventory.pair_scores
        self._instances = health.mig_instances(inventory)
        self._book = HealthBook()
        self._allocations: collections.deque[Allocation] = collections.deque(maxlen=ALLOCATIONS_KEPT)
        self._wall_clock = wall_clock
        self._allocation_log = (
            allocationlog.AllocationLog(allocationlog.path_beside(settings.plugin_dir), keep=ALLOCATIONS_KEPT)
            if settings.keep_allocation_log
            else None
        )
        self._servers: dict[str, PluginServer] = {}
        self._registered: set[str] = set()  # resources registered since their server started
        self._lock = asyncio.Lock()
        self._tasks = Supervisor("agent")
        self._registrations = Supervisor("registrations")
        self._version = 0
        self._changed = asyncio.Event()
        self._health_marked = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._response_options = self._options_for(config)
        # Set when directed GPUs are on and the API is reachable (agent.directing).
        self.director: Director | None = None

    # ---- what the publisher reads --------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def snapshot(self) -> Snapshot:
        return Snapshot(
            version=self._version,
            config=self.config,
            resources=self.resources,
            unhealthy=self._unhealthy_ids(),
            allocations=tuple(self._allocations),
        )

    async def wait_changed(self, after: int) -> Snapshot:
        while self._version <= after:
            await self._changed.wait()
        return self.snapshot()

    async def changes(self) -> AsyncIterator[Snapshot]:
        snap = self.snapshot()
        yield snap
        while True:
            snap = await self.wait_changed(snap.version)
            yield snap

    def _unhealthy_ids(self) -> frozenset[str]:
        sick = self._book.unhealthy
        return frozenset(d.id for r in self.resources for d in r.devices if d.uuid in sick)

    def readiness(self) -> tuple[bool, str]:
        """(ready, why): ready once every resource served is registered with the kubelet."""
        if self._stop_requested.is_set():
            return False, "stopping"
        waiting = sorted(r.name for r in self.resources if r.name not in self._registered)
        if waiting:
            return False, "not registered with the kubelet: " + ", ".join(waiting)
        return True, f"{len(self.resources)} resource(s) registered"

    def server_sockets(self) -> dict[str, Path]:
        """Resource name -> socket path of the servers running now."""
        return {name: s.socket_path for name, s in self._servers.items()}

    def _notify(self) -> None:
        self._export_health()
        self._version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for server in self._servers.values():
            server.notify()

    def _export_health(self) -> None:
        # On every change, not per scrape: a few hundred devices at most, and a scrape then
        # reads what the kubelet was last told.
        sick = self._book.unhealthy
        gauge = self.metrics.unhealthy
        gauge.clear()  # resources a reload removed go away
        for r in self.resources:
            gauge.labels(r.name).set(sum(1 for d in r.devices if d.uuid in sick))

    def _record_allocation(self, resource: str, device_ids: Sequence[str]) -> None:
        wall = self._wall_clock()
        self._allocations.append(Allocation(resource, tuple(device_ids), self._clock(), wall))
        if self._allocation_log is not None:
            kept = ((a.resource, a.device_ids, a.wall) for a in self._allocations)
            self._allocation_log.append(resource, device_ids, wall, kept)
        self._notify()

    def _restore_allocations(self) -> None:
        """Reload the Allocate log a previous life of the agent left on disk (the devices of
        finished init containers are known only from it)."""
        if self._allocation_log is None:
            return
        entries = self._allocation_log.load()
        if not entries:
            return
        now, wall = self._clock(), self._wall_clock()
        restored = [Allocation(r, ids, now - max(wall - t, 0.0), t) for r, ids, t in entries]
        self._allocations.extendleft(reversed(restored))
        log.info("restored %d allocation(s) from %s", len(restored), self._allocation_log.path)

    def _options_for(self, config: Config) -> ResponseOptions:
        return responses.options_from(config)

    # ---- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until `request_stop()` (then drain) or until a long-lived task fails."""
        try:
            await self.start()
            stop = asyncio.ensure_future(self._stop_requested.wait())
            failed = asyncio.ensure_future(self._tasks.wait())
            try:
                await asyncio.wait({stop, failed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                failed.cancel()
                await asyncio.wait({stop, failed})
            if failed.done() and not failed.cancelled():
                raise failed.result()
            log.info("stop requested: draining %d plugin server(s)", len(self._servers))
        finally:
            await self.stop()

    def request_stop(self) -> None:
        self._stop_requested.set()

    def supervise(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """Run a long-lived task (e.g. publication) under the agent's supervisor: its failure
        stops the agent like any other, and `run()` cancels it when the agent stops."""
        self._tasks.spawn(name, coro)

    async def start(self) -> None:
        self._restore_allocations()
        async with self._lock:
            await self._start_servers()
        self._tasks.spawn(
            "kubelet-watch",
            registering.watch_kubelet(
                self.settings.kubelet_socket,
                lambda: [s.socket_path for s in self._servers.values()],
                self._restart_servers,
                busy=self._lock.locked,
                interval=self.settings.watch_interval_s,
            ),
        )
        policy = self.settings.xid_policy
        if self._wait_for_xid is None:
            log.info("no XID source: device health checks are off")
        elif policy.checks_off:
            log.info("%s (%s)", policy.describe(), health.ENV_DISABLE)
        else:
            log.info("watching XID events: %s", policy.describe())
            self._tasks.spawn(
                "xid-watch",
                health.watch_xids(self._wait_for_xid, self.handle_xid, timeout_ms=self.settings.xid_wait_ms),
            )
        if self.settings.recovery_after_s > 0:
            self._tasks.spawn("health-recovery", self._recover_forever())
        self._notify()

    async def stop(self) -> None:
        await self._tasks.stop()
        await self._registrations.stop()
        async with self._lock:
            await self._stop_servers(grace=self.settings.drain_grace_s)

    async def _start_servers(self) -> None:
        """Serve every resource, then register each in the background (the kubelet may be away)."""
        for resource in self.resources:
            path = self.settings.plugin_dir / registering.socket_name(resource.name)
            server = PluginServer(_ResourcePlugin(self, resource), path, metrics=self.metrics)
            server.on_stream_lost = self._stream_lost
            await server.start()
            self._servers[resource.name] = server
        for server in self._servers.values():
            await self._register_in_background(server)

    async def _register_in_background(self, server: PluginServer) -> None:
        name = f"register:{server.resource_name}"
        await self._registrations.cancel(name)
        self._unregistered(server.resource_name)
        self._registrations.spawn(name, self._register(server), expect_return=True)

    async def _register(self, server: PluginServer) -> None:
        resource = server.resource_name
        attempts = self.metrics.registrations

        def attempted(ok: bool) -> None:
            attempts.labels(resource, agent_metrics.SUCCESS if ok else agent_metrics.FAILURE).inc()

        await registering.register_until_done(
            self.settings.kubelet_socket, server.endpoint, resource, on_attempt=attempted
        )
        self._registered.add(resource)
        self.metrics.registered.labels(resource).set(1)

    def _unregistered(self, resource: str) -> None:
        self._registered.discard(resource)
        self.metrics.registered.labels(resource).set(0)

    def _stream_lost(self, server: PluginServer) -> None:
        """The kubelet ended our ListAndWatch stream while our sockets stay (a kubelet that
        restarts deletes them, which the kubelet watcher handles): register again, unless a new
        stream arrives within `stream_grace_s` (the kubelet replacing an endpoint after our own
        re-registration ends the old stream just after opening the new one)."""
        name = f"relisten:{server.resource_name}"
        if name not in self._registrations.names:
            self._registrations.spawn(name, self._register_if_still_lost(server), expect_return=True)

    async def _register_if_still_lost(self, server: PluginServer) -> None:
        await asyncio.sleep(self.settings.stream_grace_s)
        if server.stopping or server.streams or self._servers.get(server.resource_name) is not server:
            return
        log.warning(
            "the kubelet ended the ListAndWatch stream of %s (its sockets are still there): "
            "registering again", server.resource_name, extra={"resource": server.resource_name},
        )  # fmt: skip
        await self._register_in_background(server)

    async def _stop_servers(self, *, grace: float) -> None:
        servers = list(self._servers.values())
        self._servers.clear()
        for resource in list(self._registered):
            self._unregistered(resource)
        await asyncio.gather(*(s.stop(grace=grace) for s in servers))

    async def _restart_servers(self, reason: str) -> None:
        self.metrics.kubelet_restarts.inc()
        async with self._lock:
            started = self._clock()
            await self._registrations.stop()
            await self._stop_servers(grace=0)
            await self._start_servers()
            log.info(
                "plugin servers restarted (%s) in %.3fs; registering again", reason,
                self._clock() - started,
            )
        self._notify()

    # ---- configuration ---------------------------------------------------------------------

    async def apply_config(self, config: Config) -> None:
        """Rebuild resources for `config` and replace the servers; on error keep the old ones."""
        resources = build_resources(self.inventory, config)  # raises ResourceError: nothing changed
        if resources == self.resources:
            # Same devices under the same names (e.g. only the policy or a device-list strategy
            # changed): swap the config under the running servers instead of cutting their
            # streams, which would make the kubelet see every device unhealthy for a moment.
            self.config = config
            self._response_options = self._options_for(config)
            log.info(
                "config applied (policy %s, mig strategy %s); resources unchanged, servers kept",
                config.allocation_policy, config.mig_strategy,
            )
            self._notify()
            return
        async with self._lock:
            await self._registrations.stop()
            await self._stop_servers(grace=self.settings.drain_grace_s)
            self.config = config
            self.resources = resources
            self._response_options = self._options_for(config)
            self._book.retain(d.uuid for r in resources for d in r.devices)
            await self._start_servers()
        log.info(
            "config applied (policy %s, mig strategy %s): %s", config.allocation_policy, config.mig_strategy,
            ", ".join(f"{r.name}={len(r.devices)}" for r in resources) or "no resources",
        )
        self._notify()

    def request_reload(self) -> None:
        """From a signal handler: reload in a supervised task (one at a time)."""
        if "reload" in self._tasks.names:
            log.warning("config reload already in progress; this request is folded into it")
            return

        async def reload_once() -> None:
            await self.reload()

        self._tasks.spawn("reload", reload_once(), expect_return=True)

    async def reload(self) -> bool:
        """SIGHUP: re-read the config; a bad one is logged and the old one keeps serving."""
        if self._config_loader is None:
            log.warning("config reload requested but the agent has no config loader; ignoring")
            return False
        try:
            config = await asyncio.to_thread(self._config_loader)
            for warning in config.warnings:
                log.warning("config: %s", warning)
            await self.apply_config(config)
        except (ConfigError, ResourceError, OSError) as e:
            log.error("config reload failed, keeping the config in use: %s", e)
            self.metrics.config_reloads.labels("sighup", agent_metrics.FAILURE).inc()
            return False
        self.metrics.config_reloads.labels("sighup", agent_metrics.SUCCESS).inc()
        return True

    # ---- health ----------------------------------------------------------------------------

    def handle_xid(self, event: XidLike) -> None:
        where = event.uuid or "an unknown GPU"
        critical = self.settings.xid_policy.is_critical(event.xid)
        self.metrics.xids.labels(str(event.xid), "true" if critical else "false").inc()
        if not critical:
            log.info("xid %d on %s ignored (not a device failure)", event.xid, where)
            return
        hit = health.affected_devices(event, self.resources, self._instances)
        uuid_of = {d.id: d.uuid for r in self.resources for d in r.devices}
        # Health is kept per GPU / MIG instance (the device's UUID), not per replica ID, so a
        # config reload that changes replica counts or names cannot make a broken GPU healthy.
        changed = self._book.mark({uuid_of[i] for i in hit}, self._clock())
        self._health_marked.set()
        if changed:
            devices = sorted(i for i in hit if uuid_of[i] in changed)
            log.warning(
                "xid %d on %s: marking %d device(s) unhealthy: %s", event.xid, where, len(devices),
                ", ".join(devices),
                extra={"xid": event.xid, "gpu": event.uuid},
            )
            self._notify()

    async def _recover_forever(self) -> None:
        quiet = self.settings.recovery_after_s
        while True:
            deadline = self._book.next_recovery(quiet)
            timeout = None if deadline is None else max(deadline - self._clock(), 0.0)
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # arrives as the event fires, leaving this task unstoppable.
            try:
                async with asyncio.timeout(timeout):
                    await self._health_marked.wait()
                self._health_marked.clear()
                continue
            except TimeoutError:
                pass
            healed = self._book.recover(self._clock(), quiet)
            if healed:
                log.info(
                    "%s quiet for %.1fs: healthy again", ", ".join(sorted(healed)), quiet,
                )
                self._notify()

