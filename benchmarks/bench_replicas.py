"""Two extender replicas behind one address (a benchmark, not a test): how often the replica that
handles a pod's filter, prioritize or bind has not yet seen the previous pod's bind, and what
that costs in matched predictions and honoured directed GPUs.

    .venv/bin/python benchmarks/bench_replicas.py [--rounds 2] [--seed 0] [--overlap]

The sandbox (API server, 2 simulated nodes of 4 T4 x 4 replicas, `packed`) with a second
extender process; a driver sends each call to the next replica in turn (round-robin, as a
Service spreads connections), pods back to back: create, filter, prioritize, bind, admit, next
pod at once (a burst; kube-scheduler does not wait for agents either; the kubelets admit in
the background, in bind order). Before each call it
asks that replica's /metrics, sent together with the call, whether it knows every pod bound so
far: a replica sees a bind it did not make only through its pod watch
(`sharepack_extender_cache_pods`).

Prints, per round: calls made to a replica that had not seen the previous bind, per verb;
predictions matched over both replicas; directed allocations honoured by the agents.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kubernetes  # noqa: E402

from sharepack.common.policies import Policy  # noqa: E402
from sharepack.sandbox.drivers import demo  # noqa: E402
from sharepack.sandbox.controlplane.plane import free_port  # noqa: E402
from sharepack.sandbox.drivers.demo import Sandbox, Workload  # noqa: E402
from sharepack.sandbox.processes import LoggedProcess  # noqa: E402
from tests.scenario.harness import (  # noqa: E402
    MACHINE,
    REPLICAS,
    directed_allocations,
    eventually,
    node_named,
    parse_metrics,
    pod_body,
    read_pod,
    short_root,
    wait_stack_ready,
)

SIZES = (1, 2, 1, 4, 1, 2, 1, 1, 2, 4, 1, 2, 1, 1, 2, 1)  # 27 of the 32 replicas
CAPACITY = 4 * REPLICAS  # replicas per node (4 T4)
VERBS = ("filter", "prioritize", "bind")
PREDICTIONS = "sharepack_extender_predictions_total"


@dataclass
class Round:
    unseen: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VERBS, 0))
    probed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VERBS, 0))  # other replica bound the last
    matched: int = 0
    predicted: int = 0
    honoured: int = 0
    fallbacks: int = 0
    why: list[str] = field(default_factory=list)  # the agents' fallback lines, and the misses


async def metrics(box: Sandbox, url: str) -> dict[str, float]:
    async with box.session.get(f"{url}/metrics") as resp:
        return parse_metrics(await resp.text())


async def post(box: Sandbox, url: str, verb: str, body: dict[str, Any]) -> Any:
    async with box.session.post(f"{url}/{verb}", json=body) as resp:
        assert resp.status == 200, f"{verb}: HTTP {resp.status}"
        return await resp.json()


async def second_extender(box: Sandbox, root: Path) -> tuple[LoggedProcess, str]:
    port = free_port()
    proc = LoggedProcess(
        [sys.executable, "-m", "sharepack.extender", f"--listen=127.0.0.1:{port}", f"--node-policy={box.policy}",
         f"--kubeconfig={box.kubeconfig}", "--log-format=text"],
        root / "extender-2.log",
    )  # fmt: skip
    await proc.start()
    url = f"http://127.0.0.1:{port}"

    async def knows_every_node() -> bool:
        return (await metrics(box, url)).get("sharepack_extender_cache_nodes") == len(box.nodes)

    await eventually(knows_every_node, "the second extender to cache every node")
    return proc, url


async def one_round(seed: int, overlap: bool) -> Round:
    root = short_root("sprep-")
    rng = random.Random(seed)
    out = Round()
    try:
        async with Sandbox(Policy.PACKED, 2, MACHINE, Workload(REPLICAS, ()), root) as box:
            await wait_stack_ready(box)
            proc, url2 = await second_extender(box, root)
            try:
                urls = [box.extender_url, url2]
                turn = 0
                core: Any = kubernetes.client.CoreV1Api(box.api)
                docs = []
                for i, n in enumerate(SIZES):
                    await asyncio.to_thread(core.create_namespaced_pod, demo.NAMESPACE, pod_body(f"p{i}", n))
                    docs.append(await read_pod(box, f"p{i}"))
                # The kubelets admit bound pods in bind order, in the background: the next pod's
                # filter follows its predecessor's bind at once, as in kube-scheduler.
                admit: asyncio.Queue[str | None] = asyncio.Queue()

                async def kubelets() -> None:
                    while (node := await admit.get()) is not None:
                        assert await node_named(box, node).sync_pods() == []

                admitting = asyncio.create_task(kubelets())
                binding: asyncio.Task[None] | None = None
                bound_by: dict[str, str] = {}  # pod uid -> replica whose bind has returned

                async def call(verb: str, i: int, body: dict[str, Any]) -> Any:
                    nonlocal turn
                    url = urls[turn % 2]
                    turn += 1
                    probe = None
                    prev = docs[i - 1]["metadata"]["uid"] if i else ""
                    if prev and bound_by.get(prev) != url:
                        # Sent with the call, not before it: waiting for it would widen the gap
                        # the call is meant to measure.
                        probe = asyncio.ensure_future(metrics(box, url))
                        await asyncio.sleep(0)
                    reply = await post(box, url, verb, body)
                    if probe is not None:
                        out.probed[verb] += 1
                        out.unseen[verb] += (await probe).get("sharepack_extender_cache_pods", 0) < i
                    return url, reply

                async def bind(i: int, node: str) -> None:
                    meta = docs[i]["metadata"]
                    url, reply = await call("bind", i, {"PodName": meta["name"], "PodNamespace": demo.NAMESPACE,
                                                        "PodUID": meta["uid"], "Node": node})  # fmt: skip
                    assert not reply.get("Error"), reply
                    bound_by[meta["uid"]] = url
                    admit.put_nowait(node)

                # kube-scheduler's own resource fit, on its cache (assumed at the end of each
                # scheduling cycle): nodes without room are never sent to the extender.
                used = {x.name: 0 for x in box.nodes}
                for i, doc in enumerate(docs):
                    n = SIZES[i]
                    fits = [x for x, u in used.items() if u + n <= CAPACITY]
                    _, reply = await call("filter", i, {"Pod": doc, "NodeNames": fits})
                    nodes = reply["NodeNames"]
                    _, reply = await call("prioritize", i, {"Pod": doc, "NodeNames": nodes})
                    scores = {p["Host"]: p["Score"] for p in reply}
                    best = max(scores.values())
                    choice = rng.choice(sorted(h for h, s in scores.items() if s == best))
                    used[choice] += n
                    if binding is not None:
                        await binding
                    # kube-scheduler binds in a goroutine and starts the next scheduling cycle.
                    binding = asyncio.create_task(bind(i, choice))
                    if not overlap:
                        await binding
                if binding is not None:
                    await binding
                admit.put_nowait(None)
                await admitting

                async def settled() -> tuple[int, int] | None:
                    m = [await metrics(box, u) for u in urls]
                    match = sum(int(x.get(f'{PREDICTIONS}{{outcome="match"}}', 0)) for x in m)
                    miss = sum(int(x.get(f'{PREDICTIONS}{{outcome="mismatch"}}', 0)) for x in m)
                    # Every pod counted by its agent on both replicas (a pod a replica predicted
                    # infeasible, or saw already published, gives no prediction there).
                    pending = sum(int(x.get("sharepack_extender_assumed_pods", 0)) for x in m)
                    return (match, miss) if pending == 0 and match + miss >= len(SIZES) else None

                match, miss = await eventually(settled, "both replicas to settle every prediction")
                for log in (root / "extender.log", root / "extender-2.log"):
                    out.why += [line for line in log.read_text().splitlines() if "prediction missed" in line]
                out.matched, out.predicted = match, match + miss
            finally:
                await proc.stop()
        honoured, fallbacks = directed_allocations(root)
        out.honoured, out.fallbacks = honoured, len(fallbacks)
        out.why += [line.split(": ", 1)[-1] for line in fallbacks]
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="print the fallbacks and missed predictions")
    p.add_argument("--overlap", action="store_true",
                   help="send the next pod's filter and prioritize while the previous bind is in "
                        "flight (kube-scheduler's asynchronous binding cycle)")  # fmt: skip
    a = p.parse_args()
    total = Round()
    for r in range(a.rounds):
        res = asyncio.run(one_round(a.seed + r, a.overlap))
        print(f"round {r}: {len(SIZES)} pods; calls to a replica that had not seen the previous bind: "
              + ", ".join(f"{v} {res.unseen[v]}/{res.probed[v]}" for v in VERBS)
              + f"; predictions matched {res.matched}/{res.predicted} (both replicas); "
              f"directed honoured {res.honoured}/{res.honoured + res.fallbacks}", flush=True)  # fmt: skip
        if a.verbose:
            for line in res.why:
                print("   ", line)
        for v in VERBS:
            total.unseen[v] += res.unseen[v]
            total.probed[v] += res.probed[v]
        total.matched += res.matched
        total.predicted += res.predicted
        total.honoured += res.honoured
        total.fallbacks += res.fallbacks
    pods = a.rounds * len(SIZES)
    print(f"total: {pods} pods; calls to the replica that did not bind the previous pod and had "
          "not seen it yet: " + ", ".join(f"{v} {total.unseen[v]}/{total.probed[v]}" for v in VERBS)
          + f"; predictions matched {total.matched}/{total.predicted}; "
          f"directed honoured {total.honoured}/{total.honoured + total.fallbacks}")  # fmt: skip


if __name__ == "__main__":
    main()
