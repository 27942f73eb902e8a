"""Background tasks that never die silently.

`supervise(name, body)` runs `body()` as a named task. When it raises anything but a
cancellation, the error is logged once with its traceback, `on_down` is told, and the body
runs again after a capped, jittered backoff. A body that keeps failing quickly (`give_up`
failures in a row, none after a long healthy run) is given up on: the task then ends with
that error, so its owner stops and its process exits with a failure status instead of
limping on or stopping with 0.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("livepush.tasks")
T = TypeVar("T")

# A run this long without failing counts as healthy: the next failure starts a new count.
HEALTHY_RUN = 60.0


class Backoff:
    """Capped, doubling delays with jitter for a loop that retries: many processes that lost
    the same server come back spread out instead of all at once."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high
        self.delay = low
        self._quiet_since = time.monotonic()  # when the loop began retrying, or last said why
        self._said = False

    def time_to_say(self, every: float, at_once: bool = False) -> bool:
        """Whether a loop that keeps failing should say why now: once it has retried for `every`
        seconds (a restart is over well within it), then every `every` seconds; `at_once` for a
        failure that lasts until someone acts (a refused password), the first time."""
        now = time.monotonic()
        if (at_once and not self._said) or now - self._quiet_since >= every:
            self._quiet_since, self._said = now, True
            return True
        return False

    def reset(self) -> None:
        self.delay = self.low

    async def wait(self, wake: asyncio.Event | None = None) -> None:
        """The next delay; over at once when `wake` is set (a sign that retrying now may work)."""
        delay = self.delay * random.uniform(0.5, 1.5)
        self.delay = min(self.delay * 2, self.high)
        if wake is None:
            await asyncio.sleep(delay)
            return
        try:
            await asyncio.wait_for(wake.wait(), delay)
        except TimeoutError:
            pass


async def stop(task: asyncio.Task[object] | None) -> None:
    """Cancel `task` and wait until it has ended; how it ended is its own business (a
    supervised task has logged its failure already)."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass


# Work whose awaiting task was cancelled, still going on: the loop keeps only weak references
# to its tasks.
_CARRIED: set[asyncio.Task[Any]] = set()


async def carried_through(work: Coroutine[Any, Any, T], left: str) -> T:
    """Await `work` (a cancel that runs as several transactions) in a task of its own, which a
    cancel of the awaiting task does not cut off part-way: that task gets its CancelledError at
    once and the work goes on to its end; its failure then is logged, `left` saying what to do.
    A job cancelling a group or a tag it belongs to is told to stop by that very cancel, at its
    next await, which is inside the cancel: the rest of it was never done."""
    task = asyncio.ensure_future(work)
    _CARRIED.add(task)
    task.add_done_callback(_CARRIED.discard)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda t: _said_if_failed(t, left))  # nobody awaits it now
        raise


def _said_if_failed(task: asyncio.Task[Any], left: str) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("%s, whose caller was cancelled, failed part-way (%s)", left, task.exception())


def reraise_if_cancelled() -> None:
    """Drivers may turn a cancellation into their own error (psycopg raises QueryCanceled, a
    psycopg.Error; redis-py can return normally): a loop that goes on after an error must not
    swallow its own task's cancellation."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class GaveUp(Exception):
    """A supervised task failed `give_up` times in a row; the last error is its cause."""


def supervise(
    name: str,
    body: Callable[[], Awaitable[None]],
    *,
    on_down: Callable[[BaseException], None] | None = None,
    on_up: Callable[[], None] | None = None,
    backoff: tuple[float, float] = (0.1, 5.0),
    give_up: int | None = 10,
) -> asyncio.Task[None]:
    """Start `body` under supervision as a task named `name` (see the module docstring)."""

    async def run() -> None:
        retry = Backoff(*backoff)
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await body()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if time.monotonic() - started >= HEALTHY_RUN:
                    failures = 0
                    retry.reset()
                failures += 1
                if give_up is not None and failures >= give_up:
                    log.error("%s failed %d times in a row; giving up", name, failures, exc_info=exc)
                    raise GaveUp(f"{name} failed {failures} times in a row: {type(exc).__name__}: {exc}") from exc
                log.error("%s failed; restarting it in %.2f s", name, retry.delay, exc_info=exc)
                if on_down is not None:
                    on_down(exc)
                await retry.wait()
                if on_up is not None:
                    on_up()

    return asyncio.create_task(run(), name=name)
