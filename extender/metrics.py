"""Prometheus text exposition for the extender, without a client library.

Counters and histograms are plain ints and lists updated on the event loop thread; recording
one observation is a bisect and two increments, cheap enough for the prioritize path.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# Seconds. Dense below 5 ms: that is the budget at 1,000 nodes.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; +Inf last
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1


def _escape(value: str) -> str:
    # The exposition format escapes backslash, double quote and newline in label values.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Mapping[str, str]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items()) + "}"


def _num(v: float) -> str:
    if v == int(v):
        return str(int(v))
    return repr(v)


class Metrics:
    """Everything /metrics shows. Gauges are read through callbacks at scrape time."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}  # (verb, http code) -> count
        self.latency: dict[str, Histogram] = {}
        self.predictions: dict[str, int] = {"match": 0, "mismatch": 0}
        self.binds: dict[str, int] = {"success": 0, "error": 0}
        self.bind_refusals: dict[str, int] = {}  # bindguard rule -> count
        self.gauges: dict[str, tuple[str, Callable[[], float]]] = {}

    def observe(self, verb: str, code: int, seconds: float) -> None:
        key = (verb, code)
        self.requests[key] = self.requests.get(key, 0) + 1
        h = self.latency.get(verb)
        if h is None:
            h = self.latency[verb] = Histogram()
        h.observe(seconds)

    def prediction(self, match: bool) -> None:
        self.predictions["match" if match else "mismatch"] += 1

    def bind_refused(self, rule: str) -> None:
        self.bind_refusals[rule] = self.bind_refusals.get(rule, 0) + 1

    def gauge(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        self.gauges[name] = (help_text, read)

    def render(self) -> str:
        lines: list[str] = []

        def head(name: str, kind: str, help_text: str) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")

        head("sharepack_extender_requests_total", "counter", "Extender HTTP requests by verb and code.")
        for (verb, code), n in sorted(self.requests.items()):
            lines.append(
                f"sharepack_extender_requests_total{_labels({'verb': verb, 'code': str(code)})} {n}"
            )
        name = "sharepack_extender_request_duration_seconds"
        head(name, "histogram", "Time from request read to reply written, by verb.")
        for verb, h in sorted(self.latency.items()):
            cumulative = 0
            for bound, n in zip((*h.buckets, float("inf")), h.counts):
                cumulative += n
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f"{name}_bucket{_labels({'verb': verb, 'le': le})} {cumulative}")
            lines.append(f"{name}_sum{_labels({'verb': verb})} {_num(h.total)}")
            lines.append(f"{name}_count{_labels({'verb': verb})} {h.n}")
        head(
            "sharepack_extender_predictions_total",
            "counter",
            "Predicted vs reported physical GPUs of pods once their node's agent counts them.",
        )
        for outcome, n in self.predictions.items():
            lines.append(f"sharepack_extender_predictions_total{_labels({'outcome': outcome})} {n}")
        head("sharepack_extender_binds_total", "counter", "Bindings created by /bind, by result.")
        for result, n in self.binds.items():
            lines.append(f"sharepack_extender_binds_total{_labels({'result': result})} {n}")
        name = "sharepack_extender_bind_refusals_total"
        head(name, "counter", "/bind requests refused, by the rule that failed (docs/security.md).")
        for rule, n in sorted(self.bind_refusals.items()):
            lines.append(f"{name}{_labels({'rule': rule})} {n}")
        for gname, (help_text, read) in sorted(self.gauges.items()):
            head(gname, "gauge", help_text)
            lines.append(f"{gname} {_num(float(read()))}")
        return "\n".join(lines) + "\n"


def parse_text(text: str) -> dict[str, float]:
    """Sample name with labels -> value (for tests and the benchmark)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out
