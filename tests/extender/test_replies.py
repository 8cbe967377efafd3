"""Answers kept per request shape (extender.replies) agree with the node-by-node loops through
any sequence of node changes, staleness and bound pods."""

from __future__ import annotations

import random

import pytest

from sharepack.common import podrequests
from sharepack.common import state as published
from sharepack.common.policies import Policy
from sharepack.extender.caches import ClusterView
from tests.extender.test_freshness import MAX_AGE, T0, WallClock, state_obj

NAMES = [f"node-{i}" for i in range(12)]
SHARED = "nvidia.com/gpu.shared"


def pod(uid: str, n: int, node: str = "") -> dict[str, object]:
    return {
        "metadata": {"name": f"p-{uid}", "namespace": "default", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {SHARED: str(n)}}}]},
        "status": {"phase": "Running"},
    }


def request(uid: str, n: int) -> podrequests.PodRequest:
    return podrequests.pod_request(podrequests.decode_pod(pod(uid, n), None), None)


def agree(view: ClusterView, names: list[str], req: podrequests.PodRequest) -> None:
    now = view.wall_clock()
    kept = view._replies.get(req.shape)
    assert kept is not None
    survivors, failed, unresolvable = view._filter_each(names, req, now)
    if 0 < view.tier_width < len(survivors):
        survivors = view._best_tier(names, survivors, req, now, failed)
    assert view.filter_nodes(names, req) == (survivors, failed, unresolvable)
    assert view.host_priorities(names, req) == view._priorities_each(names, req, now)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("tier", [0, 2], ids=["every feasible node", "best two"])
def test_kept_answers_agree_with_the_node_by_node_loops(seed: int, tier: int) -> None:
    rng = random.Random(seed)
    clock = WallClock()
    view = ClusterView(Policy.PACKED, max_age_s=MAX_AGE, wall_clock=clock, tier_width=tier)
    rv = iter(range(2, 10_000))

    def write(name: str, observed: float | str | None = None) -> None:
        gpus = [(4, rng.choice([0, 1, 2, 3, 4])) for _ in range(2)]
        view.upsert_state(state_obj(name, clock.now if observed is None else observed, gpus, rv=str(next(rv))))

    for name in NAMES[:-1]:  # the last one is never published: unknown
        write(name)
    requests = [request(f"u{n}", n) for n in (1, 2, 3, 5, 9)]
    for step in range(60):
        req = rng.choice(requests)
        view.remember(req, prioritizing=True)  # the tier's ranking is test_tierranks'
        agree(view, rng.sample(NAMES, rng.randint(1, len(NAMES))), req)
        op = rng.randrange(6)
        name = rng.choice(NAMES[:-1])
        if op == 0:
            write(name)
        elif op == 1:  # a heartbeat: same counts, new observedAt
            entry = view.published.get(name)
            if entry is not None:
                obj = state_obj(name, clock.now, [(4, 0)] * 2, rv=str(next(rv)))
                obj["status"]["resources"] = published.to_status(entry[1])["resources"]
                view.upsert_state(obj)
        elif op == 2:  # time passes: some states go stale
            clock.now += rng.choice([10.0, MAX_AGE / 2, MAX_AGE])
        elif op == 3:
            view.delete_state({"metadata": {"name": name}})
        elif op == 4:  # a pod bound there, counted with its prediction
            view.upsert_pod(pod(f"bound-{step}", rng.randint(1, 3), name))
        else:
            write(name, "not a time")  # unreadable observedAt: stale at once
    assert clock.now > T0
