"""Publish this node's per-GPU state as its `NodeGpuState` object, promptly and cheaply.

Inputs, each feeding one "something may have changed" signal:
* the agent (`Agent.wait_changed`): an Allocate answered, health, a config applied;
* the kubelet's PodResources API, polled every `poll_interval_s` and right after each agent
  change (plus `settle_s`, because the kubelet records a pod's devices after our Allocate
  returns) -- the only way to notice that a pod released its devices;
* the pods bound to this node, watched in the API, for namespace/name -> UID (PodResources names
  pods only by namespace and name).

The writer turns the signal into writes: it waits `debounce_s` after the first change (a burst of
pod starts becomes one write), never writes twice within `min_interval_s`, and writes only if the
content (everything but `observedAt`) differs from what it last wrote. At the defaults a change is
published within about 0.2 s, and in any case within `settle_s + debounce_s + min_interval_s`
(under 1 s) of the agent noticing it.

Heartbeat: with nothing changed for `heartbeat_s` (`--state-heartbeat-seconds`), the same content
is written again with a fresh `observedAt`, so that readers can tell a quiet node from a dead
agent (the extender treats a state older than its `--state-max-age-seconds` as unknown). 0 turns
the heartbeat off: then `observedAt` only says when the content last changed.

Nothing is published before the first PodResources read and the first list of pods (so a
restarted agent never flashes "all free"); a restarted agent whose state matches the object's
writes nothing. The object is created when missing, owned by the Node (so it goes when the Node
goes; the ownerReference needs the Node's uid, read from the API), and only its `/status` is
written after that (a PUT carrying the resourceVersion we last saw: a 409 means read it again). Failures never reach the device plugin: the writer retries with exponential back-off and,
when the API answers again, writes the state as it is *then*. Every `resync_s` it reads the
object back and rewrites it if it is gone or differs (someone deleted or edited it).

Devices the agent allocated after the last PodResources read began (less `settle_s`) count as
allocated even if that read did not show them yet; a pod the kubelet then rejects drops out at
the next read. Devices a finished init container still holds (the kubelet keeps them for the
pod, PodResources does not list them) are recovered from the agent's Allocate log
(`statebuilding.with_init_container_devices`), which the agent keeps on disk too
(agent.allocationlog), so a restart does not forget them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from kubernetes.aio import client as kclient

from sharepack.agent import configwatching
from sharepack.kube.reflecting import Key, Obj, Reflector
from sharepack.agent.metrics import AgentMetrics
from sharepack.agent import directing
from sharepack.agent.directing import Director
from sharepack.agent.podresources import PodResourcesClient, PodResourcesError
from sharepack.agent.reloading import ConfigReloader
from sharepack.agent.running import Snapshot
from sharepack.agent.tasks import Supervisor
from sharepack.common import state as schema
from sharepack.common import statebuilding
from sharepack.common.config import Config
from sharepack.common.state import NodeState

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
MANAGED_BY = "sharepack-agent"


@dataclass(frozen=True, slots=True)
class PublishSettings:
    debounce_s: float = 0.1  # wait after the first change, so a burst becomes one write
    min_interval_s: float = 0.5  # at most one write per this interval
    poll_interval_s: float = 0.25  # PodResources List period (the kubelet allows 100 qps)
    settle_s: float = 0.05  # after an agent change, before reading PodResources
    retry_initial_s: float = 0.2
    retry_max_s: float = 5.0
    resync_s: float = 30.0  # read the object back this often; rewrite it if gone or edited
    request_timeout_s: float = 5.0
    agent_version: str = AGENT_VERSION
    heartbeat_s: float = 60.0  # rewrite an unchanged state this often (fresh observedAt); 0: never


class AgentView(Protocol):
    """What publishing and config watching need from `agent.running.Agent`."""

    @property
    def config(self) -> Config: ...

    def snapshot(self) -> Snapshot: ...

    async def wait_changed(self, after: int) -> Snapshot: ...

    async def apply_config(self, config: Config) -> None: ...


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def age_s(observed_at: object, now: datetime | None = None) -> float | None:
    """Seconds since an `observedAt` (RFC 3339); None when missing or unreadable."""
    if not isinstance(observed_at, str) or not observed_at:
        return None
    try:
        when = datetime.fromisoformat(observed_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return ((now or datetime.now(UTC)) - when).total_seconds()


def is_api_outage(exc: BaseException) -> bool:
    """Errors after which we retry later: the API is away, slow, or refusing for now."""
    if isinstance(exc, kclient.ApiException):
        return exc.status is None or exc.status in (409, 429) or int(exc.status) >= 500
    return isinstance(exc, aiohttp.ClientError | OSError | TimeoutError)


# The pod watch retries at least this often while the API is away. The kubelet admits the pods
# bound once it is back as soon as its own watch is, and the Director waits only
# `directing.DEFAULT_WAIT_S` for this watch to show each one (then the node's policy answers and
# the extender's directions are lost). The reflector's usual back-off grows to 5 s through an
# outage (and kube-apiserver answers 429 for a while after it restarts), which could leave the
# pods bound in the first seconds after it undirected.
POD_WATCH_BACKOFF_MAX_S = directing.DEFAULT_WAIT_S / 2


class PodIndex:
    """namespace/name -> UID of the pods bound to this node, from a watch (which the Director
    also reads: `Director.feed`)."""

    def __init__(self, api: kclient.ApiClient, node_name: str, on_change: Callable[[], None]) -> None:
        core = kclient.CoreV1Api(api)
        self._on_change = on_change
        self.uids: dict[tuple[str, str], str] = {}
        self.reflector = Reflector(
            functools.partial(
                core.list_pod_for_all_namespaces_without_preload_content,
                field_selector=f"spec.nodeName={node_name}",
            ),
            what=f"pods on node {node_name}",
            on_change=self._changed,
            backoff_max_s=POD_WATCH_BACKOFF_MAX_S,
        )

    def _changed(self, cache: Mapping[Key, Obj]) -> None:
        uids = {key: str(obj["metadata"].get("uid", "")) for key, obj in cache.items()}
        if uids != self.uids:
            gone = self.uids.keys() - uids.keys()
            self.uids = uids
            self._on_change()
            if gone:
                log.debug("pods left node: %s", ", ".join(f"{ns}/{n}" for ns, n in sorted(gone)))

    async def run(self) -> None:
        await self.reflector.run()


class Publisher:
    def __init__(
        self,
        agent: AgentView,
        api: kclient.ApiClient,
        node_name: str,
        pod_resources: PodResourcesClient,
        settings: PublishSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.agent = agent
        self.node_name = node_name
        self.metrics = metrics or AgentMetrics()
        self.settings = settings or PublishSettings()
        self._custom = kclient.CustomObjectsApi(api)
        self._core = kclient.CoreV1Api(api)
        self._pod_resources = pod_resources
        self._clock = clock
        self.pods = PodIndex(api, node_name, self._mark_dirty_and_poll)
        self._resync_now = False
        self._own_object = Reflector(
            functools.partial(
                self._custom.list_cluster_custom_object_without_preload_content,
                schema.GROUP, schema.VERSION, schema.PLURAL, field_selector=f"metadata.name={node_name}",
            ),
            what=f"NodeGpuState {node_name}",
            on_change=lambda _cache: None,
            on_event=self._own_object_event,
        )
        self.director: Director | None = None  # directed GPUs: names the pods of fresh allocations
        self._dirty = asyncio.Event()
        self._dirty_since: float | None = None  # clock() of the first change not yet written
        self._kick = asyncio.Event()
        self._listed = asyncio.Event()
        self._listing: tuple[statebuilding.PodDevices, ...] = ()
        self._allocatable: Mapping[str, frozenset[str]] = {}
        self._list_started = float("-inf")
        # Allocations PodResources has shown (app containers, sidecars): never an init container's.
        self._ever_listed: set[statebuilding.AllocationLike] = set()
        self._object: dict[str, Any] | None = None
        self.published: NodeState | None = None
        self._published_at = float("-inf")  # clock() when the published observedAt was current
        self.writes = 0
        self.write_failures = 0

    def pod_objects(self) -> Any:
        """The pods bound to this node, as the watch last saw them (for agent.directing)."""
        return self.pods.reflector.cache.values()

    def listed_pods(self) -> set[tuple[str, str]]:
        """(namespace, name) of the pods PodResources last listed with devices."""
        return {(p.namespace, p.name) for p in self._listing}

    # -- signals ---------------------------------------------------------------------------

    def _mark_dirty(self) -> None:
        if self._dirty_since is None:
            self._dirty_since = self._clock()
        self._dirty.set()

    def _mark_dirty_and_poll(self) -> None:
        self._mark_dirty()
        self._kick.set()

    # -- the state -------------------------------------------------------------------------

    def current_state(self) -> NodeState:
        snap = self.agent.snapshot()
        cutoff = self._list_started - self.settings.settle_s
        recent: dict[str, set[str]] = {}
        for alloc in snap.allocations:
            if alloc.at > cutoff:
                recent.setdefault(alloc.resource, set()).update(alloc.device_ids)
        pods = statebuilding.with_init_container_devices(
            self._listing, snap.allocations, ever_listed=self._ever_listed
        )
        return statebuilding.build_node_state(
            resources=snap.resources,
            unhealthy=self._unhealthy(snap),
            pods=pods,
            pod_uids=self.pods.uids,
            allocation_policy=snap.config.allocation_policy,
            mig_strategy=snap.config.mig_strategy,
            agent_version=self.settings.agent_version,
            observed_at=now_rfc3339(),
            recently_allocated=recent,
            recent_holders=self.director.holders() if self.director is not None and recent else None,
        )

    def _unhealthy(self, snap: Snapshot) -> Collection[str]:
        # A device the kubelet does not offer (its resource is known to the kubelet, the device
        # is not in its allocatable list) is as good as unhealthy for a scheduler.
        sick = set(snap.unhealthy)
        for res in snap.resources:
            offered = self._allocatable.get(res.name)
            if offered:
                sick.update(d.id for d in res.devices if d.id not in offered)
        return sick

    # -- tasks -----------------------------------------------------------------------------

    def _own_object_event(self, kind: str, obj: Obj) -> None:
        """Someone deleted our NodeGpuState, or wrote a status we did not: read it back and
        rewrite it now rather than at the next resync (a scheduler would trust it meanwhile)."""
        if kind == "DELETED" or (
            self.published is not None
            and not _same_status(obj.get("status"), statebuilding.status_document(self.published))
        ):
            self._resync_now = True
            self._dirty.set()

    async def run(self) -> None:
        tasks = Supervisor(f"publisher {self.node_name}")
        tasks.spawn("publish:pods-watch", self.pods.run())
        tasks.spawn("publish:own-object-watch", self._own_object.run())
        tasks.spawn("publish:agent-follow", self._follow_agent())
        tasks.spawn("publish:podresources-poll", self._poll_pod_resources())
        tasks.spawn("publish:write", self._write_forever())
        try:
            raise await tasks.wait()
        finally:
            await tasks.stop()

    async def _follow_agent(self) -> None:
        version = self.agent.snapshot().version
        while True:
            snap = await self.agent.wait_changed(version)
            version = snap.version
            self._mark_dirty_and_poll()

    async def _poll_pod_resources(self) -> None:
        failing = False
        while True:
            if await _wait_event(self._kick, self.settings.poll_interval_s):
                await asyncio.sleep(self.settings.settle_s)
            self._kick.clear()
            started = self._clock()
            try:
                listing = await self._pod_resources.list()
                allocatable = await self._pod_resources.allocatable()
            except Exception as e:  # noqa: BLE001 - logged; the kubelet's trouble is not ours to die of
                if not failing:
                    log.log(
                        logging.WARNING if isinstance(e, PodResourcesError) else logging.ERROR,
                        "cannot read PodResources: %s; publishing what the agent knows meanwhile", e,
                        exc_info=None if isinstance(e, PodResourcesError) else e,
                    )
                failing = True
                continue
            if failing:
                log.info("PodResources readable again")
                failing = False
            changed = listing != self._listing or allocatable != self._allocatable
            old_cutoff = self._list_started - self.settings.settle_s
            # Allocations counted as pending so far leave that window now: rebuild then too.
            pending = any(a.at > old_cutoff for a in self.agent.snapshot().allocations)
            self._listing, self._allocatable, self._list_started = listing, allocatable, started
            allocations = self.agent.snapshot().allocations
            kept = set(allocations)
            self._ever_listed = {a for a in self._ever_listed if a in kept} | statebuilding.app_allocations(
                allocations, listing
            )
            self._listed.set()
            if changed or pending:
                self._mark_dirty()

    async def _write_forever(self) -> None:
        s = self.settings
        # Never publish "nothing allocated" before the first PodResources read, nor pods
        # without UIDs before the first list of pods (without the API we cannot write anyway).
        await self._listed.wait()
        await self.pods.reflector.synced.wait()
        self._dirty_since = None  # the first write publishes the start, not a change: not timed
        last_write = float("-inf")
        last_resync = self._clock()
        while True:
            due = last_resync + s.resync_s
            if s.heartbeat_s > 0 and self.published is not None:
                due = min(due, self._published_at + s.heartbeat_s)
            dirty = await _wait_event(self._dirty, max(due - self._clock(), 0.0))
            if dirty:
                wait = max(s.debounce_s, last_write + s.min_interval_s - self._clock())
                await asyncio.sleep(wait)
            self._dirty.clear()
            now = self._clock()
            if now >= last_resync + s.resync_s or self._resync_now:
                last_resync, self._resync_now = now, False
                await self._resync()
            heartbeat = s.heartbeat_s > 0 and now >= self._published_at + s.heartbeat_s
            if await self._publish_until_done(heartbeat=heartbeat):
                last_write = self._clock()

    async def _resync(self) -> None:
        try:
            obj = await self._custom.get_cluster_custom_object(
                schema.GROUP, schema.VERSION, schema.PLURAL, self.node_name,
                _request_timeout=self.settings.request_timeout_s,
            )
        except kclient.ApiException as e:
            if e.status == 404:
                log.warning("NodeGpuState %s is gone; writing it again", self.node_name)
                self._object, self.published = None, None
            return
        except Exception as e:  # noqa: BLE001 - the next resync tries again
            log.debug("resync of NodeGpuState %s failed: %s", self.node_name, _describe(e))
            return
        assert isinstance(obj, dict)
        self._object = obj
        if self.published is not None and not _same_status(obj.get("status"), statebuilding.status_document(self.published)):
            log.warning("NodeGpuState %s was changed by someone else; writing ours again", self.node_name)
            self.published = None

    async def _publish_until_done(self, *, heartbeat: bool = False) -> bool:
        """Write the current state if it differs from what is published (or, for a heartbeat,
        in any case, to refresh `observedAt`); retry until done."""
        backoff = 0.0
        stale_retried = False
        since: float | None = None  # the oldest change the state written includes
        while True:
            # Every change marked so far is in the state read now; later ones mark anew.
            since = self._dirty_since if since is None else since
            self._dirty_since = None
            state = self.current_state()
            if not heartbeat and statebuilding.same_content(state, self.published):
                return False
            try:
                await self._write(state)
                if since is not None:
                    self.metrics.state_publish_delay.observe(self._clock() - since)
                return True
            except kclient.ApiException as e:
                if e.status in (404, 409) and not stale_retried:
                    stale_retried = True  # our copy was stale or deleted: read it again, at once
                    continue
                # Anything else (403 from RBAC, 422 from a newer CRD schema) is logged and
                # retried too: publishing must never take the device plugin down with it.
                await self._back_off(e, backoff := self._next_backoff(backoff))
            except Exception as e:  # noqa: BLE001 - connection trouble, or a bug: logged, retried
                await self._back_off(e, backoff := self._next_backoff(backoff))

    def _next_backoff(self, backoff: float) -> float:
        return min(max(backoff * 2, self.settings.retry_initial_s), self.settings.retry_max_s)

    async def _back_off(self, exc: BaseException, backoff: float) -> None:
        self.write_failures += 1
        self.metrics.state_write_errors.inc()
        outage = is_api_outage(exc)
        log.log(
            logging.WARNING if outage else logging.ERROR,
            "cannot publish NodeGpuState %s: %s; retrying in %.1fs", self.node_name, _describe(exc), backoff,
            exc_info=None if outage or isinstance(exc, kclient.ApiException) else exc,
        )
        await asyncio.sleep(random.uniform(backoff / 2, backoff))

    async def _write(self, state: NodeState) -> None:
        timeout = self.settings.request_timeout_s
        doc = statebuilding.status_document(state)
        if self._object is None:
            self._object = await self._get_or_create()
            status = self._object.get("status")
            if _same_status(status, doc):
                # E.g. after an agent restart: nothing to write, unless its observedAt is due
                # for a heartbeat (a restart after a long outage must not leave it stale).
                age = age_s(status.get("observedAt")) if isinstance(status, Mapping) else None
                beat = self.settings.heartbeat_s
                if beat <= 0 or (age is not None and 0 <= age < beat):
                    self.published = state
                    self._published_at = self._clock() - (age or 0.0)
                    return
        body = dict(self._object)
        body["status"] = doc
        try:
            obj = await self._custom.replace_cluster_custom_object_status(
                schema.GROUP, schema.VERSION, schema.PLURAL, self.node_name, body, _request_timeout=timeout
            )
        except kclient.ApiException as e:
            if e.status in (404, 409):
                self._object = None  # gone, or someone else wrote: read it again, then retry
            raise
        assert isinstance(obj, dict)
        self._object = obj
        self.published = state
        self._published_at = self._clock()
        self.writes += 1
        self.metrics.state_writes.inc()
        log.debug("published NodeGpuState %s (write %d)", self.node_name, self.writes)

    async def _get_or_create(self) -> dict[str, Any]:
        timeout = self.settings.request_timeout_s
        try:
            obj = await self._custom.get_cluster_custom_object(
                schema.GROUP, schema.VERSION, schema.PLURAL, self.node_name, _request_timeout=timeout
            )
            assert isinstance(obj, dict)
            return obj
        except kclient.ApiException as e:
            if e.status != 404:
                raise
        node = await self._core.read_node(self.node_name, _request_timeout=timeout)
        node_uid = node.metadata.uid if node.metadata is not None else None
        if not node_uid:
            raise kclient.ApiException(status=500, reason=f"node {self.node_name} has no uid")
        body = {
            "apiVersion": f"{schema.GROUP}/{schema.VERSION}",
            "kind": schema.KIND,
            "metadata": {
                "name": self.node_name,
                "labels": {"app.kubernetes.io/managed-by": MANAGED_BY},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": node_uid}
                ],
            },
        }
        try:
            obj = await self._custom.create_cluster_custom_object(
                schema.GROUP, schema.VERSION, schema.PLURAL, body, _request_timeout=timeout
            )
        except kclient.ApiException as e:
            if e.status != 409:
                raise
            obj = await self._custom.get_cluster_custom_object(
                schema.GROUP, schema.VERSION, schema.PLURAL, self.node_name, _request_timeout=timeout
            )
        else:
            log.info("created NodeGpuState %s (owned by Node uid %s)", self.node_name, node_uid)
        assert isinstance(obj, dict)
        return obj


async def _wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Whether `event` was set within `timeout`. (asyncio.timeout, not wait_for: on Python 3.11
    wait_for can swallow a cancellation that races with the event, leaving a task that never
    stops.)"""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


