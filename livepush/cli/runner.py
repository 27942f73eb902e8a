"""How a long-running command runs: its coroutine on uvloop where available, once per process
(after it, the process only exits)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any

from .. import stopsignals

log = logging.getLogger("livepush")

# Once the command's coroutine has returned, what still runs on its loop (a job given back at the
# stop, a pool's worker) is cancelled and gets this long to end. Cancelled work ends within a few
# loop turns; what is still there after this swallows its cancellation and would never end.
SETTLE_SECONDS = 2.0


def run_async(coro: Coroutine[Any, Any, int]) -> int:
    _open_standard_descriptors()
    return _run(coro)


def _run(coro: Coroutine[Any, Any, int]) -> int:
    """asyncio.run(), but for its last step: asyncio.run() cancels every task left and waits for
    each to end, unbounded. A job that swallows asyncio.CancelledError in a loop would then hold
    the stopped process forever, deaf to signals, though its lease was given back: here such a
    task is left behind after SETTLE_SECONDS, never to run again (the loop closes under it)."""
    runner = asyncio.Runner(loop_factory=_loop_factory())
    stuck: set[asyncio.Task[Any]] = set()
    try:
        return runner.run(coro)
    finally:
        try:
            stuck = runner.run(_cancel_the_rest(SETTLE_SECONDS))
        finally:
            # Closing the loop takes its signal handlers off. After it the process only exits,
            # so a stop signal then (Ctrl-C twice) is ignored, not left to kill by default.
            with stopsignals.held_then_ignored():
                if stuck:
                    _close_leaving(runner.get_loop(), stuck)
                else:
                    runner.close()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _cancel_the_rest(bound: float) -> set[asyncio.Task[Any]]:
    """Cancel every other task on this loop; the ones that have not ended `bound` seconds later."""
    me = asyncio.current_task()
    rest = {t for t in asyncio.all_tasks() if t is not me}
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=bound)
    stuck = {t for t in rest if not t.done()}
    if stuck:
        log.warning("%d task(s) did not end within %g s of being cancelled (%s): exiting without them",
                    len(stuck), bound, ", ".join(sorted(t.get_name() for t in stuck)))
    return stuck


def _close_leaving(loop: asyncio.AbstractEventLoop, stuck: set[asyncio.Task[Any]]) -> None:
    """Close `loop` as asyncio.Runner.close() does, without waiting for the `stuck` tasks."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # Each stuck task, collected at exit, would log "Task was destroyed but it is pending!" at
        # ERROR: the warning above has said it already, and that it is harmless.
        if context.get("task") not in stuck:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
    try:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def _open_standard_descriptors() -> None:
    """Point any of descriptors 0, 1 and 2 that is closed (`livepush serve <&-`) at /dev/null.

    Otherwise the next socket opened takes it, and uvloop aborts the whole process (SIGABRT) when
    it closes a descriptor that low, which is at the stop at the latest."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)  # the lowest free number: `fd` itself
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
