"""`sharepack-chaos`: a soak of the whole stack under churn and faults, with invariants checked
all the time.

N simulated nodes (fake kubelet + the real agent), two extender replicas behind one address
(connections spread round-robin, as a Service spreads them), a scheduler (the real kube-scheduler
when the real control plane is built, else the sandbox's scheduler driver), pods created in
bursts of up to 100 and deleted (no more than MAX_PODS left after a round), and faults drawn
from the seed:

    agent-kill        SIGKILL an agent, start it again
    kubelet-restart   the kubelet restarts (its sockets deleted); the agent must register again
    extender-kill     SIGKILL an extender replica, start it again on the same port
    apiserver-restart kube-apiserver stops and starts (etcd keeps the data); in-process: an outage
    xid               a critical XID on a GPU; the agent marks it unhealthy, then recovers it
    config-change     the named config every node uses changes in the agent ConfigMap (applied live)
    state-delete      a node's NodeGpuState deleted by hand

Every kind is injected, in a seeded order, at least `--min-per-kind` times: the soak runs past
`--duration` until it has, and a kind never injected is a violation (`coverage`).

A fault has a *scope*, what it can disturb: its node (agent-kill, kubelet-restart, xid,
state-delete); the extender replica killed (its predictions, and the scheduling of pending pods);
or the whole cluster (`*`: kube-apiserver, the ConfigMap every node's agent reads, and
kube-scheduler restarting after it lost its lease in an outage). Its window lasts from its start
until SETTLE_S after it ended; each check is muted only by the windows of the scopes it depends
on, and always by the cluster's.

Invariants, checked every CHECK_S:
    double-held   no device is listed for two pods by a kubelet's PodResources API (read over
                  gRPC, as the agent reads it), and every device a pod holds there was last
                  handed out by the node's agent to that pod's container (its Allocate log on
                  disk, which survives agent restarts)
    state         every NodeGpuState equals what PodResources reports on its node (per physical
                  GPU: replicas held and the pods holding them), at least once every SETTLE_S
                  outside its node's fault windows
    lost-pod      every pod is bound and running, refused at admission with a reason, or pending
                  with the scheduler's reason, within POD_GRACE_S of its creation (or of the end
                  of the last fault window of its node, or of the cluster while it is unbound)
    extender-5xx  no extender replica answers 5xx (its own request counter, by code)
After the churn and faults stop, a drain of at least DRAIN_S (longer than SETTLE_S) keeps
checking, then every pod and every state is judged once more with no grace: the last fault's
damage is judged too.

Predictions, per pod: each extender replica logs the GPUs it predicts for a pod it counts
(`extender.predictionlog`); the soak joins them with the GPUs the pod holds when PodResources
first lists it. A prediction is judged unless a window of its node, of the replica that made it
or of the cluster overlaps the time from the prediction to that first listing; matched when node
and physical GPUs (with the number of replicas on each) are equal.

The last line: `soak: S s, F faults, V invariant violations, predictions matched M/T (P %,
95 % lower bound L %)`; L is the Wilson score interval's lower end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import kubernetes
import orjson
import yaml

from sharepack.agent import allocationlog
from sharepack.agent.podresources import PodResourcesClient, PodResourcesError
from sharepack.agent.running import ALLOCATIONS_KEPT
from sharepack.common import devices, shipped
from sharepack.common import state as gpustate
from sharepack.common.config import NODE_CONFIG_LABEL
from sharepack.common.errors import StateSchemaError
from sharepack.common.policies import NodePolicy, Policy
from sharepack.extender import predictionlog
from sharepack.sandbox.drivers import demo
from sharepack.sandbox.controlplane import kubebuild
from sharepack.sandbox.controlplane.plane import TRANSIENT_API_ERRORS
from sharepack.sandbox.drivers.demo import SHARED_RESOURCE, Sandbox, Workload

log = logging.getLogger("sharepack.sandbox.drivers.chaos")

FAULTS = (
    "agent-kill", "kubelet-restart", "extender-kill", "apiserver-restart", "xid", "config-change", "state-delete",
)  # fmt: skip
CLUSTER = "*"  # the scope of a fault of the whole cluster
CLUSTER_FAULTS = frozenset({"apiserver-restart", "config-change"})  # every node's agent feels these
CHECK_S = 0.5
SETTLE_S = 5.0  # a node's published state must match its kubelet this long after a fault
DRAIN_S = SETTLE_S + 4 * CHECK_S  # after the last fault: longer than SETTLE_S, so its damage is judged
POD_GRACE_S = 30.0  # a pod may be unbound and reasonless, or bound and not running, this long
FAULT_GAP_S = (3.0, 7.0)  # the pause between two faults, drawn uniformly
MAX_PODS = 100  # alive after a round of deletions: three nodes hold about 50 pods (1.8 replicas each)
NAMESPACE = demo.NAMESPACE
# deploy/base's: the agent's own namespace, where its Role lets it read the ConfigMap.
CONFIGMAP_NAMESPACE, CONFIGMAP = "sharepack-node", "sharepack-agent-config"
CONFIG_NAME = "chaos"  # the named config the soak's nodes use, in the agent ConfigMap
SHAPES = (1, 1, 1, 2, 2, 4)  # replicas per pod, drawn uniformly
XID = 48  # double-bit ECC: critical
RECOVERY_S = 3  # --unhealthy-recovery-seconds for the soak's agents
LEASE_TAKEOVER_S = 20.0  # kube-scheduler's default lease duration (15 s) and its retry period
Z95 = 1.959964  # two-sided 95 %
LIST_ERRORS: tuple[type[Exception], ...] = (*TRANSIENT_API_ERRORS, orjson.JSONDecodeError)
INVARIANTS = ("double-held", "state", "lost-pod", "extender-5xx", "coverage")


@dataclass(slots=True)
class Fault:
    kind: str
    target: str
    started: float
    ended: float = 0.0
    survived: bool = False
    detail: str = ""


@dataclass(slots=True)
class Violation:
    invariant: str
    at: float
    detail: str


def wilson_lower(successes: int, trials: int, z: float = Z95) -> float:
    """The lower end of the Wilson score interval for a proportion (0 with no trials)."""
    if trials <= 0:
        return 0.0
    p = successes / trials
    denom = 1 + z * z / trials
    centre = p + z * z / (2 * trials)
    spread = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(0.0, (centre - spread) / denom)


@dataclass(slots=True)
class Report:
    control_plane: str = ""
    seconds: float = 0.0
    faults: list[Fault] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    matched: int = 0
    predicted: int = 0  # judged predictions
    unjudged: Counter[str] = field(default_factory=Counter)  # predictions left out, by why
    pods_created: int = 0
    pods_deleted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # pods the kubelet refused, by reason
    missed: list[str] = field(default_factory=list)  # the first judged predictions that missed

    def closing_line(self) -> str:
        share = 100.0 * self.matched / self.predicted if self.predicted else 100.0
        lower = 100.0 * wilson_lower(self.matched, self.predicted)
        return (
            f"soak: {self.seconds:.0f} s, {len(self.faults)} faults, {len(self.violations)} invariant violations, "
            f"predictions matched {self.matched}/{self.predicted} ({share:.1f} %, 95 % lower bound {lower:.1f} %)"
        )


def chaos_config(replicas: int, pass_device_specs: bool) -> str:
    """The soak's named config: time-slicing as the demo's, with one harmless knob to change."""
    doc = yaml.safe_load(demo.agent_config(replicas))
    doc.setdefault("flags", {}).setdefault("plugin", {})["passDeviceSpecs"] = pass_device_specs
    return str(yaml.safe_dump(doc))


Held = dict[str, frozenset[str]]  # "namespace/name" -> device IDs of the shared resource


def truth(held: Held, uids: dict[str, str]) -> dict[str, Counter[str]]:
    """Per physical GPU: pod UID -> replicas, from PodResources (pods named by namespace/name,
    mapped to the UIDs the API server gave them)."""
    per_gpu: dict[str, Counter[str]] = {}
    for pod, ids in held.items():
        uid = uids.get(pod, pod)
        for device in ids:
            per_gpu.setdefault(devices.physical_key(device), Counter())[uid] += 1
    return per_gpu


def published(state: gpustate.NodeState) -> dict[str, tuple[int, frozenset[str]]]:
    res = state.resource(SHARED_RESOURCE)
    return {g.key: (g.allocated, frozenset(g.pods)) for g in res.gpus if g.allocated or g.pods} if res else {}


def agrees(state: gpustate.NodeState, per_gpu: dict[str, Counter[str]]) -> bool:
    expected = {key: (sum(pods.values()), frozenset(pods)) for key, pods in per_gpu.items() if pods}
    return published(state) == expected


@dataclass(slots=True)
class Holding:
    node: str
    gpus: Counter[str]  # physical GPU key -> replicas
    seen: float  # monotonic: when PodResources first listed the pod


def replica_scope(index: int) -> str:
    """The scope of extender replica `index`: the stem of its log file (sandbox.demo names them)."""
    return "extender" if index == 0 else f"extender-{index}"


class Windows:
    """Fault windows per scope (a node's name, an extender replica's, or CLUSTER), in monotonic
    seconds. Every query names the scopes that matter to it; CLUSTER always does."""

    def __init__(self) -> None:
        self._spans: dict[str, list[list[float]]] = {}  # scope -> [start, end]; end inf while open

    def open(self, scope: str, at: float) -> list[float]:
        span = [at, math.inf]
        self._spans.setdefault(scope, []).append(span)
        return span

    def add(self, scope: str, start: float, end: float) -> None:
        self._spans.setdefault(scope, []).append([start, end])

    def _affecting(self, scopes: Iterable[str | None]) -> Iterator[list[float]]:
        for scope in {CLUSTER, *scopes}:
            if scope is not None:
                yield from self._spans.get(scope, ())

    def muted(self, scopes: Iterable[str | None], start: float, end: float) -> bool:
        """Whether a window of `scopes` overlaps [start, end] (a window lasts SETTLE_S past its end)."""
        return any(s <= end and e + SETTLE_S >= start for s, e in self._affecting(scopes))

    def busy(self, scopes: Iterable[str | None], now: float) -> bool:
        """Whether a fault of `scopes` is still being injected."""
        return any(e == math.inf and s <= now for s, e in self._affecting(scopes))

    def last_end(self, scopes: Iterable[str | None]) -> float:
        """The end of the latest closed window of `scopes` (0 when none)."""
        return max((e for _, e in self._affecting(scopes) if e != math.inf), default=0.0)


class PredictionTail:
    """Reads the extender replicas' logs as they grow and keeps every prediction of each pod
    (a bind that failed is retried, maybe by the other replica, with a prediction of its own)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._offsets: dict[Path, int] = {}
        self.made: dict[str, list[tuple[predictionlog.Prediction, str]]] = {}  # pod UID -> (prediction, log stem)

    @property
    def first(self) -> dict[str, predictionlog.Prediction]:
        return {uid: min(made, key=lambda m: m[0].at)[0] for uid, made in self.made.items()}

    def latest(self, uid: str, before: float) -> tuple[predictionlog.Prediction, str] | None:
        """The last prediction of `uid` made before wall-clock time `before`, and its log's stem."""
        made = [m for m in self.made.get(uid, ()) if m[0].at <= before]
        return max(made, key=lambda m: m[0].at) if made else None

    def read(self) -> None:
        for path in sorted(self.root.glob("extender*.log")):
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            complete = chunk.rfind(b"\n") + 1  # a line still being written waits for the next read
            self._offsets[path] = offset + complete
            for line in chunk[:complete].decode(errors="replace").splitlines():
                p = predictionlog.parse(line)
                if p is not None:
                    self.made.setdefault(p.uid, []).append((p, path.stem))


