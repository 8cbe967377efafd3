"""`sharepack-agent`: the composition root. Only here are argv and the environment read.

    sharepack-agent --simulated-machine dgx-a100 --kubelet-socket /tmp/x/kubelet.sock

Signals: SIGHUP reloads the config source in charge (agent.reloading): the named per-node config
while one is followed, else the config file (a bad one is logged, the old config keeps serving);
the first SIGTERM/SIGINT drains gracefully, a second one exits at once.

With a Kubernetes API (`--kubeconfig`, or in-cluster) and `--node-name`, the node's
`NodeGpuState` is published (agent.publishing) and, with `--node-config-configmap`, the per-node
config is followed live (agent.configwatching). Without an API the device plugin still serves.
NVML problems at start honour `failOnInitError`: exit 1, or log and serve nothing until stopped.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sharepack.agent import monitoring, nvml, nvmlsim, options, reloading
from sharepack.agent.errors import OptionsError
from sharepack.agent.health import XidPolicy
from sharepack.agent.metrics import AgentMetrics
from sharepack.agent.running import Agent, Settings
from sharepack.common.config import Config, load_config
from sharepack.common.errors import ConfigError, SharepackError
from sharepack.common.inventory import Inventory

log = logging.getLogger("agent")

# Attributes every LogRecord has; anything else came in through `extra=` and is context.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        if context:
            text += " " + " ".join(f"{k}={v}" for k, v in context.items())
        return text


def setup_logging(log_format: str, *, stream: object = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def config_loader(opts: options.Options) -> Callable[[], Config]:
    """Reads the file on every call (SIGHUP), merged with the same flags and env as at start."""

    def load() -> Config:
        text = None
        if opts.config_file is not None:
            raw = Path(opts.config_file).read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                # Not an OSError: unwrapped, it would escape the start-up and SIGHUP handlers.
                raise ConfigError(opts.config_file, [f"not valid UTF-8: {e}"]) from e
        return load_config(
            file_text=text, file_source=opts.config_file or "config file",
            env=opts.env, flags=opts.config_flags,
        )

    return load


async def serve(opts: options.Options, config: Config) -> int:
    metrics = AgentMetrics()
    monitor = monitoring.MonitoringServer(metrics, *opts.metrics_listen)
    try:
        await monitor.start()
    except OSError as e:  # address in use, unknown host: say so instead of a traceback
        log.error("cannot start: cannot serve on --metrics-listen %s:%d: %s",
                  *opts.metrics_listen, e.strerror or e)  # fmt: skip
        return 1
    try:
        return await _serve(opts, config, metrics, monitor)
    finally:
        await monitor.stop()


async def _serve(
    opts: options.Options, config: Config, metrics: AgentMetrics, monitor: monitoring.MonitoringServer
) -> int:
    loop = asyncio.get_running_loop()
    try:
        lib = await asyncio.to_thread(
            nvml.load_library, opts.simulated_machine, control_file=opts.env.get(nvmlsim.CONTROL_ENV)
        )
    except nvml.NvmlUnavailable as e:
        if config.fail_on_init_error:
            log.error("cannot start: %s (failOnInitError is true)", e)
            return 1
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.error("cannot start: %s; failOnInitError is false, so serving nothing until stopped", e)
        # Nothing to register, so nothing to wait for: a node without a driver stays Ready.
        why = f"serving no GPUs: {e}"  # `e` is unbound once the except block ends
        monitor.readiness = lambda: (True, why)
        await stop.wait()
        return 0
    try:
        inventory = await asyncio.to_thread(nvml.read_inventory, lib)
        watcher = await asyncio.to_thread(nvml.XidWatcher, lib)
        try:
            return await _serve_inventory(opts, config, inventory, watcher, metrics, monitor)
        finally:
            watcher.close()  # the XID task has let its last wait finish before it stopped
    finally:
        nvml.shutdown(lib)


async def _serve_inventory(
    opts: options.Options,
    config: Config,
    inventory: Inventory,
    watcher: nvml.XidWatcher,
    metrics: AgentMetrics,
    monitor: monitoring.MonitoringServer,
) -> int:
    loop = asyncio.get_running_loop()
    for uuid, why in watcher.unwatched.items():
        log.warning("no health checks for %s: %s", uuid, why)
    log.info(
        "found %d GPU(s): %s", len(inventory.gpus),
        ", ".join(f"{g.index}:{g.name}" + (" (MIG)" if g.mig_enabled else "") for g in inventory.gpus),
    )
    if opts.mode == options.DRA_MODE:
        return await _serve_dra(opts, config, inventory, await kubernetes_api(opts), watcher, monitor)
    settings = Settings(
        kubelet_socket=opts.kubelet_socket,
        xid_policy=XidPolicy.from_env(opts.env),
        recovery_after_s=opts.unhealthy_recovery_s,
    )
    reloader = reloading.ConfigReloader(config_loader(opts))
    agent = Agent(settings, config, inventory, wait_for_xid=watcher.wait, config_loader=reloader, metrics=metrics)
    monitor.readiness = agent.readiness
    stops = 0

    def on_stop(signum: int) -> None:
        nonlocal stops
        stops += 1
        if stops == 1:
            log.info("%s: draining (send it again to exit at once)", signal.Signals(signum).name)
            agent.request_stop()
        else:
            log.warning("%s again: exiting now", signal.Signals(signum).name)
            os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop, sig)
    loop.add_signal_handler(signal.SIGHUP, agent.request_reload)
    api = await kubernetes_api(opts)
    try:
        if api is not None and opts.node_name:
            agent.supervise("publication", publication(agent, api, opts, reloader))
        elif api is not None:
            log.warning("no --node-name (NODE_NAME): not publishing this node's GPU state")
        await agent.run()
    finally:
        if api is not None:
            await api.close()
    log.info("stopped")
    return 0


async def _serve_dra(
    opts: options.Options, config: Config, inventory: Inventory, api: Any, watcher: nvml.XidWatcher,
    monitor: monitoring.MonitoringServer,
) -> int:
    """DRA mode: the kubelet plugin and the node's ResourceSlices, until SIGTERM/SIGINT."""
    from sharepack.agent.dra import running as dra  # noqa: PLC0415 - only DRA mode pays for it

    if api is None or not opts.node_name:
        log.error("cannot start: --mode dra needs the Kubernetes API and --node-name (NODE_NAME)")
        if api is not None:
            await api.close()
        return 1
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    settings = dra.DraSettings(
        node_name=opts.node_name, plugins_registry=opts.plugins_registry,
        plugins_dir=opts.plugins_dir, cdi_root=opts.cdi_root, device_order=opts.dra_device_order,
    )  # fmt: skip
    try:
        await dra.run(
            settings, config, inventory, api, stop, wait_for_xid=watcher.wait, xid_policy=XidPolicy.from_env(opts.env),
            on_start=lambda plugin: setattr(monitor, "readiness", plugin.readiness),
        )
    finally:
        await api.close()
    log.info("stopped")
    return 0


