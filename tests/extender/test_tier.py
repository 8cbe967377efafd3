"""The extender's tier filter: only the best nodes by the node policy's fine rank survive."""

from __future__ import annotations

import pytest

from sharepack.common import scoring, shipped
from sharepack.common.podrequests import ContainerKind, ContainerRequest, PodRequest
from sharepack.common.policies import Policy
from sharepack.extender.__main__ import parse_args
from sharepack.extender.caches import ClusterView
from tests.extender.test_caches import SHARED, state_obj


def one_replica() -> PodRequest:
    return PodRequest("u1", "default", "p", (ContainerRequest("c", ContainerKind.APP, ((SHARED, 1),)),))


def view(width: int) -> ClusterView:
    v = ClusterView(Policy.PACKED, tier_width=width)
    v.replace_states([
        state_obj("node-a", [(4, 0, ()), (4, 0, ())]),  # empty: packed ranks it last
        state_obj("node-c", [(4, 2, ("x",)), (4, 0, ())]),  # same as node-b: a tie
        state_obj("node-b", [(4, 2, ("y",)), (4, 0, ())]),
        state_obj("node-d", [(4, 4, ("z",)), (4, 4, ("z",))]),  # full: infeasible
    ])  # fmt: skip
    return v


NAMES = ["node-a", "node-c", "node-b", "node-d", "node-unknown"]
# node-b and node-c tie on rank: the tie goes by `scoring.tie_key` (a hash of the name), which
# here puts node-c first although node-b comes first by name.
TIE_WINNER = min(("node-b", "node-c"), key=scoring.tie_key)


@pytest.mark.parametrize(
    ("width", "kept"),
    [
        (1, [TIE_WINNER]),  # the best rank; node-b and node-c tie
        (2, ["node-c", "node-b"]),
        (3, ["node-a", "node-c", "node-b"]),  # unknown nodes rank below every known one
        (0, ["node-a", "node-c", "node-b", "node-unknown"]),  # off: every feasible node
        (9, ["node-a", "node-c", "node-b", "node-unknown"]),
    ],
)
def test_the_filter_keeps_exactly_the_best_tier(width: int, kept: list[str]) -> None:
    survivors, failed, unresolvable = view(width).filter_nodes(NAMES, one_replica())
    assert [NAMES[i] for i in survivors] == kept
    assert failed["node-d"].startswith(f"{SHARED}: not enough free devices")
    outside = {n for n in NAMES if n not in kept and n != "node-d"}
    assert {n for n, why in failed.items() if "outside the best" in why} == outside
    assert unresolvable == {}


def test_ties_go_by_a_hash_of_the_name_not_by_the_name() -> None:
    assert TIE_WINNER == "node-c"  # not the first by name: the case above tells the two apart
    assert scoring.tie_key("node-c") == scoring.tie_key("node-c") != scoring.tie_key("node-b")


def test_an_unknown_node_passes_when_no_known_node_can_take_the_pod() -> None:
    survivors, _, _ = view(1).filter_nodes(["node-d", "node-unknown"], one_replica())
    assert survivors == [1]


def test_the_tier_width_is_a_flag_and_rejects_negative_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args([]).filter_tier_width == shipped.FILTER_TIER_WIDTH == 1  # the best node only, as shipped
    assert parse_args(["--filter-tier-width", "3"]).filter_tier_width == 3
    with pytest.raises(SystemExit):
        parse_args(["--filter-tier-width", "-1"])
    assert "invalid --filter-tier-width option: -1" in capsys.readouterr().err
