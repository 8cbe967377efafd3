"""A sandbox API server per test, driven by the real (sync) kubernetes client in a thread."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from sandbox.apiserver import FakeApiServer


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
