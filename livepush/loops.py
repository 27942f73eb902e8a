"""Running a coroutine on an event loop of its own to its end, whatever its tasks do.

asyncio.run() ends by cancelling every task left on its loop and waiting for each, unbounded. A
job that swallows asyncio.CancelledError in a loop never ends, so that wait never did either:
a stopped `livepush jobs` process hung deaf to signals, and so did `jobs.drain()`, though the
job's attempt was already ended and its lease given up. `run()` waits SETTLE_SECONDS for the
tasks left, then closes the loop without those that did not end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("livepush")
T = TypeVar("T")

# Once the coroutine has returned, what still runs on its loop (a job given back at the stop, a
# pool's worker) is cancelled and gets this long to end. Cancelled work ends within a few loop
# turns; what is still there after this swallows its cancellation and would never end.
SETTLE_SECONDS = 2.0

# The tasks left behind, held for the life of the process. Collected, each would be closed at
# whatever moment the collector ran, in whatever code ran then: its `finally` blocks meet a
# closed loop, and CPython 3.11 can fail the code being compiled at that moment (an import, a
# test's assertion rewriting) with "AST constructor recursion depth mismatch".
_LEFT_BEHIND: list[asyncio.Task[Any]] = []


def run(coro: Coroutine[Any, Any, T], *, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
        closing: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext) -> T:
    """asyncio.run(coro), but for its last step: a task still running SETTLE_SECONDS after it was
    cancelled is left behind, never to run again (the loop closes under it). The loop is closed
    inside `closing()` (the command line holds its stop signals back there)."""
    runner = asyncio.Runner(loop_factory=loop_factory)
    stuck: set[asyncio.Task[Any]] = set()
    try:
        return runner.run(coro)
    finally:
        try:
            stuck = runner.run(_cancel_the_rest(SETTLE_SECONDS))
        finally:
            with closing():
                if stuck:
                    _LEFT_BEHIND.extend(asyncio.all_tasks(runner.get_loop()))
                    _close_leaving(runner.get_loop())
                else:
                    runner.close()


async def _cancel_the_rest(bound: float) -> set[asyncio.Task[Any]]:
    """Cancel every other task on this loop; the ones that have not ended `bound` seconds later.
    A task that runs on can start others meanwhile (a pool's workers, as it opens one again):
    those are cancelled too, and get what is left of the bound, or a few loop turns past it."""
    me = asyncio.current_task()
    loop = asyncio.get_running_loop()
    end = loop.time() + bound
    seen: set[asyncio.Task[Any]] = set()
    past_bound = False
    while not past_bound:
        new = {t for t in asyncio.all_tasks() if t is not me} - seen
        for task in new:
            task.cancel()
        seen |= new
        pending = {t for t in seen if not t.done()}
        if not new or not pending:
            break
        # One round past the bound at most: a task that starts another every turn never ends.
        past_bound = loop.time() >= end
        await asyncio.wait(pending, timeout=max(end - loop.time(), 0.0))
    stuck = {t for t in asyncio.all_tasks() if t is not me}
    for task in stuck - seen:  # started in the last round
        task.cancel()
    if stuck:
        log.warning("%d task(s) did not end within %g s of being cancelled (%s): leaving them behind",
                    len(stuck), bound, ", ".join(sorted(t.get_name() for t in stuck)))
    return stuck


def _close_leaving(loop: asyncio.AbstractEventLoop) -> None:
    """Close `loop` as asyncio.Runner.close() does, without waiting for the tasks still on it."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # Each stuck task, and any it starts while the loop closes, collected later, would log
        # "Task was destroyed but it is pending!" at ERROR: the warning above has said it
        # already, and that it is harmless.
        task = context.get("task")
        if task is None or task.done():
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
    try:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
