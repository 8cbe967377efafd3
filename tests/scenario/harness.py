"""Helpers for the end-to-end scenarios: the demo's sandbox, driven pod by pod, and what the
published `NodeGpuState` objects, the kubelets and the extender's `/metrics` say about it.

Everything runs through the real processes (one `python -m sharepack.agent` per node, one
`python -m sharepack.extender`), started by `sandbox.demo.Sandbox`. Waits poll observable state (the API
objects, the extender's metrics, the kubelet) against generous deadlines: the machine is shared
and often loaded, and a deadline only bounds a failure, it never orders events.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import kubernetes

from sharepack.agent.podresources import PodResourcesClient
from sharepack.common import devices, directions, podrequests, scoring
from sharepack.common import state as gpustate
from sharepack.common.errors import StateSchemaError
from sharepack.common.policies import Policy
from sharepack.sandbox.drivers import demo
from sharepack.sandbox.drivers.demo import SHARED_RESOURCE, Sandbox, Wave, Workload
from sharepack.sandbox.kubelet.nodes import SimulatedNode

MACHINE = "t4-pcie"  # 4 GPUs, no MIG
REPLICAS = 4  # time-slicing replicas per GPU
WAIT_S = 30.0  # generous: a deadline only bounds a failure
POLL_S = 0.05

T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str, *, timeout: float = WAIT_S) -> T:
    """The first non-None, non-False result of `probe`, polled until `timeout`."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = await probe()
            if value is not None and value is not False:
                return value
        except (kubernetes.client.ApiException, StateSchemaError, aiohttp.ClientError, OSError) as e:
            last = e
        if time.monotonic() > deadline:
            why = f" (last error: {last})" if last else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{why}")
        await asyncio.sleep(POLL_S)


def short_root(prefix: str) -> Path:
    """A temp dir short enough for unix socket paths (< 100 chars)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


# --- what a sandbox leaves running ---------------------------------------------------------


def children(pid: int) -> set[int]:
    """Live children of `pid`, from /proc (psutil is not a dependency)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out.update(int(c) for c in (task / "children").read_text().split())
        except OSError:  # the thread ended meanwhile
            continue
    return out


