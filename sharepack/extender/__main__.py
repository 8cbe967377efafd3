"""`sharepack-extender`: the composition root. Only here are argv and the environment read.

    sharepack-extender --listen 0.0.0.0:8888 --node-policy fragaware [--kubeconfig FILE]
                       --tls-cert-file F --tls-private-key-file K --client-ca-file CA
                       [--metrics-listen 0.0.0.0:9400] [--url-prefix /sharepack]
    sharepack-extender --node-policy fragaware [--typical-workload FILE] --insecure-http

Without `--kubeconfig` the in-cluster config is used; with neither, the extender still serves
(every node unknown: pass-through, lowest score) and /bind answers with an error.

The verbs are served over mutual TLS: only a client whose certificate `--client-ca-file` signed
(kube-scheduler's extender tlsConfig) gets past the handshake, and only the common names of
`--scheduler-client-cn` may call the verbs, those of `--explain-client-cn` /explain
(extender.authorizing). Plain HTTP takes `--insecure-http`, and is logged as a warning.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import ssl
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import uvloop
from aiohttp import web

from sharepack.common import addresses, draslices, fragmentation, podrequests, scoring, shipped, state as published
from sharepack.common.errors import ConfigError
from sharepack.common.policies import NodePolicy
from sharepack.extender import authorizing, directing, draview, http2, noderesources
from sharepack.extender.binding import ApiBinder, Binder
from sharepack.extender.bindguard import BindGuard, UnscoredBinds
from sharepack.extender.caches import ClusterView, pod_handler, state_handler
from sharepack.kube import clients
from sharepack.kube.reflecting import Reflector
from sharepack.extender.metrics import Metrics
from sharepack.extender.noderesources import NodeResources
from sharepack.extender.pendingpods import PendingPods
from sharepack.extender.server import DEFAULT_MAX_BODY_BYTES, Extender

log = logging.getLogger("extender")

DEFAULT_LISTEN = "0.0.0.0:8888"
DEFAULT_ASSUME_TTL_S = 120.0
DEFAULT_RESYNC_S = 300.0
DEFAULT_STATE_MAX_AGE_S = published.STALE_AFTER_S
MODE_DEVICE_PLUGIN = "device-plugin"
MODE_DRA = "dra"
SHUTDOWN_TIMEOUT_S = 2.0  # requests in flight at shutdown get this long to finish
EVENT_LOOPS = ("uvloop", "asyncio")  # --event-loop's choices; the first is the default
GC_YOUNG_THRESHOLD = 10_000  # allocations between the cyclic collector's young passes (default 700)


@dataclass(frozen=True, slots=True)
class Options:
    listen: str = DEFAULT_LISTEN
    node_policy: NodePolicy = shipped.NODE_POLICY
    typical_workload: fragmentation.TypicalWorkload | None = None  # fragaware; None: built in
    kubeconfig: str | None = None
    in_cluster: bool = True  # try the in-cluster config when no kubeconfig is given
    tls_cert_file: str | None = None
    tls_private_key_file: str | None = None
    client_ca_file: str | None = None  # with the two above: clients must present a certificate
    insecure_http: bool = False  # plain HTTP asked for explicitly
    metrics_listen: str = ""  # HOST:PORT for /metrics, /healthz, /readyz without TLS; "": none
    http2: bool = True  # offer HTTP/2 on the TLS port (extender.http2)
    scheduler_names: tuple[str, ...] = (podrequests.DEFAULT_SCHEDULER_NAME,)
    # Client certificate common names per path (extender.authorizing); mutual TLS only.
    scheduler_client_cns: tuple[str, ...] = authorizing.DEFAULT_SCHEDULER_CNS
    explain_client_cns: tuple[str, ...] = authorizing.DEFAULT_EXPLAIN_CNS
    unscored_binds: UnscoredBinds = UnscoredBinds.REFUSE
    url_prefix: str = ""
    log_format: str = "text"
    log_level: str = "info"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    assume_ttl_s: float = DEFAULT_ASSUME_TTL_S
    resync_s: float = DEFAULT_RESYNC_S
    state_max_age_s: float = DEFAULT_STATE_MAX_AGE_S  # 0: no age check
    filter_tier_width: int = scoring.DEFAULT_TIER_WIDTH  # 0: the filter passes every feasible node
    directed_gpus: bool = shipped.DIRECTED_GPUS  # annotate bound pods with their GPUs (extender.directing)
    mode: str = MODE_DEVICE_PLUGIN  # where node states come from: NodeGpuState, or DRA (extender.draview)
    event_loop: str = EVENT_LOOPS[0]

    @property
    def host_port(self) -> tuple[str, int]:
        return addresses.listen_address(self.listen, flag="--listen")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file and self.tls_private_key_file)


def transport_problem(opts: Options) -> str | None:
    """Why these options must not serve, or None. Kept out of `parse_args` so that tests can
    parse other flags alone; `main` refuses to start on it."""
    if not opts.tls and not opts.insecure_http:
        return ("refusing to serve /bind without client authentication: pass --tls-cert-file, "
                "--tls-private-key-file and --client-ca-file, or --insecure-http to serve plain HTTP")  # fmt: skip
    return None


def parse_args(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(prog="sharepack-extender", description=__doc__.split("\n")[0])
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="HOST:PORT to serve on")
    p.add_argument(
        "--node-policy",
        default=str(shipped.NODE_POLICY),
        choices=[x.value for x in NodePolicy],
        help="how to rank nodes: packed keeps whole GPUs and nodes free, distributed spreads, "
        "fragaware grows the FGD study's GPU fragmentation least",
    )
    p.add_argument("--typical-workload", default=None, metavar="FILE",
                   help="YAML pod shapes {gpus, share, weight, cpu, memory, models} that define "
                        "fragmentation for fragaware and packed's CPU term (default: built in, from "
                        "the FGD study's default trace)")  # fmt: skip
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster)")
    p.add_argument("--tls-cert-file", default=None, help="serving certificate (PEM)")
    p.add_argument("--tls-private-key-file", default=None, help="its private key (PEM)")
    p.add_argument("--client-ca-file", default=None, metavar="FILE",
                   help="CA bundle (PEM) that signs the clients allowed to call the verbs: "
                        "kube-scheduler's extender tlsConfig certificate")  # fmt: skip
    p.add_argument("--scheduler-client-cn", action="append", default=None, metavar="CN",
                   help="a client certificate common name that may call the verbs (/filter, /prioritize, "
                        "/bind); repeat for several (default: "
                        f"{', '.join(authorizing.DEFAULT_SCHEDULER_CNS)})")  # fmt: skip
    p.add_argument("--explain-client-cn", action="append", default=None, metavar="CN",
                   help="a client certificate common name that may call the read-only /explain; repeat "
                        f"for several (default: {', '.join(authorizing.DEFAULT_EXPLAIN_CNS)})")  # fmt: skip
    p.add_argument("--insecure-http", action="store_true",
                   help="serve plain HTTP without client authentication: anyone who reaches the "
                        "port can call /bind (logged as a warning)")  # fmt: skip
    p.add_argument("--http2", action=argparse.BooleanOptionalAction, default=True,
                   help="offer HTTP/2 on the TLS port, which kube-scheduler's client then uses for every "
                        "call on one connection (default: on; --no-http2 serves HTTP/1.1 only)")  # fmt: skip
    p.add_argument("--metrics-listen", default="", metavar="HOST:PORT",
                   help="also serve /metrics, /healthz and /readyz (only those) over plain HTTP here, "
                        "for probes and Prometheus (default: off)")  # fmt: skip
    p.add_argument("--scheduler-name", action="append", default=None, metavar="NAME",
                   help="a schedulerName whose pods /bind may bind; repeat for several "
                        f"(default {podrequests.DEFAULT_SCHEDULER_NAME})")  # fmt: skip
    p.add_argument("--unscored-binds", default=str(UnscoredBinds.REFUSE), choices=[x.value for x in UnscoredBinds],
                   help="a /bind for a pod this replica did not filter or prioritize: refuse it, or "
                        "recheck the pod and node on this replica's caches (several replicas)")  # fmt: skip
    p.add_argument("--url-prefix", default="", help="path prefix of the verbs, e.g. /sharepack")
    p.add_argument("--log-format", default="text", choices=["text", "json"])
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    p.add_argument("--assume-ttl", type=float, default=DEFAULT_ASSUME_TTL_S,
                   help="seconds a bound pod counts with its predicted placement before its "
                        "agent reports it")  # fmt: skip
    p.add_argument("--resync", type=float, default=DEFAULT_RESYNC_S, help="relist period, s")
    p.add_argument("--state-max-age-seconds", type=float, default=DEFAULT_STATE_MAX_AGE_S,
                   help="a NodeGpuState whose observedAt has not changed for this long (by our clock) is stale: its node "
                        "is treated as unknown (passes filter, score 0); 0 turns the check off")  # fmt: skip
    p.add_argument("--filter-tier-width", type=int, default=scoring.DEFAULT_TIER_WIDTH,
                   help="the filter passes only this many best feasible nodes by the node policy's "
                        "own rank (ties by name), so the scheduler cannot scatter GPU pods; 0 "
                        "passes all (default: %(default)s)")  # fmt: skip
    p.add_argument("--directed-gpus", action=argparse.BooleanOptionalAction, default=None,
                   help="at bind, write the physical GPUs the pod was counted on into its "
                        "sharepack.io/gpus annotation, for the node's agent to allocate on "
                        "(default: on; off in the DRA mode, where the scheduler allocates)")  # fmt: skip
    p.add_argument("--mode", default=MODE_DEVICE_PLUGIN, choices=[MODE_DEVICE_PLUGIN, MODE_DRA],
                   help="where node states come from: NodeGpuState objects (device-plugin) or the "
                        "gpu.sharepack.io ResourceSlices and the ResourceClaims allocated from them "
                        "(dra; states do not age there) (default: %(default)s)")  # fmt: skip
    p.add_argument("--event-loop", default=EVENT_LOOPS[0], choices=EVENT_LOOPS,
                   help="uvloop (its transports and TLS in C: about a tenth less CPU per pod scheduled, "
                        "benchmarks/bench_scheduler.py) or Python's own asyncio loop (default: %(default)s)")  # fmt: skip
    a = p.parse_args(list(argv))
    if a.filter_tier_width < 0:
        p.error(f"invalid --filter-tier-width option: {a.filter_tier_width} (want 0 or more)")
    if bool(a.tls_cert_file) != bool(a.tls_private_key_file):
        p.error("--tls-cert-file and --tls-private-key-file go together")
    if a.insecure_http and a.tls_cert_file:
        p.error("--insecure-http contradicts --tls-cert-file: choose one")
    if a.tls_cert_file and not a.client_ca_file:
        p.error("--tls-cert-file without --client-ca-file lets any client call /bind: name the CA "
                "that signs kube-scheduler's client certificate")  # fmt: skip
    if a.client_ca_file and not a.tls_cert_file:
        p.error("--client-ca-file needs --tls-cert-file and --tls-private-key-file")
    scheduler_names = tuple(a.scheduler_name or (podrequests.DEFAULT_SCHEDULER_NAME,))
    if not all(scheduler_names):
        p.error("invalid --scheduler-name option: ''")
    scheduler_cns = tuple(a.scheduler_client_cn or authorizing.DEFAULT_SCHEDULER_CNS)
    explain_cns = tuple(a.explain_client_cn or authorizing.DEFAULT_EXPLAIN_CNS)
    for flag, cns in (("--scheduler-client-cn", scheduler_cns), ("--explain-client-cn", explain_cns)):
        if not all(cns):
            p.error(f"invalid {flag} option: ''")
    if not a.state_max_age_seconds >= 0:  # also rejects nan
        p.error(f"invalid --state-max-age-seconds option: {a.state_max_age_seconds} (want seconds >= 0)")
    for flag, value in (("--assume-ttl", a.assume_ttl), ("--resync", a.resync), ("--max-body-bytes", a.max_body_bytes)):
        if not value > 0 or value == float("inf"):  # also rejects nan
            p.error(f"invalid {flag} option: {value} (want a finite number > 0)")
    if a.tls_cert_file:
        try:
            tls_context(a.tls_cert_file, a.tls_private_key_file, a.client_ca_file)
        except ValueError as e:
            p.error(str(e))
    if a.mode == MODE_DRA and a.directed_gpus:
        p.error("--directed-gpus does not apply with --mode dra: the scheduler allocates the devices")
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
        client_ca_file=a.client_ca_file,
        insecure_http=a.insecure_http,
        http2=a.http2,
        metrics_listen=a.metrics_listen,
        scheduler_names=scheduler_names,
        scheduler_client_cns=scheduler_cns,
        explain_client_cns=explain_cns,
        unscored_binds=UnscoredBinds(a.unscored_binds),
        url_prefix=a.url_prefix,
        log_format=a.log_format,
        log_level=a.log_level,
        max_body_bytes=a.max_body_bytes,
        assume_ttl_s=a.assume_ttl,
        resync_s=a.resync,
        # ResourceSlices have no heartbeat: a node's slices are withdrawn when its plugin goes.
        state_max_age_s=0.0 if a.mode == MODE_DRA else a.state_max_age_seconds,
        filter_tier_width=a.filter_tier_width,
        directed_gpus=a.mode != MODE_DRA and (shipped.DIRECTED_GPUS if a.directed_gpus is None else a.directed_gpus),
        mode=a.mode,
        event_loop=a.event_loop,
    )
    try:
        opts.host_port
        if opts.metrics_listen:
            addresses.listen_address(opts.metrics_listen, flag="--metrics-listen")
    except ValueError as e:
        p.error(str(e))
    return opts


def tls_context(cert_file: str, key_file: str, client_ca_file: str | None = None) -> ssl.SSLContext:
    """The server's TLS context, requiring a client certificate signed by `client_ca_file` when
    given; raises ValueError naming the files (checked at parse time, so a wrong path is a usage
    error rather than a traceback once the caches start)."""
    # A bare server context: it trusts no CA until told, so clients are checked against
    # --client-ca-file alone, never against OpenSSL's default paths (SSL_CERT_FILE, the system
    # store), where a public CA's certificate would get in.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # No session tickets: kube-scheduler's client (client-go's TLS config) keeps no session
    # cache and never resumes, and OpenSSL would issue two tickets at every TLS 1.3 handshake,
    # about 0.3 of the 1 ms of server CPU a handshake costs (benchmarks/bench_tls.py), on
    # hundreds of handshakes per 1,000 binds (kube-scheduler keeps two idle connections).
    ctx.num_tickets = 0
    ctx.options |= ssl.OP_NO_TICKET
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except OSError as e:  # ssl.SSLError included: not PEM, or key and certificate do not match
        raise ValueError(
            f"invalid --tls-cert-file/--tls-private-key-file option: {cert_file}, {key_file}: {e.strerror or e}"
        ) from None
    if client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=client_ca_file)
        except OSError as e:  # ssl.SSLError included: no certificate in the file
            raise ValueError(f"invalid --client-ca-file option: {client_ca_file}: {e.strerror or e}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
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
    return client.ApiClient(conf)


def watched_lists(custom: Any, core: Any) -> dict[str, Callable[..., Any]]:
    """The list calls of what the extender watches in the device-plugin mode, by name (every
    NodeGpuState; every Node where the policy is CPU-aware; every pod, pending ones too), on
    `kubernetes.aio`'s CustomObjectsApi and CoreV1Api; benchmarks/watch_floor.py watches the same."""
    return {
        "nodegpustates": partial(custom.list_cluster_custom_object_without_preload_content,
                                 published.GROUP, published.VERSION, published.PLURAL),
        "nodes": core.list_node_without_preload_content,
        "pods": core.list_pod_for_all_namespaces_without_preload_content,
    }  # fmt: skip


