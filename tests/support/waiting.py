"""Bounded waits on a condition, for tests that cannot await an event directly.

Every wait ends: on timeout it raises AssertionError naming what was awaited and the last value
seen, so a failing test says what did not happen instead of hanging.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _describe(predicate: Callable[..., Any], message: str | None) -> str:
    if message:
        return message
    return getattr(predicate, "__qualname__", None) or repr(predicate)


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 5.0,
    interval: float = 0.02,
    *,
    message: str | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `predicate` until it returns something truthy and return that; at most `timeout` s.

    Exceptions of the types in `ignore` count as "not yet" (e.g. ConnectionRefusedError while a
    server starts); any other exception propagates at once.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    last_exc: BaseException | None = None
    while True:
        try:
            last = predicate()
            last_exc = None
            if last:
                return last
        except ignore as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    seen = f"last error: {last_exc!r}" if last_exc is not None else f"last value: {last!r}"
    raise AssertionError(f"timed out after {timeout:g} s waiting for {_describe(predicate, message)} ({seen})")


async def async_wait_for(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float = 5.0,
    interval: float = 0.02,
    *,
    message: str | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """`wait_for` for async tests: `predicate` may be sync or return an awaitable; never blocks the loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                # The remaining time bounds a single slow call too.
                remaining = max(deadline - loop.time(), 0.001)
                try:
                    value = await asyncio.wait_for(value, remaining)
                except TimeoutError:
                    if loop.time() >= deadline:
                        last_exc = TimeoutError(f"the last call was still running after {remaining:.3g} s")
                        break
                    raise
            last = value
            last_exc = None
            if last:
                return last  # type: ignore[no-any-return]
        except ignore as exc:
            last_exc = exc
        if loop.time() >= deadline:
            break
        await asyncio.sleep(interval)
    seen = f"last error: {last_exc!r}" if last_exc is not None else f"last value: {last!r}"
    raise AssertionError(f"timed out after {timeout:g} s waiting for {_describe(predicate, message)} ({seen})")
