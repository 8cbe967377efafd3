"""extender.directing: when a bind lists its node's pods first (`DirectingBinder.must_list`).

The list is there for another replica's binds our pod watch has not delivered yet; a replica
binding alone skips it (one API call per bind, the Binding). These drive the binder with a
recording API and a clock of their own; tests/extender/test_directing.py runs it against the
sandbox API server."""

from __future__ import annotations

from typing import Any

from sharepack.common import podrequests
from sharepack.extender import directing
from sharepack.extender.directing import DirectingBinder
from sharepack.extender.protocol import BindingArgs
from sharepack.common.policies import Policy
from sharepack.extender.caches import ClusterView
from tests.extender.test_bindguard import SHARED, Clock, pod_doc, state_obj


class RecordingApi:
    def __init__(self) -> None:
        self.listed: list[str] = []
        self.bound: list[tuple[str, dict[str, str]]] = []
        self.pods: dict[str, Any] = {}

    async def pods_on(self, node: str) -> list[Any]:
        self.listed.append(node)
        return []

    async def bind(self, args: BindingArgs, annotations: Any = None) -> None:
        self.bound.append((args.pod_name, dict(annotations or {})))

    async def get_pod(self, namespace: str, name: str) -> Any:
        return self.pods[name]


def setup() -> tuple[DirectingBinder, RecordingApi, Clock, Any]:
    clock = Clock()
    view = ClusterView(Policy.PACKED, clock=clock)
    view.replace_states([state_obj("node-used", [(10, 0)] * 8)])  # room for every bind here
    api = RecordingApi()
    return DirectingBinder(api, view, clock=clock), api, clock, view


async def bind(binder: DirectingBinder, view: Any, api: RecordingApi, name: str, *, scored: bool = True) -> None:
    uid = f"uid-{name}"
    doc = pod_doc(uid=uid, replicas=1)
    doc["metadata"]["name"] = name
    api.pods[name] = doc
    if scored:
        view.remember(podrequests.decode_pod_request(doc))
    args = BindingArgs(name, "default", uid, "node-used")
    binder.prefetch(args)
    await binder.bind(args)


async def test_a_replica_binding_steadily_alone_lists_only_its_first_bind() -> None:
    binder, api, clock, view = setup()
    for i in range(5):
        await bind(binder, view, api, f"p{i}")
        clock.now += 1.0  # below QUIET_S between binds
    assert len(api.bound) == 5 and all(SHARED in a.get("sharepack.io/gpus", "") for _, a in api.bound)
    assert api.listed == ["node-used"] and binder.lists == 1


async def test_after_a_pause_the_next_bind_lists_again() -> None:
    binder, api, clock, view = setup()
    await bind(binder, view, api, "p0")
    clock.now += directing.QUIET_S + 0.1  # another replica may have bound meanwhile
    await bind(binder, view, api, "p1")
    clock.now += 1.0
    await bind(binder, view, api, "p2")
    assert api.listed == ["node-used", "node-used"]


async def test_a_pod_another_replica_bound_makes_every_bind_list_for_a_while() -> None:
    binder, api, clock, view = setup()
    await bind(binder, view, api, "p0")
    clock.now += 1.0
    foreign = pod_doc(uid="uid-theirs", replicas=1, node="node-used")
    foreign["metadata"]["name"] = "theirs"
    view.upsert_pod(foreign)  # the pod watch delivers a GPU pod this view did not count
    seen = clock.now
    listed_at = []
    for i in range(1, 40):  # a bind a second, no pause
        before = len(api.listed)
        await bind(binder, view, api, f"p{i}")
        if len(api.listed) > before:
            listed_at.append(clock.now - seen)
        clock.now += 1.0
    # Every bind while the other replica may be binding, none after: one API call per bind again.
    assert listed_at == [float(s) for s in range(int(directing.SHARED_S))]


async def test_a_bind_for_a_pod_this_replica_did_not_score_lists_and_so_do_the_next() -> None:
    binder, api, clock, view = setup()
    await bind(binder, view, api, "p0")
    clock.now += 1.0
    await bind(binder, view, api, "p1", scored=False)  # another replica scored it
    clock.now += 1.0
    await bind(binder, view, api, "p2")
    assert len(api.listed) == 3
