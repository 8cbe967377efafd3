"""`sharepack` (and `kubectl sharepack`, the same program under the plugin's name).

    sharepack status [--watch] [-o json] [--kubeconfig FILE]
    sharepack explain POD [-n NAMESPACE] [--extender-url URL] [-o json]

`status` draws each node's published GPUs (NodeGpuState) with the cluster's totals; `explain`
shows, for one pod, each node's filter verdict and score from the extender.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from sharepack.cli import explain, reading, status
from sharepack.cli.errors import CliError
from sharepack.common import state as gpustate
from sharepack.kube import clients
from sharepack.kube.reflecting import Key, Obj, Reflector

CLEAR = "\x1b[H\x1b[2J"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sharepack", description=__doc__.splitlines()[0] if __doc__ else None)
    kubeconfig_help = "kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)"
    p.add_argument("--kubeconfig", default=None, help=kubeconfig_help)
    # Also after the command (`kubectl sharepack status --kubeconfig F`), without resetting one
    # given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", default=argparse.SUPPRESS, help=kubeconfig_help)
    sub = p.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", parents=[common],
                        help="every node's GPUs as bars, with whole GPUs free, stranded replicas, stale nodes")
    st.add_argument("--watch", "-w", action="store_true", help="redraw on every NodeGpuState change")
    st.add_argument("--output", "-o", choices=["text", "json"], default="text")
    st.add_argument("--stale-after", type=float, default=gpustate.STALE_AFTER_S, metavar="SECONDS",
                    help=f"a state older than this is stale (default {gpustate.STALE_AFTER_S:.0f}, the extender's "
                         "--state-max-age-seconds default); 0: never")  # fmt: skip
    ex = sub.add_parser("explain", parents=[common], help="each node's filter verdict and score for a pod, from the extender")
    ex.add_argument("pod", metavar="POD")
    ex.add_argument("--namespace", "-n", default="default")
    ex.add_argument("--output", "-o", choices=["text", "json"], default="text")
    ex.add_argument("--extender-url", default="", help="the extender's base URL (default: through the API server's "
                    "service proxy to --extender-service in --extender-namespace)")  # fmt: skip
    ex.add_argument("--cert", default="", help="client certificate for an extender that requires one (mTLS): its CN must be one the "
                         "extender admits to /explain (sharepack-explain by default)")
    ex.add_argument("--key", default="", help="the client certificate's key")
    ex.add_argument("--cacert", default="", help="CA of the extender's serving certificate")
    ex.add_argument("--extender-namespace", default="sharepack-system")
    ex.add_argument("--extender-service", default="sharepack-extender")
    opts = p.parse_args(argv)
    if opts.command == "status" and opts.stale_after < 0:
        p.error(f"invalid --stale-after option: {opts.stale_after} (want seconds >= 0)")
    return opts


def _draw_status(nodes: dict[str, reading.PublishedNode], opts: argparse.Namespace, out: TextIO) -> None:
    rows = status.statuses(nodes, time.time(), opts.stale_after)
    if opts.output == "json":
        # One document per line under --watch (JSON lines), so a consumer can read them in turn.
        indent = None if opts.watch else 2
        print(json.dumps(status.to_json(rows, opts.stale_after), indent=indent), file=out, flush=True)
        return
    if opts.watch and out.isatty():
        out.write(CLEAR)
    elif opts.watch:
        out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    out.write(status.render_text(rows))
    out.flush()


# Under --watch the states are listed again this often (redrawing the ages) even when none changes.
REDRAW_S = 30.0


def run_status(api: Any, opts: argparse.Namespace, out: TextIO) -> int:
    if not opts.watch:
        _, nodes = reading.list_states(api)
        _draw_status(nodes, opts, out)
        return 0
    asyncio.run(_watch_status(api, opts, out))
    return 0


async def _watch_status(api: Any, opts: argparse.Namespace, out: TextIO) -> None:
    """The states through the reflector the agent and the extender use: redraw on every list
    and every change."""
    from kubernetes.aio import client as aio

    watch_api = clients.aio_client_like(api)
    try:
        custom = aio.CustomObjectsApi(watch_api)

        def draw(cache: Mapping[Key, Obj]) -> None:
            _draw_status({p.name: p for p in map(reading.published, cache.values()) if p.name}, opts, out)

        reflector = Reflector(
            functools.partial(custom.list_cluster_custom_object_without_preload_content,
                              gpustate.GROUP, gpustate.VERSION, gpustate.PLURAL),
            what="nodegpustates", on_change=draw, resync_s=REDRAW_S, watch_timeout_s=REDRAW_S,
        )  # fmt: skip
        await reflector.run()
    finally:
        await watch_api.close()  # type: ignore[no-untyped-call]


def run_explain(api: Any, opts: argparse.Namespace, out: TextIO) -> int:
    pod = reading.read_pod(api, opts.namespace, opts.pod)
    candidates, ruled_out = explain.by_gpu_model(pod, reading.nodes(api))
    body = explain.explain_body(pod, candidates)
    answer = explain.ask(api, explain.Extender(
        opts.extender_url, opts.extender_namespace, opts.extender_service, opts.cert, opts.key, opts.cacert
    ), body)
    answer = explain.with_pod_facts({**answer, "nodes": [*answer["nodes"], *ruled_out]}, pod)
    if opts.output == "json":
        print(json.dumps(answer, indent=2), file=out)
    else:
        out.write(explain.render_text(answer))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    try:
        api = reading.api_client(opts.kubeconfig)
        try:
            if opts.command == "status":
                return run_status(api, opts, sys.stdout)
            return run_explain(api, opts, sys.stdout)
        finally:
            api.close()
    except CliError as e:
        print(f"sharepack: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): point stdout at /dev/null so the interpreter's final
        # flush does not fail again, and exit as a shell does on SIGPIPE.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
