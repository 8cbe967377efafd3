"""The supervisor: names tasks, reports the first failure, treats a return as a failure."""

from __future__ import annotations

import asyncio

import pytest

from sharepack.agent.errors import TaskExited
from sharepack.agent.tasks import Supervisor


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_first_crash_is_reported_and_stop_cancels_the_rest() -> None:
    sup = Supervisor("t")

    async def crash() -> None:
        raise RuntimeError("boom")

    sup.spawn("forever", _forever())
    sup.spawn("crash", crash())
    failure = await asyncio.wait_for(sup.wait(), 2)
    assert isinstance(failure, RuntimeError)
    await sup.stop()
    assert sup.names == ()


async def test_an_unexpected_return_is_a_failure() -> None:
    sup = Supervisor("t")

    async def quits() -> None:
        return None

    sup.spawn("quits", quits())
    failure = await asyncio.wait_for(sup.wait(), 2)
    assert isinstance(failure, TaskExited)
    assert "quits" in str(failure)
    await sup.stop()


async def test_an_expected_return_is_fine_and_names_must_be_unique() -> None:
    sup = Supervisor("t")
    done = asyncio.Event()

    async def once() -> None:
        done.set()

    sup.spawn("once", once(), expect_return=True)
    await done.wait()
    sup.spawn("forever", _forever())
    with pytest.raises(ValueError, match="already running"):
        sup.spawn("forever", _forever())
    await sup.stop()
    waiter = asyncio.ensure_future(sup.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    waiter.cancel()
    await asyncio.wait([waiter])
