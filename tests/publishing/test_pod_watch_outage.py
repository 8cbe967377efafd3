"""The agent's pod watch after a kube-apiserver outage: back before the Director gives up.

The kubelet admits a pod bound after an outage as soon as its own watch is back, and the
Director waits `directing.DEFAULT_WAIT_S` for the agent's pod watch to show it; after that the
node's policy answers and the pod's directions are lost. So the watch must not sit out a long
back-off once the API answers again."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from kubernetes.aio import config as kconfig

from sharepack.agent import directing
from sharepack.agent.publishing import PodIndex
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer

OUTAGE_S = 8.0  # long enough for an uncapped back-off to reach the reflector's 5 s


async def test_a_pod_bound_after_a_long_outage_reaches_the_pod_index_within_the_directors_wait() -> None:
    server = FakeApiServer()
    await server.start()
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        api = await kconfig.new_client_from_config(config_file=str(server.write_kubeconfig(Path(d) / "kc")))
        index = PodIndex(api, "node-0", lambda: None)
        attempts: list[float] = []  # when the reflector asked the API (a list or a watch)
        call = index.reflector._list_call

        def counted(*args: object, **kwargs: object) -> object:
            attempts.append(time.monotonic())
            return call(*args, **kwargs)

        index.reflector._list_call = counted  # type: ignore[assignment]
        task = asyncio.create_task(index.reflector.run())
        try:
            await asyncio.wait_for(index.reflector.synced.wait(), 30)
            await server.pause()  # 503 for every request, watches cut
            down = time.monotonic()
            await asyncio.sleep(OUTAGE_S)
            tried = [t for t in attempts if t >= down] + [time.monotonic()]
            errors = index.reflector.errors
            await server.resume()
            back = time.monotonic()
            server.store.create(kinds.PODS, "default", {
                "metadata": {"name": "bound-after"},
                "spec": {"nodeName": "node-0", "containers": [{"name": "c", "image": "i"}]},
            })  # fmt: skip
            async with asyncio.timeout(30):
                while ("default", "bound-after") not in index.uids:
                    await asyncio.sleep(0.01)
            waited = time.monotonic() - back
        finally:
            task.cancel()
            await asyncio.wait([task])
            await api.close()
            await server.stop()
    assert errors >= 4, f"the outage should have failed several lists, saw {errors}"
    gap = max(b - a for a, b in zip(tried, tried[1:], strict=False))
    assert gap < directing.DEFAULT_WAIT_S, f"the pod watch waited {gap:.1f} s between two tries in the outage"
    assert waited < directing.DEFAULT_WAIT_S, (
        f"the pod index showed the pod {waited:.1f} s after the API came back; the Director waits "
        f"{directing.DEFAULT_WAIT_S} s"
    )
