"""The per-pod prediction lines (extender.predictionlog): what the extender's own placement of a
pod says, on one text log line the chaos soak reads back; other lines and garbled ones are not
predictions, and directed placements (another replica's) are not logged as ours."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from sharepack.common.podrequests import ContainerKind, ContainerRequest, PodRequest
from sharepack.common.policies import Policy
from sharepack.extender import predictionlog
from sharepack.extender.__main__ import setup_logging
from sharepack.extender.caches import ClusterView
from tests.extender.test_caches import SHARED, state_obj


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """The extender's own text log format, captured."""
    setup_logging("text", "info")
    root = logging.getLogger()
    stream = io.StringIO()
    root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
    yield stream
    root.handlers[:] = []


def request(uid: str, replicas: int) -> PodRequest:
    return PodRequest(uid, "default", uid, (ContainerRequest("main", ContainerKind.APP, ((SHARED, replicas),)),))


def test_a_logged_prediction_reads_back_as_it_was_made(lines: io.StringIO) -> None:
    predictionlog.record("uid-1", "node-a", {SHARED: ("GPU-1", "GPU-0", "GPU-1"), "other": ()})
    parsed = [p for p in map(predictionlog.parse, lines.getvalue().splitlines()) if p is not None]
    assert len(parsed) == 1
    p = parsed[0]
    assert (p.uid, p.node, dict(p.gpus)) == ("uid-1", "node-a", {SHARED: ("GPU-0", "GPU-1", "GPU-1")})
    assert p.at > 0


@pytest.mark.parametrize(
    "line",
    [
        "2026-01-01 00:00:00,000 INFO sharepack.extender.caches: prediction missed for pod u on node n",
        "2026-01-01 00:00:00,000 INFO sharepack.extender.predictionlog: prediction {not json",
        '2026-01-01 00:00:00,000 INFO sharepack.extender.predictionlog: prediction {"uid": "u"}',
        '2026-01-01 00:00:00,000 INFO sharepack.extender.predictionlog: prediction {"uid": "u", "node": "n", "gpus": [], "t": 1}',
    ],
)
def test_other_or_garbled_lines_are_not_predictions(line: str) -> None:
    assert predictionlog.parse(line) is None


def test_the_view_logs_its_own_predictions_not_directed_placements(lines: io.StringIO) -> None:
    view = ClusterView(Policy.PACKED)
    view.replace_states([state_obj("node-a", [(4, 0, ()), (4, 0, ())])])
    view.assume("own", "node-a", request("own", 2))
    view.assume("directed", "node-a", request("directed", 1), {SHARED: ("GPU-1",)})
    parsed = [p for p in map(predictionlog.parse, lines.getvalue().splitlines()) if p is not None]
    assert [(p.uid, p.node, sum(len(k) for k in p.gpus.values())) for p in parsed] == [("own", "node-a", 2)]
