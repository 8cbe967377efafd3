"""Outputs: CSVs in the study's cached-results layout, a summary table, and the allocation plot."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from sharepack.tracesim.baselines import PUBLISHED_NAMES
from sharepack.tracesim.errors import TraceError
from sharepack.tracesim.fragmentation import FloatArray
from sharepack.tracesim.metrics import GRID, Binned
from sharepack.tracesim.replaying import RunResult
from sharepack.tracesim.workloads import TUNE_RATIO

PUBLISHED_FILE = "published_means.csv"


@dataclass(frozen=True, slots=True)
class Run:
    result: RunResult
    binned: Binned


@dataclass(frozen=True, slots=True)
class Summary:
    policy: str
    seeds: int
    unallocated_100: float
    unallocated_100_sd: float
    unallocated_130: float
    frag_amount_100: float
    first_failure_pct: float | None  # mean over seeds that had a GPU pod fail
    seconds: float  # mean per run
    published_100: float | None


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def summarise(policy: str, runs: Sequence[Run], published: dict[str, FloatArray]) -> Summary:
    u100 = [r.binned.unallocated(100) for r in runs]
    firsts = [
        100.0 * r.result.first_failure_milli / 1000.0 / r.result.total_gpus
        for r in runs
        if r.result.first_failure_milli is not None
    ]
    pub = published.get(policy)
    return Summary(
        policy=policy,
        seeds=len(runs),
        unallocated_100=_mean(u100),
        unallocated_100_sd=float(np.std(u100)) if len(u100) > 1 else 0.0,
        unallocated_130=_mean([r.binned.unallocated(130) for r in runs]),
        frag_amount_100=_mean([float(r.binned.frag_amount[100]) for r in runs]),
        first_failure_pct=_mean(firsts) if firsts else None,
        seconds=_mean([r.result.seconds for r in runs]),
        published_100=None if pub is None else float(100.0 - pub[100]),
    )


def table(summaries: Sequence[Summary]) -> str:
    head = (
        f"{'policy':<16} {'seeds':>5} {'unalloc@100%':>14} {'published':>9} {'unalloc@130%':>12} "
        f"{'frag@100%':>9} {'1st fail':>8} {'s/run':>6}"
    )
    lines = [head, "-" * len(head)]
    for s in summaries:
        pub = "" if s.published_100 is None else f"{s.published_100:.2f}"
        first = "none" if s.first_failure_pct is None else f"{s.first_failure_pct:.1f}%"
        lines.append(
            f"{s.policy:<16} {s.seeds:>5} {s.unallocated_100:>8.2f} ±{s.unallocated_100_sd:4.2f} {pub:>9} "
            f"{s.unallocated_130:>12.2f} {s.frag_amount_100:>9.2f} {first:>8} {s.seconds:>6.1f}"
        )
    lines.append(
        "unalloc: % of all GPUs not allocated when that share of capacity has arrived (mean ± sd over "
        "seeds); frag: fragmented GPU milli, % of all GPUs; 1st fail: arrived % at the first GPU pod "
        "that found no node"
    )
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Paired:
    """`policy` minus `baseline`, unallocated GPU % at 100 % arrived, over the seeds both ran."""

    policy: str
    baseline: str
    seeds: int
    mean: float
    se: float  # standard error of the mean difference (sample sd / sqrt(seeds)); nan with one seed


def paired(results: dict[str, list[Run]], baseline: str) -> list[Paired]:
    """Each other policy against `baseline`, seed by seed (a seed fixes the arrival order, so
    the difference is much less noisy than either figure)."""
    base = {r.result.seed: r.binned.unallocated(100) for r in results.get(baseline, [])}
    out = []
    for label, runs in results.items():
        if label == baseline:
            continue
        diffs = [r.binned.unallocated(100) - base[r.result.seed] for r in runs if r.result.seed in base]
        if not diffs:
            continue
        se = float(np.std(diffs, ddof=1) / math.sqrt(len(diffs))) if len(diffs) > 1 else math.nan
        out.append(Paired(label, baseline, len(diffs), float(np.mean(diffs)), se))
    return out


def paired_table(results: dict[str, list[Run]], baselines: Sequence[str]) -> str:
    lines = [f"{'paired difference':<32} {'seeds':>5} {'mean':>7} {'se':>6}"]
    lines.append("-" * len(lines[0]))
    for b in baselines:
        for d in paired(results, b):
            lines.append(f"{d.policy + ' - ' + d.baseline:<32} {d.seeds:>5} {d.mean:>+7.2f} {_fmt(d.se):>6}")
    lines.append("unallocated GPU % at 100 % arrived, policy minus baseline, same seeds (negative: fewer GPUs idle)")
    return "\n".join(lines)


def _fmt(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.2f}"


POD_CLASSES = ("cpu", "share", "1gpu", "2gpu", "4gpu", "8gpu", "other")


def failures_table(results: dict[str, list[Run]]) -> str:
    """Pods that found no node by the end of the run (130 % arrived), mean per seed, by class."""
    head = f"{'failed pods':<16} " + " ".join(f"{c:>7}" for c in POD_CLASSES)
    lines = [head, "-" * len(head)]
    for label, runs in results.items():
        means = [_mean([float(r.result.failed.get(c, 0)) for r in runs]) for c in POD_CLASSES]
        lines.append(f"{label:<16} " + " ".join(f"{m:>7.1f}" for m in means))
    return "\n".join(lines)


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(f"{path.stem}_{suffix}{path.suffix or '.csv'}")


def write_csvs(path: Path, workload: str, runs: Sequence[Run]) -> list[Path]:
    """`path` in the layout of analysis_allo_discrete.csv, plus `<stem>_frag.csv` and
    `<stem>_frag_ratio.csv` in those of the frag files, `<stem>_free_gpus.csv` (fully free GPUs,
    % of all) in the same layout, and `<stem>_failed.csv` (failed pods by class, per run)."""
    grid = [str(k) for k in GRID]
    outputs: tuple[tuple[Path, bool, Callable[[Binned], FloatArray]], ...] = (
        (path, True, lambda b: b.allocation),
        (_sibling(path, "frag"), False, lambda b: b.frag_amount),
        (_sibling(path, "frag_ratio"), False, lambda b: b.frag_ratio),
        (_sibling(path, "free_gpus"), False, lambda b: b.free_gpus),
    )
    for target, with_total, pick in outputs:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["workload", "sc_policy", "tune", "seed", *(["total_gpus"] if with_total else []), *grid])
            for run in runs:
                res = run.result
                values = [_fmt(float(v)) for v in pick(run.binned)]
                total = [str(res.total_gpus)] if with_total else []
                w.writerow([workload, res.policy, TUNE_RATIO, res.seed, *total, *values])
    failed_path = _sibling(path, "failed")
    with failed_path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["workload", "sc_policy", "tune", "seed", *POD_CLASSES, "first_failure_pct"])
        for run in runs:
            res = run.result
            first = (
                ""
                if res.first_failure_milli is None
                else f"{100.0 * res.first_failure_milli / 1000.0 / res.total_gpus:.2f}"
            )
            counts = [str(res.failed.get(c, 0)) for c in POD_CLASSES]
            w.writerow([workload, res.policy, TUNE_RATIO, res.seed, *counts, first])
    return [*(o[0] for o in outputs), failed_path]


def load_published(workload: str, path: Path | None = None, metric: str = "allocation") -> dict[str, FloatArray]:
    """Mean published curve per policy (our names) for `workload`; {} when the file lacks it.

    Reads the packaged means, or a cached-results CSV of the study (per-seed rows) given as `path`.
    """
    if path is None:
        source = f"built-in {PUBLISHED_FILE}"
        text = resources.files("sharepack.tracesim.data").joinpath(PUBLISHED_FILE).read_text(encoding="utf-8")
    else:
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise TraceError(f"cannot read --published {path}: {getattr(e, 'strerror', None) or e}") from None
    ours = {v: k for k, v in PUBLISHED_NAMES.items()}
    rows: dict[str, list[FloatArray]] = {}
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in ("workload", "sc_policy", *(str(k) for k in GRID)) if c not in (reader.fieldnames or ())]
    if missing:
        raise TraceError(f"invalid --published {source}: missing column {missing[0]!r} (want the study's results layout)")
    for line, row in enumerate(reader, start=2):
        if row.get("workload") != workload or row.get("metric", metric) != metric:
            continue
        name = ours.get(row.get("sc_policy", ""))
        if name is None:
            continue
        try:
            values = np.array([float(row[str(k)]) if row.get(str(k)) else math.nan for k in GRID])
        except ValueError as e:
            raise TraceError(f"invalid --published {source} row {line}: {e}") from None
        rows.setdefault(name, []).append(values)
    return {name: np.nanmean(np.vstack(curves), axis=0) for name, curves in rows.items()}


def plot(path: Path, workload: str, curves: dict[str, FloatArray], published: dict[str, FloatArray]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6.5))
    x = np.array(GRID)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if len(curves) > len(colors):
        colors = [plt.get_cmap("tab20")(i) for i in range(20)]
    for i, (name, y) in enumerate(curves.items()):
        color = colors[i % len(colors)]
        base = name.split("@")[0]
        ax.plot(x, y, color=color, lw=1.8, label=f"{name} (simulated)")
        if base in published and "@" not in name:
            ax.plot(x, published[base], color=color, lw=1.0, ls="--", label=f"{base} (published)")
    ax.plot(x, np.minimum(x, 100), color="grey", lw=0.8, ls=":", label="ideal")
    ax.set_xlim(0, 130)
    ax.set_ylim(0, 102)
    ax.set_xlabel("arrived workload, % of cluster GPU capacity")
    ax.set_ylabel("GPU allocation, % of cluster GPUs")
    ax.set_title(f"{workload}: allocation vs arrived workload (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    inset = ax.inset_axes((0.05, 0.58, 0.36, 0.36))
    for i, (name, y) in enumerate(curves.items()):
        color = colors[i % len(colors)]
        base = name.split("@")[0]
        inset.plot(x, y, color=color, lw=1.4)
        if base in published and "@" not in name:
            inset.plot(x, published[base], color=color, lw=0.9, ls="--")
    inset.set_xlim(85, 130)
    inset.set_ylim(80, 100)
    inset.set_title("85..130 %", fontsize=7)
    inset.tick_params(labelsize=6)
    inset.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
