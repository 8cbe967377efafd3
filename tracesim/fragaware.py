"""`ours`: a fragmentation-aware node policy (pure scoring; the simulator supplies the deltas).

It keeps what makes FGD work and adds one tie-breaker:

1. Primary: FGD's score, 100 x sigmoid(delta / 1000) truncated to an integer, where delta is the
   drop in the node's fragmentation (typical-workload definition) if the pod lands there. The
   truncation is deliberate: it groups placements whose fragmentation effect is about equal, and
   within a group the scheduler's fixed node order then fills nodes one after another, which is
   what leaves whole nodes free for multi-GPU pods. (Scoring the exact delta instead spreads
   pods and loses about one point of allocation on the default trace.)
2. Within a group: the GPU left with the least spare share after the pod lands (best fit at GPU
   level), so that a share goes where it closes a GPU rather than where it merely does not hurt.
3. Then node order, as every policy here.

The function is pure (arrays in, scores out) so the extender can adopt it once it publishes the
counts it needs; it lives in tracesim/ until then.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

NAME = "ours"
LEFTOVER_WEIGHT = 0.5  # < 1: only ever breaks ties between equal FGD scores


def fragment_gradient_scores(
    frag_delta: npt.NDArray[np.float64], leftover_milli: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """Score per candidate placement (higher wins).

    `frag_delta`: node fragmentation before minus after the placement (milli-GPU);
    `leftover_milli`: share left on the chosen GPU after the placement (0 for whole-GPU pods).
    """
    delta = np.where(np.abs(frag_delta) < 1e-6, 0.0, frag_delta)
    # Clipped: beyond |50| the truncated score is 0 or 100 anyway, and exp() would overflow.
    primary = np.trunc(100.0 / (1.0 + np.exp(np.clip(-delta / 1000.0, -50.0, 50.0))))
    out: npt.NDArray[np.float64] = primary - LEFTOVER_WEIGHT * leftover_milli / 1000.0
    return out
