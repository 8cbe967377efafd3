"""Test hygiene for the whole suite: warnings are errors (pyproject), every test has a time
budget (pytest-timeout), and an asyncio test that leaves a task running fails."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
async def _no_leftover_tasks() -> AsyncIterator[None]:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # a sync test: nothing to check
        yield
        return
    before = asyncio.all_tasks(loop)
    yield
    # Give cancelled tasks one turn to finish unwinding before judging.
    await asyncio.sleep(0)
    current = asyncio.current_task()
    leftover = [t for t in asyncio.all_tasks(loop) - before if t is not current and not t.done()]
    if leftover:
        for task in leftover:
            task.cancel()
        pytest.fail(f"test left asyncio tasks running: {[t.get_name() for t in leftover]}")


@pytest.fixture
def tmp_short() -> Iterator[Path]:
    """A temp dir under /tmp: unix socket paths must stay under ~100 characters, which pytest's
    own tmp_path (deep under /tmp/pytest-of-...) can exceed."""
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        yield Path(d)
