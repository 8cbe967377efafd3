"""`sharepack-demo`: the cluster in a box, showing packed vs distributed end to end.

For each policy it starts a fresh sandbox — the API server, N simulated GPU nodes (fake kubelet +
the real agent on a simulated machine, as child processes), the real extender over HTTP — and
drives a scheduler through a wave of shared pods (single time-sliced replicas) and then a wave of
full-GPU pods (all replicas of one GPU). It draws which replica slots each GPU has taken after the
first wave, and counts the full-GPU pods that got a whole physical GPU to themselves.

    sharepack-demo                       # both policies, 3 nodes of 4 GPUs, about a minute
    sharepack-demo --policy packed --keep-running   # leave the stack up for kubectl
    sharepack-demo --control-plane real --mode dra  # the DRA mode (docs/dra.md)

In the DRA mode (real control plane only: the in-process API server does not serve
resource.k8s.io) the agents are DRA kubelet plugins publishing ResourceSlices in the policy's
device order, kube-scheduler allocates the devices (first fit) for the claims it makes from the
pods' unchanged `nvidia.com/gpu.shared` requests, and the extender (`--mode dra`) ranks nodes
from the slices and the allocated claims. The picture is drawn from those same objects.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

import aiohttp
import kubernetes
import yaml

from sharepack.common import bars, shipped
from sharepack.common import state as gpustate
from sharepack.common.errors import DraSchemaError, StateSchemaError
from sharepack.common.policies import Policy
from sharepack.extender.metrics import parse_text
from sharepack.sandbox.controlplane import certificates, plane as controlplane, kubebuild
from sharepack.sandbox.apiserver.server import FakeApiServer
from sharepack.sandbox.controlplane.plane import ControlPlaneUnavailable, RealControlPlane, free_port
from sharepack.sandbox.controlplane.identities import Identities
from sharepack.sandbox.kubelet.nodes import DEVICE_PLUGIN_MODE, DRA_MODE, NodeSpec, NodeStartError, SimulatedNode
from sharepack.sandbox.processes import LoggedProcess
from sharepack.sandbox.drivers import drastack
from sharepack.sandbox.drivers.stacks import Stack
from sharepack.sandbox.scheduling import Decision, ExtenderConfig, SchedulerDriver
from sharepack.sandbox.tcpproxy import RoundRobinProxy

log = logging.getLogger("sharepack.sandbox.drivers.demo")
T = TypeVar("T")

DEFAULT_MACHINE = "t4-pcie"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
NAMESPACE = "default"
PUBLISH_TIMEOUT_S = 10.0
IN_PROCESS, REAL = "in-process", "real"
CONTROL_PLANES = (IN_PROCESS, REAL)
MODES = (DEVICE_PLUGIN_MODE, DRA_MODE)
SCHEDULE_TIMEOUT_S = 30.0


class DemoError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Wave:
    name: str
    count: int
    replicas: int  # replicas of SHARED_RESOURCE per pod
    whole_gpu: bool  # counted as placed only when it holds one whole GPU alone


@dataclass(frozen=True, slots=True)
class Workload:
    replicas: int  # time-slicing replicas per GPU
    waves: tuple[Wave, ...]


def default_workload(nodes: int, gpus_per_node: int, replicas: int) -> Workload:
    gpus = nodes * gpus_per_node
    return Workload(
        replicas,
        (
            Wave("shared", gpus, 1, False),  # as many single replicas as there are GPUs
            Wave("full-gpu", gpus // 2, replicas, True),  # then half the GPUs, whole
        ),
    )


def load_workload(path: Path) -> Workload:
    where = str(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise DemoError(f"invalid workload file {where}: {e}") from e
    if not isinstance(doc, Mapping):
        raise DemoError(f"invalid workload file {where}: expected a mapping with replicas and waves")
    replicas = doc.get("replicas", 4)
    if not isinstance(replicas, int) or replicas < 1:
        raise DemoError(f"invalid workload file {where}: replicas must be a positive integer, got {replicas!r}")
    waves = []
    for i, w in enumerate(doc.get("waves") or []):
        if not isinstance(w, Mapping):
            raise DemoError(f"invalid workload file {where}: waves[{i}] is not a mapping")
        count, size = w.get("count"), w.get("replicas", 1)
        if not isinstance(count, int) or count < 0:
            raise DemoError(f"invalid workload file {where}: waves[{i}].count must be >= 0, got {count!r}")
        if not isinstance(size, int) or not 1 <= size <= replicas:
            raise DemoError(
                f"invalid workload file {where}: waves[{i}].replicas must be 1..{replicas}, got {size!r}"
            )
        waves.append(Wave(str(w.get("name", f"wave-{i}")), count, size, bool(w.get("wholeGpu", size == replicas))))
    if not waves:
        raise DemoError(f"invalid workload file {where}: no waves")
    return Workload(replicas, tuple(waves))


def agent_config(replicas: int) -> str:
    return yaml.safe_dump(
        {
            "version": "v1",
            "flags": {"migStrategy": "none"},
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": True,
                    "resources": [{"name": "nvidia.com/gpu", "replicas": replicas}],
                }
            },
        }
    )


def render_states(states: Sequence[gpustate.NodeState], names: Sequence[str], out: TextIO) -> None:
    for name, st in zip(names, states, strict=True):
        print("    " + bars.node_line(name, st.resource(SHARED_RESOURCE)), file=out)


@dataclass(frozen=True, slots=True)
class ExtenderReplica:
    process: LoggedProcess
    port: int

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


class Sandbox(Stack):
    """One policy's stack: control plane, nodes, extender, scheduler.

    `control_plane`: "in-process" (the sandbox API server and the scheduler driver, no Go
    needed) or "real" (etcd, kube-apiserver and kube-scheduler built from their Go modules,
    deploy/base applied, every process with the identity it has in a cluster)."""

    def __init__(
        self, policy: Policy, nodes: int, machine: str, workload: Workload, root: Path,
        *, control_plane: str = IN_PROCESS, extender_replicas: int = 1, agent_args: Sequence[str] = (),
        extender_args: Sequence[str] = (), node_labels: Mapping[str, str] | None = None, session_affinity: bool = True,
        before_nodes: Callable[[Sandbox], Awaitable[None]] | None = None, mode: str = DEVICE_PLUGIN_MODE,
    ) -> None:  # fmt: skip
        """`agent_args`, `node_labels`: for every node; `extender_args`: for every extender
        replica (e.g. `--no-directed-gpus`); `before_nodes`: runs once the control
        plane is up, before any node or agent starts (objects the agents read at start).
        `mode`: the device-plugin mode, or the DRA mode (deploy/dra applied, agents as DRA
        kubelet plugins, the extender `--mode dra`; the real control plane only)."""
        if control_plane not in CONTROL_PLANES:
            raise DemoError(f"invalid control plane: {control_plane} (choose from {', '.join(CONTROL_PLANES)})")
        check_mode(mode, control_plane)
        self.mode = mode
        self.policy = policy
        self.workload = workload
        self.root = root
        self.control_plane = control_plane
        self.agent_args = tuple(agent_args)
        # Several replicas run as deploy/ runs its two (`common.shipped`): a bind that reaches
        # the replica which did not score the pod is re-checked there. The flag's default,
        # refuse, made kube-scheduler bind such pods itself, undirected (chaos soak misses).
        replicated = (f"--unscored-binds={shipped.REPLICATED_UNSCORED_BINDS}",) if extender_replicas > 1 else ()
        self.extender_args = (*replicated, *extender_args)
        self.node_labels = dict(node_labels or {})
        self.session_affinity = session_affinity  # the extender Service's sessionAffinity: ClientIP
        self._before_nodes = before_nodes
        self.api_server = FakeApiServer()
        self.real: RealControlPlane | None = None
        self.kubeconfig = root / "kubeconfig"
        self.node_specs = [NodeSpec(f"node-{i}", machine, root / "agent-config.yaml") for i in range(nodes)]
        self.nodes: list[SimulatedNode] = []
        self.extender: LoggedProcess | None = None  # the first replica
        self.extender_replicas = extender_replicas
        self.replicas: list[ExtenderReplica] = []
        self.extender_url = ""  # the one replica, or the proxy in front of them
        super().__init__()

    @property
    def url(self) -> str:
        return self.real.url if self.real is not None else self.api_server.url

    @property
    def kubectl(self) -> str:
        """The kubectl to point a user at: the one built with the real control plane, if any."""
        return str(self.real.binaries.path("kubectl")) if self.real is not None else "kubectl"

    async def _start_control_plane(self) -> None:
        if self.control_plane == REAL:
            try:
                self.real = RealControlPlane(self.root / "kube")
                await self.real.start()
            except ControlPlaneUnavailable as e:
                raise DemoError(str(e)) from None
            finally:
                if self.real is not None:
                    self._stack.push_async_callback(self.real.stop)
            shutil.copyfile(self.real.kubeconfig, self.kubeconfig)
            deploy = (drastack.DRA_DIR,) if self.mode == DRA_MODE else ()  # deploy/dra, else deploy/base
            self.identities = Identities(self.real, await self.real.apply_deploy_base(*deploy))
        else:
            await self.api_server.start()
            self._stack.push_async_callback(self.api_server.stop)
            self.api_server.write_kubeconfig(self.kubeconfig)

    async def _node(self, spec: NodeSpec, node_root: Path) -> SimulatedNode:
        if self.real is None:
            return SimulatedNode(spec, node_root, self.api, self.kubeconfig, log_dir=self.root)
        kubelet_api = controlplane.api_client(self.real.node_kubeconfig(spec.name))
        self._stack.callback(kubelet_api.close)
        return SimulatedNode(
            spec, node_root, kubelet_api, await self.identities.agent_kubeconfig(spec.name), log_dir=self.root
        )

    async def _start(self) -> None:
        await self._start_control_plane()
        (self.root / "agent-config.yaml").write_text(agent_config(self.workload.replicas))
        self.api: Any = controlplane.api_client(self.kubeconfig)
        self._stack.callback(self.api.close)
        if self._before_nodes is not None:
            await self._before_nodes(self)

        for i, spec in enumerate(self.node_specs):
            spec = NodeSpec(
                spec.name, spec.machine, spec.config_file, labels=self.node_labels,
                extra_agent_args=(f"--shared-devices-allocation-policy={self.policy}", *self.agent_args),
                mode=self.mode,
            )  # fmt: skip
            node_root = Path(tempfile.mkdtemp(prefix=f"n{i}-", dir=self.root))
            self.nodes.append(await self._node(spec, node_root))
        for node in self.nodes:
            self._stack.push_async_callback(node.stop)
        try:
            # A TaskGroup, not gather: when one node fails the others are cancelled (and stop
            # what they started) before the stack is unwound.
            async with asyncio.TaskGroup() as group:
                for node in self.nodes:
                    group.create_task(node.start([SHARED_RESOURCE], watch_pods=self.real is not None))
        except* NodeStartError as failed:
            raise DemoError(str(failed.exceptions[0])) from None

        self.extender_kubeconfig = await self.identities.extender_kubeconfig() if self.real else self.kubeconfig
        # Mutual TLS, as deployed: the extender answers only clients with this CA's certificate.
        self.tls = certificates.write_tls_files(self.root / "tls")
        client_tls = self.tls.client_context()
        # Every call this session makes to the extender presents the scheduler's certificate.
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls))
        self._stack.push_async_callback(self.session.close)
        for i in range(self.extender_replicas):
            self.replicas.append(await self.start_extender(i))
        self.extender = self.replicas[0].process
        if len(self.replicas) > 1:  # one address for all, as a Service gives them
            proxy = RoundRobinProxy([("127.0.0.1", r.port) for r in self.replicas], affinity=self.session_affinity)
            await proxy.start()
            self._stack.push_async_callback(proxy.stop)
            self.extender_url = f"https://127.0.0.1:{proxy.port}"  # TLS passes through the proxy
        else:
            self.extender_url = self.replicas[0].url
        self.driver = SchedulerDriver(
            self.api, self.session, ExtenderConfig(self.extender_url, ignorable=False, tls=client_tls), seed=0
        )
        if self.real is not None:
            try:
                await self.real.start_scheduler(self.extender_url, tls=self.tls.scheduler_tls_config())
            except ControlPlaneUnavailable as e:
                raise DemoError(str(e)) from None

    async def start_extender(self, index: int, port: int = 0) -> ExtenderReplica:
        """Start extender replica `index` (on `port`, else a free one); return once it is ready
        and has cached every node's NodeGpuState."""
        port = port or free_port()
        process = LoggedProcess(
            [
                sys.executable, "-m", "sharepack.extender",
                f"--listen=127.0.0.1:{port}", f"--node-policy={self.policy}",
                f"--kubeconfig={self.extender_kubeconfig}", "--log-format=text", *self.tls.extender_args(),
                *((f"--mode={DRA_MODE}",) if self.mode == DRA_MODE else ()), *self.extender_args,
            ],
            self.root / ("extender.log" if index == 0 else f"extender-{index}.log"),
        )  # fmt: skip
        await process.start()
        self._stack.push_async_callback(process.stop)
        replica = ExtenderReplica(process, port)
        await self._wait_ready(replica)
        await self._wait_states_cached(replica)
        return replica

    async def _wait_ready(self, replica: ExtenderReplica) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if replica.process.exited:
                break
            with contextlib.suppress(aiohttp.ClientError):
                async with self.session.get(f"{replica.url}/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
        raise DemoError(f"extender at {replica.url} did not become ready:\n{replica.process.log_tail()}")

    async def _wait_states_cached(self, replica: ExtenderReplica) -> None:
        """Every node has published its NodeGpuState and the extender holds them all. Ready
        means its caches listed once, maybe before an agent's first write: a pod scheduled then
        is scored as on unknown nodes, and `node_states()` can meet a 404."""
        deadline = time.monotonic() + PUBLISH_TIMEOUT_S
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with self.session.get(f"{replica.url}/metrics") as resp:
                    if parse_text(await resp.text()).get("sharepack_extender_cache_nodes") == len(self.nodes):
                        return
            if time.monotonic() > deadline:
                raise DemoError(f"the extender did not cache every node's NodeGpuState within {PUBLISH_TIMEOUT_S} s")
            await asyncio.sleep(0.05)

    async def node_states(self) -> list[gpustate.NodeState]:
        """Each node's per-GPU view: its NodeGpuState, or in the DRA mode its ResourceSlices and
        the claims allocated from them, decoded as the extender decodes them."""
        if self.mode == DRA_MODE:
            return await drastack.node_states(self.api, [n.name for n in self.nodes])
        custom: Any = kubernetes.client.CustomObjectsApi(self.api)
        out = []
        for node in self.nodes:
            obj = await asyncio.to_thread(
                custom.get_cluster_custom_object,
                gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL, node.name,
            )  # fmt: skip
            out.append(gpustate.from_status(obj.get("status"), source=f"nodegpustate/{node.name}"))
        return out

    async def wait_published(self, node: str, uid: str) -> gpustate.NodeState:
        """The serial stream: the next pod is scheduled once the node has published this one
        (in the DRA mode: once a claim allocated on the node is reserved for it)."""
        deadline = time.monotonic() + PUBLISH_TIMEOUT_S
        names = [n.name for n in self.nodes]
        while True:
            with contextlib.suppress(kubernetes.client.ApiException, StateSchemaError, DraSchemaError):
                st = (await self.node_states())[names.index(node)]
                res = st.resource(SHARED_RESOURCE)
                if res and any(uid in g.pods for g in res.gpus):
                    return st
            if time.monotonic() > deadline:
                raise DemoError(f"node {node} did not publish pod {uid} within {PUBLISH_TIMEOUT_S} s")
            await asyncio.sleep(0.05)

    async def run_pod(self, name: str, replicas: int) -> tuple[Decision, tuple[str, ...]]:
        """Create, schedule, admit one pod; returns the decision and the GPUs its replicas sit on."""
        core: Any = kubernetes.client.CoreV1Api(self.api)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                        "resources": {"limits": {SHARED_RESOURCE: str(replicas)}},
                    }
                ]
            },
        }
        pod = await asyncio.to_thread(core.create_namespaced_pod, NAMESPACE, body)
        if self.real is not None:
            decision = await self._scheduled_by_kube_scheduler(core, name)
        else:
            decision = await self.driver.schedule(NAMESPACE, name)
        if decision.node is None:
            return decision, ()
        node = next(n for n in self.nodes if n.name == decision.node)
        rejected = await node.sync_pods()
        if rejected:
            return Decision(decision.pod, None, rejected[0][1]), ()
        st = await self.wait_published(node.name, pod.metadata.uid)
        res = st.resource(SHARED_RESOURCE)
        gpus = tuple(g.key for g in res.gpus if pod.metadata.uid in g.pods) if res else ()
        return decision, gpus

    async def schedule(self, name: str) -> Decision:
        """Schedule pod `name` (created already): the scheduler driver's one pass on the
        in-process control plane; on the real one, wait until kube-scheduler binds it or marks
        it unschedulable."""
        if self.real is None:
            return await self.driver.schedule(NAMESPACE, name)
        return await self._scheduled_by_kube_scheduler(kubernetes.client.CoreV1Api(self.api), name)

    async def _scheduled_by_kube_scheduler(self, core: Any, name: str) -> Decision:
        """Wait until kube-scheduler binds the pod, or marks it unschedulable."""
        key = f"{NAMESPACE}/{name}"
        deadline = time.monotonic() + SCHEDULE_TIMEOUT_S
        while time.monotonic() < deadline:
            pod = await asyncio.to_thread(core.read_namespaced_pod, name, NAMESPACE)
            if pod.spec.node_name:
                return Decision(key, pod.spec.node_name)
            for cond in (pod.status.conditions or []) if pod.status else []:
                if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
                    return Decision(key, None, cond.message or cond.reason)
            await asyncio.sleep(0.05)
        raise DemoError(f"kube-scheduler neither bound nor gave up on pod {key} within {SCHEDULE_TIMEOUT_S:.0f} s")

    async def keep_serving(self) -> None:
        """Until cancelled, a cluster a user can drive: pods applied with kubectl are scheduled
        (by the scheduler driver on the in-process control plane) and admitted by the kubelets."""
        for node in self.nodes:
            node.watch_pods()
        if self.real is not None:
            await asyncio.Event().wait()
        await self.driver.run()