class Service:
    """The running extender: caches, informers and the HTTP server."""

    def __init__(self, opts: Options, *, api: Any | None = None) -> None:
        self.opts = opts
        self.api = api
        self.metrics = Metrics()
        # The CPU-aware ranks need every node's CPU and memory (a Node watch; the pod watch
        # counts every bound pod's requests): extender.noderesources.
        self.resources = NodeResources() if scoring.cpu_aware(opts.node_policy) and api is not None else None
        self.view = ClusterView(
            opts.node_policy, metrics=self.metrics, assume_ttl=opts.assume_ttl_s,
            max_age_s=opts.state_max_age_s, workload=opts.typical_workload,
            tier_width=opts.filter_tier_width, resources=self.resources,
            directed=opts.directed_gpus and opts.node_policy == NodePolicy.FRAGAWARE,
            whole_of=draview.WHOLE_OF if opts.mode == MODE_DRA else None,
        )  # fmt: skip
        self.pending = PendingPods(opts.scheduler_names)  # fed by the pod watch, read at bind
        self.informers: list[Reflector] = []
        self._watch_api: Any | None = None  # kubernetes.aio client of the reflectors
        self._api_binder: ApiBinder | None = None
        binder: Binder | None = None
        if api is not None:
            from kubernetes.aio import client as aio

            self._watch_api = clients.aio_client_like(api)
            custom = aio.CustomObjectsApi(self._watch_api)
            core = aio.CoreV1Api(self._watch_api)
            watched = watched_lists(custom, core)
            self.informers = [
                *(self._dra_informers(custom) if opts.mode == MODE_DRA else [Reflector(
                    watched["nodegpustates"],
                    what="nodegpustates",
                    on_list=lambda cache: self.view.replace_states(list(cache.values())),
                    on_event=state_handler(self.view),
                    watch_timeout_s=60, resync_s=opts.resync_s, backoff_initial_s=0.2, backoff_max_s=10.0,
                    keep_cache=False,  # ClusterView keeps what it needs, decoded
                )]),  # fmt: skip
                Reflector(
                    # Every pod, pending ones too: the bind guard reads the pod it binds from
                    # here (`extender.pendingpods`), not from the API once per bind.
                    watched["pods"],
                    what="pods",
                    on_list=self._on_pod_list,
                    on_event=self._pod_handler(),
                    watch_timeout_s=60, resync_s=opts.resync_s, backoff_initial_s=0.2, backoff_max_s=10.0,
                    keep_cache=False,  # ClusterView keeps what it needs, decoded
                ),  # fmt: skip
            ]
            if self.resources is not None:
                resources = self.resources
                # Before the pods: a node's room needs its allocatable first.
                self.informers.insert(1, Reflector(
                    watched["nodes"],
                    what="nodes",
                    on_list=lambda cache: resources.replace_nodes(list(cache.values())),
                    on_event=noderesources.node_handler(resources),
                    watch_timeout_s=60, resync_s=opts.resync_s, backoff_initial_s=0.2, backoff_max_s=10.0,
                    keep_cache=False,
                ))  # fmt: skip
            api_binder = self._api_binder = ApiBinder(self._watch_api)
            binder = directing.DirectingBinder(api_binder, self.view) if opts.directed_gpus else api_binder
            if isinstance(binder, directing.DirectingBinder):
                lists = binder
                self.metrics.gauge("sharepack_extender_bind_node_lists",
                                   "Binds that listed their node's pods first: another binder was about "
                                   "(directing.SHARED_S after its last sign) or this one had paused.",
                                   lambda: lists.lists)  # fmt: skip
        guard = BindGuard(self.view, scheduler_names=opts.scheduler_names, unscored=opts.unscored_binds,
                          pending=self.pending)  # fmt: skip
        self.extender = Extender(
            self.view, binder=binder, metrics=self.metrics, ready=self.synced,
            url_prefix=opts.url_prefix, guard=guard,
        )  # fmt: skip
        self._runners: list[web.AppRunner] = []
        self._servers: list[asyncio.AbstractServer] = []  # the TLS port's where it offers HTTP/2
        self._h2 = http2.Connections()
        self._tasks: list[asyncio.Task[None]] = []
        self.port = 0
        self.metrics_port = 0  # --metrics-listen's bound port; 0: not serving it

    def _on_pod_list(self, cache: Mapping[tuple[str, str], dict[str, Any]]) -> None:
        pods = list(cache.values())
        self.pending.replace(pods)
        if self.resources is not None:
            self.resources.replace_pods(pods)
        self.view.replace_pods(pods)

    def _pod_handler(self) -> Callable[[str, Any], None]:
        handler = pod_handler(self.view, self.pending)
        return handler if self.resources is None else noderesources.pod_handler(self.resources, handler)

    def _dra_informers(self, custom: Any) -> list[Reflector]:
        """The DRA mode's sources: this driver's ResourceSlices and every ResourceClaim (the
        API cannot select claims by driver), fed through `extender.draview` into the view."""
        states = draview.DraStates(self.view)
        group, version = draslices.GROUP, draslices.VERSION
        timing: dict[str, Any] = dict(watch_timeout_s=60, resync_s=self.opts.resync_s, backoff_initial_s=0.2,
                                      backoff_max_s=10.0, keep_cache=False)  # fmt: skip
        return [
            Reflector(
                partial(custom.list_cluster_custom_object_without_preload_content, group, version, draview.SLICES,
                        field_selector=f"spec.driver={draslices.DRIVER}"),
                what="resourceslices", on_list=lambda cache: states.replace_slices(list(cache.values())),
                on_event=draview.slice_handler(states), **timing,
            ),  # fmt: skip
            Reflector(
                partial(custom.list_cluster_custom_object_without_preload_content, group, version, draview.CLAIMS),
                what="resourceclaims", on_list=lambda cache: states.replace_claims(list(cache.values())),
                on_event=draview.claim_handler(states), **timing,
            ),  # fmt: skip
        ]

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    async def start(self) -> None:
        host, port = self.opts.host_port
        ssl_context = None
        if self.opts.tls_cert_file and self.opts.tls_private_key_file:
            ssl_context = tls_context(self.opts.tls_cert_file, self.opts.tls_private_key_file,
                                      self.opts.client_ca_file)  # fmt: skip
            stats = ssl_context.session_stats
            # Whether kube-scheduler keeps its connections: a handshake per request would show
            # here as one per call (and cost a few ms of CPU on both sides each).
            self.metrics.gauge("sharepack_extender_tls_handshakes",
                               "TLS handshakes the verbs' server has started since it began serving.",
                               lambda: stats()["accept"])  # fmt: skip
        if ssl_context is not None and self.opts.client_ca_file is not None:
            self.extender.authorizer = authorizing.Authorizer(frozenset(self.opts.scheduler_client_cns),
                                                              frozenset(self.opts.explain_client_cns),
                                                              self.extender.url_prefix)  # fmt: skip
        app = self.extender.app(max_body_bytes=self.opts.max_body_bytes)
        if ssl_context is not None and self.opts.http2:
            ssl_context.set_alpn_protocols(list(http2.ALPN_PROTOCOLS))
        try:
            self.port = await self._serve(app, host, port, ssl_context)
            if self.opts.metrics_listen:
                m_host, m_port = addresses.listen_address(self.opts.metrics_listen, flag="--metrics-listen")
                self.metrics_port = await self._serve(self.extender.probe_app(), m_host, m_port, None)
        except BaseException:
            await self._cleanup_runners()
            raise
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._start_informers(), name="extender-start-informers"),
            loop.create_task(self._expire_assumed(), name="extender-expire-assumed"),
            loop.create_task(self._freeze_when_synced(), name="extender-gc-freeze"),
        ]
        if self.opts.state_max_age_s > 0:
            self._tasks.append(loop.create_task(self._sweep_stale(), name="extender-sweep-stale"))
        if ssl_context is None:
            log.warning("serving plain HTTP on %s:%d without client authentication (--insecure-http): "
                        "anyone who reaches this port can ask /bind to bind pods", host, self.port)  # fmt: skip
        elif self.opts.client_ca_file is None:
            log.warning("serving HTTPS on %s:%d without client certificates: anyone who reaches this "
                        "port can ask /bind to bind pods", host, self.port)  # fmt: skip
        transport = "plain http" if ssl_context is None else "https" if self.opts.client_ca_file is None else "mtls"
        log.info("serving on %s:%d (%s) with node policy %s",
                 host, self.port, transport,
                 self.opts.node_policy, extra={"options": asdict(self.opts)})  # fmt: skip

    async def _serve(self, app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None) -> int:
        """Serve `app`; returns the bound port (0 asks for a free one)."""
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        self._runners.append(runner)
        if ssl_context is not None and self.opts.http2:
            # aiohttp for HTTP/1.1, extender.http2 where the client's ALPN chose h2.
            http1 = runner.server
            assert http1 is not None
            respond, limit, live, count = self.extender.respond, self.opts.max_body_bytes, self._h2, self.metrics.connection
            alpn = await asyncio.get_running_loop().create_server(
                lambda: http2.AlpnServer(http1, respond, limit, live, count), host, port, ssl=ssl_context,
                reuse_address=True,
            )  # fmt: skip
            self._servers.append(alpn)
            return int(alpn.sockets[0].getsockname()[1])
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True)
        await site.start()
        server = site._server  # the bound port (0 picks one); aiohttp exposes it only here
        assert server is not None
        return int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def _cleanup_runners(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        await self._h2.shutdown(SHUTDOWN_TIMEOUT_S)
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()

    async def _start_informers(self) -> None:
        # One after another: a bound pod is assumed with a placement predicted on its node's
        # state, so the states must be in before the first pod arrives. The reflectors run as
        # tasks of this one, so stopping it stops them.
        async with asyncio.TaskGroup() as group:
            for informer in self.informers:
                group.create_task(informer.run(), name=f"extender-watch-{informer.what}")
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
        # Every request and watch event allocates thousands of short-lived containers, nearly
        # all freed by reference counting; at the default 700 the collector ran every few
        # requests, 5 % of the process's time in a with phase (py-spy, docs/scale.md). Cyclic
        # garbage is rare here: it waits for 10,000 allocations instead.
        gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)
        log.info("caches synced: %d node states, %d GPU pods",
                 len(self.view.scorers), len(self.view.pods))  # fmt: skip

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._api_binder is not None:
            await self._api_binder.close()
        if self._watch_api is not None:
            await self._watch_api.close()
        await self._cleanup_runners()


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
            # Not sys.exit: raised in this callback it unwinds through asyncio.run's teardown,
            # which cancels in-flight handlers (aiohttp logs a traceback) and joins worker threads
            # (a /bind stuck in the API client). At once means at once: flush the logs and go.
            logging.shutdown()
            os._exit(1)
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
    problem = transport_problem(opts)
    if problem is not None:
        print(f"sharepack-extender: error: {problem}", file=sys.stderr)
        return 2
    setup_logging(opts.log_format, opts.log_level)
    with asyncio.Runner(loop_factory=event_loop_factory(opts.event_loop)) as runner:
        return runner.run(run(opts))


def event_loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop `--event-loop` names (None: asyncio's default)."""
    return None if name == "asyncio" else uvloop.new_event_loop


if __name__ == "__main__":
    sys.exit(main())
