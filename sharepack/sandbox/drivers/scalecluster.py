"""A large simulated cluster on the real control plane, for scheduler throughput and trace
replay: etcd + kube-apiserver with deploy/base applied, a `sandbox.fleet.Fleet` of simulated
GPU nodes, the real extender as a child process (with the extender's own service account; mutual TLS
between kube-scheduler and the extender, as deploy/ ships it, unless told otherwise), and
kube-scheduler started and stopped on demand, with or without the extender.

`PodTracker` watches the pods of one namespace and records, per pod, when it was bound (the
watch event's arrival) or declared unschedulable, so a caller can wait for either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from sharepack.common.policies import NodePolicy, Policy
from sharepack.extender.metrics import parse_text
from sharepack.sandbox.controlplane import certificates, plane as controlplane, kubebuild
from sharepack.sandbox.apiwatch import ApiSession, reflect
from sharepack.sandbox.controlplane.plane import ControlPlaneUnavailable, RealControlPlane, free_port
from sharepack.sandbox.kubelet.fleet import Fleet, NodeShape, wait_for
from sharepack.sandbox.controlplane.identities import Identities
from sharepack.sandbox.processes import LoggedProcess
from sharepack.sandbox.drivers.stacks import Stack

log = logging.getLogger(__name__)

NAMESPACE = "scale"
EXTENDER_READY_TIMEOUT_S = 300.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
LE = re.compile(r'[{,]le="([^"]*)"')


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat utime, stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def scheduler_config(*, with_extender: bool, client_qps: int = 0, source: Path = controlplane.SCHEDULER_CONFIG) -> dict[str, Any]:
    """deploy/'s KubeSchedulerConfiguration, or (`with_extender` false) the same without its
    extenders stanza: the default plugins only, everything else (percentageOfNodesToScore) as
    shipped. `client_qps` > 0 raises kube-scheduler's API rate limit (default 50 QPS, burst
    100) to that QPS and burst, as Kubernetes' scheduler_perf does, so binding and its events
    do not cap the rate measured."""
    doc: dict[str, Any] = yaml.safe_load(source.read_text())
    if not with_extender:
        doc.pop("extenders", None)
    if client_qps > 0:
        doc.setdefault("clientConnection", {}).update({"qps": client_qps, "burst": client_qps})
    return doc


@dataclass(slots=True)
class PodOutcome:
    name: str
    node: str = ""
    bound_at: float = 0.0  # monotonic, at the watch event
    unschedulable: str = ""  # the scheduler's message


class PodTracker:
    """Bound / unschedulable pods of one namespace, from a watch."""

    def __init__(self, api: ApiSession, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.pods: dict[str, PodOutcome] = {}  # by name
        self.changed = asyncio.Event()

    async def run(self) -> None:
        await reflect(self.api, f"/api/v1/namespaces/{self.namespace}/pods", {}, self._on_pod)

    async def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        name = str((pod.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            self.pods.pop(name, None)
            self.changed.set()
            return
        outcome = self.pods.get(name)
        if outcome is None:
            outcome = self.pods[name] = PodOutcome(name)
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if node and not outcome.node:
            outcome.node, outcome.bound_at = node, time.monotonic()
            self.changed.set()
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
                if not outcome.unschedulable:
                    outcome.unschedulable = str(cond.get("message") or "Unschedulable")
                    self.changed.set()

    async def wait(self, names: Iterable[str], timeout: float) -> list[PodOutcome]:
        """Until every pod in `names` is bound or unschedulable; their outcomes, in order."""
        wanted = list(names)
        async with asyncio.timeout(timeout):
            while True:
                outcomes = [self.pods.get(n) for n in wanted]
                if all(o is not None and (o.node or o.unschedulable) for o in outcomes):
                    return [o for o in outcomes if o is not None]
                self.changed.clear()
                await self.changed.wait()


def gpu_pod(
    name: str, *, resource: str, count: int, cpu_milli: int = 0, memory_mib: int = 0,
    products: Sequence[str] = (), namespace: str = NAMESPACE,
) -> dict[str, Any]:  # fmt: skip
    """A pod as a user writes it: cpu and memory requests, the GPU resource as a limit, and a
    required node affinity on the GPU model when the pod names allowed models."""
    requests: dict[str, str] = {}
    if cpu_milli:
        requests["cpu"] = f"{cpu_milli}m"
    if memory_mib:
        requests["memory"] = f"{memory_mib}Mi"
    resources: dict[str, Any] = {"requests": requests} if requests else {}
    if count:
        resources["limits"] = {resource: str(count)}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}],
        "terminationGracePeriodSeconds": 0,
    }
    if products:
        term = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": list(products)}]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


@dataclass(frozen=True, slots=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count)
    total: float
    count: float

    def minus(self, earlier: Histogram | None) -> Histogram:
        if earlier is None:
            return self
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets),
            self.total - earlier.total, self.count - earlier.count,
        )  # fmt: skip

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding quantile `q` (as coarse as the buckets)."""
        if self.count <= 0:
            return float("nan")
        rank = q * self.count
        for le, n in self.buckets:
            if n >= rank:
                return le
        return float("inf")

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def describe(self) -> str:
        if self.count <= 0:
            return "no samples"
        return (
            f"n={self.count:.0f} mean {self.mean * 1000:.2f} ms, p50 <= {self.quantile(0.5) * 1000:g} ms, "
            f"p99 <= {self.quantile(0.99) * 1000:g} ms"
        )