def check_mode(mode: str, control_plane: str) -> None:
    if mode not in MODES:
        raise DemoError(f"invalid mode: {mode} (choose from {', '.join(MODES)})")
    if mode == DRA_MODE and control_plane != REAL:
        raise DemoError(
            f"--mode {DRA_MODE} needs --control-plane {REAL}: DRA runs on the real kube-apiserver and "
            f"kube-scheduler (the {control_plane} API server does not serve resource.k8s.io, and the "
            "scheduler's allocator is kube-scheduler's)"
        )


def print_results(results: Mapping[Policy, tuple[int, int]], out: TextIO) -> None:
    print("", file=out)
    for policy, (placed, total) in results.items():
        print(f"{policy}: full-GPU pods placed {placed}/{total}", file=out)


async def run_policy(
    policy: Policy, nodes: int, machine: str, workload: Workload | None, out: TextIO, *,
    keep_running: bool, earlier: Mapping[Policy, tuple[int, int]] | None = None, control_plane: str = IN_PROCESS,
    mode: str = DEVICE_PLUGIN_MODE,
) -> tuple[int, int]:
    check_mode(mode, control_plane)
    root = Path(tempfile.mkdtemp(prefix="sp-", dir="/tmp"))
    started = time.monotonic()
    if mode == DRA_MODE:
        print(
            f"\n== {policy}: agents --mode=dra publish their devices in {policy} order, kube-scheduler allocates "
            f"(first fit), extender --mode=dra --node-policy={policy}",
            file=out,
        )
    else:
        print(f"\n== {policy}: agents --shared-devices-allocation-policy={policy}, extender --node-policy={policy}", file=out)
    try:
        wl = workload or default_workload(nodes, 4, 4)
        async with Sandbox(policy, nodes, machine, wl, root, control_plane=control_plane, mode=mode) as box:
            gpus_per_node = len((await box.node_states())[0].resources[0].gpus)
            if workload is None and gpus_per_node != 4:
                wl = default_workload(nodes, gpus_per_node, 4)
                box.workload = wl
            print(
                f"   up in {time.monotonic() - started:.1f} s: {control_plane} API server {box.url}, "
                f"{nodes} node{'s' if nodes != 1 else ''} ({machine}, {gpus_per_node} GPUs x {wl.replicas} replicas), "
                f"extender {box.extender_url}",
                file=out,
            )
            placed = whole = 0
            for wave in wl.waves:
                print(f"   {wave.name}: {wave.count} pods x {wave.replicas} replica(s) of {SHARED_RESOURCE}", file=out)
                wave_placed = 0
                for i in range(wave.count):
                    decision, gpus = await box.run_pod(f"{wave.name}-{i}", wave.replicas)
                    if decision.node is None:
                        print(f"     {decision.pod}: not placed: {decision.reason}", file=out)
                        continue
                    wave_placed += 1
                    if wave.whole_gpu:
                        states = await box.node_states()
                        if _holds_whole_gpu(states, decision.node, [n.name for n in box.nodes], gpus):
                            placed += 1
                            print(f"     {decision.pod} -> {decision.node}: a whole GPU", file=out)
                        else:
                            print(f"     {decision.pod} -> {decision.node}: stranded, its replicas share {len(gpus)} GPU(s) with other pods", file=out)
                        whole += 1
                if not wave.whole_gpu:
                    print(f"   after {wave.name} ({wave_placed}/{wave.count} placed):", file=out)
                    render_states(await box.node_states(), [n.name for n in box.nodes], out)
            total_whole = sum(w.count for w in wl.waves if w.whole_gpu)
            print(f"   done in {time.monotonic() - started:.1f} s", file=out)
            if keep_running:
                # The results first: the run never returns to print them once the stack stays up.
                print_results({**(earlier or {}), policy: (placed, total_whole)}, out)
                print(f"\n   stack left running. kubeconfig: {box.kubeconfig}", file=out)
                if mode == DRA_MODE:
                    print(f"   try: {box.kubectl} --kubeconfig {box.kubeconfig} get resourceslices,resourceclaims -A", file=out)
                    print(f"        {box.kubectl} --kubeconfig {box.kubeconfig} get nodes,pods", file=out)
                else:
                    print(f"   try: {box.kubectl} --kubeconfig {box.kubeconfig} get nodes,nodegpustates,pods", file=out)
                print("   pods you apply are scheduled through the extender and admitted by the nodes.", file=out)
                tls = box.tls
                if mode != DRA_MODE:  # `explain` is checked in the device-plugin mode only
                    print(
                        f"   explain a pod: sharepack --kubeconfig {box.kubeconfig} explain POD --extender-url "
                        f"{box.extender_url} --cert {tls.explain_cert} --key {tls.explain_key} --cacert {tls.ca_cert}",
                        file=out,
                    )  # fmt: skip
                print("   Ctrl-C to stop.", file=out)
                await box.keep_serving()
            return placed, total_whole
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _holds_whole_gpu(
    states: Sequence[gpustate.NodeState], node: str, names: Sequence[str], gpus: Sequence[str]
) -> bool:
    if len(gpus) != 1:
        return False
    res = states[list(names).index(node)].resource(SHARED_RESOURCE)
    gpu = next(g for g in res.gpus if g.key == gpus[0]) if res else None
    return gpu is not None and len(gpu.pods) == 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sharepack-demo", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=3, help="simulated GPU nodes (default 3)")
    p.add_argument("--machine", default=DEFAULT_MACHINE, help=f"simulated machine name or YAML (default {DEFAULT_MACHINE})")
    p.add_argument("--policy", default="distributed,packed", help="comma-separated policies to run (default distributed,packed)")
    p.add_argument("--workload", type=Path, help="YAML: replicas and waves (name, count, replicas, wholeGpu)")
    p.add_argument("--keep-running", action="store_true", help="leave the (last) stack up and print a kubeconfig")
    p.add_argument(
        "--control-plane", choices=CONTROL_PLANES, default=IN_PROCESS,
        help="in-process: the sandbox API server and scheduler driver (default, no Go needed); "
        "real: kube-apiserver, etcd and kube-scheduler built from their Go modules (Go >= 1.26; "
        "the first build takes 15-25 minutes, then it is cached)",
    )  # fmt: skip
    p.add_argument(
        "--mode", choices=MODES, default=DEVICE_PLUGIN_MODE,
        help="device-plugin: the agents serve the kubelet's device-plugin API (default); dra: they are DRA "
        "kubelet plugins publishing ResourceSlices and kube-scheduler allocates (needs --control-plane real)",
    )  # fmt: skip
    p.add_argument("--verbose", action="store_true", help="log the sandbox's own components")
    opts = p.parse_args(argv)
    if opts.nodes < 1:
        p.error(f"--nodes must be at least 1, got {opts.nodes}")
    try:
        check_mode(opts.mode, opts.control_plane)
    except DemoError as e:
        p.error(str(e))
    try:
        opts.policies = [Policy(x.strip()) for x in opts.policy.split(",") if x.strip()]
    except ValueError:
        p.error(f"invalid --policy option: {opts.policy} (choose from {', '.join(Policy)})")
    return opts


