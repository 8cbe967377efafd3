"""GPU fragmentation of a node, and the fragmentation gradient of placing a pod there.

The measure is the one of the FGD study ("Beware of Fragmentation", USENIX ATC '23), over a
*typical workload*: the pod shapes (GPU count, per-GPU share) that make up most of the pods,
each with a weight (how often it occurs). For one node and one shape s, the node's idle GPU
share counts as fragment when s cannot run there at all (s needs no GPU, the node does not
admit s for another reason, or fewer than `gpus` GPUs have s's share free); when s can run,
only the GPUs with less than s's share free are fragment. The node's fragmentation is the
weight-averaged fragment over the shapes, in milli-GPU.

A placement's *gradient* is the node's fragmentation before minus after: positive when the pod
closes a fragment, negative when it opens one. The FGD policy scores 100 x sigmoid(gradient /
1000), truncated; ours (`fragaware`) uses that score first, then the GPU left with the least
spare share (best fit), see `placement_rank`. The extender maps the gradient onto its 0..10
scale with `extender_score`.

Shares are integers in milli-GPU (1000 = a whole GPU), so that "fits" never depends on float
rounding; integer weights keep the sums exact, so equal states compare equal wherever they are
evaluated (the truncated scores depend on exact ties). Everything here is pure Python: the
trace simulator and the extender call the same code.

Callers that know more about a node than its GPUs (CPU left, GPU model) pass `admitted`: a
bit mask over the workload's shapes, bit i set when the node could run shape i apart from GPU
room. The default admits every shape. Shapes may carry CPU and memory (`Shape.cpu`, `.memory`):
`Fragmentation.admitted(cpu_left, memory_left)` is the mask of the shapes a node's CPU and
memory still admit, so GPUs a node can no longer use for lack of CPU count as fragment. Shapes
may name the GPU models they allow (`Shape.models`, as a pod's node affinity on
`nvidia.com/gpu.product` does): `Fragmentation.access(model)` is the mask of the shapes a node
with that GPU model admits, so a T4 node's GPUs are all fragment for a V100-only shape (FGD's
rule), and a pod that fills a T4 strands nothing a V100-only pod could have used.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import yaml

from sharepack.common import noderoom
from sharepack.common.errors import ConfigError

MILLI = 1000
ALL_ADMITTED = -1  # every bit set: every shape admitted
# `placement_rank`: below 1, so the leftover only ever breaks ties between equal FGD scores.
LEFTOVER_WEIGHT = 0.5
# `extender_score`: 10 x sigmoid(gradient / 100); about one point per 40 milli-GPU of change
# near zero, saturating beyond +-400 milli (a fragment of a few tenths of a GPU is already bad).
EXTENDER_SCALE_MILLI = 100.0
_NOISE = 1e-6  # float noise below this is no change (exact sums give exactly 0)


@dataclass(frozen=True, slots=True)
class Shape:
    gpus: int  # GPUs per pod (0: a pod that needs no GPU)
    milli: int  # per-GPU share, 1..1000 milli-GPU (0 with gpus == 0)
    weight: float  # how often it occurs (any unit: counts keep sums exact)
    # What the shape needs besides GPUs (milli-CPU, MiB; 0: nothing). A node whose CPU or
    # memory left is short of it cannot run the shape, so its idle GPUs are fragment for it
    # (FGD counts GPUs stranded by CPU so); see `Fragmentation.admitted`.
    cpu: int = 0
    memory: int = 0
    # The GPU models the shape allows (the node's `nvidia.com/gpu.product`); empty: any model.
    models: frozenset[str] = frozenset()

    @property
    def needs_gpu(self) -> bool:
        return self.gpus > 0 and self.milli > 0


@dataclass(frozen=True, slots=True)
class TypicalWorkload:
    shapes: tuple[Shape, ...]
    source: str = ""  # where it came from, for logs

    def __post_init__(self) -> None:
        problems = _check_shapes(self.shapes)
        if problems:
            raise ConfigError(self.source or "typical workload", problems)

    @property
    def total_weight(self) -> float:
        return sum(s.weight for s in self.shapes)


def _check_shapes(shapes: Sequence[Shape]) -> list[str]:
    problems = []
    if not shapes:
        problems.append("shapes: empty: a typical workload needs at least one pod shape")
    for i, s in enumerate(shapes):
        if s.gpus < 0 or s.gpus > 64:
            problems.append(f"shapes[{i}].gpus: invalid value {s.gpus}: want 0..64")
        if not 0 <= s.milli <= MILLI or (s.gpus > 0 and s.milli == 0):
            problems.append(f"shapes[{i}].share: invalid value {s.milli / MILLI}: want 0 < share <= 1")
        if not s.weight > 0 or math.isinf(s.weight):
            problems.append(f"shapes[{i}].weight: invalid value {s.weight}: want a finite number > 0")
    return problems


# The default trace of the FGD study (Alibaba cluster-trace-gpu-v2023, openb_pod_list_default,
# 8,152 pods), its typical workload as the study (and `sharepack-simulate`) takes it: pod shapes
# by (GPU count, per-GPU share, CPU request; zero CPU counted as 100m, as kube-scheduler scores
# it), the most frequent until they cover 95 % of the pods, CPU-only pods included, weighted by
# their pod counts. CPU is what lets the CPU-aware ranks see GPUs stranded by CPU (`admitted`);
# the study's shapes carry no memory, and no shape here asks for a GPU model. Regenerate from
# another trace with `--typical-workload FILE`.
DEFAULT_TYPICAL_WORKLOAD = TypicalWorkload(
    shapes=(
        Shape(1, 810, 1047, cpu=3152),
        Shape(1, 1000, 874, cpu=11300),
        Shape(1, 1000, 599, cpu=11400),
        Shape(1, 1000, 470, cpu=3152),
        Shape(1, 470, 388, cpu=11908),
        Shape(0, 0, 366, cpu=12500),
        Shape(1, 470, 360, cpu=8000),
        Shape(1, 1000, 326, cpu=12000),
        Shape(0, 0, 290, cpu=32000),
        Shape(1, 1000, 255, cpu=18708),
        Shape(1, 650, 237, cpu=11908),
        Shape(1, 320, 232, cpu=4000),
        Shape(1, 1000, 195, cpu=9810),
        Shape(0, 0, 185, cpu=8000),
        Shape(1, 1000, 164, cpu=8000),
        Shape(1, 1000, 159, cpu=4000),
        Shape(1, 1000, 158, cpu=15700),
        Shape(1, 1000, 153, cpu=11908),
        Shape(1, 1000, 150, cpu=16000),
        Shape(1, 230, 122, cpu=4000),
        Shape(0, 0, 120, cpu=15400),
        Shape(1, 460, 120, cpu=6000),
        Shape(0, 0, 95, cpu=16500),
        Shape(1, 1000, 93, cpu=14200),
        Shape(1, 1000, 84, cpu=24200),
        Shape(1, 590, 75, cpu=3152),
        Shape(1, 320, 72, cpu=8000),
        Shape(1, 550, 72, cpu=4152),
        Shape(1, 1000, 55, cpu=11900),
        Shape(1, 160, 54, cpu=4000),
        Shape(1, 370, 45, cpu=4152),
        Shape(1, 220, 43, cpu=4000),
        Shape(1, 1000, 41, cpu=8200),
        Shape(1, 1000, 36, cpu=15200),
        Shape(1, 810, 31, cpu=4152),
    ),
    source="built-in: FGD default trace (openb_pod_list_default), 95 % coverage, with CPU",
)


def load_typical_workload(text: str, source: str) -> TypicalWorkload:
    """A typical workload from YAML: `shapes: [{gpus: 1, share: 0.5, weight: 120, cpu: 4}, ...]`.

    `share` is the per-GPU fraction (0 < share <= 1, kept to milli-GPU; ignored with `gpus: 0`,
    a CPU-only shape); `gpus` defaults to 1; `cpu` and `memory` (optional, Kubernetes
    quantities: `4`, `3152m`, `16Gi`) are what the shape requests besides GPUs; `models`
    (optional, a list of `nvidia.com/gpu.product` values) the GPU models it allows.
    Raises ConfigError naming every problem.
    """
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(source, [f"not YAML: {e}"]) from e
    raw = doc.get("shapes") if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        raise ConfigError(source, ["shapes: missing: want a list of {gpus, share, weight}"])
    shapes: list[Shape] = []
    problems: list[str] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) - {"gpus", "share", "weight", "cpu", "memory", "models"}:
            problems.append(
                f"shapes[{i}]: invalid value {item!r}: want a mapping of gpus, share, weight, cpu, memory, models"
            )
            continue
        models = item.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
            problems.append(f"shapes[{i}].models: invalid value {models!r}: want a list of GPU model names")
            continue
        gpus, share, weight = item.get("gpus", 1), item.get("share", 0 if item.get("gpus") == 0 else None), item.get("weight")
        if not isinstance(gpus, int) or isinstance(gpus, bool):
            problems.append(f"shapes[{i}].gpus: invalid value {gpus!r}: want an integer")
            continue
        try:
            cpu = math.ceil(noderoom.quantity(item.get("cpu", 0), f"shapes[{i}].cpu") * 1000)
            memory = math.ceil(noderoom.quantity(item.get("memory", 0), f"shapes[{i}].memory") / noderoom.MIB)
        except noderoom.QuantityError as e:
            problems.append(f"{e}: want a Kubernetes quantity (4, 3152m, 16Gi)")
            continue
        if cpu < 0 or memory < 0:
            problems.append(f"shapes[{i}]: invalid cpu or memory {item.get('cpu')!r}, {item.get('memory')!r}: want >= 0")
            continue
        if not isinstance(share, int | float) or isinstance(share, bool):
            problems.append(f"shapes[{i}].share: invalid value {share!r}: want a number in (0, 1]")
            continue
        if not isinstance(weight, int | float) or isinstance(weight, bool):
            problems.append(f"shapes[{i}].weight: invalid value {weight!r}: want a number > 0")
            continue
        shapes.append(
            Shape(gpus, round(share * MILLI) if gpus else 0, weight, cpu=cpu, memory=memory, models=frozenset(models))
        )
    problems.extend(_check_shapes(shapes) if not problems else [])
    if problems:
        raise ConfigError(source, problems)
    return TypicalWorkload(tuple(shapes), source)


class Fragmentation:
    """The measure for one typical workload: precomputed shape data, memoised per node state.

    A node state is its per-GPU free share (milli, any order: the measure does not depend on
    which GPU is which) and the `admitted` mask. Memo entries are the weighted sums (exact with
    integer weights); the table is dropped when it grows past `max_entries`.
    """

    __slots__ = (
        "workload", "total_weight", "_shapes", "_memo", "max_entries", "_needs", "_admitted", "_access", "_groups",
    )  # fmt: skip

    def __init__(self, workload: TypicalWorkload, *, max_entries: int = 1 << 18) -> None:
        self.workload = workload
        self.total_weight = workload.total_weight
        self._shapes = tuple((i, s.needs_gpu, s.gpus, s.milli, s.weight) for i, s in enumerate(workload.shapes))
        self._memo: dict[tuple[tuple[int, ...], int], float] = {}
        self.max_entries = max_entries
        self._needs = tuple((i, s.cpu, s.memory) for i, s in enumerate(workload.shapes) if s.cpu or s.memory)
        self._admitted: dict[tuple[int, int], int] = {}
        self._access: dict[str, int] = {}
        # admitted mask -> `_grouped`; None where a weight is not an int (see `weighted`).
        self._groups: dict[int, tuple[int, tuple[tuple[int, int, int], ...]]] | None = (
            {} if all(isinstance(s.weight, int) for s in workload.shapes) else None
        )

    def access(self, model: str | None) -> int:
        """The `admitted` mask of a node whose GPUs are of `model` (its `nvidia.com/gpu.product`):
        every shape that names no models or names this one. None (the model is unknown): every
        shape, as before the extender knew models."""
        if model is None:
            return ALL_ADMITTED
        mask = self._access.get(model)
        if mask is None:
            mask = ALL_ADMITTED
            for i, s in enumerate(self.workload.shapes):
                if s.models and model not in s.models:
                    mask &= ~(1 << i)
            if len(self._access) >= self.max_entries:
                self._access.clear()
            self._access[model] = mask
        return mask

    def admitted(self, cpu_left: int, memory_left: int) -> int:
        """The `admitted` mask of a node with `cpu_left` milli-CPU and `memory_left` MiB left:
        every shape whose CPU and memory fit (shapes that need neither always do)."""
        key = (cpu_left, memory_left)
        mask = self._admitted.get(key)
        if mask is None:
            mask = ALL_ADMITTED
            for i, cpu, memory in self._needs:
                if cpu > cpu_left or memory > memory_left:
                    mask &= ~(1 << i)
            if len(self._admitted) >= self.max_entries:
                self._admitted.clear()
            self._admitted[key] = mask
        return mask

    def weighted(self, free: Sequence[int], admitted: int = ALL_ADMITTED) -> float:
        """Sum over shapes of weight x fragment (milli); divide by `total_weight` for the amount."""
        ordered = tuple(sorted(free))
        key = (ordered, admitted)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        total = sum(ordered)
        prefix = (0, *accumulate(ordered))  # prefix[i]: free share on the i smallest GPUs
        n = len(ordered)
        acc: float = 0
        if self._groups is not None:
            # Integer weights: the sum is exact in any order, so shapes that ask for the same
            # share and GPU count are counted once, with their weights summed (a new node state
            # misses this memo once per node on a cold request).
            rest, groups = self._grouped(admitted)
            acc += rest * total
            for share, count, summed in groups:
                below = bisect_left(ordered, share)  # GPUs with less than the share free
                acc += summed * (prefix[below] if n - below >= count else total)
        else:
            for i, needs_gpu, gpus, milli, weight in self._shapes:
                if needs_gpu and (admitted >> i) & 1:
                    below = bisect_left(ordered, milli)  # GPUs with less than the share free
                    acc += weight * (prefix[below] if n - below >= gpus else total)
                else:
                    acc += weight * total
        if len(self._memo) >= self.max_entries:
            self._memo.clear()
        self._memo[key] = acc
        return acc

    def _grouped(self, admitted: int) -> tuple[int, tuple[tuple[int, int, int], ...]]:
        """For `weighted` with integer weights: the weight of the shapes for which the whole free
        share is fragment (no GPU needed, or not admitted), and per (share, GPU count) of the
        admitted shapes that need GPUs, their summed weight."""
        assert self._groups is not None
        hit = self._groups.get(admitted)
        if hit is None:
            rest = 0
            summed: dict[tuple[int, int], int] = {}
            for i, needs_gpu, gpus, milli, weight in self._shapes:
                if needs_gpu and (admitted >> i) & 1:
                    summed[milli, gpus] = summed.get((milli, gpus), 0) + int(weight)
                else:
                    rest += int(weight)
            if len(self._groups) >= self.max_entries:
                self._groups.clear()
            hit = self._groups[admitted] = (rest, tuple((m, g, w) for (m, g), w in summed.items()))
        return hit

    def amount(self, free: Sequence[int], admitted: int = ALL_ADMITTED) -> float:
        """The node's fragmentation, milli-GPU."""
        return self.weighted(free, admitted) / self.total_weight

    def gradient(
        self,
        before: Sequence[int],
        after: Sequence[int],
        admitted_before: int = ALL_ADMITTED,
        admitted_after: int = ALL_ADMITTED,
    ) -> float:
        """Fragmentation before minus after a placement (milli-GPU; higher is better)."""
        return self.gradient_from(self.weighted(before, admitted_before), after, admitted_after)

    def gradient_from(self, weighted_before: float, after: Sequence[int], admitted_after: int = ALL_ADMITTED) -> float:
        """`gradient` with the state before given by its `weighted` sum: the candidate placements
        of one pod on one node share it."""
        return (weighted_before - self.weighted(after, admitted_after)) / self.total_weight

    def best_share_gpu(
        self, free: Sequence[int], milli: int, admitted_before: int = ALL_ADMITTED, admitted_after: int = ALL_ADMITTED
    ) -> tuple[float, int] | None:
        """`fragaware` on one node for a share of `milli` on one GPU: the best `placement_rank`
        and the first GPU (index order) that reaches it; None when no GPU has room."""
        best: tuple[float, int] | None = None
        after = list(free)
        for g, left in enumerate(free):
            if left < milli:
                continue
            after[g] = left - milli
            rank = placement_rank(self.gradient(free, after, admitted_before, admitted_after), left - milli)
            after[g] = left
            if best is None or rank > best[0]:
                best = (rank, g)
        return best


