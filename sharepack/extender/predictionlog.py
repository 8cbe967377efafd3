"""One log line per pod the extender counts with a placement of its own: which physical GPUs
it predicts the pod will get on its node.

Why: `sharepack_extender_predictions_total` says how often predictions matched, judged by the
extender itself against what the agent later publishes. A soak (sandbox.chaos) must judge them
from outside, per pod: it joins these lines with the devices each pod really holds (PodResources)
and leaves out the pods whose prediction a fault could have spoiled.

Format: `prediction {"uid": ..., "node": ..., "gpus": {resource: [physical GPU key, one per
device, sorted]}, "t": wall-clock seconds}` after the logger's own prefix, at INFO. Only the
extender's own predictions are logged: a pod counted with the GPUs its `sharepack.io/gpus`
annotation directs (another replica's prediction) is not this replica's to judge. One line per
bind: cheap next to the bind's API calls, and nothing is logged per filter or prioritize call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

log = logging.getLogger(__name__)

MARKER = "prediction "


@dataclass(frozen=True, slots=True)
class Prediction:
    uid: str
    node: str
    gpus: Mapping[str, tuple[str, ...]]  # resource -> physical GPU keys, one per device, sorted
    at: float  # wall-clock seconds


def record(uid: str, node: str, placement: Mapping[str, Sequence[str]]) -> None:
    """Log the placement `uid` is counted with on `node` (empty resources left out)."""
    if not log.isEnabledFor(logging.INFO):
        return
    gpus = {resource: sorted(keys) for resource, keys in placement.items() if keys}
    if gpus:
        doc = {"uid": uid, "node": node, "gpus": gpus, "t": round(time.time(), 3)}
        log.info("%s%s", MARKER, orjson.dumps(doc).decode())


def parse(line: str) -> Prediction | None:
    """The prediction on one log line, or None for any other line (or a garbled one)."""
    _, marker, rest = line.partition(f"{__name__}: {MARKER}")
    if not marker:
        return None
    try:
        doc = orjson.loads(rest)
        gpus = {str(r): tuple(sorted(str(k) for k in keys)) for r, keys in doc["gpus"].items()}
        return Prediction(str(doc["uid"]), str(doc["node"]), gpus, float(doc["t"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