def processes_mentioning(paths: list[Path]) -> list[str]:
    """Every process on the machine whose command line names one of `paths` (orphans included:
    an agent or extender whose parent died is reparented, but still names its sandbox dir)."""
    needles = [str(p).rstrip("/").encode() + b"/" for p in paths]  # every arg naming it goes inside
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if any(n in cmdline for n in needles):
            found.append(entry.name + ": " + cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def _ctrl_c_as_in_a_shell() -> None:
    """A shell's foreground job takes Ctrl-C by default; a test run started in the background
    (`cmd &` in a script: SIGINT ignored, and inherited) must not make the demo deaf to it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def demo_in_its_own_group(argv: Sequence[str]) -> Iterator[tuple[subprocess.Popen[bytes], list[Path]]]:
    """`sharepack-demo argv` as a user starts it from a shell (its own process group, so a
    Ctrl-C reaches its agents and extender too), with the list the caller fills with the stack's
    roots. Whatever happens, nothing of the group outlives the block and the roots are gone."""
    with subprocess.Popen(
        [sys.executable, "-m", "sharepack.sandbox.drivers.demo", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
        preexec_fn=_ctrl_c_as_in_a_shell,
    ) as proc:  # fmt: skip
        roots: list[Path] = []
        try:
            yield proc, roots
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # ours: its own session
            proc.wait()
            for root in roots:
                shutil.rmtree(root, ignore_errors=True)


def unix_sockets_under(paths: list[Path]) -> list[str]:
    """Bound unix sockets (whoever holds them, even if their file is gone) under `paths`."""
    prefixes = tuple(str(p).rstrip("/") + "/" for p in paths)
    found = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 8:
            path = "/" + parts[7].lstrip("/")  # grpc binds some as "///tmp/..."
            if path.startswith(prefixes):
                found.append(path)
    return found


# --- the published state --------------------------------------------------------------------


def pods_on(state: gpustate.NodeState) -> set[str]:
    res = state.resource(SHARED_RESOURCE)
    return {p for g in res.gpus for p in g.pods} if res else set()


def gpus_of(state: gpustate.NodeState, uid: str) -> frozenset[str]:
    """Physical GPUs the published state says the pod holds."""
    return scoring.placed_gpus(state, uid).get(SHARED_RESOURCE, frozenset())


def whole_gpu_holders(states: Mapping[str, gpustate.NodeState]) -> set[str]:
    """UIDs of pods that hold every replica of one GPU, alone (what a full-GPU pod needs)."""
    out = set()
    for st in states.values():
        res = st.resource(SHARED_RESOURCE)
        for g in res.gpus if res else ():
            if len(g.pods) == 1 and g.allocated == g.total:
                out.add(g.pods[0])
    return out


def free_gpus(states: Mapping[str, gpustate.NodeState]) -> int:
    """GPUs with no replica taken, over all nodes."""
    count = 0
    for st in states.values():
        res = st.resource(SHARED_RESOURCE)
        count += sum(1 for g in res.gpus if g.allocated == 0 and g.unhealthy == 0) if res else 0
    return count


async def node_states(box: Sandbox) -> dict[str, gpustate.NodeState]:
    return dict(zip((n.name for n in box.nodes), await box.node_states(), strict=True))


# --- the extender's metrics -----------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: `name{labels}` -> value (our own reader, independent of extender.metrics)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


async def extender_metrics(box: Sandbox) -> dict[str, float]:
    async with box.session.get(f"{box.extender_url}/metrics") as resp:
        assert resp.status == 200, f"/metrics: HTTP {resp.status}"
        return parse_metrics(await resp.text())


def predictions(metrics: Mapping[str, float]) -> tuple[int, int]:
    """(match, mismatch) counts of `sharepack_extender_predictions_total`."""
    name = "sharepack_extender_predictions_total"
    return int(metrics.get(f'{name}{{outcome="match"}}', 0)), int(metrics.get(f'{name}{{outcome="mismatch"}}', 0))


async def wait_settled(box: Sandbox, expected: int) -> tuple[int, int]:
    """Wait until the extender has compared `expected` predictions with what agents report."""

    async def probe() -> tuple[int, int] | None:
        counts = predictions(await extender_metrics(box))
        return counts if sum(counts) >= expected else None

    return await eventually(probe, f"the extender to settle {expected} predictions")


async def wait_stack_ready(box: Sandbox) -> dict[str, gpustate.NodeState]:
    """Every node has published its state and the extender's cache holds every node.

    The demo does not wait for this; a pod scheduled earlier is scored as on an unknown node
    (and its prediction is never checked), so the scenarios do.
    """
    states = await eventually(lambda: node_states(box), "every node to publish its NodeGpuState")

    async def extender_knows_all() -> bool:
        m = await extender_metrics(box)
        return m.get("sharepack_extender_cache_nodes") == len(box.nodes)

    await eventually(extender_knows_all, "the extender to cache every node's state")
    return states


# --- pods -----------------------------------------------------------------------------------


def pod_body(name: str, replicas: int) -> dict[str, Any]:
    """The demo's pod: one container with `replicas` of the shared resource as a limit."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": demo.NAMESPACE},
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


async def read_pod(box: Sandbox, name: str) -> dict[str, Any]:
    core: Any = kubernetes.client.CoreV1Api(box.api)
    pod = await asyncio.to_thread(core.read_namespaced_pod, name, demo.NAMESPACE)
    doc: dict[str, Any] = box.api.sanitize_for_serialization(pod)
    return doc


def node_named(box: Sandbox, name: str) -> SimulatedNode:
    return next(n for n in box.nodes if n.name == name)


def kubelet_gpus(node: SimulatedNode, uid: str) -> Counter[str]:
    """Replicas per physical GPU the node's kubelet actually gave the pod (via the agent)."""
    return Counter(devices.physical_key(d) for d in node.kubelet.admission(uid).held(SHARED_RESOURCE))


def kubelet_held(node: SimulatedNode) -> Counter[str]:
    """Replicas per physical GPU the node's kubelet holds, for any pod."""
    return Counter(devices.physical_key(d) for d in node.kubelet.allocated(SHARED_RESOURCE))


def published_allocated(state: gpustate.NodeState) -> Counter[str]:
    """Replicas per physical GPU the published state counts as held (GPUs with none left out)."""
    res = state.resource(SHARED_RESOURCE)
    return +Counter({g.key: g.allocated for g in res.gpus}) if res else Counter()


@dataclass(frozen=True, slots=True)
class PodOutcome:
    name: str
    wave: str
    uid: str
    node: str | None
    reason: str
    predicted: Counter[str]  # scoring's placement on the chosen node, from the state before the pod
    admitted: Counter[str]  # what the kubelet holds for the pod (device IDs -> physical GPU)
    published: frozenset[str]  # physical GPUs the node's NodeGpuState lists the pod on
    scores: Mapping[str, int]
    directed: Counter[str] = field(default_factory=Counter)  # its sharepack.io/gpus annotation, per GPU
    held: Counter[str] = field(default_factory=Counter)  # what PodResources lists for it, per GPU

    def describe(self) -> str:
        return (
            f"{self.name} -> {self.node}: predicted {dict(self.predicted)}, kubelet "
            f"{dict(self.admitted)}, published {sorted(self.published)}, scores {dict(self.scores)}"
        )


async def run_serial_pod(box: Sandbox, wave: Wave, i: int, node_policy: Policy) -> PodOutcome:
    """One pod of a serial stream through the demo's own path (`Sandbox.run_pod`), recording
    what `common.scoring` predicts on the chosen node from the state published just before."""
    before = await node_states(box)
    name = f"{wave.name}-{i}"
    decision, _ = await box.run_pod(name, wave.replicas)
    doc = await read_pod(box, name)
    uid = doc["metadata"]["uid"]
    if decision.node is None:
        return PodOutcome(name, wave.name, uid, None, decision.reason, Counter(), Counter(), frozenset(), {})
    node = node_named(box, decision.node)
    request = podrequests.decode_pod_request(doc)
    predicted = scoring.score_node(before[decision.node], request, node_policy)
    after = await node_states(box)
    return PodOutcome(
        name=name,
        wave=wave.name,
        uid=uid,
        node=decision.node,
        reason=decision.reason or predicted.reason,
        predicted=Counter(predicted.placement.get(SHARED_RESOURCE, ())),
        admitted=kubelet_gpus(node, uid),
        published=gpus_of(after[decision.node], uid),
        scores=dict(decision.scores),
        directed=directed_gpus(doc, decision.node),
        held=await podresources_gpus(node, name),
    )


def directed_gpus(doc: Mapping[str, Any], node: str) -> Counter[str]:
    """Replicas per physical GPU the pod's `sharepack.io/gpus` annotation directs (none: empty)."""
    text = (doc.get("metadata", {}).get("annotations") or {}).get(directions.ANNOTATION)
    if text is None:
        return Counter()
    d = directions.decode(text, where=f"pod {doc['metadata']['name']}")
    assert d.node == node, f"directed to {d.node}, bound to {node}"
    return Counter(directions.placement(d).get(SHARED_RESOURCE, ()))


async def podresources_gpus(node: SimulatedNode, name: str) -> Counter[str]:
    """Replicas per physical GPU the node's PodResources API lists for pod `name` (over gRPC,
    as the agent reads it)."""
    async with PodResourcesClient(node.kubelet.pod_resources_socket) as client:
        pods = await client.list()
    ids = next((p.devices.get(SHARED_RESOURCE, frozenset()) for p in pods if (p.namespace, p.name) == (demo.NAMESPACE, name)), frozenset())
    return Counter(devices.physical_key(d) for d in ids)


@dataclass(frozen=True, slots=True)
class StreamResult:
    policy: Policy
    outcomes: tuple[PodOutcome, ...]
    after_shared: Mapping[str, gpustate.NodeState]
    final: Mapping[str, gpustate.NodeState]
    predictions: tuple[int, int]  # (match, mismatch) from the extender's /metrics
    seconds: float  # start of the sandbox to the end of the stream
    startup_s: float  # start of the sandbox until every node's state is cached by the extender
    missed: tuple[str, ...]  # the extender's "prediction missed" log lines
    directed: tuple[int, tuple[str, ...]]  # agents' honoured directed allocations, fallback lines
    while_up: Residue  # what the sandbox had running (proves the detectors see something)
    after: Residue  # what it left once stopped: nothing, or a bug
    control_plane: str = demo.IN_PROCESS
    scheduled_by: Mapping[str, str] | None = None  # pod name -> who its Scheduled event names

    def wave(self, name: str) -> list[PodOutcome]:
        return [o for o in self.outcomes if o.wave == name]


async def scheduled_events(box: Sandbox) -> dict[str, str]:
    """Pod name -> the reporting controller of its `Scheduled` event (events.k8s.io/v1, as
    kube-scheduler records them)."""
    events: Any = kubernetes.client.EventsV1Api(box.api)
    listed = await asyncio.to_thread(events.list_namespaced_event, demo.NAMESPACE)
    return {
        e.regarding.name: e.reporting_controller
        for e in listed.items
        if e.reason == "Scheduled" and e.regarding is not None and e.regarding.kind == "Pod"
    }


async def run_stream(
    policy: Policy, nodes: int, waves: Sequence[Wave], *, control_plane: str = demo.IN_PROCESS
) -> StreamResult:
    """A fresh sandbox with `policy` on every agent and on the extender; the waves, one pod at
    a time, each pod published before the next is scheduled (a serial stream)."""
    started = time.monotonic()
    root = short_root("spsc-")
    before = children(os.getpid())
    try:
        workload = Workload(REPLICAS, tuple(waves))
        async with Sandbox(policy, nodes, MACHINE, workload, root, control_plane=control_plane) as box:
            await wait_stack_ready(box)
            startup_s = time.monotonic() - started
            outcomes: list[PodOutcome] = []
            after_shared: Mapping[str, gpustate.NodeState] = {}
            for wave in waves:
                for i in range(wave.count):
                    outcomes.append(await run_serial_pod(box, wave, i, policy))
                if not wave.whole_gpu:
                    after_shared = await node_states(box)
            final = await node_states(box)
            placed = sum(1 for o in outcomes if o.node is not None)
            counts = await wait_settled(box, placed)
            scheduled_by = await scheduled_events(box) if box.real is not None else None
            seconds = time.monotonic() - started
            while_up = residue(root, before)
        after = residue(root, before)
        log = (root / "extender.log").read_text(errors="replace")
        missed = tuple(line for line in log.splitlines() if "prediction missed" in line)
        return StreamResult(
            policy, tuple(outcomes), after_shared, final, counts, seconds, startup_s, missed,
            directed_allocations(root), while_up, after, control_plane, scheduled_by,
        )  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


def directed_allocations(root: Path) -> tuple[int, tuple[str, ...]]:
    """From the agents' logs (agent.directing): how many directed allocations were honoured,
    and the lines explaining each fallback."""
    honoured, fallbacks = 0, []
    for log in sorted(root.glob("agent-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "directed allocation honoured" in line:
                honoured += 1
            elif "directed allocation not used" in line:
                fallbacks.append(line)
    return honoured, tuple(fallbacks)


@dataclass(frozen=True, slots=True)
class Residue:
    children: frozenset[int]  # our child processes not there before the sandbox
    processes: tuple[str, ...]  # any process naming the sandbox's dir (orphans included)
    bound_sockets: tuple[str, ...]  # unix sockets bound under the dir, by anyone
    socket_files: tuple[str, ...]  # socket files under the dir
    tasks: tuple[str, ...]  # asyncio tasks of this loop besides the current one


def residue(root: Path, children_before: set[int]) -> Residue:
    current = asyncio.current_task()
    return Residue(
        children=frozenset(children(os.getpid()) - children_before),
        processes=tuple(processes_mentioning([root])),
        bound_sockets=tuple(unix_sockets_under([root])),
        socket_files=socket_files(root),
        tasks=tuple(t.get_name() for t in asyncio.all_tasks() if t is not current and not t.done()),
    )


def socket_files(root: Path) -> tuple[str, ...]:
    out = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    out.append(path)
    return tuple(sorted(out))
