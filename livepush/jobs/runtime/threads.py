"""Calling user code in a thread of the runtime's pool: a sync job, a workflow's sync step, a
checkpoint's sync function. Apart from the executor so that the durable calls use it too."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any


class Raised:
    """What user code raised that asyncio cannot carry from its thread to the loop."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def stop_caught(func: Callable[..., Any], *args: Any) -> Any:
    """`func(*args)`, in its thread. A StopIteration it raises (next() on an exhausted iterator)
    comes back as a Raised: an asyncio future refuses it (in a callback, where nobody sees the
    TypeError), so the future never completed and whoever awaited it waited for ever."""
    try:
        return func(*args)
    except StopIteration as exc:
        return Raised(exc)


async def call_in_thread(pool: concurrent.futures.Executor | None, func: Callable[..., Any], *args: Any) -> Any:
    """`func(*args)` in a thread of `pool`: what it raises, a StopIteration too, is raised here
    (a workflow's sync step, called with its ctx first; a checkpoint's sync function)."""
    value = await asyncio.get_running_loop().run_in_executor(pool, functools.partial(stop_caught, func, *args))
    if isinstance(value, Raised):
        raise value.exc
    return value
