"""Named long-lived tasks, supervised together.

Every long-lived coroutine of the agent (the kubelet watcher, the XID watcher, health recovery,
registrations, publishing; the gRPC servers run inside grpc.aio, not as our tasks) starts
through `Supervisor.spawn`, so that:

* a crash is logged at once, with the task's name, not when someone finally awaits it;
* a task that returns although it was meant to run forever is treated as a failure (a silently
  finished watcher is how a node stops noticing kubelet restarts);
* the owner waits for the *first* failure and stops the rest (`Supervisor.wait`).

Short-lived tasks that are meant to finish (a one-off re-registration) use `expect_return=True`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from sharepack.agent.errors import TaskExited

log = logging.getLogger(__name__)


class Supervisor:
    """A set of named tasks; the first one to fail (or exit unexpectedly) is reported by `wait`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._failed: asyncio.Future[BaseException] | None = None

    def _failure(self) -> asyncio.Future[BaseException]:
        if self._failed is None:
            self._failed = asyncio.get_running_loop().create_future()
        return self._failed

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, task in self._tasks.items() if not task.done())

    def spawn(
        self, name: str, coro: Coroutine[Any, Any, None], *, expect_return: bool = False
    ) -> asyncio.Task[None]:
        if name in self._tasks and not self._tasks[name].done():
            coro.close()
            raise ValueError(f"task name already running in {self.name}: {name}")
        self._failure()  # created now, on the running loop
        # The coroutine runs as the task itself (no wrapper), so a task cancelled before its
        # first step closes the coroutine cleanly; the outcome is judged in a done callback.
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(lambda t: self._judge(name, t, expect_return))
        self._tasks[name] = task
        return task

    def _judge(self, name: str, task: asyncio.Task[None], expect_return: bool) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("task %s crashed: %s", name, exc, exc_info=exc, extra={"task": name})
            self._report(exc)
        elif not expect_return:
            exited = TaskExited(f"task {name}: returned although it should run until stopped")
            log.error("%s", exited, extra={"task": name})
            self._report(exited)

    def _report(self, exc: BaseException) -> None:
        failed = self._failure()
        if not failed.done():
            failed.set_result(exc)

    async def wait(self) -> BaseException:
        """The first failure among the tasks (blocks until one fails). Cancelling a waiter
        leaves the supervisor able to report to others (the shared future is shielded)."""
        return await asyncio.shield(self._failure())

    async def cancel(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            await _cancel_and_wait(task)

    async def stop(self) -> None:
        """Cancel every task and wait until each one has unwound."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            await _settle(task)


async def _cancel_and_wait(task: asyncio.Task[None]) -> None:
    task.cancel()
    await _settle(task)


async def _settle(task: asyncio.Task[None]) -> None:
    # Wait for the task without re-raising its own outcome (already logged by _judge), but let
    # a cancellation of *our* caller propagate.
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # mark retrieved: no "exception was never retrieved" warnings
