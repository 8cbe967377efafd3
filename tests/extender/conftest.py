"""A sandbox API server for the extender's tests that run the real Service against it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sharepack.sandbox.apiserver.server import FakeApiServer


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    srv = FakeApiServer(bookmark_interval=0.2)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()
