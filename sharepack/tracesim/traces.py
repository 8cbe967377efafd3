"""Pod and node lists of the Alibaba GPU trace (cluster-trace-gpu-v2023), as column arrays.

The columns follow the trace's CSV layout. Values are normalised the way the FGD study's
converter turned them into Kubernetes objects: a GPU pod's per-GPU share (`gpu_milli`) is clamped
to 1..1000, and a pod that asks for GPUs with a zero share is a CPU pod (the study's GPU filter
skips it, and it adds nothing to the GPU totals).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from sharepack.tracesim.errors import TraceError

MILLI = 1000
DEFAULT_PODS = "openb_pod_list_default.csv"
DEFAULT_NODES = "openb_node_list_gpu_node.csv"

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class PodList:
    source: str
    names: tuple[str, ...]
    cpu: IntArray  # milli-CPU requested
    memory: IntArray  # MiB requested
    num_gpu: IntArray  # GPUs requested (0 for CPU pods)
    milli: IntArray  # per-GPU share, 1..1000 for GPU pods, 0 for CPU pods
    spec: tuple[str, ...]  # allowed GPU models joined by "|", "" when any model will do

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_milli(self) -> IntArray:
        return self.num_gpu * self.milli

    def take(self, index: IntArray) -> PodList:
        """The pods at `index` (in that order): slices for tests, inflated sequences for runs."""
        idx = [int(i) for i in index]
        return PodList(
            source=self.source,
            names=tuple(self.names[i] for i in idx),
            cpu=self.cpu[index],
            memory=self.memory[index],
            num_gpu=self.num_gpu[index],
            milli=self.milli[index],
            spec=tuple(self.spec[i] for i in idx),
        )


@dataclass(frozen=True, slots=True)
class NodeList:
    source: str
    names: tuple[str, ...]
    cpu: IntArray  # milli-CPU allocatable
    memory: IntArray  # MiB allocatable
    num_gpu: IntArray
    model: tuple[str, ...]  # "" for CPU-only nodes

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_gpus(self) -> int:
        return int(self.num_gpu.sum())


def _rows(path: Path | None, default: str) -> tuple[str, list[tuple[int, dict[str, str]]]]:
    """The source's name and its rows, each with its line in the file (rows get sorted later)."""
    if path is None:
        ref = resources.files("sharepack.tracesim.data").joinpath(default)
        text = ref.read_text(encoding="utf-8")
        source = f"built-in {default}"
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise TraceError(f"cannot read trace file {path}: {e.strerror}") from e
        except UnicodeDecodeError as e:
            raise TraceError(f"cannot read trace file {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        source = str(path)
    return source, list(enumerate(csv.DictReader(text.splitlines()), start=2))


def _int(row: dict[str, str], column: str, where: str) -> int:
    raw = row.get(column)
    if raw is None:
        raise TraceError(f"missing column {column!r} in {where}")
    raw = raw.strip()
    if raw == "" or raw.lower() == "nan":
        return 0
    try:
        return int(float(raw))
    except (ValueError, OverflowError):  # OverflowError: "inf"
        raise TraceError(f"invalid {column} {raw!r} in {where}") from None


def load_pods(path: Path | None = None) -> PodList:
    """Pods sorted by name (the study sorts before its seeded shuffle, so order is reproducible)."""
    source, rows = _rows(path, DEFAULT_PODS)
    if not rows:
        raise TraceError(f"no pods in {source}")
    rows.sort(key=lambda r: r[1].get("name", ""))
    names, cpu, mem, num, milli, spec = [], [], [], [], [], []
    for i, (line, row) in enumerate(rows):
        where = f"{source} row {line}"
        n = _int(row, "num_gpu", where)
        m = _int(row, "gpu_milli", where) if n > 0 else 0
        m = min(m, MILLI)
        if n < 0:
            raise TraceError(f"invalid num_gpu {n} in {where}")
        if m <= 0:
            n, m = 0, 0
        if n > 1 and m < MILLI:
            # The study's model keeps a share on one GPU; its simulator rejects these too.
            raise TraceError(f"invalid pod in {where}: {n} GPUs with a fractional share of {m} milli each")
        raw_spec = (row.get("gpu_spec") or "").strip()
        models = [s for s in raw_spec.split("|") if s and s.lower() != "nan"]
        names.append(row.get("name") or f"pod-{i}")
        cpu.append(_int(row, "cpu_milli", where))
        mem.append(_int(row, "memory_mib", where))
        num.append(n)
        milli.append(m)
        spec.append("|".join(models) if n > 0 else "")
    return PodList(
        source=source,
        names=tuple(names),
        cpu=np.array(cpu, dtype=np.int64),
        memory=np.array(mem, dtype=np.int64),
        num_gpu=np.array(num, dtype=np.int64),
        milli=np.array(milli, dtype=np.int64),
        spec=tuple(spec),
    )


def load_nodes(path: Path | None = None) -> NodeList:
    source, rows = _rows(path, DEFAULT_NODES)
    if not rows:
        raise TraceError(f"no nodes in {source}")
    rows.sort(key=lambda r: r[1].get("sn", ""))
    names, cpu, mem, num, model = [], [], [], [], []
    for i, (line, row) in enumerate(rows):
        where = f"{source} row {line}"
        n = _int(row, "gpu", where)
        if not 0 <= n <= 8:
            # The study's nodes hold at most 8 GPUs, and its frag memo pads to 8.
            raise TraceError(f"invalid gpu count {n} in {where}: expected 0..8")
        raw_model = (row.get("model") or "").strip()
        names.append(row.get("sn") or f"node-{i}")
        cpu.append(_int(row, "cpu_milli", where))
        mem.append(_int(row, "memory_mib", where))
        num.append(n)
        model.append("" if raw_model.lower() == "nan" else raw_model)
    return NodeList(
        source=source,
        names=tuple(names),
        cpu=np.array(cpu, dtype=np.int64),
        memory=np.array(mem, dtype=np.int64),
        num_gpu=np.array(num, dtype=np.int64),
        model=tuple(model),
    )


def accessible(node_model: str, pod_spec: str) -> bool:
    """Whether a pod's GPU model constraint admits a node (the study's rule)."""
    if not pod_spec:
        return True
    if not node_model:
        return False
    return node_model in pod_spec.split("|")


def workload_name(pods: PodList) -> str:
    """`openb_pod_list_default` for the default trace: the `workload` column of the CSV."""
    name = pods.source.removeprefix("built-in ")
    return Path(name).stem
