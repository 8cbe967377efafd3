"""The study's fragmentation of one node, checked against hand-computed values.

Typical workload: A = 4 CPUs + 500 milli (p 0.5), B = 8 CPUs, no GPU (p 0.25), C = 4 CPUs + one
whole T4 (p 0.25).
"""

from __future__ import annotations

import numpy as np
import pytest

from sharepack.tracesim import traces
from sharepack.tracesim.fragmentation import FragModel
from sharepack.tracesim.workloads import Shape, TypicalWorkload

TYPICAL = TypicalWorkload(
    shapes=(Shape(4000, 500, 1, ""), Shape(8000, 0, 0, ""), Shape(4000, 1000, 1, "T4")),
    freq=np.array([0.5, 0.25, 0.25]),
)


def nodes(model: str) -> traces.NodeList:
    return traces.NodeList(
        source="test",
        names=("n",),
        cpu=np.array([16000]),
        memory=np.array([65536]),
        num_gpu=np.array([2]),
        model=(model,),
    )


@pytest.mark.parametrize(
    ("model", "cpu_left", "gpu_left", "expected"),
    [
        pytest.param("P100", 16000, [1000, 1000], 1000.0, id="empty node: only shapes it can never run count"),
        pytest.param("P100", 16000, [300, 1000], 800.0, id="a partly used GPU is fragment for shapes that do not fit it"),
        pytest.param("P100", 16000, [300, 0], 300.0, id="no shape fits: all idle GPU is fragment"),
        pytest.param("P100", 2000, [1000, 1000], 2000.0, id="no CPU left: all idle GPU is fragment"),
        pytest.param("T4", 16000, [600, 1000], 550.0, id="the model the shape asks for makes it count"),
    ],
)
def test_node_fragmentation_matches_the_definition(
    model: str, cpu_left: int, gpu_left: list[int], expected: float
) -> None:
    fm = FragModel.build(TYPICAL, nodes(model))
    gl = np.array([gpu_left], dtype=np.int64)
    fits, small = fm.counts(gl)
    frag = fm.frag(np.array([cpu_left]), fits, small, gl.sum(axis=1), fm.access)
    assert frag[0] == pytest.approx(expected)


def test_counts_ignore_absent_gpus() -> None:
    fm = FragModel.build(TYPICAL, nodes("T4"))
    fits, small = fm.counts(np.array([[400, 0, 0, 0, 0, 0, 0, 0]], dtype=np.int64))
    gpu_shapes = [0, 2]  # A and C; CPU shapes always count the node's whole idle GPU
    assert fits[:, gpu_shapes].tolist() == [[0, 0]]
    assert small[:, gpu_shapes].tolist() == [[400, 400]]