async def kubernetes_api(opts: options.Options) -> Any:
    """An API client from --kubeconfig, else in-cluster config, else None (no API: the device
    plugin still serves, nothing is published). A broken config is logged, never fatal."""
    if not opts.kubeconfig and not opts.env.get("KUBERNETES_SERVICE_HOST"):
        log.info("no Kubernetes API configured (no --kubeconfig, not in a cluster): publishing off")
        return None
    from kubernetes.aio import client as kclient  # noqa: PLC0415 - only runs that publish pay for it
    from kubernetes.aio import config as kconfig  # noqa: PLC0415

    try:
        if opts.kubeconfig:
            return await kconfig.new_client_from_config(config_file=opts.kubeconfig)  # type: ignore[no-untyped-call]
        configuration = kclient.Configuration()
        kconfig.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return kclient.ApiClient(configuration=configuration)
    except Exception as e:  # noqa: BLE001 - any config problem: serve without publishing
        where = opts.kubeconfig or "in-cluster config"
        log.error("cannot use the Kubernetes API (%s): %s; publishing off, still serving", where, e)
        return None


async def publication(
    agent: Agent, api: Any, opts: options.Options, reloader: reloading.ConfigReloader | None = None
) -> None:
    from sharepack.agent import configwatching, directing, publishing  # noqa: PLC0415

    source = None
    if opts.node_config_configmap is not None:
        namespace, name = opts.node_config_configmap
        source = configwatching.ConfigSource(namespace, name, env=opts.env, flags=opts.config_flags)
    assert opts.node_name is not None
    director = directing.Director(opts.node_name, metrics=agent.metrics) if opts.directed_gpus else None
    agent.director = director
    await publishing.run_publication(
        agent, api, opts.node_name, pod_resources_socket=opts.pod_resources_socket,
        settings=publishing.PublishSettings(
            heartbeat_s=opts.state_heartbeat_s, min_interval_s=opts.state_min_write_interval_s
        ),
        config_source=source, reloader=reloader, metrics=agent.metrics, director=director,
    )


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    try:
        opts = options.parse(sys.argv[1:] if argv is None else argv, env)
    except OptionsError as e:
        print(f"sharepack-agent: {e}", file=sys.stderr)
        return 2
    setup_logging(opts.log_format)
    try:
        config = config_loader(opts)()
    except (SharepackError, OSError) as e:
        log.error("cannot start: %s", e)
        return 1
    for warning in config.warnings:
        log.warning("config: %s", warning)
    log.info("running with config: %s", json.dumps(config.describe(), sort_keys=True),
             extra={"kubelet_socket": str(opts.kubelet_socket)})
    try:
        return asyncio.run(serve(opts, config))
    except SharepackError as e:
        log.error("agent failed: %s", e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
