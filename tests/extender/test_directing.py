"""The extender's side of directed GPUs: at /bind the pod is annotated with the GPUs it is
counted on, before the Binding exists (extender.directing), through the sandbox API server."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kubernetes import config

from sharepack.common import directions
from sharepack.extender.__main__ import Service, parse_args
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer
from tests.extender.test_service import SHARED, allocated, call, create_pod, publish, synced, until


async def started(server: FakeApiServer, tmp_short: Path, *flags: str) -> Service:
    publish(server, "node-a", [(4, 1, ("old",)), (4, 0, ())])
    kubeconfig = server.write_kubeconfig(tmp_short / "kubeconfig")
    opts = parse_args(["--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig), *flags])
    svc = Service(opts, api=config.new_client_from_config(config_file=str(kubeconfig)))
    await svc.start()
    await synced(svc)
    await until(svc, lambda: "node-a" in svc.view.scorers)
    return svc


async def filtered(svc: Service, server: FakeApiServer, name: str, n: int) -> str:
    """A new pod asking for `n` replicas, run through /filter on node-a; its UID."""
    uid = create_pod(server, name, n)
    pod = server.store.get(kinds.PODS, "default", name)
    assert (await call(svc, "POST", "/filter", {"Pod": pod, "NodeNames": ["node-a"]}))[0] == 200
    return uid


async def schedule(svc: Service, server: FakeApiServer, name: str, n: int) -> tuple[str, dict[str, object]]:
    uid = create_pod(server, name, n)
    pod = server.store.get(kinds.PODS, "default", name)
    assert (await call(svc, "POST", "/filter", {"Pod": pod, "NodeNames": ["node-a"]}))[0] == 200
    code, reply = await call(svc, "POST", "/bind",
                             {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": "node-a"})  # fmt: skip
    assert (code, reply) == (200, {"Error": ""})
    return uid, server.store.get(kinds.PODS, "default", name)


async def test_bind_annotates_the_pod_with_the_gpus_it_is_counted_on(server: FakeApiServer, tmp_short: Path) -> None:
    # `packed`: the agent's own loop is the prediction (`fragaware` chooses a share's GPU
    # itself: tests/extender/test_noderesources.py).
    svc = await started(server, tmp_short, "--node-policy=packed")
    try:
        uid, pod = await schedule(svc, server, "trainer-0", 2)
        d = directions.decode(pod["metadata"]["annotations"][directions.ANNOTATION], where="test")
        assert d == directions.Directions(
            "node-a", (directions.ContainerDirections("main", {SHARED: ("GPU-0", "GPU-0")}),)
        )
        assert pod["spec"]["nodeName"] == "node-a"
        # What the agent is told is what the extender counts.
        assert svc.view.assumed[uid].placement == {SHARED: ("GPU-0", "GPU-0")}
        assert allocated(svc, "node-a") == [3, 0]
        # The next pod is directed on the state that counts the first.
        _, second = await schedule(svc, server, "trainer-1", 2)
        d = directions.decode(second["metadata"]["annotations"][directions.ANNOTATION], where="test")
        assert d.containers[0].gpus == {SHARED: ("GPU-0", "GPU-1")}
    finally:
        await svc.stop()


async def test_with_directed_gpus_off_the_pod_is_bound_without_annotation(server: FakeApiServer, tmp_short: Path) -> None:
    svc = await started(server, tmp_short, "--no-directed-gpus")
    try:
        uid, pod = await schedule(svc, server, "trainer-0", 1)
        assert directions.ANNOTATION not in (pod["metadata"].get("annotations") or {})
        assert svc.view.assumed[uid].placement == {SHARED: ("GPU-0",)}  # still counted
    finally:
        await svc.stop()


async def test_a_failed_bind_stops_counting_the_directed_pod(server: FakeApiServer, tmp_short: Path) -> None:
    svc = await started(server, tmp_short)
    try:
        uid = await filtered(svc, server, "doomed", 1)
        # The guard admits the bind; the Binding itself then fails at the API server (a conflict).
        server.fail_next("POST", "/binding", 409)
        code, reply = await call(svc, "POST", "/bind",
                                 {"PodName": "doomed", "PodNamespace": "default", "PodUID": uid, "Node": "node-a"})  # fmt: skip
        assert code == 200 and "409" in reply["Error"]
        assert allocated(svc, "node-a") == [1, 0]  # what node-a published, and nothing more
        assert uid not in svc.view.assumed
    finally:
        await svc.stop()


async def test_a_pod_this_replica_never_scored_is_read_and_directed(server: FakeApiServer, tmp_short: Path) -> None:
    """Behind one Service, /bind may reach a replica that saw neither filter nor prioritize:
    with `--unscored-binds=recheck` (as deploy/ runs it) it checks the pod itself and directs it."""
    svc = await started(server, tmp_short, "--unscored-binds=recheck")
    try:
        uid = create_pod(server, "elsewhere", 1)
        code, reply = await call(svc, "POST", "/bind",
                                 {"PodName": "elsewhere", "PodNamespace": "default", "PodUID": uid, "Node": "node-a"})  # fmt: skip
        assert (code, reply) == (200, {"Error": ""})
        pod = server.store.get(kinds.PODS, "default", "elsewhere")
        d = directions.decode(pod["metadata"]["annotations"][directions.ANNOTATION], where="test")
        assert directions.placement(d) == {SHARED: ("GPU-0",)} == svc.view.assumed[uid].placement
    finally:
        await svc.stop()


async def test_a_bind_that_finds_the_node_full_waits_for_a_release_on_its_way(
    server: FakeApiServer, tmp_short: Path
) -> None:
    """kube-scheduler saw a deletion our view had not yet: the node looks full here when the
    bind arrives, and the release lands tens of milliseconds later. The bind waits for it and
    directs the pod, instead of refusing it (kube-scheduler then binds it itself, undirected,
    onto GPUs the next pods were directed to: the soak's cascades of missed predictions)."""
    svc = await started(server, tmp_short)
    try:
        uid = await filtered(svc, server, "late-room", 2)
        publish(server, "node-a", [(4, 4, ("old",)), (4, 4, ("gone",))])  # full, in our view
        await until(svc, lambda: allocated(svc, "node-a") == [4, 4])

        async def released() -> None:
            await asyncio.sleep(0.05)
            publish(server, "node-a", [(4, 4, ("old",)), (4, 0, ())])  # "gone" is gone

        later = asyncio.create_task(released())
        code, reply = await call(svc, "POST", "/bind",
                                 {"PodName": "late-room", "PodNamespace": "default", "PodUID": uid, "Node": "node-a"})  # fmt: skip
        await later
        assert (code, reply) == (200, {"Error": ""})
        bound = server.store.get(kinds.PODS, "default", "late-room")
        d = directions.decode(bound["metadata"]["annotations"][directions.ANNOTATION], where="test")
        assert directions.placement(d) == {SHARED: ("GPU-1", "GPU-1")} == svc.view.assumed[uid].placement
    finally:
        await svc.stop()


async def test_a_node_that_stays_full_is_still_refused(server: FakeApiServer, tmp_short: Path) -> None:
    svc = await started(server, tmp_short)
    try:
        uid = await filtered(svc, server, "no-room", 2)
        publish(server, "node-a", [(4, 4, ("old",)), (4, 3, ("other",))])
        await until(svc, lambda: allocated(svc, "node-a") == [4, 3])
        code, reply = await call(svc, "POST", "/bind",
                                 {"PodName": "no-room", "PodNamespace": "default", "PodUID": uid, "Node": "node-a"})  # fmt: skip
        assert code == 200 and "bind refused (node-not-feasible)" in reply["Error"], reply
        assert not server.store.get(kinds.PODS, "default", "no-room")["spec"].get("nodeName")
    finally:
        await svc.stop()


def test_the_flag_is_on_by_default() -> None:
    assert parse_args([]).directed_gpus is True
    assert parse_args(["--no-directed-gpus"]).directed_gpus is False
