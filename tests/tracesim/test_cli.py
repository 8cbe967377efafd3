"""`sharepack-simulate` end to end on a small trace: table, CSV layout, plot, errors."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import pytest

from sharepack.tracesim import reporting
from sharepack.tracesim.__main__ import main

STUDY_HEADER = ["workload", "sc_policy", "tune", "seed", "total_gpus", *[str(k) for k in range(131)]]


@pytest.fixture
def trace(write: Callable[[str, str], Path], pod_lines: Callable[..., str], node_lines: Callable[..., str]) -> tuple[Path, Path]:
    pods = [(f"pod-{i:03d}", 2000 + 500 * (i % 5), 4096, 1, (250, 500, 1000, 750)[i % 4], "") for i in range(60)]
    pods += [(f"cpu-{i}", 4000, 4096, 0, 0, "") for i in range(8)]
    nodes = [(f"n{i}", 64000, 262144, (2, 4, 8)[i % 3], "T4") for i in range(9)]
    return write("pods.csv", pod_lines(pods)), write("nodes.csv", node_lines(nodes))


def test_a_run_prints_the_table_and_writes_csvs_and_a_plot(
    trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pods, nodes = trace
    out = tmp_path / "out" / "res.csv"
    png = tmp_path / "out" / "alloc.png"
    rc = main(["--pods", str(pods), "--nodes", str(nodes), "--policy", "random,fgd,packed,ours",
               "--seeds", "2", "--csv", str(out), "--plot", str(png)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "pods: 2 seed(s)" in captured.out
    for label in ("random", "fgd", "packed", "ours"):  # packed: the kube model, in replicas
        assert f"\n{label} " in captured.out
    assert "[8/8] ours seed 43" in captured.err
    with out.open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == STUDY_HEADER
    assert [(r[0], r[1], r[3]) for r in rows[1:3]] == [("pods", "random", "42"), ("pods", "random", "43")]
    assert {r[1] for r in rows[1:]} == {"random", "fgd", "packed", "ours"}
    for sibling in ("res_frag.csv", "res_frag_ratio.csv", "res_free_gpus.csv"):
        with (tmp_path / "out" / sibling).open() as f:
            assert next(csv.reader(f)) == [h for h in STUDY_HEADER if h != "total_gpus"]
    with (tmp_path / "out" / "res_failed.csv").open() as f:
        failed = list(csv.DictReader(f))
    assert len(failed) == 8 and sum(int(r["1gpu"]) + int(r["share"]) for r in failed) > 0
    assert "failed pods" in captured.out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "tetris"], "invalid --policy tetris"),
        (["--seeds", "0"], "invalid --seeds 0"),
        (["--replicas", "3"], "invalid --replicas 3"),
        (["--pods", "/nonexistent/p.csv"], "cannot read trace file /nonexistent/p.csv"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main([*args, "--csv", str(tmp_path / "r.csv"), "--plot", str(tmp_path / "p.png"), "--quiet"])
    assert rc == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(None, "cannot read --published {path}: No such file", id="a missing file"),
        pytest.param("x,y\n1,2\n", "invalid --published {path}: missing column 'workload'", id="another layout"),
        pytest.param(",".join(STUDY_HEADER) + "\npods,01-Random,1.3,42,9," + ",".join(["x"] * 131) + "\n",
                     "invalid --published {path} row 2: could not convert", id="a value not a number"),
    ],
)  # fmt: skip
def test_a_bad_published_file_is_named_before_any_run(
    trace: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "published.csv"
    if content is not None:
        path.write_text(content)
    pods, nodes = trace
    rc = main(["--pods", str(pods), "--nodes", str(nodes), "--policy", "random", "--seeds", "1",
               "--published", str(path), "--csv", str(tmp_path / "r.csv"), "--plot", str(tmp_path / "p.png")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2
    assert message.format(path=path) in err
    assert "seed 42" not in err  # refused before the runs, not after them
    assert not (tmp_path / "r.csv").exists()


def test_published_means_are_built_in_for_the_default_trace() -> None:
    published = reporting.load_published("openb_pod_list_default")
    assert set(published) == {"random", "dotprod", "clustering", "packing", "bestfit", "fgd"}
    assert 100 - published["random"][100] == pytest.approx(13.70, abs=0.01)
    assert 100 - published["bestfit"][100] == pytest.approx(7.14, abs=0.01)
    assert 100 - published["fgd"][100] == pytest.approx(4.77, abs=0.01)


def test_the_studys_per_seed_results_file_can_be_the_comparison(write: Callable[[str, str], Path]) -> None:
    header = ",".join(STUDY_HEADER)
    rows = [
        f"openb_pod_list_x,06-FGD,1.3,{seed},6212," + ",".join(str(v) for v in [90.0 + seed - 42] * 131)
        for seed in (42, 43)
    ]
    path = write("allo.csv", "\n".join([header, *rows]) + "\n")
    published = reporting.load_published("openb_pod_list_x", path)
    assert list(published) == ["fgd"]
    assert published["fgd"][100] == pytest.approx(90.5)