@dataclass(frozen=True, slots=True)
class PodView:
    """What the lost-pod check reads of a pod."""

    name: str
    node: str
    phase: str
    reason: str
    message: str
    scheduling_reason: str  # the scheduler's message on PodScheduled=False, if any

    @classmethod
    def of(cls, doc: dict[str, Any]) -> PodView:
        status = doc.get("status") or {}
        unscheduled = [
            c.get("message") or "" for c in status.get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("status") == "False"
        ]  # fmt: skip
        return cls(
            str((doc.get("metadata") or {}).get("name", "")), str((doc.get("spec") or {}).get("nodeName") or ""),
            str(status.get("phase") or ""), str(status.get("reason") or ""), str(status.get("message") or ""),
            next((m for m in unscheduled if m), ""),
        )  # fmt: skip

    @property
    def settled(self) -> bool:
        """Bound and running, refused at admission with a reason, or pending with a reason."""
        if self.node:
            return self.phase == "Running" or (self.phase == "Failed" and bool(self.reason))
        return bool(self.scheduling_reason)


def crashed(tasks: Sequence[asyncio.Task[None]]) -> None:
    """Raise what ended one of the soak's own loops (churn, faults, checks, scheduler): a soak
    that stopped driving or checking must not report a clean run."""
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError(f"the soak's {task.get_name()} loop died") from task.exception()


