"""Per-node configuration, as upstream's config-manager does it, without a sidecar.

The agent watches its own Node's label (`nvidia.com/device-plugin.config` by default) and one
ConfigMap whose keys are named config files. `common.config.load_named_config` picks the file
(the label's value; without a label `default`, else the only one) and validates it; the agent
then applies it live (`Agent.apply_config`: rebuild resources, restart and re-register the plugin
servers; the publisher notices the change and re-publishes).

A config that fails (unknown name, invalid file, resources that cannot be built on this node) is
logged and reported as a Warning Event on the Node, once per distinct input; the running config
stays. Until both the Node and the ConfigMap have been read nothing is applied; a missing
ConfigMap keeps the config the agent started with.

SIGHUP (`agent.reloading.ConfigReloader`): once the ConfigMap has been seen the named config is
in charge, and `reload_config` selects it again from the label and ConfigMap last seen, so a
reload never falls back to `--config-file` behind the watcher's back.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Protocol

from kubernetes.aio import client as kclient

from sharepack.kube.reflecting import Key, Obj, Reflector
from sharepack.agent.metrics import FAILURE, SUCCESS, AgentMetrics
from sharepack.agent.tasks import Supervisor
from sharepack.common.config import DEFAULT_CONFIG_NAME, NODE_CONFIG_LABEL, Config, load_named_config
from sharepack.common.errors import ConfigError, ResourceError

log = logging.getLogger(__name__)

EVENT_NAMESPACE = "default"  # where events about cluster-scoped objects (Nodes) go
COMPONENT = "sharepack-agent"


@dataclass(frozen=True, slots=True)
class ConfigSource:
    namespace: str
    configmap: str
    label: str = NODE_CONFIG_LABEL
    default_name: str = DEFAULT_CONFIG_NAME
    # The same env and flags the agent started with: each named config is merged with them.
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    flags: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))


class ConfigTarget(Protocol):
    @property
    def config(self) -> Config: ...

    async def apply_config(self, config: Config) -> None: ...


def _effective(config: Config) -> dict[str, object]:
    """What a config does, without where its settings came from."""
    return {k: v for k, v in config.describe().items() if k != "sources"}


class ConfigWatcher:
    def __init__(
        self,
        agent: ConfigTarget,
        api: kclient.ApiClient,
        node_name: str,
        source: ConfigSource,
        *,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self._reloads = (metrics or AgentMetrics()).config_reloads
        self.agent = agent
        self.node_name = node_name
        self.source = source
        self._core = kclient.CoreV1Api(api)
        self._changed = asyncio.Event()
        self.node = Reflector(
            functools.partial(
                self._core.list_node_without_preload_content, field_selector=f"metadata.name={node_name}"
            ),
            what=f"node {node_name}",
            on_change=self._on_change,
        )
        self.configmap = Reflector(
            functools.partial(
                self._core.list_namespaced_config_map_without_preload_content,
                source.namespace,
                field_selector=f"metadata.name={source.configmap}",
            ),
            what=f"configmap {source.namespace}/{source.configmap}",
            on_change=self._on_change,
        )
        self._last_inputs: tuple[str | None, tuple[tuple[str, str], ...] | None] | None = None
        self.applied: tuple[str, str] | None = None  # (config name, file text) now serving
        self.applied_event = asyncio.Event()  # set after each apply (tests)
        self.rejected: list[str] = []  # problems reported, newest last (tests)
        self._missing_reported = False
        self._running = False

    def _on_change(self, _cache: Mapping[Key, Obj]) -> None:
        self._changed.set()

    def reload_config(self) -> Config | None:
        """For SIGHUP: the named config selected again from the label and ConfigMap last seen,
        merged with the agent's flags and env; None while no named config is in charge (not
        running, not synced yet, or no ConfigMap: the file is). Raises ConfigError, like the
        file would. Safe from a worker thread: it reads one immutable snapshot."""
        inputs = self._last_inputs if self._running else None
        if inputs is None:
            return None
        label, data = inputs
        if data is None:
            return None
        where = f"configmap {self.source.namespace}/{self.source.configmap}"
        name, config = load_named_config(
            dict(data), label, env=self.source.env, flags=self.source.flags,
            default_name=self.source.default_name, source=where,
        )
        log.info("reload: named config %s from %s (label %s=%s) is in charge; applying it again",
                 name, where, self.source.label, label, extra={"config": name})  # fmt: skip
        return config

    async def run(self) -> None:
        self._running = True
        try:
            await self._run()
        finally:
            self._running = False

    async def _run(self) -> None:
        tasks = Supervisor(f"config {self.node_name}")
        tasks.spawn("config:node-watch", self.node.run())
        tasks.spawn("config:configmap-watch", self.configmap.run())
        tasks.spawn("config:reconcile", self._reconcile_forever())
        try:
            raise await tasks.wait()
        finally:
            await tasks.stop()

    async def _reconcile_forever(self) -> None:
        await self.node.synced.wait()
        await self.configmap.synced.wait()
        while True:
            self._changed.clear()
            await self.reconcile()
            await self._changed.wait()

    def _inputs(self) -> tuple[str | None, tuple[tuple[str, str], ...] | None]:
        node = self.node.cache.get(("", self.node_name))
        labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        label = labels.get(self.source.label)
        cm = self.configmap.cache.get((self.source.namespace, self.source.configmap))
        data = None if cm is None else tuple(sorted((cm.get("data") or {}).items()))
        return (None if label is None else str(label), data)

    async def reconcile(self) -> None:
        inputs = self._inputs()
        if inputs == self._last_inputs:
            return  # a Node heartbeat, or another label: nothing for us
        self._last_inputs = inputs
        label, data = inputs
        where = f"configmap {self.source.namespace}/{self.source.configmap}"
        if data is None:
            if not self._missing_reported:
                log.warning("%s not found; keeping the config the agent started with", where)
                self._missing_reported = True
            return
        self._missing_reported = False
        configs = dict(data)
        try:
            name, config = load_named_config(
                configs, label, env=self.source.env, flags=self.source.flags,
                default_name=self.source.default_name, source=where,
            )
        except ConfigError as e:
            await self._reject(str(e))
            return
        if self.applied == (name, configs[name]):
            return
        if _effective(config) == _effective(self.agent.config):
            # Already serving exactly this (the usual case at start): restarting the plugin
            # servers would only cut the kubelet's calls in flight.
            self.applied = (name, configs[name])
            log.info("named config %s from %s is the config in use", name, where, extra={"config": name})
            return
        try:
            await self.agent.apply_config(config)
        except (ResourceError, ConfigError) as e:
            await self._reject(f"config {name} from {where} cannot be served on this node: {e}")
            return
        except Exception as e:  # noqa: BLE001 - e.g. a plugin socket that would not serve
            log.exception("applying config %s from %s failed", name, where)
            await self._reject(f"config {name} from {where} could not be applied: {e}")
            return
        self.applied = (name, configs[name])
        self._reloads.labels("configmap", SUCCESS).inc()
        log.info("applied named config %s from %s", name, where, extra={"config": name})
        for warning in config.warnings:
            log.warning("config %s: %s", name, warning)
        self.applied_event.set()
        self.applied_event = asyncio.Event()
        await self._event("Normal", "ConfigApplied", f"applied named config {name} from {where}")

    async def _reject(self, problem: str) -> None:
        self.rejected.append(problem)
        self._reloads.labels("configmap", FAILURE).inc()
        log.error("%s; keeping the config in use", problem)
        await self._event("Warning", "InvalidConfig", f"{problem}; keeping the config in use")

    async def _event(self, kind: str, reason: str, message: str) -> None:
        node = self.node.cache.get(("", self.node_name)) or {}
        involved = {"apiVersion": "v1", "kind": "Node", "name": self.node_name}
        uid = (node.get("metadata") or {}).get("uid")
        if uid:
            involved["uid"] = str(uid)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"generateName": f"{self.node_name}.", "namespace": EVENT_NAMESPACE},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": COMPONENT, "host": self.node_name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node_name,
        }
        try:
            event = kclient.CoreV1Event.from_dict(body)
            assert event is not None
            await self._core.create_namespaced_event(EVENT_NAMESPACE, event, _request_timeout=5)
        except Exception as e:  # noqa: BLE001 - an event is best effort; the log line stays
            log.warning("cannot record event %s on node %s: %s", reason, self.node_name, e)
