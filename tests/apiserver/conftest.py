"""A sandbox API server per test, driven by the real (sync) kubernetes client in a thread."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from sharepack.sandbox.apiserver.server import FakeApiServer
from tests.apiserver.endpoints import Endpoint


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    srv = FakeApiServer(bookmark_interval=0.1)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
def api(server: FakeApiServer, tmp_short: Path) -> Iterator[client.ApiClient]:
    kubeconfig = server.write_kubeconfig(tmp_short / "kubeconfig")
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture(params=["sandbox", "real"])
async def kube(request: pytest.FixtureRequest, tmp_short: Path) -> AsyncIterator[Endpoint]:
    """The protocol tests' endpoint: each runs on the sandbox API server and on the real
    kube-apiserver (skipped, with the reason, where the real control plane is not built)."""
    if request.param == "sandbox":
        async with FakeApiServer(bookmark_interval=0.1) as srv:
            kubeconfig = srv.write_kubeconfig(tmp_short / "kubeconfig")
            api_client = config.new_client_from_config(config_file=str(kubeconfig))
            try:
                yield Endpoint("sandbox", kubeconfig, api_client, srv)
            finally:
                api_client.close()
        return
    control = request.getfixturevalue("real_control_plane")  # skips, or fails under SHAREPACK_REQUIRE_REAL
    kubeconfig = Path(control.kubeconfig)
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield Endpoint("real", kubeconfig, api_client, control=control)
    finally:
        api_client.close()
