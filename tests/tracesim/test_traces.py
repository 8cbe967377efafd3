"""Reading the trace: the built-in default, normalisation, and errors that name the bad value."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sharepack.tracesim import traces
from sharepack.tracesim.errors import TraceError

PodLines = Callable[[list[tuple[str, int, int, int, int, str]]], str]


def test_built_in_default_trace_is_the_studys() -> None:
    pods = traces.load_pods()
    nodes = traces.load_nodes()
    assert (len(pods), len(nodes), nodes.total_gpus) == (8152, 1213, 6212)
    assert int(pods.total_milli.sum()) == 6_086_800
    assert traces.workload_name(pods) == "openb_pod_list_default"
    assert list(pods.names) == sorted(pods.names)


@pytest.mark.parametrize(
    ("num_gpu", "gpu_milli", "spec", "expected"),
    [
        pytest.param(1, 460, "", (1, 460, ""), id="a share stays as written"),
        pytest.param(2, 1000, "", (2, 1000, ""), id="whole GPUs stay as written"),
        pytest.param(1, 1500, "", (1, 1000, ""), id="a share above one GPU is clamped to one GPU"),
        pytest.param(1, 0, "V100M16", (0, 0, ""), id="GPUs with a zero share make a CPU pod"),
        pytest.param(0, 300, "", (0, 0, ""), id="a share without GPUs is ignored"),
        pytest.param(1, 500, "V100M16|V100M32", (1, 500, "V100M16|V100M32"), id="model constraints are kept"),
        pytest.param(1, 500, "nan", (1, 500, ""), id="nan means no model constraint"),
    ],
)
def test_pods_are_normalised_as_the_study_converts_them(
    write: Callable[[str, str], Path], pod_lines: PodLines, num_gpu: int, gpu_milli: int, spec: str,
    expected: tuple[int, int, str],
) -> None:
    pods = traces.load_pods(write("p.csv", pod_lines([("p", 1000, 1024, num_gpu, gpu_milli, spec)])))
    assert (int(pods.num_gpu[0]), int(pods.milli[0]), pods.spec[0]) == expected


def test_pod_lists_without_a_gpu_spec_column_load(write: Callable[[str, str], Path]) -> None:
    text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,10,1,500\n"
    pods = traces.load_pods(write("p.csv", text))
    assert pods.spec == ("",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,lots,10,1,500\n", "invalid cpu_milli 'lots'", id="bad number"),
        pytest.param("name,memory_mib,num_gpu,gpu_milli\np1,10,1,500\n", "missing column 'cpu_milli'", id="missing column"),
        pytest.param("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nzz,lots,10,1,500\naa,1,10,1,500\n",
                     "invalid cpu_milli 'lots' in .*p.csv row 2$", id="the row named is the file's, not the sorted one"),
        pytest.param("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,10,1,inf\n", "invalid gpu_milli 'inf'",
                     id="an infinite number"),
        pytest.param("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "no pods in", id="empty list"),
        pytest.param(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,10,2,500\n",
            "2 GPUs with a fractional share of 500 milli",
            id="shares on several GPUs",
        ),
    ],
)
def test_bad_pod_lists_are_rejected_with_the_reason(
    write: Callable[[str, str], Path], text: str, message: str
) -> None:
    with pytest.raises(TraceError, match=message):
        traces.load_pods(write("p.csv", text))


def test_nodes_with_more_than_eight_gpus_are_rejected(write: Callable[[str, str], Path]) -> None:
    with pytest.raises(TraceError, match="invalid gpu count 16"):
        traces.load_nodes(write("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn1,1000,10,16,A100\n"))


def test_a_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    path = tmp_path / "binary.csv"
    path.write_bytes(b"name,cpu\n\xff\xfe\x00")
    with pytest.raises(TraceError, match="cannot read trace file .*binary.csv: not UTF-8"):
        traces.load_nodes(path)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace file .*nope.csv"):
        traces.load_pods(tmp_path / "nope.csv")


@pytest.mark.parametrize(
    ("model", "spec", "ok"),
    [
        ("T4", "", True),
        ("T4", "T4|P100", True),
        ("V100M32", "T4|P100", False),
        ("", "T4", False),
        ("", "", True),
    ],
)
def test_model_constraints_admit_listed_models_only(model: str, spec: str, ok: bool) -> None:
    assert traces.accessible(model, spec) is ok