def gradient_score(gradient: float) -> int:
    """FGD's node score: 100 x sigmoid(gradient / 1000), truncated (0..100)."""
    if abs(gradient) < _NOISE:
        gradient = 0.0
    # Clipped: beyond |50| the truncated score is 0 or 100 anyway, and exp() would overflow.
    x = min(max(-gradient / 1000.0, -50.0), 50.0)
    return math.trunc(100.0 / (1.0 + math.exp(x)))


def placement_rank(gradient: float, leftover_milli: int) -> float:
    """`fragaware`'s rank of one placement (higher wins): FGD's truncated score first, then the
    least share left on the chosen GPU (0 for whole GPUs).

    The truncation is deliberate: it groups placements whose effect on fragmentation is about
    equal, and within a group a fixed node order fills nodes one after another (whole nodes stay
    free for multi-GPU pods); best fit then sends a share where it closes a GPU.
    """
    return gradient_score(gradient) - LEFTOVER_WEIGHT * leftover_milli / MILLI


def extender_score(gradient: float) -> int:
    """The gradient on the extender's 0..10 scale: 10 x sigmoid(gradient / 100), rounded half up."""
    if abs(gradient) < _NOISE:
        gradient = 0.0
    x = min(max(-gradient / EXTENDER_SCALE_MILLI, -50.0), 50.0)
    return min(max(int(10.0 / (1.0 + math.exp(x)) + 0.5), 0), 10)


_MEASURES: dict[TypicalWorkload, Fragmentation] = {}
# By the workload object's identity first: hashing a workload hashes every shape in it, and the
# extender asks once per node per request (a third of its CPU at 1,000 nodes, profiled). The
# entry holds the workload, so its id is not reused while it is here.
_BY_ID: dict[int, tuple[TypicalWorkload, Fragmentation]] = {}
_BY_ID_KEPT = 64


def measure_for(workload: TypicalWorkload) -> Fragmentation:
    """The one memoised measure per workload (process-wide, so every caller shares its memo)."""
    hit = _BY_ID.get(id(workload))
    if hit is not None and hit[0] is workload:
        return hit[1]
    m = _MEASURES.get(workload)
    if m is None:
        m = _MEASURES[workload] = Fragmentation(workload)
    if len(_BY_ID) >= _BY_ID_KEPT:
        _BY_ID.clear()
    _BY_ID[id(workload)] = (workload, m)
    return m
