"""Server CPU per request of the extender's transport, apart from the verbs' own work.

    .venv/bin/python benchmarks/bench_transport.py [--requests 2000] [--rounds 2]

A server process serves the extender's TLS port as `sharepack-extender` does (its TLS context,
mutual TLS with the sandbox's ECDSA certificates, ALPN h2 and http/1.1, `extender.http2.AlpnServer`
in front of an aiohttp app), with a handler that returns a fixed filter reply, so what is
measured is the transport: TLS, HTTP parsing and framing, the event loop. A client process sends
the bodies kube-scheduler sends (a filter's `--nodes` node names, 1,000 by default; a bind's names) and reads the
server's CPU from /proc before and after. Per event loop (asyncio, as the extender runs; and
uvloop where it is installed, `pip install uvloop`, for comparison) and way of calling:

* HTTP/1.1, keep-alive: one connection, requests one after another;
* HTTP/1.1, a new connection per request: a full mutual-TLS handshake each, as kube-scheduler's
  client opens when more binds are in flight than the two idle connections it keeps;
* HTTP/2: one connection, one request at a time, and 5 at a time (concurrent binds).

The loops alternate, `--rounds` times, so load elsewhere on the machine hits both alike; the
median of the rounds is printed, then the transport's CPU per pod at `--nodes` nodes for the ways
kube-scheduler can call (1 filter + 0.875 binds per pod, the trace's GPU share; over HTTP/1.1
also `--handshakes-per-pod`, 0.5 as bench_scheduler.py counts them), and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sharepack.extender import http2  # noqa: E402
from sharepack.extender.__main__ import tls_context  # noqa: E402
from sharepack.sandbox.controlplane.certificates import TlsFiles, write_tls_files  # noqa: E402
from tests.extender.h2client import H2Client  # noqa: E402

REPLY = orjson.dumps({"NodeNames": ["node-00001"], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""})

def filter_body(nodes: int) -> bytes:
    return orjson.dumps({"Pod": {}, "Nodes": None, "NodeNames": [f"node-{i:05d}" for i in range(nodes)]})

BIND_BODY = orjson.dumps({"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "node-00001"})
EVENT_LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
try:
    import uvloop

    EVENT_LOOPS["uvloop"] = uvloop.new_event_loop
except ImportError:  # not a dependency: measured against, not adopted (docs/scale.md)
    pass
BINDS_PER_POD = 0.875  # bench_scheduler.py's pod mix: 875 of 1,000 pods have GPUs (CPU-only pods bind themselves)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the server process --------------------------------------------------------------------------


async def _serve(port: int, files: TlsFiles) -> None:
    async def respond(method: str, path: str, body: bytes | None, peercert: object) -> http2.Reply:
        return http2.Reply(200, REPLY)

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=REPLY, content_type="application/json")

    app = web.Application(client_max_size=8 << 20)
    app.router.add_post("/filter", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    http1 = runner.server
    assert http1 is not None
    ctx = tls_context(str(files.server_cert), str(files.server_key), str(files.ca_cert))
    ctx.set_alpn_protocols(list(http2.ALPN_PROTOCOLS))
    await asyncio.get_running_loop().create_server(
        lambda: http2.AlpnServer(http1, respond, 8 << 20), "127.0.0.1", port, ssl=ctx
    )
    await asyncio.Event().wait()


def serve(port: int, loop: str, directory: Path) -> None:
    files = write_tls_files(directory)  # the same files: written once by the parent, reused here
    with asyncio.Runner(loop_factory=EVENT_LOOPS[loop]) as runner:
        runner.run(_serve(port, files))


# --- the client ----------------------------------------------------------------------------------


def client_context(files: TlsFiles, alpn: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(files.ca_cert))
    ctx.check_hostname = False
    ctx.load_cert_chain(str(files.client_cert), str(files.client_key))
    ctx.set_alpn_protocols([alpn])
    return ctx


async def http1(port: int, files: TlsFiles, body: bytes, n: int, pid: int, *, fresh: bool) -> float:
    connector = aiohttp.TCPConnector(ssl=client_context(files, "http/1.1"), force_close=fresh, limit=1)
    url = f"https://127.0.0.1:{port}/filter"
    async with aiohttp.ClientSession(connector=connector) as http:
        for i in range(n + 20):  # 20 to warm up
            if i == 20:
                before = cpu_seconds(pid)
            async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200
                await resp.read()
    return (cpu_seconds(pid) - before) / n


async def h2(port: int, files: TlsFiles, body: bytes, n: int, pid: int, *, concurrent: int) -> float:
    client = await H2Client.connect(port, client_context(files, "h2"))
    try:
        assert client.alpn() == "h2"
        for _ in range(20):
            await client.request("POST", "/filter", body)
        before = cpu_seconds(pid)
        for _ in range(n // concurrent):
            answers = await asyncio.gather(*(client.request("POST", "/filter", body) for _ in range(concurrent)))
            assert all(a.status == 200 for a in answers)
        return (cpu_seconds(pid) - before) / (n // concurrent * concurrent)
    finally:
        await client.close()


WAYS = ("http/1.1 keep-alive", "http/1.1 new connection", "h2", "h2 x5")


async def measure(port: int, files: TlsFiles, pid: int, n: int, nodes: int) -> dict[tuple[str, str], float]:
    out = {}
    for name, body in (("filter", filter_body(nodes)), ("bind", BIND_BODY)):
        out[(name, WAYS[0])] = await http1(port, files, body, n, pid, fresh=False)
        out[(name, WAYS[1])] = await http1(port, files, body, max(n // 5, 50), pid, fresh=True)
        out[(name, WAYS[2])] = await h2(port, files, body, n, pid, concurrent=1)
        out[(name, WAYS[3])] = await h2(port, files, body, n, pid, concurrent=5)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000, help="requests per measurement (a fifth with new connections)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--handshakes-per-pod", type=float, default=0.5)
    p.add_argument("--nodes", type=int, default=1000, help="node names in the filter's body (kube-scheduler sends every candidate)")
    p.add_argument("--serve", nargs=3, metavar=("PORT", "LOOP", "DIR"), help=argparse.SUPPRESS)
    opts = p.parse_args()
    if opts.serve:
        serve(int(opts.serve[0]), opts.serve[1], Path(opts.serve[2]))
        return
    from sharepack.sandbox.controlplane.plane import free_port

    samples: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        files = write_tls_files(Path(d))
        for r in range(opts.rounds):
            for loop in EVENT_LOOPS:
                port = free_port()
                proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port), loop, d])
                try:
                    deadline = time.monotonic() + 30
                    while True:
                        try:
                            asyncio.run(http1(port, files, BIND_BODY, 1, proc.pid, fresh=True))
                            break
                        except (aiohttp.ClientError, OSError):
                            if time.monotonic() > deadline:
                                raise
                            time.sleep(0.2)
                    print(f"round {r + 1}/{opts.rounds}: {loop}", file=sys.stderr, flush=True)
                    for (verb, way), s in asyncio.run(measure(port, files, proc.pid, opts.requests, opts.nodes)).items():
                        samples.setdefault((loop, verb, way), []).append(s)
                finally:
                    proc.kill()
                    proc.wait()
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    print("server CPU per request, ms (median of the rounds):")
    print(f"{'loop':8s} {'verb':7s} " + " ".join(f"{w:>24s}" for w in WAYS))
    for loop in EVENT_LOOPS:
        for verb in ("filter", "bind"):
            print(f"{loop:8s} {verb:7s} " + " ".join(f"{med[(loop, verb, w)]:24.3f}" for w in WAYS))
    print(f"transport CPU per pod at {opts.nodes} nodes (1 filter + {BINDS_PER_POD} binds; "
          f"HTTP/1.1 with {opts.handshakes_per_pod} handshakes per pod):")  # fmt: skip
    per_pod = {}
    for loop in EVENT_LOOPS:
        handshake = med[(loop, "bind", WAYS[1])] - med[(loop, "bind", WAYS[0])]
        per_pod[(loop, "http/1.1")] = (med[(loop, "filter", WAYS[0])] + BINDS_PER_POD * med[(loop, "bind", WAYS[0])]
                                       + opts.handshakes_per_pod * handshake)  # fmt: skip
        per_pod[(loop, "h2")] = med[(loop, "filter", WAYS[2])] + BINDS_PER_POD * med[(loop, "bind", WAYS[3])]
        print(f"  {loop:8s} HTTP/1.1 {per_pod[(loop, 'http/1.1')]:.3f} ms (a handshake {handshake:.3f} ms), "
              f"HTTP/2 {per_pod[(loop, 'h2')]:.3f} ms")  # fmt: skip
    base = per_pod[("asyncio", "http/1.1")]
    if "uvloop" in EVENT_LOOPS:
        print(f"transport per pod: uvloop / asyncio, both HTTP/2 = {per_pod[('uvloop', 'h2')] / per_pod[('asyncio', 'h2')]:.2f}")
    print(f"transport per pod: HTTP/2 (shipped) / HTTP/1.1 = {per_pod[('asyncio', 'h2')] / base:.2f}")


if __name__ == "__main__":
    main()
