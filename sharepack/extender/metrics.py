"""The extender's Prometheus metrics (prometheus_client), in a registry of the `Metrics` object.

Every name below is part of the interface (docs, deploy/grafana/sharepack.json, the scenario
tests read them); rename none without updating those.

* Request path: `observe` keeps the labelled children of the request counter and the latency
  histogram in dicts, so one request costs two lookups, one increment and one histogram
  observation (a few microseconds; the benchmark in benchmarks/bench_extender.py measures it).
* Per node and per GPU gauges (allocation, whole GPUs free, stranded replicas): `node_gauges`
  turns a node's published state into a `NodeGauges` when its values change (ClusterView calls
  it; a heartbeat keeps the old one). The library formats a node's samples once, at the first
  scrape after the change, and keeps the text; a scrape joins the nodes' texts under one
  HELP/TYPE header per family, in a worker thread over a snapshot. Formatting every sample on
  every scrape cost 0.3-0.5 s at 1,000 nodes (about 3 series per GPU) on our shared 2-core machine
  and held the event loop's GIL while scheduling requests waited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

from sharepack.common.capacity import capacity
from sharepack.common.state import NodeState

# A `_created` series per counter and histogram doubles what Prometheus stores and says nothing
# a restart-aware rate() does not; process-wide, so set once here.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# Seconds. Dense below 5 ms: that is the budget at 1,000 nodes.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip

GPU_ALLOCATED = "sharepack_extender_gpu_devices_allocated"
GPU_TOTAL = "sharepack_extender_gpu_devices_total"
GPU_UNHEALTHY = "sharepack_extender_gpu_devices_unhealthy"
NODE_WHOLE_GPUS_FREE = "sharepack_extender_node_whole_gpus_free"
NODE_STRANDED = "sharepack_extender_node_stranded_replicas"


@dataclass(frozen=True, slots=True)
class GpuRow:
    resource: str
    gpu: str  # the GPU's index on its node
    allocated: int
    total: int
    unhealthy: int


class NodeGauges:
    """One node's gauge values, and (after the first scrape that shows them) their text."""

    __slots__ = ("node", "values", "_text")

    def __init__(self, node: str, whole_gpus_free: int, stranded: int, gpus: tuple[GpuRow, ...]) -> None:
        self.node = node
        self.values = (whole_gpus_free, stranded, gpus)
        self._text: dict[str, bytes] | None = None

    @property
    def whole_gpus_free(self) -> int:
        return self.values[0]

    @property
    def stranded(self) -> int:
        return self.values[1]

    @property
    def gpus(self) -> tuple[GpuRow, ...]:
        return self.values[2]

    def text(self) -> dict[str, bytes]:
        """Family name -> this node's sample lines, formatted by the library once."""
        if self._text is None:  # two scrapes at once may both format it: same result
            self._text = _by_family(generate_latest(_NodeRows((self,))))
        return self._text


def node_gauges(node: str, state: NodeState) -> NodeGauges:
    c = capacity(state)
    rows = tuple(
        GpuRow(res.name, g.index, g.allocated, g.total, g.unhealthy) for res in state.resources for g in res.gpus
    )
    return NodeGauges(node, c.whole_gpus_free, c.stranded, rows)


def _by_family(text: bytes) -> dict[str, bytes]:
    """Exposition text split into its families: name -> the lines under its HELP/TYPE."""
    out: dict[str, list[bytes]] = {}
    lines: list[bytes] = []
    for line in text.splitlines(keepends=True):
        if line.startswith(b"# HELP "):
            lines = out.setdefault(line.split(b" ", 3)[2].decode(), [])
        elif not line.startswith(b"#"):
            lines.append(line)
    return {name: b"".join(ls) for name, ls in out.items()}


def _headers() -> list[tuple[str, bytes]]:
    """(family name, its HELP and TYPE lines) of the per-node families, in order."""
    out: list[tuple[str, bytes]] = []
    for line in generate_latest(_NodeRows(())).splitlines(keepends=True):
        if line.startswith(b"# HELP "):
            out.append((line.split(b" ", 3)[2].decode(), line))
        else:
            name, head = out[-1]
            out[-1] = (name, head + line)
    return out


def render_nodes(nodes: Iterable[NodeGauges]) -> bytes:
    """The per-node families: each header once, then every node's lines of that family."""
    nodes = tuple(nodes)
    parts: list[bytes] = []
    for name, head in _HEADERS:
        parts.append(head)
        parts.extend(n.text().get(name, b"") for n in nodes)
    return b"".join(parts)


