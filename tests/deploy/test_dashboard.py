"""deploy/grafana/sharepack.json asks only for metrics that the running processes export: every
PromQL expression is parsed, and each metric name it uses must appear in a scrape of a real
extender process and a real agent process; the label names it filters or groups by must be on
one of the metrics it selects (the processes are driven first, so that labelled series exist:
an allocation and an XID on the agent, a published state and a request on the extender)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prometheus_client.parser import text_string_to_metric_families

from sharepack.agent.nvmlsim import control_line
from sharepack.common.devices import physical_key
from sharepack.sandbox.apiserver.server import FakeApiServer
from sharepack.sandbox.kubelet.devicemanager import FakeKubelet
from tests.agent.harness import pod, stop_process
from tests.agent.test_cli import _Lines
from tests.agent.test_monitoring import agent_process
from tests.extender.test_service import publish

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "sharepack.json"

# Aggregations and functions the dashboard may call, and the words PromQL reserves.
FUNCTIONS = frozenset({
    "sum", "max", "min", "avg", "count", "topk", "bottomk", "rate", "irate", "increase", "delta",
    "histogram_quantile", "vector", "clamp_min", "clamp_max", "abs", "label_values",
})  # fmt: skip
KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"})
LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def label_names(expr: str) -> set[str]:
    """Label names an expression matches on (`{a="x"}`) or groups by (`by (a, b)`)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    names = {m for block in re.findall(r"\{([^}]*)\}", text) for m in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", block)}
    for block in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        names |= {n.strip() for n in block.split(",") if n.strip()}
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (label matchers, ranges, label lists, strings
    and numbers removed; what is left is functions, keywords and metric names)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = LABEL_LISTS.sub("", text)
    text = re.sub(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        token = match.group()
        if text[match.end():].lstrip().startswith("("):
            assert token in FUNCTIONS, f"{token}(...) in {expr!r} is not a function this test knows"
        elif token not in KEYWORDS:
            names.add(token)
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        pytest.param('histogram_quantile(0.99, sum by (le, verb) (rate(x_seconds_bucket{verb="bind"}[$__rate_interval])))',
                     {"x_seconds_bucket"}, id="a quantile over a histogram names its bucket series"),
        pytest.param('sum(increase(a_total{outcome="match"}[$__range])) / sum(increase(a_total[$__range]))', {"a_total"},
                     id="a ratio of one counter"),
        pytest.param('count(b == 0) or vector(0)', {"b"}, id="comparisons, or and vector"),
        pytest.param('sum by (node) (c{node=~"$node", x="sum(d)"}) / on (node) e', {"c", "e"},
                     id="label values and label lists are not metrics"),
    ],
)  # fmt: skip
def test_metric_names_are_found_in_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_label_names_are_found_in_promql() -> None:
    expr = 'sum by (node, gpu) (a{node=~"$node", x!="y{z=1}"}) / on (node) b{le="0.5"}'
    assert label_names(expr) == {"node", "gpu", "x", "le"}


def expressions(doc: Any) -> Iterator[str]:
    """Every PromQL expression of the dashboard: panel targets (rows included) and the
    `label_values(metric, label)` queries of its variables (as the metric selector)."""
    for panel in doc["panels"]:
        for inner in (panel, *panel.get("panels", ())):
            for target in inner.get("targets", ()):
                yield target["expr"]
    for variable in doc["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            found = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            assert found, f"variable {variable['name']}: {query}"
            yield found.group(1)


def exported(text: str) -> dict[str, set[str]]:
    """Series name -> the label names its samples carry. Every family's TYPE line counts (a
    labelled family shows no sample before its first use), histograms with their `_bucket`,
    `_sum` and `_count`."""
    names: dict[str, set[str]] = {}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        for suffix in suffixes:
            names[name + suffix] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


async def scrape(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as resp:
        assert resp.status == 200, f"{url}: HTTP {resp.status}"
        return await resp.text()


async def extender_metrics(root: Path) -> str:
    """A real extender on the sandbox API server with one node's published state, after one
    /filter call."""
    async with FakeApiServer() as api:
        publish(api, "node-0", [(4, 1, ("p0",)), (4, 0, ())])
        kubeconfig = api.write_kubeconfig(root / "kubeconfig")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sharepack.extender", "--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig), "--insecure-http",
            stderr=asyncio.subprocess.PIPE, cwd=ROOT,
        )  # fmt: skip
        assert proc.stderr is not None
        try:
            line = await _Lines(proc.stderr).wait_for(r"serving on 127\.0\.0\.1:\d+")
            port = re.search(r"127\.0\.0\.1:(\d+)", line)
            assert port is not None
            base = f"http://127.0.0.1:{port.group(1)}"
            async with aiohttp.ClientSession() as session:
                async with asyncio.timeout(20):
                    while 'node="node-0"' not in await scrape(session, base + "/metrics"):
                        await asyncio.sleep(0.05)
                async with session.post(base + "/filter", data=b"{") as resp:
                    assert resp.status == 400  # counted like any request
                return await scrape(session, base + "/metrics")
        finally:
            await stop_process(proc)


async def agent_metrics(root: Path) -> str:
    """A real agent after one allocation and one XID."""
    control = root / "nvml-control"
    control.touch()
    async with FakeKubelet(root) as kubelet, agent_process(kubelet, control) as (http, _):
        await http.wait_ready()
        admission = await kubelet.admit_pod(pod("a", "nvidia.com/gpu"))
        (device,) = admission.devices("main", "nvidia.com/gpu")
        with control.open("a") as f:
            f.write(control_line(physical_key(device), 79))
        async with asyncio.timeout(20):
            while "sharepack_agent_xids_total{" not in (text := (await http.get("/metrics"))[1]):
                await asyncio.sleep(0.05)
        return text


async def test_every_metric_the_dashboard_queries_is_exported() -> None:
    doc = json.loads(DASHBOARD.read_text())
    used = {name: expr for expr in expressions(doc) for name in metric_names(expr)}
    assert any(n.startswith("sharepack_extender_") for n in used) and any(n.startswith("sharepack_agent_") for n in used)
    root = Path(tempfile.mkdtemp(prefix="spd-", dir="/tmp"))
    try:
        available = exported(await extender_metrics(root)) | exported(await agent_metrics(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    missing = {name: expr for name, expr in used.items() if name not in available}
    assert not missing, f"the dashboard queries metrics no process exports: {missing}"
    for expr in expressions(doc):
        carried = set().union(*(available[n] for n in metric_names(expr)))
        assert label_names(expr) <= carried, f"{expr}: no metric it selects has {label_names(expr) - carried}"