class Soak:
    def __init__(self, box: Sandbox, rng: random.Random, duration: float, out: TextIO, *, min_per_kind: int = 1) -> None:
        self.box = box
        self.rng = rng
        self.duration = duration
        self.min_per_kind = min_per_kind
        self.out = out
        self.report = Report(control_plane=box.control_plane)
        self.core: Any = kubernetes.client.CoreV1Api(box.api)
        self.custom: Any = kubernetes.client.CustomObjectsApi(box.api)
        self.started = time.monotonic()
        self.wall_offset = time.time() - time.monotonic()  # wall-clock minus monotonic
        self.stopping = False
        self.pods: dict[str, float] = {}  # name -> created at
        self.uids: dict[str, str] = {}  # "namespace/name" -> UID, of every pod created
        self.windows = Windows()
        self.replica_scopes = [replica_scope(i) for i in range(len(box.replicas))]
        self.agreed: dict[str, float] = {}  # node -> last time its state matched PodResources
        self.held: dict[str, Held] = {}  # node -> the latest PodResources listing
        self.holdings: dict[str, Holding] = {}  # pod UID -> where and what PodResources first listed
        self.predictions = PredictionTail(box.root)
        self.podresources = {n.name: PodResourcesClient(n.kubelet.pod_resources_socket, timeout=2.0) for n in box.nodes}
        self.counter = 0
        self.scheduler_restarts = 0
        self.replica_errors: dict[tuple[int, int], int] = {}  # (replica, pid) -> 5xx answered
        self.reported_state: set[str] = set()  # nodes in a reported episode: one violation each
        self.reported_lost: set[str] = set()  # pods reported lost (or counted refused) once

    # -- driving ---------------------------------------------------------------------------

    async def run(self) -> Report:
        now = time.monotonic()
        self.agreed = {n.name: now for n in self.box.nodes}
        for node in self.box.nodes:
            node.watch_pods()  # on the in-process control plane the demo admits pods itself
        tasks = [
            asyncio.create_task(self._churn(), name="chaos-churn"),
            asyncio.create_task(self._faults(), name="chaos-faults"),
            asyncio.create_task(self._check(), name="chaos-check"),
        ]
        if self.box.real is None:
            tasks.append(asyncio.create_task(self.box.driver.run(period=0.2), name="chaos-scheduler"))
        try:
            await asyncio.wait(tasks, timeout=self.duration, return_when=asyncio.FIRST_EXCEPTION)
            while not self._covered() and not tasks[1].done():
                crashed(tasks)
                await asyncio.sleep(CHECK_S)  # every kind its turn: the table can then be judged
            crashed(tasks)
            self.stopping = True
            await asyncio.gather(tasks[0], tasks[1])  # each ends at its next step
            await self._drain(tasks)
            await self._final_checks()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for client in self.podresources.values():
                await client.close()
        self._judge_predictions()
        self._judge_coverage()
        self.report.seconds = time.monotonic() - self.started
        return self.report

    def _covered(self) -> bool:
        injected = Counter(f.kind for f in self.report.faults)
        return all(injected[kind] >= self.min_per_kind for kind in FAULTS)

    async def _drain(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        """At least DRAIN_S, then until every pod has settled (or its grace has run out)."""
        began = time.monotonic()
        while True:
            await asyncio.sleep(CHECK_S)
            crashed(tasks)
            waited = time.monotonic() - began
            if waited >= max(DRAIN_S, POD_GRACE_S + SETTLE_S):
                return
            if waited >= DRAIN_S and await self._all_settled():
                return

    async def _churn(self) -> None:
        while not self.stopping:
            burst = self.rng.randint(1, 100)
            names = [self._next_name() for _ in range(burst)]
            await asyncio.gather(*(self._create(n, self.rng.choice(SHAPES)) for n in names))
            await self._pause(self.rng.uniform(2.0, 5.0))
            if self.stopping:
                return
            # Never fewer than bring the pool back to MAX_PODS: else it grows by a quarter burst
            # a round, pending pods crowd the victims out, and bound pods stop turning over
            # (a 10-minute run judged 162 predictions where its first 90 s alone judged 96).
            k = max(self.rng.randint(burst // 2, burst), len(self.pods) - MAX_PODS)
            victims = self.rng.sample(sorted(self.pods), k=min(len(self.pods), k))
            await asyncio.gather(*(self._delete(n) for n in victims))
            await self._pause(self.rng.uniform(1.0, 3.0))

    def _next_name(self) -> str:
        self.counter += 1
        return f"soak-{self.counter}"

    async def _create(self, name: str, replicas: int) -> None:
        body = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"containers": [{
                "name": "main", "image": "busybox",
                "resources": {"limits": {SHARED_RESOURCE: str(replicas)}},
            }]},
        }  # fmt: skip
        with contextlib.suppress(*TRANSIENT_API_ERRORS):  # an API outage: try later
            pod = await asyncio.to_thread(self.core.create_namespaced_pod, NAMESPACE, body)
            self.pods[name] = time.monotonic()
            self.uids[f"{NAMESPACE}/{name}"] = pod.metadata.uid
            self.report.pods_created += 1

    async def _delete(self, name: str) -> None:
        with contextlib.suppress(*TRANSIENT_API_ERRORS):
            await asyncio.to_thread(self.core.delete_namespaced_pod, name, NAMESPACE)
            self.pods.pop(name, None)
            self.report.pods_deleted += 1

    async def _pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            await asyncio.sleep(0.1)

    # -- faults ----------------------------------------------------------------------------

    async def _faults(self) -> None:
        kinds: list[str] = []
        await self._pause(self.rng.uniform(2.0, 4.0))
        # Past the duration only until every kind had its turns (run() waits for that).
        while not self.stopping and not (time.monotonic() - self.started >= self.duration and self._covered()):
            if not kinds:  # every kind once before any repeats, in a seeded order
                kinds = list(FAULTS)
                self.rng.shuffle(kinds)
            kind = kinds.pop()
            node = self.rng.choice(self.box.nodes)
            fault = Fault(kind, node.name, time.monotonic())
            scope = CLUSTER if kind in CLUSTER_FAULTS else node.name
            if kind == "extender-kill":  # the replica is drawn here: its window is its own
                index = self.rng.randrange(len(self.box.replicas))
                scope = replica_scope(index)
                fault.target = f"extender-{index}"
            window = self.windows.open(scope, fault.started)
            try:
                await self._inject(fault, node)
            except Exception as e:  # noqa: BLE001 - a fault the stack did not survive is reported, not raised
                fault.detail = f"{type(e).__name__}: {e}"
            finally:
                fault.ended = window[1] = time.monotonic()
                self.report.faults.append(fault)
            await self._pause(self.rng.uniform(*FAULT_GAP_S))

    async def _inject(self, fault: Fault, node: Any) -> None:
        kind = fault.kind
        if kind == "agent-kill":
            await node.kill_agent()
            await asyncio.sleep(self.rng.uniform(0.2, 2.0))
            await node.start_agent([SHARED_RESOURCE])
            fault.survived = True
        elif kind == "kubelet-restart":
            await node.kubelet.restart()
            await node.kubelet.wait_for_resource(SHARED_RESOURCE, timeout=30)
            fault.survived = True
        elif kind == "extender-kill":
            index = int(fault.target.rsplit("-", 1)[1])
            replica = self.box.replicas[index]
            await replica.process.kill()
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
            self.box.replicas[index] = await self.box.start_extender(index, replica.port)
            fault.survived = True
        elif kind == "apiserver-restart":
            fault.target = "kube-apiserver"
            downtime = self.rng.uniform(0.5, 2.0)
            if self.box.real is not None:
                await self.box.real.restart_apiserver(downtime)
            else:
                await self.box.api_server.pause()
                await asyncio.sleep(downtime)
                await self.box.api_server.resume()
            fault.survived = True
        elif kind == "xid":
            state = await self._state(node.name)
            res = state.resource(SHARED_RESOURCE) if state else None
            if res is None:
                fault.detail = "no published state to pick a GPU from"
                return
            gpu = self.rng.choice(res.gpus)
            fault.target = f"{node.name}/GPU{gpu.index}"
            node.inject_xid(gpu.key, XID)
            ids = [d for d in node.kubelet.devices(SHARED_RESOURCE) if devices.physical_key(d) == gpu.key]
            await node.kubelet.wait_until(
                lambda: any(not node.kubelet.devices(SHARED_RESOURCE)[d].healthy for d in ids),
                timeout=10, what="the XID's devices to turn unhealthy",
            )  # fmt: skip
            await node.kubelet.wait_until(
                lambda: all(node.kubelet.devices(SHARED_RESOURCE)[d].healthy for d in ids),
                timeout=RECOVERY_S + 15, what="the XID's devices to recover",
            )  # fmt: skip
            fault.survived = True
        elif kind == "config-change":
            flip = self.counter % 2 == 0
            fault.target = f"{CONFIGMAP}/{CONFIG_NAME}"
            fault.detail = f"passDeviceSpecs={flip}"
            await self._write_config(chaos_config(self.box.workload.replicas, flip))
            await asyncio.sleep(1.0)
            for each in self.box.nodes:  # every node uses the named config
                await each.kubelet.wait_for_resource(SHARED_RESOURCE, timeout=30)
            fault.survived = True
        elif kind == "state-delete":
            await asyncio.to_thread(
                self.custom.delete_cluster_custom_object, gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL, node.name
            )
            deadline = time.monotonic() + SETTLE_S
            while time.monotonic() < deadline:
                if await self._state(node.name) is not None:
                    fault.survived = True
                    return
                await asyncio.sleep(0.2)
            fault.detail = f"not written again within {SETTLE_S:.0f} s"

    async def _write_config(self, text: str) -> None:
        patch = {"data": {CONFIG_NAME: text}}
        await asyncio.to_thread(self.core.patch_namespaced_config_map, CONFIGMAP, CONFIGMAP_NAMESPACE, patch)

    async def _state(self, name: str) -> gpustate.NodeState | None:
        try:
            obj = await asyncio.to_thread(
                self.custom.get_cluster_custom_object, gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL, name
            )
            return gpustate.from_status(obj.get("status"), source=f"nodegpustate/{name}")
        except TRANSIENT_API_ERRORS:
            return None
        except StateSchemaError:
            return None

    # -- invariants ------------------------------------------------------------------------

    def _violate(self, invariant: str, detail: str) -> None:
        self.report.violations.append(Violation(invariant, time.monotonic() - self.started, detail))
        log.warning("invariant %s violated: %s", invariant, detail)

    async def _check(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            await self._check_once(time.monotonic())

    async def _check_once(self, now: float, *, final: bool = False) -> None:
        real = self.box.real
        if real is not None and real.scheduler_restarts > self.scheduler_restarts:
            # kube-scheduler lost its lease in an API outage and restarts: until the old lease
            # expires nothing schedules, as in a cluster. A fault of the whole cluster.
            self.scheduler_restarts = real.scheduler_restarts
            self.windows.add(CLUSTER, now, now + LEASE_TAKEOVER_S)
        await self._check_devices(now)
        self.predictions.read()
        await self._check_states(now, final=final)
        await self._check_pods(now, final=final)
        await self._scrape()

    async def _check_devices(self, now: float) -> None:
        """PodResources of every node (the latest listing kept for the other checks): no device
        listed for two pods; and, from the agent's side, every device a pod holds was last
        handed out (Allocate) together with devices of that pod only: an Allocate that gave one
        of them to another container while the pod kept it is a device held twice."""
        for node in self.box.nodes:
            listed_at = time.time()  # the agent's log uses wall-clock time
            try:
                listing = await self.podresources[node.name].list()
            except PodResourcesError:
                continue  # the kubelet restarting: its node is in a fault window
            # Read after the listing, so every Allocate behind it is in the file. Per device: its
            # latest Allocate from before the listing began, and those since (a pod admitted
            # while the listing ran; a device released and handed out again meanwhile).
            before: dict[str, frozenset[str]] = {}
            since: dict[str, list[frozenset[str]]] = {}
            for resource, allocated, at in self._allocation_log(node).load():
                if resource != SHARED_RESOURCE:
                    continue
                for device in allocated:
                    if at < listed_at:
                        before[device] = frozenset(allocated)
                    else:
                        since.setdefault(device, []).append(frozenset(allocated))
            held: Held = {}
            owners: dict[str, str] = {}
            for pod in listing:
                key = f"{pod.namespace}/{pod.name}"
                ids = pod.devices.get(SHARED_RESOURCE, frozenset())
                if not ids:
                    continue
                held[key] = ids
                for device in sorted(ids):
                    other = owners.setdefault(device, key)
                    if other != key:
                        self._violate("double-held", f"{node.name}: PodResources lists {device} for pods {other} and {key}")
                    given = before.get(device)
                    if given is None and device not in since:
                        self._violate("double-held", f"{node.name}: {key} holds {device}, which its agent never allocated")
                    elif not any(g <= ids for g in ([given] if given else []) + since.get(device, [])):
                        self._violate(
                            "double-held", f"{node.name}: {key} holds {device}, which its agent last allocated "
                            f"with {sorted(set().union(given or (), *since.get(device, [])) - ids)} (another container's)",
                        )  # fmt: skip
                uid = self.uids.get(key)
                if uid is not None and uid not in self.holdings:
                    self.holdings[uid] = Holding(node.name, Counter(devices.physical_key(d) for d in ids), now)
            self.held[node.name] = held

    @staticmethod
    def _allocation_log(node: Any) -> allocationlog.AllocationLog:
        return allocationlog.AllocationLog(allocationlog.path_beside(node.kubelet.device_plugin_dir), keep=ALLOCATIONS_KEPT)

    async def _check_states(self, now: float, *, final: bool) -> None:
        reported = self.reported_state
        for node in self.box.nodes:
            state = await self._state(node.name)
            per_gpu = truth(self.held.get(node.name, {}), self.uids)
            if state is not None and agrees(state, per_gpu):
                self.agreed[node.name] = now
                reported.discard(node.name)
                continue
            if node.name in reported or self.windows.busy([node.name], now):
                continue  # one violation per episode, not one per check
            since = max(self.agreed[node.name], self.windows.last_end([node.name]))
            if final or now - since > SETTLE_S:
                reported.add(node.name)
                got = published(state) if state else "no state"
                want = {k: dict(v) for k, v in per_gpu.items() if v}
                self._violate("state", f"{node.name}: published {got}, PodResources lists {want}")

    async def _pod_list(self) -> list[PodView] | None:
        """The namespace's pods, decoded with orjson rather than the client's models: the soak
        lists every CHECK_S and must not take the CPU the stack under test needs."""
        try:
            resp = await asyncio.to_thread(self.core.list_namespaced_pod, NAMESPACE, _preload_content=False)
            items = orjson.loads(resp.data).get("items") or []
        except LIST_ERRORS:
            return None
        return [PodView.of(doc) for doc in items]

    async def _all_settled(self) -> bool:
        pods = await self._pod_list()
        return pods is not None and all(p.settled for p in pods if p.name in self.pods)

    async def _check_pods(self, now: float, *, final: bool) -> None:
        reported = self.reported_lost
        pods = await self._pod_list()
        if pods is None:
            return  # an API outage: the next check judges
        for pod in pods:
            name = pod.name
            created = self.pods.get(name)
            if created is None or name in reported:
                continue
            node = pod.node or None
            phase = pod.phase
            if node and phase == "Failed" and pod.reason:  # refused at admission: accounted for
                reported.add(name)
                self.report.rejected[f"{pod.reason}: {pod.message}"] += 1
                continue
            if pod.settled:
                continue
            # Bound: its node's faults excuse it; unbound: the scheduler's (an extender away).
            scopes = [node] if node else self.replica_scopes
            if not final and (
                self.windows.busy(scopes, now) or now - max(created, self.windows.last_end(scopes)) < POD_GRACE_S
            ):
                continue  # its grace runs from its creation, or from the end of the last fault it waited out
            reported.add(name)
            if node:
                self._violate("lost-pod", f"{name}: bound to {node} but {phase} after {POD_GRACE_S:.0f} s")
            else:
                self._violate("lost-pod", f"{name}: neither bound nor given a reason after {POD_GRACE_S:.0f} s")

    async def _final_checks(self) -> None:
        """Everything once more, no grace: nothing is injected any more and the drain is over."""
        await self._check_once(time.monotonic(), final=True)

    async def _scrape(self) -> None:
        for index, replica in enumerate(self.box.replicas):
            pid = replica.process.proc.pid if replica.process.proc else 0
            try:
                async with self.box.session.get(f"{replica.url}/metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    text = await resp.text()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                continue
            errors = sum(
                int(float(line.rsplit(" ", 1)[1]))
                for line in text.splitlines()
                if line.startswith("sharepack_extender_requests_total{") and 'code="5' in line
            )
            before = self.replica_errors.get((index, pid), 0)
            self.replica_errors[(index, pid)] = errors
            if errors > before:
                self._violate("extender-5xx", f"extender-{index} answered {errors - before} requests with 5xx")

    # -- verdicts --------------------------------------------------------------------------

    def _judge_predictions(self) -> None:
        """Each pod PodResources listed is judged by the last prediction made before that
        listing (the bind that succeeded: the agent follows its directions)."""
        self.predictions.read()
        names = {uid: key for key, uid in self.uids.items()}
        for uid in sorted(self.predictions.made, key=lambda u: min(p.at for p, _ in self.predictions.made[u])):
            holding = self.holdings.get(uid)
            if holding is None:
                self.report.unjudged["never listed by PodResources (deleted or refused first)"] += 1
                continue
            found = self.predictions.latest(uid, holding.seen + self.wall_offset)
            if found is None:
                self.report.unjudged["listed by PodResources before any prediction"] += 1
                continue
            p, source = found
            if self.windows.muted([p.node, source], p.at - self.wall_offset, holding.seen):
                self.report.unjudged["a window of its node, its replica or the cluster overlapped"] += 1
                continue
            predicted = Counter(p.gpus.get(SHARED_RESOURCE, ()))
            self.report.predicted += 1
            if holding.node == p.node and holding.gpus == predicted:
                self.report.matched += 1
            elif len(self.report.missed) < 20:
                self.report.missed.append(
                    f"pod {uid}: predicted {p.node} {dict(predicted)} by {source} "
                    f"({len(self.predictions.made[uid])} prediction(s)), holds {holding.node} {dict(holding.gpus)}; "
                    f"its agent: {self._agent_said(holding.node, names.get(uid, ''))}"
                )

    def _agent_said(self, node: str, pod: str) -> str:
        """What the node's agent logged of directing `pod` ("namespace/name"): why a miss missed."""
        try:
            text = (self.box.root / f"agent-{node}.log").read_text(errors="replace")
        except OSError as e:
            return f"no log ({e})"
        said = [line.split(": ", 1)[-1] for line in text.splitlines() if "directed allocation" in line and f"pod {pod} " in line]
        return " | ".join(said) or "nothing about directing it"

    def _judge_coverage(self) -> None:
        injected = Counter(f.kind for f in self.report.faults)
        for kind in FAULTS:
            if injected[kind] < self.min_per_kind:
                self._violate("coverage", f"{kind} injected {injected[kind]} time(s), fewer than {self.min_per_kind}")


def render(report: Report, out: TextIO) -> None:
    print(f"\n{'fault':<18} {'injected':>8} {'survived':>8}", file=out)
    injected = Counter(f.kind for f in report.faults)
    survived = Counter(f.kind for f in report.faults if f.survived)
    for kind in FAULTS:
        print(f"{kind:<18} {injected[kind]:>8} {survived[kind]:>8}", file=out)
    for fault in report.faults:
        if not fault.survived:
            print(f"  not survived: {fault.kind} on {fault.target}: {fault.detail}", file=out)
    by_kind = Counter(v.invariant for v in report.violations)
    print(f"\npods created {report.pods_created}, deleted {report.pods_deleted}", file=out)
    for reason, n in report.rejected.most_common():
        print(f"  refused at admission (not lost: Failed with a reason) x{n}: {reason}", file=out)
    for invariant in INVARIANTS:
        print(f"invariant {invariant:<13} violations {by_kind[invariant]}", file=out)
    for violation in report.violations[:20]:
        print(f"  at {violation.at:6.1f} s {violation.invariant}: {violation.detail}", file=out)
    unjudged = sum(report.unjudged.values())
    print(f"\npredictions judged per pod {report.predicted}, left out {unjudged}", file=out)
    for why, n in report.unjudged.most_common():
        print(f"  left out x{n}: {why}", file=out)
    for line in report.missed[:5]:
        print(f"  missed: {line}", file=out)
    print(report.closing_line(), file=out)


async def soak(opts: argparse.Namespace, out: TextIO) -> Report:
    control_plane = opts.control_plane
    if control_plane == "auto":
        control_plane = demo.REAL if kubebuild.cached() is not None else demo.IN_PROCESS
    root = Path(tempfile.mkdtemp(prefix="sp-chaos-", dir="/tmp"))
    rng = random.Random(opts.seed)
    agent_args = (
        f"--node-config-configmap={CONFIGMAP_NAMESPACE}/{CONFIGMAP}",
        f"--unhealthy-recovery-seconds={RECOVERY_S}",
    )
    try:
        gpus = 8 if opts.machine.startswith("dgx") else 4
        workload = Workload(4, ())
        box = Sandbox(
            Policy(opts.policy), opts.nodes, opts.machine, workload, root,
            control_plane=control_plane, extender_replicas=opts.extender_replicas, agent_args=agent_args,
            extender_args=(f"--node-policy={opts.node_policy}",),
            session_affinity=not opts.spread_connections,
            node_labels={NODE_CONFIG_LABEL: CONFIG_NAME},
            before_nodes=lambda b: _install_config(b, workload.replicas),
        )  # fmt: skip
        print(
            f"chaos: {opts.nodes} nodes ({opts.machine}, {gpus} GPUs x {workload.replicas} replicas), "
            f"{control_plane} control plane, {opts.extender_replicas} extender replica(s), seed {opts.seed}, "
            f"{opts.duration:.0f} s, each fault kind at least {opts.min_per_kind} time(s), "
            f"agents {opts.policy}, extenders {opts.node_policy}",
            file=out, flush=True,
        )  # fmt: skip
        async with box:
            report = await Soak(box, rng, opts.duration, out, min_per_kind=opts.min_per_kind).run()
        render(report, out)
        return report
    finally:
        if opts.keep:
            print(f"logs kept in {root}", file=out)
        else:
            shutil.rmtree(root, ignore_errors=True)


async def _install_config(box: Sandbox, replicas: int) -> None:
    """The agent ConfigMap with the soak's named config, before any agent starts."""
    core: Any = kubernetes.client.CoreV1Api(box.api)
    body = {
        "metadata": {"name": CONFIGMAP, "namespace": CONFIGMAP_NAMESPACE},
        "data": {CONFIG_NAME: chaos_config(replicas, True)},
    }
    with contextlib.suppress(kubernetes.client.ApiException):  # exists (deploy/base made it)
        await asyncio.to_thread(core.create_namespace, {"metadata": {"name": CONFIGMAP_NAMESPACE}})
    try:
        await asyncio.to_thread(core.create_namespaced_config_map, CONFIGMAP_NAMESPACE, body)
    except kubernetes.client.ApiException as e:
        if e.status != 409:
            raise
        await asyncio.to_thread(core.patch_namespaced_config_map, CONFIGMAP, CONFIGMAP_NAMESPACE, {"data": body["data"]})


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sharepack-chaos", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of churn and faults (default 60)")
    p.add_argument(
        "--min-per-kind", type=int, default=1,
        help="inject every fault kind at least this many times, running past --duration if need be (default 1)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=1, help="seeds the bursts, the faults and their targets (default 1)")
    p.add_argument("--nodes", type=int, default=3, help="simulated GPU nodes (default 3)")
    p.add_argument("--machine", default="dgx-a100", help="simulated machine (default dgx-a100: 8 GPUs)")
    p.add_argument("--extender-replicas", type=int, default=2, help="extender replicas behind one address (default 2)")
    p.add_argument(
        "--spread-connections", action="store_true",
        help="spread the scheduler's connections over the replicas (a Service without the "
        "sessionAffinity: ClientIP that deploy/ sets)",
    )  # fmt: skip
    p.add_argument("--policy", default=str(shipped.AGENT_POLICY),
                   help=f"the agents' allocation policy (default: as shipped, {shipped.AGENT_POLICY})")
    p.add_argument("--node-policy", default=str(shipped.NODE_POLICY),
                   help=f"the extenders' --node-policy (default: as shipped, {shipped.NODE_POLICY})")  # fmt: skip
    p.add_argument(
        "--control-plane", choices=("auto", *demo.CONTROL_PLANES), default="auto",
        help="auto (default): the real kube-apiserver and kube-scheduler when built, else in-process",
    )  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep the soak's directory (every process's log) and print its path")
    p.add_argument("--verbose", action="store_true")
    opts = p.parse_args(argv)
    if opts.duration <= 0:
        p.error(f"--duration must be positive, got {opts.duration}")
    if opts.min_per_kind < 1:
        p.error(f"--min-per-kind must be at least 1, got {opts.min_per_kind}")
    if opts.nodes < 1:
        p.error(f"--nodes must be at least 1, got {opts.nodes}")
    if opts.extender_replicas < 1:
        p.error(f"--extender-replicas must be at least 1, got {opts.extender_replicas}")
    try:
        Policy(opts.policy)
    except ValueError:
        p.error(f"invalid --policy option: {opts.policy} (choose from {', '.join(Policy)})")
    if opts.node_policy not in list(NodePolicy):
        p.error(f"invalid --node-policy option: {opts.node_policy} (choose from {', '.join(NodePolicy)})")
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.INFO if opts.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # The API server restarts on purpose: the client's retry warnings would drown the report.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    try:
        report = asyncio.run(demo.cancelled_by_sigterm(soak(opts, sys.stdout)))
    except KeyboardInterrupt:
        print("\ninterrupted: soak stopped", file=sys.stderr)
        return 130
    except asyncio.CancelledError:  # SIGTERM
        print("\nterminated: soak stopped", file=sys.stderr)
        return 143
    except demo.DemoError as e:
        print(f"sharepack-chaos: {e}", file=sys.stderr)
        return 1
    return 0 if not report.violations else 2


if __name__ == "__main__":
    raise SystemExit(main())
