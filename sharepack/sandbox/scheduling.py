"""A scheduler driver that does, for GPU pods, what kube-scheduler does with an extender.

One pod at a time (kube-scheduler's scheduling cycle is serial):

1. Filter: nodes whose allocatable extended resources (published by their kubelets in the Node
   status) still cover the pod's request after the pods already bound there (the in-tree
   NodeResourcesFit check for extended resources, counted as the kubelet counts them).
2. If the pod requests a managed resource and an extender is configured: POST the real
   `ExtenderArgs` JSON to `<url>/filter` (nodeCacheCapable: node names only) and keep the nodes it
   returns; then, when more than one node is left, POST to `<url>/prioritize` and add
   `score x weight x 10` per node (MaxNodeScore / MaxExtenderPriority = 10), as the scheduler
   does. Filter errors are ignored when the extender is `ignorable`; prioritize errors always
   are (the extender then adds no score), like kube-scheduler.
3. Pick the highest total; ties go to a seeded random choice among the best (kube-scheduler
   samples ties uniformly).
4. Bind: through the extender's `/bind` when it has a bind verb, else the `binding` subresource.

The in-tree scores (LeastAllocated on CPU and memory, spreading...) are left out: the demo's pods
request GPUs only, for which they are all equal.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import random
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kubernetes
import urllib3

from sharepack.common import podrequests

log = logging.getLogger(__name__)

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
RESCHEDULE_S = 1.0
# The API server or the extender away (a restart, an outage): what one pass of the loop may meet.
UNAVAILABLE: tuple[type[Exception], ...] = (
    kubernetes.client.ApiException, aiohttp.ClientError, asyncio.TimeoutError, OSError, urllib3.exceptions.HTTPError,
)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    url_prefix: str  # e.g. "https://127.0.0.1:8888"
    weight: int = 5
    bind: bool = True
    ignorable: bool = True
    http_timeout: float = 5.0
    managed_prefixes: tuple[str, ...] = podrequests.DEFAULT_MANAGED_PREFIXES
    # kube-scheduler's extender tlsConfig: the client certificate and the CA to trust
    # (sandbox.certificates.TlsFiles.client_context). None: the session's default.
    tls: ssl.SSLContext | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    pod: str  # namespace/name
    node: str | None
    reason: str = ""
    feasible: tuple[str, ...] = ()
    scores: Mapping[str, int] = field(default_factory=dict)


class SchedulingError(Exception):
    pass


def _allocatable(node: Any) -> dict[str, int]:
    raw = (node.status.allocatable if node.status else None) or {}
    out: dict[str, int] = {}
    for name, value in raw.items():
        try:
            out[name] = podrequests.parse_count(value, where=f"node {node.metadata.name}")
        except Exception:  # cpu "500m", memory "1Gi"...: not extended resources
            continue
    return out


def _bound_usage(pods: Sequence[Any], api: Any) -> dict[str, dict[str, int]]:
    usage: dict[str, dict[str, int]] = {}
    for pod in pods:
        if not pod.spec.node_name or (pod.status and pod.status.phase in ("Succeeded", "Failed")):
            continue
        request = podrequests.decode_pod_request(api.sanitize_for_serialization(pod))
        node = usage.setdefault(pod.spec.node_name, {})
        for name in request.resources:
            node[name] = node.get(name, 0) + request.total(name)
    return usage


class SchedulerDriver:
    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        session: aiohttp.ClientSession,
        extender: ExtenderConfig | None,
        *,
        seed: int = 0,
    ) -> None:
        self._api: Any = api
        # The client's generated types make every field Optional; the sandbox reads them as the
        # API server fills them, so it holds the client untyped.
        self._core: Any = kubernetes.client.CoreV1Api(api)
        self._session = session
        self._extender = extender
        self._rng = random.Random(seed)

    async def schedule(self, namespace: str, name: str) -> Decision:
        pod = await asyncio.to_thread(self._core.read_namespaced_pod, name, namespace)
        nodes = (await asyncio.to_thread(self._core.list_node)).items
        pods = (await asyncio.to_thread(self._core.list_pod_for_all_namespaces)).items
        return await self._decide(pod, nodes, _bound_usage(pods, self._api))

    async def _decide(self, pod: Any, nodes: Sequence[Any], usage: dict[str, dict[str, int]]) -> Decision:
        """Filter, score and bind `pod` against `usage` (node -> resource -> bound), which a
        successful bind updates: one pass of `run` lists nodes and pods once, as kube-scheduler
        schedules from its cache rather than listing per pod."""
        doc = self._api.sanitize_for_serialization(pod)
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        request = podrequests.decode_pod_request(doc)

        feasible = []
        reasons: dict[str, str] = {}
        for node in nodes:
            free = _allocatable(node)
            used = usage.get(node.metadata.name, {})
            short = [
                r for r in request.resources if free.get(r, 0) - used.get(r, 0) < request.total(r)
            ]
            if short:
                reasons[node.metadata.name] = "Insufficient " + ", ".join(short)
            else:
                feasible.append(node.metadata.name)

        scores: dict[str, int] = {n: 0 for n in feasible}
        ext = self._extender
        # kube-scheduler calls an extender entry only for pods that request one of its
        # managedResources (`IsInterested`). As shipped (deploy/scheduler), the bind-only entry
        # lists the GPU resources, so /bind goes to the extender for GPU pods only and
        # kube-scheduler binds the rest itself; the ranking entry lists none (every pod), which
        # this driver, whose pods request GPUs, does not need to model.
        interested = ext is not None and any(r.startswith(ext.managed_prefixes) for r in request.resources)
        if ext is not None and feasible and interested:
            try:
                result = await self._post(ext, "filter", {"Pod": doc, "NodeNames": feasible, "Nodes": None})
                if result.get("Error"):
                    raise SchedulingError(str(result["Error"]))
                kept = result.get("NodeNames") or []
                for node_name, why in (result.get("FailedNodes") or {}).items():
                    reasons[node_name] = str(why)
                for node_name, why in (result.get("FailedAndUnresolvableNodes") or {}).items():
                    reasons[node_name] = str(why)
                feasible = [n for n in feasible if n in set(kept)]
                scores = {n: 0 for n in feasible}
            except (aiohttp.ClientError, asyncio.TimeoutError, SchedulingError, ValueError) as e:
                if not ext.ignorable:
                    return Decision(key, None, f"extender failed: {e}")
                log.warning("extender call failed, scheduling without it: %s", e)
            if len(feasible) > 1:  # the scheduler skips prioritize with one node left
                try:
                    ranked = await self._post(
                        ext, "prioritize", {"Pod": doc, "NodeNames": feasible, "Nodes": None}
                    )
                    factor = ext.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
                    for entry in ranked or []:
                        if entry.get("Host") in scores:
                            scores[entry["Host"]] += int(entry.get("Score", 0)) * factor
                except (aiohttp.ClientError, asyncio.TimeoutError, SchedulingError, ValueError) as e:
                    # kube-scheduler ignores prioritize errors, `ignorable` or not: no score.
                    scores = {n: 0 for n in feasible}
                    log.warning("extender prioritize failed, no extender score for this pod: %s", e)

        if not feasible:
            summary = "; ".join(f"{n}: {r}" for n, r in sorted(reasons.items()))
            return Decision(key, None, f"0/{len(nodes)} nodes are available: {summary}")
        best = max(scores.values())
        choice = self._rng.choice(sorted(n for n, s in scores.items() if s == best))
        await self._bind(ext if interested else None, pod, choice)
        used = usage.setdefault(choice, {})
        for r in request.resources:
            used[r] = used.get(r, 0) + request.total(r)
        return Decision(key, choice, "", tuple(feasible), scores)

    async def run(self, *, scheduler_name: str = "default-scheduler", period: float = RESCHEDULE_S) -> None:
        """Until cancelled, schedule every pending pod of `scheduler_name`, as kube-scheduler's
        loop does: unschedulable pods are retried each `period`, and each outcome is recorded as
        kube-scheduler records it (the PodScheduled condition and a Scheduled or
        FailedScheduling event)."""
        while True:
            try:
                nodes = (await asyncio.to_thread(self._core.list_node)).items
                pods = (await asyncio.to_thread(self._core.list_pod_for_all_namespaces)).items
            except UNAVAILABLE as e:  # the API server away: kube-scheduler waits it out too
                log.warning("listing pods failed: %s", getattr(e, "reason", None) or e)
                await asyncio.sleep(period)
                continue
            usage = _bound_usage(pods, self._api)
            for pod in (p for p in pods if not p.spec.node_name):
                meta = pod.metadata
                if meta.deletion_timestamp or pod.spec.scheduler_name not in (None, scheduler_name):
                    continue
                if pod.status and pod.status.phase in ("Succeeded", "Failed"):
                    continue
                try:
                    decision = await self._decide(pod, nodes, usage)
                    await self._record(pod, decision)
                except kubernetes.client.ApiException as e:
                    if e.status != 404:  # 404: deleted since the list
                        log.warning("scheduling %s/%s failed: %s", meta.namespace, meta.name, e.reason)
                    if e.status is not None and e.status >= 500:
                        break  # the API server is away: the next pass tries again
                except SchedulingError as e:
                    log.warning("scheduling %s/%s failed: %s", meta.namespace, meta.name, e)
                except UNAVAILABLE as e:
                    # The extender or the API server away: the pod is retried on the next pass,
                    # as kube-scheduler requeues it; never the end of the loop.
                    log.warning("scheduling %s/%s failed: %s", meta.namespace, meta.name, e)
                    break
            await asyncio.sleep(period)

    async def _record(self, pod: Any, decision: Decision) -> None:
        meta = pod.metadata
        if decision.node is None:
            condition = {
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": decision.reason, "lastProbeTime": None, "lastTransitionTime": _now(),
            }  # fmt: skip
            with contextlib.suppress(kubernetes.client.ApiException):
                await asyncio.to_thread(
                    self._core.patch_namespaced_pod_status, meta.name, meta.namespace,
                    {"status": {"conditions": [condition]}},
                )  # fmt: skip
        reason, kind, note = (
            ("Scheduled", "Normal", f"Successfully assigned {decision.pod} to {decision.node}")
            if decision.node is not None
            else ("FailedScheduling", "Warning", decision.reason)
        )
        event = {
            "metadata": {"generateName": f"{meta.name}.", "namespace": meta.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta.name, "namespace": meta.namespace, "uid": meta.uid},
            "reason": reason, "type": kind, "message": note,
            "source": {"component": "default-scheduler"}, "reportingComponent": "default-scheduler",
            "firstTimestamp": _now(), "lastTimestamp": _now(), "count": 1,
        }  # fmt: skip
        with contextlib.suppress(kubernetes.client.ApiException):  # a server without events
            await asyncio.to_thread(self._core.create_namespaced_event, meta.namespace, event)

    async def _bind(self, ext: ExtenderConfig | None, pod: Any, node: str) -> None:
        meta = pod.metadata
        if ext is not None and ext.bind:
            result = await self._post(
                ext,
                "bind",
                {"PodName": meta.name, "PodNamespace": meta.namespace, "PodUID": meta.uid, "Node": node},
            )
            if result.get("Error"):
                raise SchedulingError(f"extender bind of {meta.namespace}/{meta.name} to {node}: {result['Error']}")
            return
        body = kubernetes.client.V1Binding(
            metadata=kubernetes.client.V1ObjectMeta(name=meta.name, namespace=meta.namespace, uid=meta.uid),
            target=kubernetes.client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        await asyncio.to_thread(
            self._core.create_namespaced_pod_binding, meta.name, meta.namespace, body, _preload_content=False
        )

    async def _post(self, ext: ExtenderConfig, verb: str, body: Mapping[str, Any]) -> Any:
        url = f"{ext.url_prefix.rstrip('/')}/{verb}"
        timeout = aiohttp.ClientTimeout(total=ext.http_timeout)
        tls = True if ext.tls is None else ext.tls  # aiohttp: True verifies with the defaults
        async with self._session.post(url, json=body, timeout=timeout, ssl=tls) as resp:
            if resp.status != 200:
                raise SchedulingError(f"extender {verb}: HTTP {resp.status}: {await resp.text()}")
            return await resp.json()
