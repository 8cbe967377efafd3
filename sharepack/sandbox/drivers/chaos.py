"""`sharepack-chaos`: a soak of the whole stack under churn and faults, with invariants checked
all the time.

N simulated nodes (fake kubelet + the real agent), two extender replicas behind one address
(connections spread round-robin, as a Service spreads them), a scheduler (the real kube-scheduler
when the real control plane is built, else the sandbox's scheduler driver), pods created in
bursts of up to 100 and deleted, and faults drawn from the seed:

    agent-kill        SIGKILL an agent, start it again
    kubelet-restart   the kubelet restarts (its sockets deleted); the agent must register again
    extender-kill     SIGKILL an extender replica, start it again on the same port
    apiserver-restart kube-apiserver stops and starts (etcd keeps the data); in-process: an outage
    xid               a critical XID on a GPU; the agent marks it unhealthy, then recovers it
    config-change     the node's named config in the agent ConfigMap changes (applied live)
    state-delete      a node's NodeGpuState deleted by hand

Invariants, checked every CHECK_S:
    double-held   no device is held by two pods (ground truth: the sandbox kubelets)
    state         every NodeGpuState equals its node's ground truth within SETTLE_S of the last
                  fault on that node (per physical GPU: replicas held and the pods holding them)
    lost-pod      every pod is bound and running, or pending with the scheduler's reason
    extender-5xx  no extender replica answers 5xx (its own request counter, by code)
Predictions: the extenders' match/mismatch counters, over the intervals with no fault window
open (a fault's window lasts until SETTLE_S after it ended).

The last line: `soak: S s, F faults, V invariant violations, predictions matched M/T (P %)`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import kubernetes
import yaml

from sharepack.common import devices
from sharepack.common import state as gpustate
from sharepack.common.config import NODE_CONFIG_LABEL
from sharepack.common.errors import StateSchemaError
from sharepack.common.policies import Policy
from sharepack.sandbox.drivers import demo
from sharepack.sandbox.controlplane import kubebuild
from sharepack.sandbox.controlplane.plane import TRANSIENT_API_ERRORS
from sharepack.sandbox.drivers.demo import SHARED_RESOURCE, Sandbox, Workload

log = logging.getLogger("sharepack.sandbox.drivers.chaos")

FAULTS = (
    "agent-kill", "kubelet-restart", "extender-kill", "apiserver-restart", "xid", "config-change", "state-delete",
)  # fmt: skip
CHECK_S = 0.5
SETTLE_S = 5.0  # a node's published state must match its kubelet this long after a fault
POD_GRACE_S = 30.0  # a pod may be unbound and reasonless, or bound and not running, this long
NAMESPACE = demo.NAMESPACE
CONFIGMAP_NAMESPACE, CONFIGMAP = "sharepack-system", "sharepack-agent-config"
CONFIG_NAME = "chaos"  # the named config the soak's nodes use, in the agent ConfigMap
SHAPES = (1, 1, 1, 2, 2, 4)  # replicas per pod, drawn uniformly
XID = 48  # double-bit ECC: critical
RECOVERY_S = 3  # --unhealthy-recovery-seconds for the soak's agents
LEASE_TAKEOVER_S = 20.0  # kube-scheduler's default lease duration (15 s) and its retry period


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


@dataclass(slots=True)
class Report:
    seconds: float = 0.0
    faults: list[Fault] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    matched: int = 0
    predicted: int = 0
    pods_created: int = 0
    pods_deleted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # pods the kubelet refused, by reason
    missed: list[str] = field(default_factory=list)  # the extenders' "prediction missed" lines

    def closing_line(self) -> str:
        share = 100.0 * self.matched / self.predicted if self.predicted else 100.0
        return (
            f"soak: {self.seconds:.0f} s, {len(self.faults)} faults, {len(self.violations)} invariant violations, "
            f"predictions matched {self.matched}/{self.predicted} ({share:.1f} %)"
        )


def chaos_config(replicas: int, pass_device_specs: bool) -> str:
    """The soak's named config: time-slicing as the demo's, with one harmless knob to change."""
    doc = yaml.safe_load(demo.agent_config(replicas))
    doc.setdefault("flags", {}).setdefault("plugin", {})["passDeviceSpecs"] = pass_device_specs
    return str(yaml.safe_dump(doc))


def truth(node: Any) -> dict[str, Counter[str]]:
    """Per physical GPU of the shared resource: pod UID -> replicas, from the kubelet."""
    held: dict[str, Counter[str]] = defaultdict(Counter)
    for admission in node.kubelet.admissions():
        for device in admission.held(SHARED_RESOURCE):
            held[devices.physical_key(device)][admission.pod.uid] += 1
    return held


def published(state: gpustate.NodeState) -> dict[str, tuple[int, frozenset[str]]]:
    res = state.resource(SHARED_RESOURCE)
    return {g.key: (g.allocated, frozenset(g.pods)) for g in res.gpus if g.allocated or g.pods} if res else {}


def agrees(state: gpustate.NodeState, held: dict[str, Counter[str]]) -> bool:
    expected = {key: (sum(pods.values()), frozenset(pods)) for key, pods in held.items() if pods}
    return published(state) == expected


class Soak:
    def __init__(self, box: Sandbox, rng: random.Random, duration: float, out: TextIO) -> None:
        self.box = box
        self.rng = rng
        self.duration = duration
        self.out = out
        self.report = Report()
        self.core: Any = kubernetes.client.CoreV1Api(box.api)
        self.custom: Any = kubernetes.client.CustomObjectsApi(box.api)
        self.started = time.monotonic()
        self.stopping = False
        self.pods: dict[str, float] = {}  # name -> created at
        self.last_fault: dict[str, float] = {}  # node (or "*": all nodes) -> end of its latest fault window
        self.agreed: dict[str, float] = {}  # node -> last time its state matched its kubelet
        self.open_faults = 0
        self.counter = 0
        self.scheduler_restarts = 0
        self.replica_counts: dict[tuple[int, int], tuple[int, int, int]] = {}  # (replica, pid) -> (match, miss, 5xx)

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
            await asyncio.sleep(self.duration)
            self.stopping = True
            await asyncio.gather(tasks[0], tasks[1])  # each ends at its next step
            await asyncio.sleep(SETTLE_S + 2 * CHECK_S)  # the last checks see a settled cluster
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.report.seconds = time.monotonic() - self.started
        return self.report

    async def _churn(self) -> None:
        while not self.stopping:
            burst = self.rng.randint(1, 100)
            names = [self._next_name() for _ in range(burst)]
            await asyncio.gather(*(self._create(n, self.rng.choice(SHAPES)) for n in names))
            await self._pause(self.rng.uniform(2.0, 5.0))
            if self.stopping:
                return
            victims = self.rng.sample(sorted(self.pods), k=min(len(self.pods), self.rng.randint(burst // 2, burst)))
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
            await asyncio.to_thread(self.core.create_namespaced_pod, NAMESPACE, body)
            self.pods[name] = time.monotonic()
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
        while not self.stopping:
            if not kinds:  # every kind once before any repeats, in a seeded order
                kinds = list(FAULTS)
                self.rng.shuffle(kinds)
            kind = kinds.pop()
            node = self.rng.choice(self.box.nodes)
            fault = Fault(kind, node.name, time.monotonic())
            self.open_faults += 1
            try:
                await self._inject(fault, node)
            except Exception as e:  # noqa: BLE001 - a fault the stack did not survive is reported, not raised
                fault.detail = f"{type(e).__name__}: {e}"
            finally:
                fault.ended = time.monotonic()
                self.open_faults -= 1
                scope = "*" if kind in ("extender-kill", "apiserver-restart") else node.name
                self.last_fault[scope] = fault.ended + SETTLE_S
                self.report.faults.append(fault)
            await self._pause(self.rng.uniform(3.0, 7.0))

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
            index = self.rng.randrange(len(self.box.replicas))
            fault.target = f"extender-{index}"
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
            await self._write_config(chaos_config(self.box.workload.replicas, flip))
            await asyncio.sleep(1.0)
            await node.kubelet.wait_for_resource(SHARED_RESOURCE, timeout=30)
            fault.target = f"{CONFIGMAP}/{CONFIG_NAME}"
            fault.detail = f"passDeviceSpecs={flip}"
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
        seen_lost: set[str] = set()
        seen_state: set[str] = set()
        last_scrape = time.monotonic()
        while True:
            await asyncio.sleep(CHECK_S)
            now = time.monotonic()
            real = self.box.real
            if real is not None and real.scheduler_restarts > self.scheduler_restarts:
                # kube-scheduler lost its lease in an API outage and restarts: until the old lease
                # expires nothing schedules, as in a cluster. A fault of the whole cluster.
                self.scheduler_restarts = real.scheduler_restarts
                self.last_fault["*"] = now + LEASE_TAKEOVER_S + SETTLE_S
            self._check_double_held()
            await self._check_states(now, seen_state)
            await self._check_pods(now, seen_lost)
            quiet = self.open_faults == 0 and all(t <= last_scrape for t in self.last_fault.values())
            await self._scrape(count_predictions=quiet)
            last_scrape = now

    def _check_double_held(self) -> None:
        for node in self.box.nodes:
            owners: dict[str, str] = {}
            for admission in node.kubelet.admissions():
                for device in admission.held(SHARED_RESOURCE):
                    other = owners.setdefault(device, admission.pod.uid)
                    if other != admission.pod.uid:
                        self._violate("double-held", f"{node.name}: {device} held by pods {other} and {admission.pod.uid}")

    async def _check_states(self, now: float, reported: set[str]) -> None:
        for node in self.box.nodes:
            state = await self._state(node.name)
            if state is not None and agrees(state, truth(node)):
                self.agreed[node.name] = now
                reported.discard(node.name)
                continue
            since = max(self.agreed[node.name], self.last_fault.get(node.name, 0.0), self.last_fault.get("*", 0.0))
            busy = self.open_faults > 0
            if not busy and now - since > SETTLE_S and node.name not in reported:
                reported.add(node.name)  # one violation per episode, not one per check
                got = published(state) if state else "no state"
                want = {k: dict(v) for k, v in truth(node).items() if v}
                self._violate("state", f"{node.name}: published {got}, kubelet holds {want}")

    async def _check_pods(self, now: float, reported: set[str]) -> None:
        if self.open_faults > 0 or any(end > now for end in self.last_fault.values()):
            return  # an API outage or a restarting agent: judged once it is over
        try:
            pods = (await asyncio.to_thread(self.core.list_namespaced_pod, NAMESPACE)).items
        except TRANSIENT_API_ERRORS:
            return
        for pod in pods:
            name = pod.metadata.name
            created = self.pods.get(name)
            # A pod waits out a fault of the whole cluster (the scheduler away) on top of its grace.
            if created is None or name in reported or now - max(created, self.last_fault.get("*", 0.0)) < POD_GRACE_S:
                continue
            phase = pod.status.phase if pod.status else None
            if pod.spec.node_name:
                if phase == "Failed" and pod.status.reason:  # refused at admission: accounted for
                    reported.add(name)
                    self.report.rejected[f"{pod.status.reason}: {pod.status.message}"] += 1
                elif phase != "Running":
                    reported.add(name)
                    self._violate("lost-pod", f"{name}: bound to {pod.spec.node_name} but {phase} after {POD_GRACE_S:.0f} s")
                continue
            reasons = [
                c for c in (pod.status.conditions or []) if c.type == "PodScheduled" and c.status == "False" and c.message
            ] if pod.status else []  # fmt: skip
            if not reasons:
                reported.add(name)
                self._violate("lost-pod", f"{name}: neither bound nor given a reason after {POD_GRACE_S:.0f} s")

    async def _scrape(self, *, count_predictions: bool) -> None:
        for index, replica in enumerate(self.box.replicas):
            pid = replica.process.proc.pid if replica.process.proc else 0
            try:
                async with self.box.session.get(f"{replica.url}/metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    text = await resp.text()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                continue
            match = miss = errors = 0
            for line in text.splitlines():
                if line.startswith('sharepack_extender_predictions_total{outcome="match"}'):
                    match = int(float(line.rsplit(" ", 1)[1]))
                elif line.startswith('sharepack_extender_predictions_total{outcome="mismatch"}'):
                    miss = int(float(line.rsplit(" ", 1)[1]))
                elif line.startswith("sharepack_extender_requests_total{") and 'code="5' in line:
                    errors += int(float(line.rsplit(" ", 1)[1]))
            before = self.replica_counts.get((index, pid), (0, 0, 0))
            self.replica_counts[(index, pid)] = (match, miss, errors)
            if errors > before[2]:
                self._violate("extender-5xx", f"extender-{index} answered {errors - before[2]} requests with 5xx")
            if count_predictions:
                self.report.matched += match - before[0]
                self.report.predicted += (match - before[0]) + (miss - before[1])


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
    for invariant in ("double-held", "state", "lost-pod", "extender-5xx"):
        print(f"invariant {invariant:<13} violations {by_kind[invariant]}", file=out)
    for violation in report.violations[:20]:
        print(f"  at {violation.at:6.1f} s {violation.invariant}: {violation.detail}", file=out)
    if report.missed:
        print(f"\nprediction misses logged by the extenders (all, faults included): {len(report.missed)}, the first:", file=out)
        for line in report.missed[:5]:
            print(f"  {line}", file=out)
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
            session_affinity=not opts.spread_connections,
            node_labels={NODE_CONFIG_LABEL: CONFIG_NAME},
            before_nodes=lambda b: _install_config(b, workload.replicas),
        )  # fmt: skip
        print(
            f"chaos: {opts.nodes} nodes ({opts.machine}, {gpus} GPUs x {workload.replicas} replicas), "
            f"{control_plane} control plane, {opts.extender_replicas} extender replica(s), seed {opts.seed}, "
            f"{opts.duration:.0f} s",
            file=out, flush=True,
        )  # fmt: skip
        async with box:
            report = await Soak(box, rng, opts.duration, out).run()
        report.missed = [
            line.strip()
            for log_file in sorted(root.glob("extender*.log"))
            for line in log_file.read_text(errors="replace").splitlines()
            if "prediction missed" in line
        ]
        render(report, out)
        return report
    finally:
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
    p.add_argument("--seed", type=int, default=1, help="seeds the bursts, the faults and their targets (default 1)")
    p.add_argument("--nodes", type=int, default=3, help="simulated GPU nodes (default 3)")
    p.add_argument("--machine", default="dgx-a100", help="simulated machine (default dgx-a100: 8 GPUs)")
    p.add_argument("--extender-replicas", type=int, default=2, help="extender replicas behind one address (default 2)")
    p.add_argument(
        "--spread-connections", action="store_true",
        help="spread the scheduler's connections over the replicas (a Service without the "
        "sessionAffinity: ClientIP that deploy/ sets)",
    )  # fmt: skip
    p.add_argument("--policy", default="packed", help="agents' and extenders' policy (default packed)")
    p.add_argument(
        "--control-plane", choices=("auto", *demo.CONTROL_PLANES), default="auto",
        help="auto (default): the real kube-apiserver and kube-scheduler when built, else in-process",
    )  # fmt: skip
    p.add_argument("--verbose", action="store_true")
    opts = p.parse_args(argv)
    if opts.duration <= 0:
        p.error(f"--duration must be positive, got {opts.duration}")
    if opts.nodes < 1:
        p.error(f"--nodes must be at least 1, got {opts.nodes}")
    if opts.extender_replicas < 1:
        p.error(f"--extender-replicas must be at least 1, got {opts.extender_replicas}")
    try:
        Policy(opts.policy)
    except ValueError:
        p.error(f"invalid --policy option: {opts.policy} (choose from {', '.join(Policy)})")
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
