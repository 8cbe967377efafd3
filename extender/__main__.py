"""`sharepack-extender`: the composition root. Only here are argv and the environment read.

    sharepack-extender --listen 0.0.0.0:8888 --node-policy packed [--kubeconfig FILE]
                       [--tls-cert-file F --tls-private-key-file K] [--url-prefix /sharepack]
    sharepack-extender --node-policy fragaware [--typical-workload FILE]

Without `--kubeconfig` the in-cluster config is used; with neither, the extender still serves
(every node unknown: pass-through, lowest score) and /bind answers with an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import signal
import ssl
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from aiohttp import web

from common import fragmentation
from common import state as published
from common.errors import ConfigError
from common.policies import NodePolicy
from extender.binding import BIND_CONCURRENCY, ApiBinder, Binder
from extender.caches import ClusterView, Informer, pod_handler, state_handler
from extender.metrics import Metrics
from extender.server import DEFAULT_MAX_BODY_BYTES, Extender

log = logging.getLogger("extender")

DEFAULT_LISTEN = "0.0.0.0:8888"
DEFAULT_ASSUME_TTL_S = 120.0
DEFAULT_RESYNC_S = 300.0
# Three agent heartbeats (--state-heartbeat-seconds, 60 s by default): one lost or late write
# does not make a live node unknown; a dead agent's node is unknown within three minutes.
DEFAULT_STATE_MAX_AGE_S = 180.0


@dataclass(frozen=True, slots=True)
class Options:
    listen: str = DEFAULT_LISTEN
    node_policy: NodePolicy = NodePolicy.PACKED
    typical_workload: fragmentation.TypicalWorkload | None = None  # fragaware; None: built in
    kubeconfig: str | None = None
    in_cluster: bool = True  # try the in-cluster config when no kubeconfig is given
    tls_cert_file: str | None = None
    tls_private_key_file: str | None = None
    url_prefix: str = ""
    log_format: str = "text"
    log_level: str = "info"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    assume_ttl_s: float = DEFAULT_ASSUME_TTL_S
    resync_s: float = DEFAULT_RESYNC_S
    state_max_age_s: float = DEFAULT_STATE_MAX_AGE_S  # 0: no age check

    @property
    def host_port(self) -> tuple[str, int]:
        host, sep, port = self.listen.rpartition(":")
        if not sep or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"invalid --listen option: {self.listen!r} (want HOST:PORT)")
        return host.strip("[]") or "0.0.0.0", int(port)


def parse_args(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(prog="sharepack-extender", description=__doc__.split("\n")[0])
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="HOST:PORT to serve on")
    p.add_argument(
        "--node-policy",
        default=str(NodePolicy.PACKED),
        choices=[x.value for x in NodePolicy],
        help="how to rank nodes: packed keeps whole GPUs and nodes free, distributed spreads, "
        "fragaware grows the FGD study's GPU fragmentation least",
    )
    p.add_argument("--typical-workload", default=None, metavar="FILE",
                   help="YAML pod shapes {gpus, share, weight} that define fragmentation for "
                        "fragaware (default: built in, from the FGD study's default trace)")  # fmt: skip
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster)")
    p.add_argument("--tls-cert-file", default=None)
    p.add_argument("--tls-private-key-file", default=None)
    p.add_argument("--url-prefix", default="", help="path prefix of the verbs, e.g. /sharepack")
    p.add_argument("--log-format", default="text", choices=["text", "json"])
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    p.add_argument("--assume-ttl", type=float, default=DEFAULT_ASSUME_TTL_S,
                   help="seconds a bound pod counts with its predicted placement before its "
                        "agent reports it")  # fmt: skip
    p.add_argument("--resync", type=float, default=DEFAULT_RESYNC_S, help="relist period, s")
    p.add_argument("--state-max-age-seconds", type=float, default=DEFAULT_STATE_MAX_AGE_S,
                   help="a NodeGpuState whose observedAt is older than this is stale: its node "
                        "is treated as unknown (passes filter, score 0); 0 turns the check off")  # fmt: skip
    a = p.parse_args(list(argv))
    if bool(a.tls_cert_file) != bool(a.tls_private_key_file):
        p.error("--tls-cert-file and --tls-private-key-file go together")
    if not a.state_max_age_seconds >= 0:  # also rejects nan
        p.error(f"invalid --state-max-age-seconds option: {a.state_max_age_seconds} (want seconds >= 0)")
    for flag, value in (("--assume-ttl", a.assume_ttl), ("--resync", a.resync), ("--max-body-bytes", a.max_body_bytes)):
        if not value > 0 or value == float("inf"):  # also rejects nan
            p.error(f"invalid {flag} option: {value} (want a finite number > 0)")
    if a.tls_cert_file:
        try:
            tls_context(a.tls_cert_file, a.tls_private_key_file)
        except ValueError as e:
            p.error(str(e))
    workload = None
    if a.typical_workload is not None:
        try:
            with open(a.typical_workload, encoding="utf-8") as f:
                workload = fragmentation.load_typical_workload(f.read(), a.typical_workload)
        except OSError as e:
            p.error(f"invalid --typical-workload option: {a.typical_workload}: {e.strerror}")
        except ConfigError as e:
            p.error(f"invalid --typical-workload option: {e}")
    opts = Options(
        listen=a.listen,
        node_policy=NodePolicy(a.node_policy),
        typical_workload=workload,
        kubeconfig=a.kubeconfig,
        tls_cert_file=a.tls_cert_file,
        tls_private_key_file=a.tls_private_key_file,
        url_prefix=a.url_prefix,
        log_format=a.log_format,
        log_level=a.log_level,
        max_body_bytes=a.max_body_bytes,
        assume_ttl_s=a.assume_ttl,
        resync_s=a.resync,
        state_max_age_s=a.state_max_age_seconds,
    )
    try:
        opts.host_port
    except ValueError as e:
        p.error(str(e))
    return opts


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The server's TLS context; raises ValueError naming the files (checked at parse time, so
    a wrong path is a usage error rather than a traceback once the caches start)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except OSError as e:  # ssl.SSLError included: not PEM, or key and certificate do not match
        raise ValueError(
            f"invalid --tls-cert-file/--tls-private-key-file option: {cert_file}, {key_file}: {e.strerror or e}"
        ) from None
    return ctx


class _JsonFormatter(logging.Formatter):
    _STD = set(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update({k: v for k, v in vars(record).items() if k not in self._STD})
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(fmt: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def api_client(opts: Options) -> Any | None:
    """A kubernetes ApiClient, or None when there is no API to talk to."""
    from kubernetes import client, config

    conf = client.Configuration()
    if opts.kubeconfig:
        config.load_kube_config(config_file=opts.kubeconfig, client_configuration=conf)  # type: ignore[no-untyped-call]
    elif opts.in_cluster:
        try:
            config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
        except config.ConfigException as e:
            log.warning("no Kubernetes API (%s): every node is unknown and /bind is off", e)
            return None
    else:
        return None
    # One connection per bind thread, plus the informers' watches: a smaller pool would open
    # and discard connections (with a warning each) under a burst of binds.
    conf.connection_pool_maxsize = BIND_CONCURRENCY + 4
    return client.ApiClient(conf)


class Service:
    """The running extender: caches, informers and the HTTP server."""

    def __init__(self, opts: Options, *, api: Any | None = None) -> None:
        self.opts = opts
        self.api = api
        self.metrics = Metrics()
        self.view = ClusterView(
            opts.node_policy, metrics=self.metrics, assume_ttl=opts.assume_ttl_s,
            max_age_s=opts.state_max_age_s, workload=opts.typical_workload,
        )  # fmt: skip
        self.informers: list[Informer] = []
        binder: Binder | None = None
        if api is not None:
            from kubernetes import client

            custom = client.CustomObjectsApi(api)
            core = client.CoreV1Api(api)
            self.informers = [
                Informer(
                    "nodegpustates",
                    partial(custom.list_cluster_custom_object,
                            published.GROUP, published.VERSION, published.PLURAL),
                    on_replace=self.view.replace_states,
                    on_event=state_handler(self.view),
                    resync_s=opts.resync_s,
                ),  # fmt: skip
                Informer(
                    "pods",
                    partial(core.list_pod_for_all_namespaces, field_selector="spec.nodeName!="),
                    on_replace=self.view.replace_pods,
                    on_event=pod_handler(self.view),
                    resync_s=opts.resync_s,
                ),
            ]
            binder = ApiBinder(api)
        self.extender = Extender(
            self.view, binder=binder, metrics=self.metrics, ready=self.synced,
            url_prefix=opts.url_prefix,
        )  # fmt: skip
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.port = 0

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    async def start(self) -> None:
        host, port = self.opts.host_port
        ssl_context = None
        if self.opts.tls_cert_file and self.opts.tls_private_key_file:
            ssl_context = tls_context(self.opts.tls_cert_file, self.opts.tls_private_key_file)
        app = self.extender.app(max_body_bytes=self.opts.max_body_bytes)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        server = site._server  # the bound port (0 picks one); aiohttp exposes it only here
        assert isinstance(server, asyncio.base_events.Server)
        self.port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._start_informers(), name="extender-start-informers"),
            loop.create_task(self._expire_assumed(), name="extender-expire-assumed"),
            loop.create_task(self._freeze_when_synced(), name="extender-gc-freeze"),
        ]
        if self.opts.state_max_age_s > 0:
            self._tasks.append(loop.create_task(self._sweep_stale(), name="extender-sweep-stale"))
        log.info("serving on %s:%d (%s) with node policy %s",
                 host, self.port, "https" if ssl_context else "http",
                 self.opts.node_policy, extra={"options": asdict(self.opts)})  # fmt: skip

    async def _start_informers(self) -> None:
        # One after another: a bound pod is assumed with a placement predicted on its node's
        # state, so the states must be in before the first pod arrives.
        for informer in self.informers:
            await informer.start()
            await informer.synced.wait()

    async def _expire_assumed(self) -> None:
        period = max(self.opts.assume_ttl_s / 4, 0.05)
        while True:
            await asyncio.sleep(period)
            self.view.expire()

    async def _sweep_stale(self) -> None:
        # Only for the log: requests compare each state's age themselves.
        period = max(min(self.opts.state_max_age_s / 6, 10.0), 0.05)
        while True:
            await asyncio.sleep(period)
            self.view.sweep_stale()

    async def _freeze_when_synced(self) -> None:
        for informer in self.informers:
            await informer.synced.wait()
        # The initial lists leave thousands of long-lived objects; one full collection now
        # and moving them out of the collector's view keeps later pauses off the request path.
        gc.collect()
        gc.freeze()
        log.info("caches synced: %d node states, %d GPU pods",
                 len(self.view.scorers), len(self.view.pods))  # fmt: skip

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for informer in self.informers:
            await informer.stop()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


async def run(opts: Options) -> int:
    service = Service(opts, api=await asyncio.to_thread(api_client, opts))
    try:
        await service.start()
    except OSError as e:  # address in use, unknown host: say so instead of a traceback
        log.error("cannot serve on --listen %s: %s", opts.listen, e.strerror or e)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            log.warning("second signal: exiting now")
            sys.exit(1)
        log.info("signal received: draining (send another to exit at once)")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await stop.wait()
    finally:
        await service.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging(opts.log_format, opts.log_level)
    return asyncio.run(run(opts))


if __name__ == "__main__":
    sys.exit(main())
