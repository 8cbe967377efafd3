"""`ours`: FGD's integer score first, then the tightest GPU, never the other way round."""

from __future__ import annotations

import numpy as np
import pytest

from tracesim.fragaware import fragment_gradient_scores


@pytest.mark.parametrize(
    ("deltas", "leftovers", "winner"),
    [
        pytest.param([-50.0, 300.0], [0, 900], 1, id="a larger fragmentation drop beats a tighter fit"),
        pytest.param([10.0, 12.0], [400, 30], 1, id="within one FGD score the tighter GPU wins"),
        pytest.param([0.0, 0.0], [0, 500], 0, id="no change in fragmentation: the closed GPU wins"),
        pytest.param([1e-9, -1e-9], [10, 0], 1, id="float noise around zero is no difference"),
    ],
)
def test_placements_rank_by_fgd_score_then_leftover(deltas: list[float], leftovers: list[int], winner: int) -> None:
    scores = fragment_gradient_scores(np.array(deltas), np.array(leftovers, dtype=np.int64))
    assert int(np.argmax(scores)) == winner


def test_scores_keep_fgds_scale() -> None:
    scores = fragment_gradient_scores(np.array([0.0, 1e6, -1e6]), np.zeros(3, dtype=np.int64))
    assert scores.tolist() == [50.0, 100.0, 0.0]
