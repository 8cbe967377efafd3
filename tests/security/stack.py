"""The extender as a real process (`python -m sharepack.extender`) serving mutual TLS, against the sandbox
API server, with node states written straight into the API (no agents: these tests are about
who may call the extender and what /bind binds, not about publication).

`tls_exchange` speaks raw TLS from a thread, so a test can tell a refusal in the handshake from
one after it, and see that not one byte of HTTP came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from sharepack.common import state as published
from sharepack.common.policies import MigStrategy, Policy, Sharing
from sharepack.common.state import GpuState, NodeState, ResourceState
from sharepack.sandbox.apiserver import resources as kinds
from sharepack.sandbox.apiserver.server import FakeApiServer
from sharepack.sandbox.controlplane import pki
from sharepack.sandbox.controlplane.certificates import TlsFiles, extender_tls, write_tls_files
from sharepack.sandbox.controlplane.plane import free_port
from sharepack.sandbox.processes import LoggedProcess

SHARED = "nvidia.com/gpu.shared"
WAIT_S = 30.0  # generous: a deadline only bounds a failure


def publish(server: FakeApiServer, node: str, gpus: Sequence[tuple[int, int]]) -> None:
    """A node's agent's write, straight into the store: (replicas, taken) per GPU."""
    state = NodeState(
        datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "0.1.0", Policy.PACKED, MigStrategy.NONE,
        (ResourceState(SHARED, Sharing.TIME_SLICING, False,
                       tuple(GpuState(f"GPU-{node}-{i}", str(i), "T4", t, a, 0) for i, (t, a) in enumerate(gpus))),),
    )  # fmt: skip
    store, rt = server.store, kinds.NODE_GPU_STATES
    if ("", node) not in store.objects[rt]:
        store.create(rt, "", {"apiVersion": f"{published.GROUP}/{published.VERSION}",
                              "kind": published.KIND, "metadata": {"name": node}})  # fmt: skip
    obj = store.get(rt, "", node)
    obj["status"] = published.to_status(state)
    store.update(rt, "", node, obj, "status")


def create_pod(server: FakeApiServer, name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    """A pending pod asking for `replicas` of the shared GPU (none: no GPU at all), as stored."""
    limits = {SHARED: str(replicas)} if replicas else {"cpu": "100m"}
    body = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}], **spec},
    }  # fmt: skip
    pod: dict[str, Any] = server.store.create(kinds.PODS, "default", body)
    return pod


def node_of(server: FakeApiServer, name: str) -> str:
    return str(server.store.get(kinds.PODS, "default", name)["spec"].get("nodeName") or "")


@dataclass
class ExtenderProcess:
    process: LoggedProcess
    url: str  # https, the verbs
    probes_url: str  # plain http, --metrics-listen
    port: int


PORT_TRIES = 3


async def start_extender(root: Path, kubeconfig: Path, tls: TlsFiles, nodes: int, *extra: str) -> ExtenderProcess:
    """An extender on free ports, ready with `nodes` node states cached (`wait_caches`). A port
    found free can be taken before the child binds it (another test's listener): then it starts
    again on fresh ones."""
    for attempt in range(PORT_TRIES):
        port, probes = free_port(), free_port()
        process = LoggedProcess(
            [sys.executable, "-m", "sharepack.extender", f"--listen=127.0.0.1:{port}", f"--metrics-listen=127.0.0.1:{probes}",
             f"--kubeconfig={kubeconfig}", "--log-format=text", *tls.extender_args(), *extra],
            root / f"extender-{port}.log",
        )  # fmt: skip
        await process.start()
        ext = ExtenderProcess(process, f"https://127.0.0.1:{port}", f"http://127.0.0.1:{probes}", port)
        try:
            await wait_caches(ext, nodes)
            return ext
        except BaseException:
            await process.stop()
            if attempt + 1 == PORT_TRIES or "address already in use" not in process.log_tail():
                raise
    raise AssertionError("unreachable")


async def metrics(ext: ExtenderProcess) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(f"{ext.probes_url}/metrics") as resp:
        assert resp.status == 200
        out = {}
        for line in (await resp.text()).splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out


async def ready(ext: ExtenderProcess) -> bool:
    async with aiohttp.ClientSession() as http, http.get(f"{ext.probes_url}/readyz") as resp:
        return resp.status == 200


async def wait_caches(ext: ExtenderProcess, nodes: int) -> None:
    """Ready (both informers listed), and every node's state is in the extender's cache."""
    deadline = time.monotonic() + WAIT_S
    while True:
        assert not ext.process.exited, ext.process.log_tail()
        with contextlib.suppress(aiohttp.ClientError):
            if await ready(ext) and (await metrics(ext)).get("sharepack_extender_cache_nodes") == nodes:
                return
        assert time.monotonic() < deadline, f"the extender did not cache {nodes} nodes:\n{ext.process.log_tail()}"
        await asyncio.sleep(0.05)


@dataclass
class Stack:
    server: FakeApiServer
    root: Path
    kubeconfig: Path
    tls: TlsFiles  # the scheduler's CA, serving and client certificates
    stranger: TlsFiles  # the same, from another CA
    authority: pki.Authority  # the CA of `tls`, to issue more client certificates
    scheduler: aiohttp.ClientSession  # presents the scheduler's client certificate
    extender: ExtenderProcess

    async def post(self, verb: str, body: Any, *, to: ExtenderProcess | None = None) -> Any:
        url = f"{(to or self.extender).url}/{verb}"
        async with self.scheduler.post(url, data=orjson.dumps(body)) as resp:
            assert resp.status == 200, await resp.text()
            return orjson.loads(await resp.read())

    async def bind(self, pod: dict[str, Any], node: str, *, to: ExtenderProcess | None = None) -> str:
        meta = pod["metadata"]
        reply = await self.post("bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                         "PodUID": meta["uid"], "Node": node}, to=to)  # fmt: skip
        return str(reply["Error"])


@contextlib.asynccontextmanager
async def stack(root: Path, nodes: dict[str, Sequence[tuple[int, int]]], *extra: str) -> AsyncIterator[Stack]:
    async with FakeApiServer(bookmark_interval=0.2) as server:
        for name, gpus in nodes.items():
            publish(server, name, gpus)
        kubeconfig = server.write_kubeconfig(root / "kubeconfig")
        authority = pki.Authority(root / "tls", "sharepack-extender-ca")
        tls = extender_tls(authority)
        stranger = write_tls_files(root / "stranger", ca_name="some other CA")
        ext = await start_extender(root, kubeconfig, tls, len(nodes), *extra)
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context())) as session:
                yield Stack(server, root, kubeconfig, tls, stranger, authority, session, ext)
        finally:
            await ext.process.stop()


# --- raw TLS ------------------------------------------------------------------------------------

SERVED = b"served"


@contextlib.asynccontextmanager
async def tls_server(ctx: ssl.SSLContext) -> AsyncIterator[int]:
    """A TLS server on 127.0.0.1 that writes `SERVED` to every client that gets past the
    handshake; yields its port."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SERVED)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=ctx)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()



def client_context(ca: Path, cert: TlsFiles | None, version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client trusting `ca`, presenting `cert`'s client certificate (None: none), at exactly
    `version`."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.minimum_version = ctx.maximum_version = version
    if cert is not None:
        ctx.load_cert_chain(str(cert.client_cert), str(cert.client_key))
    return ctx


def tls_exchange(port: int, ctx: ssl.SSLContext, request: bytes, *, server_hostname: str = "localhost") -> tuple[str, bytes]:
    """Handshake, send `request`, read the reply. Returns ("handshake", b"") when the handshake
    failed, else ("reply", every byte the server sent before closing; b"" when it closed at once
    or the connection ended in a TLS error)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as raw:
        try:
            conn = ctx.wrap_socket(raw, server_hostname=server_hostname)
        except (ssl.SSLError, ConnectionError):
            return "handshake", b""
        with conn:
            received = b""
            try:
                conn.sendall(request)
                while chunk := conn.recv(65536):
                    received += chunk
            except (ssl.SSLError, ConnectionError):
                pass
            return "reply", received


def http_request(path: str, body: bytes = b"") -> bytes:
    method = "POST" if body else "GET"
    return (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip
