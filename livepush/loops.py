"""Running a coroutine on an event loop of its own to its end, whatever its tasks do.

asyncio.run() ends by cancelling every task left on its loop and waiting for each, unbounded. A
job that swallows asyncio.CancelledError in a loop never ends, so that wait never did either:
a stopped `livepush jobs` process hung deaf to signals, and so did `jobs.drain()`, though the
job's attempt was already ended and its lease given up. `run()` waits SETTLE_SECONDS for the
tasks left, then closes the loop without those that did not end. The same holds for the calls
the loop's default executor runs (`asyncio.to_thread()`): closing a loop joins its threads, and
one blocked in a call held the process for as long as the call ran.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
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


class _DefaultThreads(concurrent.futures.ThreadPoolExecutor):
    """The default executor of run()'s loop, which counts the calls it holds (queued or running),
    so that the loop can be closed without waiting for one that does not end."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="livepush-loop-thread")
        self._count_lock = threading.Lock()
        self.held = 0
        self._settled: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        with self._count_lock:
            self.held += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._ended()
            raise
        future.add_done_callback(lambda _future: self._ended())  # run, failed or cancelled
        return future

    def _ended(self) -> None:
        with self._count_lock:
            self.held -= 1
            settled = self._settled if self.held == 0 else None
        if settled is not None:
            loop, waiter = settled

            def settle() -> None:
                if not waiter.done():
                    waiter.set_result(None)

            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(settle)

    async def settled(self, timeout: float) -> bool:
        """Whether every call has ended within `timeout` seconds."""
        loop = asyncio.get_running_loop()
        with self._count_lock:
            if self.held == 0:
                return True
            waiter = loop.create_future()
            self._settled = (loop, waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
            return True
        except TimeoutError:
            return False


# The default executors of ended loops whose calls had not ended, for threads_left_running().
_THREADS_LEFT: list[_DefaultThreads] = []


def threads_left_running() -> int:
    """How many calls of run()'s default executors (asyncio.to_thread()) still run after their
    loop was closed without them: a process that exits should leave without joining their threads."""
    return sum(threads.held for threads in _THREADS_LEFT)


def run(coro: Coroutine[Any, Any, T], *, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
        closing: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext) -> T:
    """asyncio.run(coro), but for its last step: a task still running SETTLE_SECONDS after it was
    cancelled is left behind, never to run again (the loop closes under it), and so is a call of
    its default executor still running then (its thread runs on). The loop is closed inside
    `closing()` (the command line holds its stop signals back there)."""
    runner = asyncio.Runner(loop_factory=loop_factory)
    threads = _DefaultThreads()
    runner.get_loop().set_default_executor(threads)
    stuck: set[asyncio.Task[Any]] = set()
    settled = True
    try:
        return runner.run(coro)
    finally:
        try:
            end = time.monotonic() + SETTLE_SECONDS  # one bound for the tasks and the threads
            stuck = runner.run(_cancel_the_rest(SETTLE_SECONDS))
            settled = runner.run(_settle_threads(threads, max(end - time.monotonic(), 0.0)))
        finally:
            with closing():
                if stuck or not settled:
                    _LEFT_BEHIND.extend(asyncio.all_tasks(runner.get_loop()))
                    if not settled:
                        _THREADS_LEFT.append(threads)
                    _close_leaving(runner.get_loop(), join_threads=settled)
                else:
                    runner.close()


async def _settle_threads(threads: _DefaultThreads, bound: float) -> bool:
    """Whether the default executor's calls end within `bound` seconds (a cancelled to_thread()
    leaves its call running); says so when they do not."""
    if await threads.settled(bound):
        return True
    log.warning("%d call(s) in threads of the event loop (asyncio.to_thread) did not end within %g s of the "
                "stop: left running", threads.held, SETTLE_SECONDS)
    return False


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


def _close_leaving(loop: asyncio.AbstractEventLoop, *, join_threads: bool = True) -> None:
    """Close `loop` as asyncio.Runner.close() does, without waiting for the tasks still on it,
    nor, unless `join_threads`, for its default executor's threads (closing it shuts that down
    without a wait)."""

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
        if join_threads:
            loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
