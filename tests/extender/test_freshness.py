"""A node whose agent stopped writing is unknown, not scored on old counts.

Agents rewrite their state every heartbeat even when nothing changed; a state whose `observedAt`
has not changed for `max_age_s` by the extender's own clock is stale (the node's clock may be
off: its `observedAt` is compared only with its previous value): filter passes the node,
prioritize gives it 0, a log line says so once, and `sharepack_extender_stale_nodes` counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubernetes import config

from sharepack.common import state as published
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.extender.__main__ import Options, Service, parse_args
from sharepack.extender.caches import ClusterView, observed_epoch
from sharepack.extender.metrics import parse_text
from sharepack.extender.server import Extender
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer

SHARED = "nvidia.com/gpu.shared"
T0 = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC).timestamp()
MAX_AGE = 180.0


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(observed_at: str, gpus: list[tuple[int, int]]) -> dict[str, Any]:
    return published.to_status(NodeState(
        observed_at, "0.1.0", Policy.PACKED, MigStrategy.NONE,
        (ResourceState(SHARED, Sharing.TIME_SLICING, False,
                       tuple(GpuState(f"GPU-{i}", str(i), "A100", t, a, 0, ("x",) * a)
                             for i, (t, a) in enumerate(gpus))),),
    ))  # fmt: skip


def state_obj(name: str, observed: float | str, gpus: list[tuple[int, int]], *, rv: str = "1") -> dict[str, Any]:
    at = observed if isinstance(observed, str) else rfc3339(observed)
    return {"metadata": {"name": name, "resourceVersion": rv}, "status": status(at, gpus)}


class WallClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


FULL = [(4, 4), (4, 4)]  # no free replica: fails the filter while its state is believed
USED = [(4, 2), (4, 0)]  # half a GPU used: a packed extender scores it above 0


def make_view(clock: WallClock, max_age: float = MAX_AGE) -> ClusterView:
    view = ClusterView(Policy.PACKED, max_age_s=max_age, wall_clock=clock)
    view.replace_states([state_obj("node-full", T0, FULL), state_obj("node-used", T0, USED)])
    return view


def pod_body(n: int, nodes: list[str]) -> bytes:
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "uid-p"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {SHARED: str(n)}}}]},
    }
    return orjson.dumps({"Pod": pod, "NodeNames": nodes})


async def ask(view: ClusterView, verb: str, n: int = 1) -> Any:
    async with TestClient(TestServer(Extender(view).app())) as c:
        resp = await c.post(f"/{verb}", data=pod_body(n, ["node-full", "node-used"]))
        assert resp.status == 200
        return orjson.loads(await resp.read())


# --- parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30T03:00:00Z", T0),
        ("2026-11-30T03:00:00.250Z", T0 + 0.25),
        ("2026-11-30T04:00:00+01:00", T0),
        ("", None),
        ("yesterday", None),
        ("2026-11-30T03:00:00", None),
    ],
    ids=["utc with Z", "fractional seconds", "an offset", "missing", "not a time", "no time zone"],
)
def test_observed_at_is_parsed_into_posix_seconds(text: str, expected: float | None) -> None:
    assert observed_epoch(text) == expected


# --- the verbs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("age", "full_fails", "used_score"),
    [
        pytest.param(0.0, True, True, id="a just-written state is scored"),
        pytest.param(MAX_AGE - 1, True, True, id="a state just under the max age is scored"),
        pytest.param(MAX_AGE + 1, False, False, id="a state over the max age is unknown"),
    ],
)
async def test_a_stale_node_passes_the_filter_and_scores_zero(age: float, full_fails: bool, used_score: bool) -> None:
    clock = WallClock()
    view = make_view(clock)
    clock.now = T0 + age
    reply = await ask(view, "filter")
    assert ("node-full" in reply["NodeNames"]) is not full_fails
    scores = {p["Host"]: p["Score"] for p in await ask(view, "prioritize")}
    assert (scores.get("node-used", 0) > 0) is used_score
    assert "node-full" not in scores  # 0: left out


async def test_without_a_max_age_old_states_are_still_scored() -> None:
    clock = WallClock(T0 + 86400)
    view = make_view(clock, max_age=0)
    reply = await ask(view, "filter")
    assert reply["NodeNames"] == ["node-used"]
    assert view.sweep_stale() == 0 and view.count_stale() == 0


async def test_a_heartbeat_makes_the_node_fresh_again_and_keeps_its_scorer() -> None:
    clock = WallClock()
    view = make_view(clock)
    before = view.scorers["node-full"]
    clock.now = T0 + MAX_AGE + 10
    assert view.fresh_scorer("node-full") is None
    # The agent's heartbeat: same content, a new observedAt and resourceVersion.
    view.upsert_state(state_obj("node-full", clock.now, FULL, rv="2"))
    assert view.scorers["node-full"] is before, "a heartbeat is not a change: the memo stays"
    assert view.fresh_scorer("node-full") is before
    assert (await ask(view, "filter"))["NodeNames"] == ["node-used"]
    # A real change still rebuilds.
    view.upsert_state(state_obj("node-full", clock.now, [(4, 3), (4, 4)], rv="3"))
    assert view.scorers["node-full"] is not before


def test_an_agent_clock_ahead_of_ours_buys_no_extra_life() -> None:
    clock = WallClock()
    view = ClusterView(Policy.PACKED, max_age_s=MAX_AGE, wall_clock=clock)
    view.upsert_state(state_obj("node-a", T0 + 3600, USED))  # written "an hour from now"
    assert view.scorers["node-a"].fresh_until == T0 + MAX_AGE


@pytest.mark.parametrize("skew", [-600.0, 600.0], ids=["node clock 10 min behind", "node clock 10 min ahead"])
def test_a_skewed_node_clock_is_fresh_while_its_agent_beats_and_stale_once_it_stops(skew: float) -> None:
    clock = WallClock()
    view = ClusterView(Policy.PACKED, max_age_s=MAX_AGE, wall_clock=clock)
    for beat in range(6):  # heartbeats every 60 s, stamped by the node's own clock
        clock.now = T0 + 60 * beat
        view.upsert_state(state_obj("node-a", clock.now + skew, USED, rv=str(beat + 1)))
        assert view.fresh_scorer("node-a") is not None, f"stale after heartbeat {beat}"
        clock.now += 59
        assert view.fresh_scorer("node-a") is not None
    last = T0 + 60 * 5
    clock.now = last + MAX_AGE - 1
    assert view.fresh_scorer("node-a") is not None
    # A resync repeating the last write (same observedAt, new resourceVersion) is no heartbeat.
    view.upsert_state(state_obj("node-a", last + skew, USED, rv="99"))
    clock.now = last + MAX_AGE + 1
    assert view.fresh_scorer("node-a") is None and view.count_stale() == 1


def test_a_state_without_a_readable_observed_at_is_stale() -> None:
    clock = WallClock()
    view = ClusterView(Policy.PACKED, max_age_s=MAX_AGE, wall_clock=clock)
    view.upsert_state(state_obj("node-a", "not a time", USED))
    assert view.fresh_scorer("node-a") is None and view.count_stale() == 1


# --- log and gauge ------------------------------------------------------------------------------


def test_going_stale_and_fresh_again_is_logged_once_each(caplog: pytest.LogCaptureFixture) -> None:
    clock = WallClock()
    view = make_view(clock)
    caplog.set_level(logging.INFO, logger="sharepack.extender.caches")
    assert view.sweep_stale() == 0
    clock.now = T0 + MAX_AGE + 1
    assert view.sweep_stale() == 2
    assert view.sweep_stale() == 2
    view.upsert_state(state_obj("node-full", T0, FULL, rv="2"))  # a late event, still old
    stale = [r for r in caplog.records if "is stale" in r.getMessage()]
    assert sorted(r.getMessage().split()[3] for r in stale) == ["node-full", "node-used"]
    assert all(r.levelno == logging.WARNING for r in stale)
    view.upsert_state(state_obj("node-full", clock.now, FULL, rv="3"))
    view.upsert_state(state_obj("node-full", clock.now + 60, FULL, rv="4"))
    fresh = [r.getMessage() for r in caplog.records if "fresh again" in r.getMessage()]
    assert len(fresh) == 1 and "node-full" in fresh[0]
    assert view.stale == {"node-used"}
    # Stale again after its last heartbeat: the log names that heartbeat's time, not the first,
    # and its age by our clock (it arrived at `heard`, stamped 60 s ahead).
    heard, last = clock.now, clock.now + 60
    clock.now = last + MAX_AGE + 1
    caplog.clear()
    assert view.sweep_stale() == 2
    (again,) = [r.getMessage() for r in caplog.records if "is stale" in r.getMessage()]
    assert f"observed at {rfc3339(last)} (unchanged for {clock.now - heard:.0f} s by our clock)" in again


def test_a_state_first_seen_counts_fresh_for_one_max_age(caplog: pytest.LogCaptureFixture) -> None:
    """At our start an hour-old observedAt may be a dead agent or a slow clock: we wait one max
    age for it to change before calling the node unknown."""
    clock = WallClock(T0 + 3600)
    view = ClusterView(Policy.PACKED, max_age_s=MAX_AGE, wall_clock=clock)
    view.replace_states([state_obj("node-dead", T0, USED)])  # e.g. at extender start
    assert view.fresh_scorer("node-dead") is not None
    clock.now += MAX_AGE + 1
    assert view.sweep_stale() == 1
    assert [r.getMessage() for r in caplog.records if "is stale" in r.getMessage()][0].startswith(
        "NodeGpuState of node node-dead is stale: observed at 2026-11-30T03:00:00Z "
        f"(unchanged for {MAX_AGE + 1:.0f} s by our clock)"
    )
    view.delete_state(state_obj("node-dead", T0, USED))
    assert view.stale == set() and view.count_stale() == 0


async def test_the_stale_nodes_gauge_is_exported() -> None:
    clock = WallClock()
    view = make_view(clock)
    async with TestClient(TestServer(Extender(view).app())) as c:
        async def gauge() -> float:
            resp = await c.get("/metrics")
            return parse_text(await resp.text())["sharepack_extender_stale_nodes"]

        assert await gauge() == 0
        clock.now = T0 + MAX_AGE + 1
        assert await gauge() == 2


def test_the_max_age_flag() -> None:
    assert parse_args([]).state_max_age_s == 180.0
    assert parse_args(["--state-max-age-seconds", "0"]).state_max_age_s == 0.0
    with pytest.raises(SystemExit):
        parse_args(["--state-max-age-seconds", "-1"])


# --- through the sandbox API server -------------------------------------------------------------


def publish(server: FakeApiServer, node: str, observed_at: str, gpus: list[tuple[int, int]]) -> None:
    store, rt = server.store, kinds.NODE_GPU_STATES
    if ("", node) not in store.objects[rt]:
        store.create(rt, "", {"apiVersion": f"{published.GROUP}/{published.VERSION}",
                              "kind": published.KIND, "metadata": {"name": node}})  # fmt: skip
    obj = store.get(rt, "", node)
    obj["status"] = status(observed_at, gpus)
    store.update(rt, "", node, obj, "status")


async def test_a_dead_agents_state_from_the_api_is_unknown_until_it_writes_again(server: FakeApiServer) -> None:
    """Two nodes whose clocks are 10 minutes off (one behind, one ahead); only one agent keeps
    beating. The silent one goes stale after the max age; the beating one never does."""
    max_age = 2.0
    now = datetime.now(UTC).timestamp()
    publish(server, "node-dead", rfc3339(now - 600), FULL)
    publish(server, "node-live", rfc3339(now + 600), FULL)
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        kubeconfig = server.write_kubeconfig(Path(d) / "kubeconfig")
        api = config.new_client_from_config(config_file=str(kubeconfig))
        opts = Options(listen="127.0.0.1:0", kubeconfig=str(kubeconfig), state_max_age_s=max_age)
        svc = Service(opts, api=api)
        await svc.start()
        beats = 0
        beating_nodes = {"node-live": 600.0}  # node -> its clock's offset from ours

        async def beat_live() -> None:
            nonlocal beats
            while True:
                await asyncio.sleep(max_age / 10)
                beats += 1
                for node, skew in list(beating_nodes.items()):
                    publish(server, node, rfc3339(now + skew + beats), FULL)

        beating = asyncio.create_task(beat_live())
        try:
            changed = asyncio.Event()
            svc.view.on_change = changed.set

            async def until(cond: Any) -> None:
                async with asyncio.timeout(10):
                    while not cond():
                        changed.clear()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(0.05):
                                await changed.wait()

            await until(lambda: {"node-dead", "node-live"} <= set(svc.view.scorers))
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{svc.port}"

                async def filter_reply() -> Any:
                    body = pod_body(1, ["node-dead", "node-live"])
                    async with http.post(f"{base}/filter", data=body) as resp:
                        return orjson.loads(await resp.read())

                async def until_reply(passed: list[str], failed: set[str]) -> None:
                    """Conditions, not a window: a beat the loaded machine delays past the max
                    age makes the live node stale for a moment, so the reply is asked again."""
                    reply: Any = None
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(10):
                            while True:
                                reply = await filter_reply()
                                if reply["NodeNames"] == passed and not failed & set(reply["NodeNames"]):
                                    return
                                await asyncio.sleep(max_age / 10)
                    raise AssertionError(f"filter never answered {passed} passed, {failed} failed; last: {reply}")

                await until(lambda: svc.view.fresh_scorer("node-dead") is None)
                await until(lambda: svc.view.fresh_scorer("node-live") is not None)
                await until_reply(["node-dead"], {"node-live"})
                async def stale_nodes() -> float:
                    async with http.get(f"{base}/metrics") as resp:
                        return float(parse_text(await resp.text())["sharepack_extender_stale_nodes"])

                stale: list[float] = []
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        while not stale or stale[-1] != 1:
                            stale.append(await stale_nodes())
                            await asyncio.sleep(max_age / 10)
                assert stale and stale[-1] == 1, stale
                # The agent comes back and beats (still with its slow clock): judged again.
                beating_nodes["node-dead"] = -590.0
                await until(lambda: svc.view.fresh_scorer("node-dead") is not None)
                await until_reply([], {"node-dead", "node-live"})
                assert beats >= 3
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            await svc.stop()
            api.close()