def _same_status(a: Any, b: Mapping[str, Any]) -> bool:
    if not isinstance(a, Mapping):
        return False
    return {k: v for k, v in a.items() if k != "observedAt"} == {k: v for k, v in b.items() if k != "observedAt"}


def _describe(exc: BaseException) -> str:
    if isinstance(exc, kclient.ApiException):
        return f"API answered {exc.status} {exc.reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"


async def run_publication(
    agent: AgentView,
    api: kclient.ApiClient,
    node_name: str,
    *,
    pod_resources_socket: Path,
    settings: PublishSettings | None = None,
    config_source: configwatching.ConfigSource | None = None,
    reloader: ConfigReloader | None = None,
    metrics: AgentMetrics | None = None,
    director: Director | None = None,
) -> None:
    """Publish the node's NodeGpuState (and, with `config_source`, follow the per-node config)
    until cancelled. Meant to run as one supervised task next to `Agent.run()`; it raises only on
    a bug, never because the API or the kubelet is away. Returns never.

    `reloader` (the agent's SIGHUP config loader) follows the per-node config while it is
    watched, so SIGHUP re-applies the named config in charge rather than the file.
    `director` (directed GPUs) reads the pods this publication watches."""
    async with PodResourcesClient(pod_resources_socket) as pod_resources:
        metrics = metrics or AgentMetrics()
        publisher = Publisher(agent, api, node_name, pod_resources, settings, metrics=metrics)
        if director is not None:
            director.feed(publisher.pod_objects, publisher.listed_pods)
            publisher.director = director
        tasks = Supervisor(f"publication {node_name}")
        tasks.spawn("publication:publisher", publisher.run())
        watcher = None
        if config_source is not None:
            watcher = configwatching.ConfigWatcher(agent, api, node_name, config_source, metrics=metrics)
            tasks.spawn("publication:config", watcher.run())
            if reloader is not None:
                reloader.follow(watcher)
        try:
            raise await tasks.wait()
        finally:
            if reloader is not None and watcher is not None:
                reloader.follow(None)
            await tasks.stop()