class _NodeRows(Collector):
    """A prometheus_client collector over `NodeGauges` (only for formatting: see `render_nodes`)."""

    def __init__(self, nodes: Iterable[NodeGauges]) -> None:
        self._nodes = tuple(nodes)

    def collect(self) -> Iterator[Metric]:
        gpu_labels = ["node", "resource", "gpu"]
        allocated = GaugeMetricFamily(GPU_ALLOCATED, "Devices (replicas, MIG instances) of a GPU held by pods, "
                                      "as its node's agent last published.", labels=gpu_labels)  # fmt: skip
        total = GaugeMetricFamily(GPU_TOTAL, "Devices a GPU serves for a resource.", labels=gpu_labels)
        unhealthy = GaugeMetricFamily(GPU_UNHEALTHY, "Devices of a GPU unhealthy and not held.", labels=gpu_labels)
        free = GaugeMetricFamily(NODE_WHOLE_GPUS_FREE, "GPUs of a node with no device held or unhealthy in any "
                                 "resource (what a whole-GPU pod needs).", labels=["node"])  # fmt: skip
        stranded = GaugeMetricFamily(NODE_STRANDED, "Free devices on GPUs of a node that are partly taken: they "
                                     "serve shares, never a whole GPU.", labels=["node"])  # fmt: skip
        for n in self._nodes:
            free.add_metric([n.node], n.whole_gpus_free)
            stranded.add_metric([n.node], n.stranded)
            for g in n.gpus:
                labels = [n.node, g.resource, g.gpu]
                allocated.add_metric(labels, g.allocated)
                total.add_metric(labels, g.total)
                unhealthy.add_metric(labels, g.unhealthy)
        yield from (allocated, total, unhealthy, free, stranded)


class Metrics:
    """Everything /metrics shows. Simple gauges are read through callbacks at scrape time."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("sharepack_extender_requests", "Extender HTTP requests by verb and code.",
                                ["verb", "code"], registry=r)  # fmt: skip
        self.latency = Histogram("sharepack_extender_request_duration_seconds",
                                 "Time from request read to reply written, by verb.", ["verb"],
                                 buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.predictions = Counter(
            "sharepack_extender_predictions",
            "Predicted vs reported physical GPUs of pods once their node's agent counts them.",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.binds = Counter("sharepack_extender_binds", "Bindings created by /bind, by result.", ["result"], registry=r)
        self.bind_refusals = Counter(
            "sharepack_extender_bind_refusals", "/bind requests refused, by the rule that failed (docs/security.md).",
            ["rule"], registry=r,
        )  # fmt: skip
        self.connections = Counter(
            "sharepack_extender_connections", "TLS connections to the verbs' port, by the protocol ALPN chose "
            "(kube-scheduler's client takes h2 when offered: one connection for every call).",
            ["protocol"], registry=r,
        )  # fmt: skip
        for outcome in ("match", "mismatch"):
            self.predictions.labels(outcome)  # shown at 0 before the first one
        for result in ("success", "error"):
            self.binds.labels(result)
        self._requests: dict[tuple[str, int], Callable[[], None]] = {}
        self._latency: dict[str, Callable[[float], None]] = {}
        self._nodes: Callable[[], Iterable[NodeGauges]] = tuple
        self._gauges: dict[str, Gauge] = {}

    def observe(self, verb: str, code: int, seconds: float) -> None:
        inc = self._requests.get((verb, code))
        if inc is None:
            inc = self._requests[(verb, code)] = self.requests.labels(verb, str(code)).inc
        observe = self._latency.get(verb)
        if observe is None:
            observe = self._latency[verb] = self.latency.labels(verb).observe
        inc()
        observe(seconds)

    def prediction(self, match: bool) -> None:
        self.predictions.labels("match" if match else "mismatch").inc()

    def bind(self, ok: bool) -> None:
        self.binds.labels("success" if ok else "error").inc()

    def bind_refused(self, rule: str) -> None:
        self.bind_refusals.labels(rule).inc()

    def connection(self, protocol: str) -> None:
        self.connections.labels(protocol).inc()

    def gauge(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """A gauge read at scrape time; naming one again rebinds it (to the newest reader)."""
        gauge = self._gauges.get(name)
        if gauge is None:
            gauge = self._gauges[name] = Gauge(name, help_text, registry=self.registry)
        gauge.set_function(read)

    def node_rows(self, nodes: Callable[[], Iterable[NodeGauges]]) -> None:
        """Where the per node and per GPU gauges come from (called on the loop per scrape:
        it must return a snapshot, not a live view)."""
        self._nodes = nodes

    def value(self, name: str, **labels: str) -> float:
        """One sample's value (0 when absent): for tests and logs."""
        return self.registry.get_sample_value(name, labels) or 0.0

    async def render(self) -> bytes:
        """The exposition text. Counters and callback gauges are read on the loop (the
        callbacks read loop-owned caches); the per-node rows are formatted in a thread."""
        head = generate_latest(self.registry)
        return head + await asyncio.to_thread(render_nodes, self._nodes())


_HEADERS = _headers()


def parse_text(text: str) -> dict[str, float]:
    """Sample -> value, keyed `name{a="x",b="y"}` with labels in name order (as this library
    writes them): for the tests and the demo."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out
