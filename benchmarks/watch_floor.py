"""The extender's watches and nothing else: what receiving them costs before any cache is kept.

    .venv/bin/python benchmarks/watch_floor.py --kubeconfig FILE

Runs the reflectors the extender runs in its shipped mode (every NodeGpuState, every Node, every
pod, pending ones too), with the same client, TLS and decoding (`kube.reflecting`: one orjson
parse per event), but handlers that only count what arrives. `bench_scheduler.py --watch-floor`
runs it beside the extender and reports its CPU per pod in each phase: the part of the
extender's CPU that no work in its handlers or verbs can remove, as long as the watches go
through Python's asyncio TLS and aiohttp. Prints `synced` once every first list is in, then a
line of event counts per kind on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
from typing import Any

from kubernetes import client, config
from kubernetes.aio import client as aio

from sharepack.extender.__main__ import watched_lists
from sharepack.kube import clients
from sharepack.kube.reflecting import Reflector


async def run(kubeconfig: str) -> None:
    conf = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=conf)  # type: ignore[no-untyped-call]
    api = clients.aio_client_like(client.ApiClient(conf))
    custom, core = aio.CustomObjectsApi(api), aio.CoreV1Api(api)
    events: collections.Counter[str] = collections.Counter()

    def count(what: str) -> Any:
        def on_event(kind: str, obj: Any) -> None:
            events[f"{what} {kind}"] += 1

        return on_event

    # What the extender watches, as it watches it (`keep_cache=False`), handlers aside.
    reflectors = [
        Reflector(call, what=what, on_event=count(what), watch_timeout_s=60, keep_cache=False)
        for what, call in watched_lists(custom, core).items()
    ]
    tasks = [asyncio.create_task(r.run()) for r in reflectors]
    await asyncio.wait_for(asyncio.gather(*(r.synced.wait() for r in reflectors)), 120)
    print("synced", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    print("events: " + ", ".join(f"{k} {v}" for k, v in sorted(events.items())), flush=True)
    for task in tasks:
        task.cancel()
    await api.close()  # type: ignore[no-untyped-call]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--kubeconfig", required=True, help="the extender's kubeconfig (its service account)")
    asyncio.run(run(p.parse_args().kubeconfig))


if __name__ == "__main__":
    main()
