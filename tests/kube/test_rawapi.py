"""kube.rawapi: the server, path prefix and credentials of a kubernetes.aio ApiClient, straight
through kube.http1 or through the configured proxy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from kubernetes.aio import client

from sharepack.kube import rawapi
from tests.kube.test_http1 import Scripted


def api_client(host: str, token: str = "one") -> client.ApiClient:
    conf = client.Configuration(host=host)
    conf.api_key = {"BearerToken": token}
    conf.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(conf)


class Server(Scripted):
    """Answers 401 to a request whose token is `refused`, else 200 with the request target."""

    refused = ""

    def __init__(self) -> None:
        super().__init__(self.answer)

    async def answer(self, head: bytes, body: bytes, writer: asyncio.StreamWriter, served: int) -> bool:
        target = head.split(b" ")[1]
        status = 401 if self.refused and f"Bearer {self.refused}".encode() in head else 200
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: {len(target)}\r\n\r\n".encode() + target)
        return True

    def authorizations(self) -> list[str]:
        return [line.split(": ", 1)[1] for h in self.heads for line in h.decode().split("\r\n")
                if line.lower().startswith("authorization:")]  # fmt: skip


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()
    await s.start()
    yield s
    await s.stop()


def port_of(s: Scripted) -> int:
    assert s.server is not None
    return int(s.server.sockets[0].getsockname()[1])


async def test_straight_to_the_server_under_its_path_prefix_with_the_query(server: Server) -> None:
    api = api_client(f"http://127.0.0.1:{port_of(server)}/k8s/clusters/c-1")
    raw = rawapi.RawApi(api)
    try:
        status, body = await raw.request("GET", rawapi.pod_path("ns", "a/b"), query={"resourceVersion": "0"})
        assert (status, body) == (200, b"/k8s/clusters/c-1/api/v1/namespaces/ns/pods/a%2Fb?resourceVersion=0")
        assert server.authorizations() == ["Bearer one"]
        assert "Accept: application/json\r\n" in server.heads[0].decode()
    finally:
        await raw.close()
        await api.close()


async def test_credentials_are_reused_until_their_time_is_up_or_the_server_refuses_them(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = api_client(f"http://127.0.0.1:{port_of(server)}")
    raw = rawapi.RawApi(api)
    try:
        await raw.request("GET", "/a")
        api.configuration.api_key = {"BearerToken": "two"}  # rotated
        await raw.request("GET", "/b")
        assert server.authorizations() == ["Bearer one", "Bearer one"]  # within AUTH_TTL_S
        server.refused = "one"
        assert (await raw.request("GET", "/c"))[0] == 401
        monkeypatch.setattr(rawapi, "AUTH_TTL_S", 0.0)
        assert (await raw.request("GET", "/d"))[0] == 200  # asked again after the 401
        api.configuration.api_key = {"BearerToken": "three"}
        await raw.request("GET", "/e")  # and, their time up, again
        assert server.authorizations() == ["Bearer one"] * 3 + ["Bearer two", "Bearer three"]
    finally:
        await raw.close()
        await api.close()


async def test_through_a_configured_proxy(server: Server) -> None:
    api = api_client("http://apiserver.example:6443")
    api.configuration.proxy = f"http://127.0.0.1:{port_of(server)}"
    raw = rawapi.RawApi(api)
    try:
        status, body = await raw.request("POST", "/api/v1/x", b"{}")
        # A forward proxy is asked for the absolute URL (aiohttp speaks it).
        assert (status, body) == (200, b"http://apiserver.example:6443/api/v1/x")
        assert server.authorizations() == ["Bearer one"]
    finally:
        await raw.close()
        await api.close()


async def test_a_server_url_without_a_host_is_named() -> None:
    api = api_client("unix:///var/run/k8s.sock")
    raw = rawapi.RawApi(api)
    try:
        with pytest.raises(ValueError, match="'unix:///var/run/k8s.sock': not an http"):
            await raw.request("GET", "/a")
    finally:
        await raw.close()
        await api.close()
