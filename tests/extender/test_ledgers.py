"""The extender's bookkeeping as a pure model: effective states and what each input changes."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharepack.common import scoring
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.extender.ledgers import Ledger

SHARED = "nvidia.com/gpu.shared"


def state(gpus: list[tuple[int, tuple[str, ...]]], observed: str = "2026-11-30T03:00:00Z") -> NodeState:
    return NodeState(
        observed, "0.1.0", Policy.PACKED, MigStrategy.NONE,
        (ResourceState(SHARED, Sharing.TIME_SLICING, False,
                       tuple(GpuState(f"GPU-{i}", str(i), "A100", 4, a, 0, pods)
                             for i, (a, pods) in enumerate(gpus))),),
    )  # fmt: skip


def allocated(ledger: Ledger, node: str) -> list[int]:
    s = ledger.effective(node)
    assert s is not None
    return [g.allocated for g in s.resources[0].gpus]


def on(*keys: str) -> MappingProxyType[str, tuple[str, ...]]:
    return MappingProxyType({SHARED: keys})


def test_the_effective_state_is_published_minus_released_plus_assumed() -> None:
    ledger = Ledger()
    ledger.publish("n", "1", state([(2, ("gone",)), (0, ())]))
    ledger.bound("gone", "n")
    ledger.assume("new", "n", on("GPU-1", "GPU-1"), expires=10.0)
    forgotten = ledger.forget("gone", None, expires=10.0)
    assert forgotten.changed and forgotten.node == "n" and not forgotten.untold
    assert allocated(ledger, "n") == [0, 2]
    assert ledger.effective("elsewhere") is None


@pytest.mark.parametrize(
    ("second", "changed"),
    [
        pytest.param(state([(1, ("old",)), (0, ())], "2026-11-30T03:01:00Z"), False, id="a heartbeat changes nothing"),
        pytest.param(state([(2, ("old", "x")), (0, ())]), True, id="new counts change the node"),
    ],
)
def test_a_new_published_state_says_whether_the_node_changed(second: NodeState, changed: bool) -> None:
    ledger = Ledger()
    assert ledger.publish("n", "1", state([(1, ("old",)), (0, ())])).changed
    assert ledger.publish("n", "2", second).changed is changed


@pytest.mark.parametrize(
    ("reported", "match"),
    [
        pytest.param([(2, ("old", "p")), (0, ())], True, id="reported where predicted: a match"),
        pytest.param([(1, ("old",)), (1, ("p",))], False, id="reported elsewhere: a mismatch"),
    ],
)
def test_an_assumed_pod_settles_when_its_node_lists_it(
    reported: list[tuple[int, tuple[str, ...]]], match: bool
) -> None:
    ledger = Ledger()
    ledger.publish("n", "1", state([(1, ("old",)), (0, ())]))
    ledger.bound("p", "n")
    assert not ledger.counted("p", "n")
    ledger.assume("p", "n", on("GPU-0"), expires=10.0)
    published = ledger.publish("n", "2", state(reported))
    assert published.changed and [s.match for s in published.settled] == [match]
    assert ledger.assumed == {} and ledger.counted("p", "n")
    assert ("p" in ledger.placed) is match


def test_expiry_ends_assumptions_and_releases_and_names_their_nodes() -> None:
    ledger = Ledger()
    ledger.publish("a", "1", state([(1, ("gone",)), (0, ())]))
    ledger.bound("gone", "a")
    ledger.forget("gone", None, expires=5.0)
    ledger.assume("p", "b", on("GPU-0"), expires=10.0)
    assert ledger.expire(4.0).nodes == frozenset()
    first = ledger.expire(5.0)
    assert first.released == (("a", "gone"),) and first.assumed == () and first.nodes == {"a"}
    second = ledger.expire(10.0)
    assert [a.uid for a in second.assumed] == ["p"] and second.nodes == {"b"}
    assert ledger.counted("p", "b")  # expired: never assumed again
    assert allocated(ledger, "a") == [1, 0]


def test_a_gone_pod_whose_devices_the_counts_cannot_tell_is_untold() -> None:
    ledger = Ledger()
    ledger.publish("n", "1", state([(3, ("x", "p")), (2, ("y", "p"))]))
    ledger.bound("p", "n")
    forgotten = ledger.forget("p", None, expires=10.0)
    assert forgotten.untold and not forgotten.changed
    assert allocated(ledger, "n") == [3, 2]


@pytest.mark.parametrize(
    ("directed", "freed"),
    [
        pytest.param(on("GPU-0", "GPU-1", "GPU-1"), [2, 0], id="its directions, on the GPUs it is listed on: exact"),
        pytest.param(on("GPU-0", "GPU-0", "GPU-2"), None, id="directions elsewhere (not honoured): still untold"),
        pytest.param(None, None, id="no directions: still untold"),
    ],
)
def test_a_gone_pods_directions_tell_its_counts_where_the_state_lists_it_on_exactly_those_gpus(
    directed: MappingProxyType[str, tuple[str, ...]] | None, freed: list[int] | None
) -> None:
    """A pod split over shared GPUs and placed before this replica started (no prediction of
    ours settled it): the per-GPU lists cannot say how many devices it held on each, its
    directions can. Its node's view then frees them at once instead of counting them until the
    agent republishes, which made binds in that gap find the node full (issue 25)."""
    ledger = Ledger()
    ledger.publish("n", "1", state([(3, ("x", "p")), (2, ("y", "p")), (0, ())]))
    ledger.bound("p", "n")
    forgotten = ledger.forget("p", None, expires=10.0, directed=directed)
    if freed is None:
        assert forgotten.untold and not forgotten.changed
        assert allocated(ledger, "n") == [3, 2, 0]
    else:
        assert forgotten.changed and not forgotten.untold
        assert allocated(ledger, "n")[:2] == freed


def replayed(ledger: Ledger, node: str) -> NodeState | None:
    """The effective state by its definition: the published state, minus each released pod,
    plus each assumed pod, every time from the start."""
    entry = ledger.published.get(node)
    if entry is None:
        return None
    s = entry[1]
    for uid, r in ledger.released.get(node, {}).items():
        s = scoring.release_placement(s, uid, r.placement)
    for uid in ledger.assumed_on.get(node, ()):
        s = scoring.apply_placement(s, uid, ledger.assumed[uid].placement)
    return s


ops = st.lists(
    st.tuples(
        st.sampled_from(["assume", "assume", "assume", "unassume", "forget", "publish", "expire", "unpublish"]),
        st.sampled_from(["n", "m"]), st.integers(0, 7), st.lists(st.sampled_from(["GPU-0", "GPU-1"]), max_size=3),
    ),
    max_size=40,
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops)
def test_the_effective_state_kept_between_calls_is_the_one_replayed_from_the_start(
    ops: list[tuple[str, str, int, list[str]]],
) -> None:
    ledger = Ledger()
    clock = 0.0
    version = 0
    for op, node, pod, keys in ops:
        uid = f"pod-{pod}"
        clock += 1.0
        if op == "assume" and uid not in ledger.assumed and uid not in ledger.settled:
            ledger.assume(uid, node, on(*keys), expires=clock + 5.0)
        elif op == "unassume":
            ledger.unassume(uid, node)
        elif op == "forget":
            ledger.bound(uid, node)
            ledger.forget(uid, None, expires=clock + 5.0, directed=on(*keys))
        elif op == "publish":  # the agent's counts: what it lists now, some of the assumed pods
            version += 1
            listed = tuple(sorted(u for u, a in ledger.assumed.items() if a.node == node))[: pod % 3]
            ledger.publish(node, str(version), state([(len(listed), listed), (0, ())]))
        elif op == "expire":
            ledger.expire(clock)
        elif op == "unpublish":
            ledger.unpublish(node, releases=pod % 2 == 0)
        for n in ("n", "m"):  # asked after every step, so that kept states are reused
            assert ledger.effective(n) == replayed(ledger, n)


def test_a_release_after_the_state_was_kept_is_counted() -> None:
    ledger = Ledger()
    ledger.assume("a", "n", on("GPU-0"), expires=10.0)
    ledger.publish("n", "1", state([(1, ("a",)), (0, ())]))  # its agent lists it: settled
    assert allocated(ledger, "n") == [1, 0]
    ledger.bound("a", "n")
    ledger.forget("a", None, expires=10.0)  # gone, still published: released
    assert allocated(ledger, "n") == [0, 0]
