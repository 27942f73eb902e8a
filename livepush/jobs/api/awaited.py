"""The async calls of the jobs API that write, watched for a forgotten `await` inside a job.

A coroutine runs only when awaited: `other_job.aenqueue(1)` written in an async job without
`await` enqueues nothing, and the job ended `succeeded` over a lost job, with at most Python's
"coroutine ... was never awaited" RuntimeWarning at garbage collection. While an async job's
function runs, the runtime sets RUNNING to its ctx and task (runtime/executor.py); each call made
through @awaited in that task hands the coroutine it makes to that ctx, and the run's end fails the
job naming any it never started, as it does a forgotten durable ctx call (runtime/context.py,
JobContext._forgotten). Outside a job a call costs one ContextVar read more.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import Any, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Tracker(Protocol):
    """What RUNNING holds: the running job's ctx (runtime.context.JobContext)."""

    def _track(self, call: Coroutine[Any, Any, Any], shown: str) -> Coroutine[Any, Any, Any]: ...


# The ctx of the async job whose function is running, and the task it runs in, else None. A task
# the job starts inherits it, but what that task makes is its own to await, maybe after the job
# returned: only calls made in the job's own task are the job's.
RUNNING: ContextVar[tuple[Tracker, asyncio.Task[Any] | None] | None] = ContextVar("livepush_running_job",
                                                                                  default=None)

if sys.version_info >= (3, 12):
    iscoroutinefunction = inspect.iscoroutinefunction
    _mark = inspect.markcoroutinefunction
else:
    # Before 3.12 a sync function that returns a coroutine is marked as asyncio (and the frameworks
    # that ask it: Starlette, asgiref) reads it; inspect.iscoroutinefunction() has no such mark.
    iscoroutinefunction = asyncio.iscoroutinefunction

    def _mark(func: Callable[P, T]) -> Callable[P, T]:
        func._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]
        return func


def awaited(shown: str | Callable[[Any], str]) -> Callable[[Callable[P, Coroutine[Any, Any, T]]],
                                                           Callable[P, Coroutine[Any, Any, T]]]:
    """Make an `async def` call of the jobs API that writes watch for a forgotten `await`: called
    in a job, the coroutine it returns is handed to the job's ctx as `shown` (a str, or for a
    method a function of the object it is called on, as `fn.name + ".aenqueue()"`). The call is
    still a coroutine function to asyncio and to the frameworks that ask (a FastAPI background task
    of `some_job.aenqueue` is awaited, not run in a thread and dropped)."""
    def decorate(func: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(func)
        def call(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T]:
            made = func(*args, **kwargs)
            running = RUNNING.get()
            if running is not None and _in_task(running[1]):
                made = running[0]._track(made, shown if isinstance(shown, str) else shown(args[0]))
            return made

        return _mark(call)

    return decorate


def _in_task(task: asyncio.Task[Any] | None) -> bool:
    """Whether the caller runs in `task` (a thread the job handed work to runs in none)."""
    try:
        return asyncio.current_task() is task
    except RuntimeError:  # no loop running in this thread
        return False
