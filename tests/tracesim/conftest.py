"""Small traces written as CSV, in the trace's own layout, for the simulator tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sharepack.tracesim import traces
from sharepack.tracesim.clusters import Cluster
from sharepack.tracesim.fragmentation import FragModel
from sharepack.tracesim.workloads import typical_workload

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"


def pod_csv(rows: list[tuple[str, int, int, int, int, str]]) -> str:
    lines = [POD_HEADER]
    lines += [f"{n},{c},{m},{g},{mi},{spec},LS,Running,0,1,0" for n, c, m, g, mi, spec in rows]
    return "\n".join(lines) + "\n"


def node_csv(rows: list[tuple[str, int, int, int, str]]) -> str:
    return "\n".join([NODE_HEADER] + [f"{n},{c},{m},{g},{model}" for n, c, m, g, model in rows]) + "\n"


@pytest.fixture
def pod_lines() -> Callable[[list[tuple[str, int, int, int, int, str]]], str]:
    return pod_csv


@pytest.fixture
def node_lines() -> Callable[[list[tuple[str, int, int, int, str]]], str]:
    return node_csv


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return _write


SMALL_NODES = [
    ("node-a", 32000, 131072, 4, "T4"),
    ("node-b", 32000, 131072, 4, "T4"),
    ("node-c", 64000, 262144, 8, "V100M32"),
    ("node-d", 16000, 65536, 2, "P100"),
]

SMALL_PODS = [
    ("pod-00", 4000, 8192, 1, 500, ""),
    ("pod-01", 4000, 8192, 1, 500, ""),
    ("pod-02", 4000, 8192, 1, 250, ""),
    ("pod-03", 8000, 16384, 1, 1000, ""),
    ("pod-04", 8000, 16384, 2, 1000, ""),
    ("pod-05", 2000, 4096, 0, 0, ""),
    ("pod-06", 4000, 8192, 1, 500, "V100M32"),
    ("pod-07", 16000, 32768, 4, 1000, ""),
    ("pod-08", 4000, 8192, 1, 750, ""),
    ("pod-09", 4000, 8192, 1, 250, "T4|P100"),
]


@pytest.fixture
def small(write: Callable[[str, str], Path]) -> tuple[traces.PodList, traces.NodeList]:
    pods = traces.load_pods(write("pods.csv", pod_csv(SMALL_PODS)))
    nodes = traces.load_nodes(write("nodes.csv", node_csv(SMALL_NODES)))
    return pods, nodes


@pytest.fixture
def small_cluster(small: tuple[traces.PodList, traces.NodeList]) -> Cluster:
    pods, nodes = small
    return Cluster(nodes, FragModel.build(typical_workload(pods, threshold=1.0), nodes))
