"""The extender's HTTP surface: thin handlers (decode -> common.scoring -> encode). /bind asks
`extender.bindguard` first; filter and prioritize tell it which pod they scored.

Each route is written once, as a function of the request body to a `Reply`; `app` serves them
over HTTP/1.1 (aiohttp) and `respond` over HTTP/2 (`extender.http2`, which kube-scheduler's
client picks when the TLS port offers it), with the same authorization and metrics.

Status codes are mapped here, in one place: every scheduling outcome (feasible or not, unknown
nodes, a pod we cannot read) is HTTP 200 with the answer in the body; HTTP 400 means the body
could not be decoded as the verb's arguments; 413 a body over the size limit. A bug in a handler
is still a 500, and is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sharepack.common import podrequests
from sharepack.common.podrequests import PodRequest
from sharepack.extender import explaining, protocol
from sharepack.extender.authorizing import Authorizer
from sharepack.extender.binding import Binder, BindError
from sharepack.extender.bindguard import BindGuard, Refusal
from sharepack.extender.caches import ClusterView
from sharepack.extender.http2 import Reply
from sharepack.extender.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger(__name__)

# 5,000 candidates as NodeNames (nodeCacheCapable: true, as deploy/ ships) take 0.2 MiB, and a
# Pod at etcd's 1.5 MiB object limit fits beside them; whole Node objects (nodeCacheCapable:
# false) at ~12 KB each fit ~680 nodes. benchmarks/bench_body_size.py measures both.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
FAILED_PREFIX = "sharepack: "


def _prefixed(reasons: dict[str, str]) -> dict[str, str]:
    """The reasons as the reply gives them, each after `FAILED_PREFIX`: in C, since the tier
    filter fails every node but the best (thousands per request on a large cluster)."""
    return dict(zip(reasons, map(FAILED_PREFIX.__add__, reasons.values())))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Core = Callable[[bytes], Awaitable[Reply]]  # a verb: its request body -> its reply
TIMED_VERBS = ("filter", "prioritize", "bind")  # the scheduler's, in the latency histogram


class Extender:
    def __init__(
        self,
        view: ClusterView,
        *,
        binder: Binder | None = None,
        metrics: Metrics | None = None,
        ready: Callable[[], bool] = lambda: True,
        url_prefix: str = "",
        managed: podrequests.Managed | None = None,
        guard: BindGuard | None = None,
        authorizer: Authorizer | None = None,  # who may call which route (the mutual-TLS port)
    ) -> None:
        self.view = view
        self.authorizer = authorizer
        # /explain is read-only, behind the same mTLS, and not timed with the scheduler's verbs.
        self._verbs: dict[str, Core] = {"filter": self.filter_reply, "prioritize": self.prioritize_reply,
                                        "bind": self.bind_reply, "explain": self.explain_reply}  # fmt: skip
        self._probes: dict[str, Callable[[], Awaitable[Reply]]] = {
            "/healthz": self.healthz_reply, "/readyz": self.readyz_reply, "/metrics": self.metrics_reply,
        }  # fmt: skip
        self.binder = binder
        self.guard = guard if guard is not None else BindGuard(view, managed=managed)
        self.metrics = metrics or view.metrics
        self.ready = ready
        self.url_prefix = "/" + url_prefix.strip("/") if url_prefix.strip("/") else ""
        self.managed = managed
        m = self.metrics
        m.gauge("sharepack_extender_cache_nodes", "Nodes with a usable published state.",
                lambda: len(view.scorers))  # fmt: skip
        m.gauge("sharepack_extender_cache_nodes_unusable",
                "Nodes whose published state this extender cannot read.",
                lambda: len(view.invalid))  # fmt: skip
        m.gauge("sharepack_extender_stale_nodes",
                "Nodes whose published state is older than --state-max-age-seconds "
                "(treated as unknown; counted in cache_nodes too).",
                view.count_stale)  # fmt: skip
        m.gauge("sharepack_extender_cache_pods", "GPU pods bound to nodes.", lambda: len(view.pods))
        m.gauge("sharepack_extender_assumed_pods",
                "Pods counted with their predicted placement until their agent reports them.",
                lambda: len(view.assumed))  # fmt: skip

    # -- wiring ----------------------------------------------------------------------------

    def app(self, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> web.Application:
        """The HTTP/1.1 app: every route of `respond`, through aiohttp."""
        app = web.Application(client_max_size=max_body_bytes)
        self._add_probes(app)
        p = self.url_prefix
        for verb, core in self._verbs.items():
            app.router.add_post(f"{p}/{verb}", self._aiohttp_verb(verb, core))
        if self.authorizer is not None:
            app.middlewares.append(self.authorizer.middleware())
        return app

    def probe_app(self) -> web.Application:
        """Health and metrics only: read-only, so it may be served without client certificates
        (`--metrics-listen`) to the kubelet's probes and to Prometheus."""
        app = web.Application()
        self._add_probes(app)
        return app

    def _add_probes(self, app: web.Application) -> None:
        app[EXTENDER] = self
        for path, core in self._probes.items():
            app.router.add_get(path, self._aiohttp_probe(core))

    def _aiohttp_verb(self, verb: str, core: Core) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            t0 = time.perf_counter()
            try:
                body = await request.read()
            except web.HTTPException as e:  # 413 from the body size limit, among others
                self._observe(verb, e.status, t0)
                raise
            return _response(await self._call(verb, core, body, t0))

        return handler

    @staticmethod
    def _aiohttp_probe(core: Callable[[], Awaitable[Reply]]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return _response(await core())

        return handler

    async def respond(self, method: str, target: str, body: bytes | None, peercert: Any) -> Reply:
        """Every route of `app` for `extender.http2`: the same verbs, probes, authorization
        (`self.authorizer`, by the route's path) and metrics. `body` None: over the size limit."""
        path = target.partition("?")[0]
        t0 = time.perf_counter()
        p = self.url_prefix
        verb = path[len(p) + 1 :] if path.startswith(p + "/") else ""
        core = self._verbs.get(verb)
        if core is not None:
            if method != "POST":
                return _text(405, "405: Method Not Allowed")
            if self.authorizer is not None:
                refusal = self.authorizer.check(path, peercert, target)
                if refusal is not None:
                    return _text(403, refusal)
            if body is None:
                self._observe(verb, 413, t0)
                return _text(413, "413: Request Entity Too Large")
            return await self._call(verb, core, body, t0)
        probe = self._probes.get(path)
        if probe is None:
            return _text(404, "404: Not Found")
        if method != "GET":
            return _text(405, "405: Method Not Allowed")
        return await probe()

    async def _call(self, verb: str, core: Core, body: bytes, t0: float) -> Reply:
        code = 500
        try:
            reply = await core(body)
            code = reply.status
            return reply
        except Exception:
            log.exception("%s handler failed", verb)
            raise
        finally:
            self._observe(verb, code, t0)

    def _observe(self, verb: str, code: int, t0: float) -> None:
        if verb in TIMED_VERBS:
            self.metrics.observe(verb, code, time.perf_counter() - t0)

    # -- verbs -----------------------------------------------------------------------------

    @staticmethod
    def _json(body: bytes) -> Reply:
        return Reply(200, body)

    @staticmethod
    def _bad(e: Exception) -> Reply:
        return _text(400, str(e))

    def _request(self, args: protocol.ExtenderArgs, *, prioritizing: bool = False) -> PodRequest | None:
        request = args.request
        if request is None:
            return None
        request = self.view.relevant(request)
        self.view.remember(request, prioritizing=prioritizing)
        return request

    async def filter_reply(self, body: bytes) -> Reply:
        try:
            args = protocol.decode_args(body, self.managed)
        except protocol.DecodeError as e:
            return self._bad(e)
        pod = self._request(args)
        everyone = range(len(args.node_names))
        if pod is None:
            log.warning("filter: cannot read the pod: %s", args.pod_error)
            return self._json(protocol.encode_filter(args, everyone, {}, {}, args.pod_error))
        if pod.empty and not self.view.ranks_every_pod:
            self.guard.filtered(args.pod_uid, args.node_names, everyone)
            return self._json(protocol.encode_filter(args, everyone, {}, {}))
        # Reasons for nodes outside the tier only matter when none passes, and then none is.
        survivors, failed, unresolvable = self.view.filter_nodes(args.node_names, pod, all_reasons=False)
        self.guard.filtered(args.pod_uid, args.node_names, survivors)
        if survivors:
            # kube-scheduler reads the failed nodes' reasons only when no node passes (its "0/N
            # nodes are available" event, preemption); with a survivor it schedules and drops
            # them. The tier filter fails every node but the best, so they were most of the
            # reply (92 KB at 1,000 nodes) for kube-scheduler to decode on its serial
            # path; /explain gives every node's verdict.
            return self._json(protocol.encode_filter(args, survivors, {}, {}))
        return self._json(protocol.encode_filter(args, survivors, _prefixed(failed), _prefixed(unresolvable)))

    async def prioritize_reply(self, body: bytes) -> Reply:
        try:
            args = protocol.decode_args(body, self.managed)
        except protocol.DecodeError as e:
            return self._bad(e)
        pod = self._request(args, prioritizing=True)
        names = args.node_names
        self.guard.prioritized(args.pod_uid, names)
        if pod is None or (pod.empty and not self.view.ranks_every_pod):
            return self._json(protocol.join_priorities(()))  # every node 0: none named
        return self._json(protocol.join_priorities(self.view.host_priorities(names, pod)))

    async def bind_reply(self, body: bytes) -> Reply:
        try:
            args = protocol.decode_binding(body)
        except protocol.DecodeError as e:
            return self._bad(e)
        m = self.metrics
        if self.binder is None:
            m.bind(False)
            return self._json(protocol.encode_binding_result(
                "binding is not available: the extender runs without Kubernetes API access"))  # fmt: skip
        # A directing binder lists the node's pods beside the guard's read (`prefetch`).
        prefetch = getattr(self.binder, "prefetch", None)
        if prefetch is not None:
            prefetch(args)
        try:
            verdict = await self.guard.admit(args, self.binder.get_pod)
        except BaseException:
            await self._discard(args)
            raise
        if isinstance(verdict, Refusal):
            await self._discard(args)
            m.bind_refused(verdict.rule)
            log.warning("bind refused (%s): %s", verdict.rule, verdict.message)
            return self._json(protocol.encode_binding_result(
                f"{FAILED_PREFIX}bind refused ({verdict.rule}): {verdict.message}"))  # fmt: skip
        # Counted on its node before the Binding is written, as kube-scheduler assumes before it
        # binds: a filter for the next pod that arrives while the write is in flight sees it,
        # and concurrent binds to one node are predicted in the order they arrived.
        uid = args.pod_uid
        assumed_now = False
        # A directing binder assumes the pod itself, with the GPUs it directs (`counts_pods`).
        counts_itself = getattr(self.binder, "counts_pods", False)
        if not counts_itself and not verdict.request.empty and uid not in self.view.assumed:
            self.view.assume(uid, args.node, verdict.request)
            assumed_now = uid in self.view.assumed
        # Its CPU and memory, any pod; a directing binder directs its GPUs with the room as
        # the filter saw it (before the pod), and the node is rebuilt once for both.
        self.view.count_resources(uid, args.node, verdict.request, deferred=counts_itself)
        try:
            await self.binder.bind(args)
        except BindError as e:
            self.view.uncount_resources(uid, args.node)
            if assumed_now:
                self.view.forget_pod(uid)  # not bound: nothing holds those devices
            m.bind(False)
            log.warning("%s", e)
            return self._json(protocol.encode_binding_result(str(e)))
        finally:
            self.view.refresh_node(args.node)  # a deferred count the binder did not get to rebuild
        m.bind(True)
        if not verdict.request.empty:
            self.view.assume(uid, args.node, verdict.request)  # a no-op when counted already
        return self._json(protocol.encode_binding_result())

    async def _discard(self, args: protocol.BindingArgs) -> None:
        discard = getattr(self.binder, "discard", None)
        if discard is not None:
            await discard(args)

    async def explain_reply(self, body: bytes) -> Reply:
        """Read-only: each node's filter verdict and score for the pod (sharepack/extender/explaining.py)."""
        try:
            args = protocol.decode_args(body, self.managed)
        except protocol.DecodeError as e:
            return self._bad(e)
        pod = self.view.relevant(args.request) if args.request is not None else None
        nodes = explaining.explain(self.view, args.node_names, pod) if pod is not None and not pod.empty else []
        return self._json(explaining.encode(args, pod, nodes))

    # -- health ----------------------------------------------------------------------------

    async def healthz_reply(self) -> Reply:
        return _text(200, "ok")

    async def readyz_reply(self) -> Reply:
        if self.ready():
            return _text(200, "ok")
        return _text(503, "caches not synced")

    async def metrics_reply(self) -> Reply:
        return Reply(200, await self.metrics.render(), CONTENT_TYPE)


def _text(status: int, text: str) -> Reply:
    return Reply(status, (text.rstrip("\n") + "\n").encode(), "text/plain; charset=utf-8")


def _response(reply: Reply) -> web.Response:
    return web.Response(status=reply.status, body=reply.body, headers={"Content-Type": reply.content_type})


EXTENDER = web.AppKey("extender", Extender)
