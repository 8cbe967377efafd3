"""A stack of started things that stops in reverse order, whatever fails on the way."""

from __future__ import annotations

import contextlib
from typing import Self


class Stack:
    """An async context manager that runs `_start()`, which registers on `self._stack` how to
    stop each thing it starts: a failure half-way stops what was started, and leaving the
    context stops everything, last started first."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()

    async def _start(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()