def histogram(samples: Mapping[str, float], name: str, labels: Mapping[str, str] | None = None) -> Histogram | None:
    """One histogram out of `extender.metrics.parse_text` samples, summed over the label sets
    that match `labels`."""
    want = [re.compile(rf'[{{,]{re.escape(k)}="{re.escape(v)}"') for k, v in (labels or {}).items()]

    def matches(key: str) -> bool:
        return all(w.search(key) for w in want)

    buckets: dict[float, float] = {}
    total = count = 0.0
    found = False
    for key, value in samples.items():
        if not matches(key):
            continue
        if key.startswith(name + "_bucket{"):
            found_le = LE.search(key)
            if found_le is None:
                continue
            le = found_le.group(1)
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + value
            found = True
        elif key.startswith(name + "_sum"):
            total += value
        elif key.startswith(name + "_count"):
            count += value
    if not found:
        return None
    return Histogram(tuple(sorted(buckets.items())), total, count)


class ScaleCluster(Stack):
    """The control plane, the fleet and the extender; an async context manager."""

    def __init__(
        self,
        shapes: Sequence[NodeShape],
        workdir: Path,
        *,
        replicas: int = 10,
        agent_policy: Policy = Policy.PACKED,
        node_policy: Policy | NodePolicy = Policy.PACKED,
        extender_args: Sequence[str] = (),
        mark_running: bool = True,
        namespace: str = NAMESPACE,
        progress: bool = True,
        profile_to: Path | None = None,
        sample_to: Path | None = None,
        tls: bool = True,
    ) -> None:
        """`tls`: the extender serves its verbs over mutual TLS and kube-scheduler calls it with
        a client certificate, as deploy/ ships them (False: plain HTTP on loopback)."""
        self.shapes = shapes
        self.workdir = workdir
        self.replicas = replicas
        self.agent_policy = agent_policy
        self.node_policy = node_policy
        self.extender_args = tuple(extender_args)
        self.mark_running = mark_running
        self.namespace = namespace
        self.progress = progress
        self.profile_to = profile_to  # run the extender under cProfile, stats written here at exit
        self.sample_to = sample_to  # run it under sandbox.cpusampler, samples written here at exit
        self.control: RealControlPlane | None = None
        self.extender: LoggedProcess | None = None
        self.extender_url = ""
        self.extender_kubeconfig: Path | None = None  # the extender's service account's
        self.extender_metrics_url = ""  # plain HTTP (--metrics-listen), also when the verbs use TLS
        self.tls: certificates.TlsFiles | None = None
        self.use_tls = tls
        self.timings: dict[str, float] = {}
        super().__init__()
        self._tasks: list[asyncio.Task[None]] = []

    def say(self, line: str) -> None:
        if self.progress:
            print(line, file=sys.stderr, flush=True)

    def on_close(self, stop: Callable[[], Awaitable[None]]) -> None:
        """`stop()` runs when the cluster closes, before what was started earlier stops."""
        self._stack.push_async_callback(stop)

    async def _start(self) -> None:
        binaries = kubebuild.cached()
        if binaries is None:
            raise ControlPlaneUnavailable(
                "the real control plane is not built: run `python -m sharepack.sandbox.controlplane.kubebuild` first (Go >= 1.26)"
            )
        t0 = time.monotonic()
        self.control = control = RealControlPlane(self.workdir / "kube", binaries=binaries)
        (self.workdir / "kube").mkdir(parents=True, exist_ok=True)
        self._stack.push_async_callback(control.stop)
        await control.start()
        manifests = await control.apply_deploy_base()
        await control.ensure_namespace(self.namespace)
        self.timings["control plane"] = time.monotonic() - t0
        self.say(f"control plane up in {self.timings['control plane']:.1f} s ({control.url})")

        admin = controlplane.api_client(control.kubeconfig)
        self._stack.callback(admin.close)
        self.api = ApiSession.of(admin)
        self._stack.push_async_callback(self.api.close)
        self.fleet = Fleet(self.api, self.shapes, replicas=self.replicas, policy=self.agent_policy, mark_running=self.mark_running)
        t0 = time.monotonic()
        await self.fleet.register()
        self.timings["fleet"] = time.monotonic() - t0
        self.say(f"{len(self.shapes)} nodes and their NodeGpuStates created in {self.timings['fleet']:.1f} s")
        self.tracker = PodTracker(self.api, self.namespace)
        self._spawn(self.fleet.run(), "fleet")
        self._spawn(self.tracker.run(), "pod-tracker")

        t0 = time.monotonic()
        kubeconfig = self.extender_kubeconfig = await Identities(control, manifests).extender_kubeconfig()
        port, metrics_port = free_port(), free_port()
        if self.use_tls:
            self.tls = certificates.write_tls_files(self.workdir / "tls")
            transport = self.tls.extender_args()
            self.extender_url = f"https://127.0.0.1:{port}"
        else:
            transport = ["--insecure-http"]
            self.extender_url = f"http://127.0.0.1:{port}"
        self.extender_metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        if self.sample_to:
            launch = ["-m", "sharepack.sandbox.cpusampler", str(self.sample_to), "sharepack.extender"]
        else:
            launch = [*(["-m", "cProfile", "-o", str(self.profile_to)] if self.profile_to else []), "-m", "sharepack.extender"]
        self.extender = LoggedProcess(
            [
                sys.executable, *launch, f"--listen=127.0.0.1:{port}", f"--node-policy={self.node_policy}",
                f"--kubeconfig={kubeconfig}", "--log-format=text", "--log-level=warning",
                f"--metrics-listen=127.0.0.1:{metrics_port}", *transport, *self.extender_args,
            ],
            self.workdir / "extender.log",
        )  # fmt: skip
        await self.extender.start()
        self._stack.push_async_callback(self.extender.stop)
        self.session = aiohttp.ClientSession()
        self._stack.push_async_callback(self.session.close)
        want = sum(1 for s in self.shapes if s.gpus)
        deadline = time.monotonic() + EXTENDER_READY_TIMEOUT_S
        while (await self.extender_metrics()).get("sharepack_extender_cache_nodes") != want:
            if self.extender.exited or time.monotonic() > deadline:
                raise ControlPlaneUnavailable(f"the extender did not cache every node: {self.extender.log_tail(800)}")
            await asyncio.sleep(0.2)
        self.timings["extender"] = time.monotonic() - t0
        self.say(f"extender caches every node after {self.timings['extender']:.1f} s ({self.extender_url})")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)

        async def stop() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        def crashed(t: asyncio.Task[None]) -> None:
            if not t.cancelled() and t.exception() is not None:
                log.error("%s stopped: %r", name, t.exception())

        task.add_done_callback(crashed)
        self._stack.push_async_callback(stop)

    async def _get_text(self, url: str) -> str:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with self.session.get(url, ssl=False) as resp:
                return await resp.text()
        return ""

    async def extender_metrics(self) -> dict[str, float]:
        return parse_text(await self._get_text(self.extender_metrics_url))

    async def scheduler_metrics(self) -> dict[str, float]:
        assert self.control is not None
        url = self.control.scheduler_metrics_url
        return parse_text(await self._get_text(url)) if url else {}

    # -- kube-scheduler ------------------------------------------------------------------------

    async def start_scheduler(
        self, *, with_extender: bool, client_qps: int = 0, plugin_config: Sequence[Mapping[str, Any]] = (),
        env: Mapping[str, str] | None = None,
    ) -> int:
        """kube-scheduler as deploy/ configures it, or without its extenders stanza
        (`scheduler_config`), with `plugin_config` as its profile's pluginConfig when given and
        `env` added to its environment; its pid."""
        assert self.control is not None
        source = self.workdir / f"kube-scheduler-{'with' if with_extender else 'without'}-extender.yaml"
        doc = scheduler_config(with_extender=with_extender, client_qps=client_qps)
        if plugin_config:
            doc["profiles"][0]["pluginConfig"] = [dict(p) for p in plugin_config]
        source.write_text(yaml.safe_dump(doc, sort_keys=False))
        tls = self.tls.scheduler_tls_config() if self.tls is not None else None
        await self.control.start_scheduler(self.extender_url, tls=tls, source=source, serve_metrics=True, env=env)
        assert self.control.scheduler is not None and self.control.scheduler.proc is not None
        return self.control.scheduler.proc.pid

    async def stop_scheduler(self) -> None:
        assert self.control is not None
        await self.control.stop_scheduler()

    # -- pods ------------------------------------------------------------------------------

    async def create_pods(self, pods: Sequence[Mapping[str, Any]], concurrency: int = 24) -> None:
        slots = asyncio.Semaphore(concurrency)
        path = f"/api/v1/namespaces/{self.namespace}/pods"

        async def one(pod: Mapping[str, Any]) -> None:
            async with slots:
                await self.api.send("POST", path, pod)

        async with asyncio.TaskGroup() as group:
            for pod in pods:
                group.create_task(one(pod))

    async def delete_all_pods(self, timeout: float = 300.0) -> None:
        """Delete every pod of the namespace at once (grace 0) and wait until the fleet has
        freed and republished their devices and the extender counts none of them."""
        path = f"/api/v1/namespaces/{self.namespace}/pods?gracePeriodSeconds=0"
        deadline = time.monotonic() + timeout
        while self.tracker.pods:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.tracker.pods)} pods still there after deleting them for {timeout:.0f} s")
            # Thousands of pods take longer than the API server's request timeout (504): what
            # it deleted meanwhile stays deleted, so ask again for the rest.
            # An overloaded API server may also drop the connection: ask again, as for a 504.
            with contextlib.suppress(aiohttp.ClientConnectionError):
                await self.api.send("DELETE", path, ok=(500, 504))
            with contextlib.suppress(TimeoutError):
                await wait_for(lambda: not self.tracker.pods, "deleting every pod", 30)
        await wait_for(lambda: not any(n.pods for n in self.fleet.nodes.values()), "the fleet freeing every pod", timeout)
        await self.fleet.settled(timeout)
        deadline = time.monotonic() + timeout
        while True:
            m = await self.extender_metrics()
            if m.get("sharepack_extender_cache_pods") == 0 and m.get("sharepack_extender_assumed_pods") == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("the extender still counts deleted pods")
            await asyncio.sleep(0.2)