async def amain(opts: argparse.Namespace, out: TextIO) -> int:
    return await cancelled_by_sigterm(_amain(opts, out))


async def cancelled_by_sigterm(work: Coroutine[Any, Any, T]) -> T:
    """`work`, cancelled by SIGTERM (kill, timeout, a CI runner) as Ctrl-C cancels it, so the
    stack is stopped and its temp dirs go: without this the interpreter dies at once."""
    loop, main_task = asyncio.get_running_loop(), asyncio.current_task()
    assert main_task is not None
    loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    try:
        return await work
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def _amain(opts: argparse.Namespace, out: TextIO) -> int:
    workload = load_workload(opts.workload) if opts.workload else None
    print(
        "sharepack demo: time-sliced GPUs, a wave of shared pods then full-GPU pods, "
        f"under {' and '.join(opts.policies)}" + (" (DRA mode)" if opts.mode == DRA_MODE else ""),
        file=out,
    )
    if opts.control_plane == REAL:
        try:  # once, before the first stack: its "up in" should not count a build
            await asyncio.to_thread(kubebuild.build)
        except ControlPlaneUnavailable as e:
            raise DemoError(str(e)) from None
    results: dict[Policy, tuple[int, int]] = {}
    for i, policy in enumerate(opts.policies):
        keep = opts.keep_running and i == len(opts.policies) - 1
        results[policy] = await run_policy(
            policy, opts.nodes, opts.machine, workload, out,
            keep_running=keep, earlier=results, control_plane=opts.control_plane, mode=opts.mode,
        )  # fmt: skip
    print_results(results, out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.INFO if opts.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(amain(opts, sys.stdout))
    except KeyboardInterrupt:
        print("\ninterrupted: sandbox stopped", file=sys.stderr)
        return 130
    except asyncio.CancelledError:  # SIGTERM, see amain
        print("\nterminated: sandbox stopped", file=sys.stderr)
        return 143
    except DemoError as e:
        print(f"sharepack-demo: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
