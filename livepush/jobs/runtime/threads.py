"""Calling user code in a thread of the runtime's pool: a sync job, a workflow's sync step, a
checkpoint's sync function; and, from such a thread, the runtime's loop (a sync job's blocking ctx
calls). Apart from the executor so that the durable calls use it too."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import queue
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..errors import RuntimeStoppedError

T = TypeVar("T")

# How often a thread waiting for a call on the runtime's loop looks whether that loop still runs.
# A loop that stopped (the runtime closing under a sync job still running in its thread) never
# answers, and the thread would wait for ever.
LOOP_CHECK = 1.0


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


class ThreadEnd:
    """Runs a call in its thread and tells the loop when it ends, should the loop have stopped
    waiting for it first (a sync job past its timeout): then its thread no longer counts as hung."""

    __slots__ = ("_lock", "_ended", "_tell")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = False
        self._tell: Callable[[], None] | None = None

    def run(self, func: Callable[..., Any], *args: Any) -> Any:
        try:
            return stop_caught(func, *args)
        finally:
            with self._lock:
                self._ended = True
                tell = self._tell
            if tell is not None:
                tell()

    def tell(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        """Call `callback` on `loop` once the call has ended (at once if it has)."""
        def from_the_thread() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody to tell
                loop.call_soon_threadsafe(callback)

        with self._lock:
            if not self._ended:
                self._tell = from_the_thread
                return
        callback()


async def call_in_thread(pool: concurrent.futures.Executor | None, func: Callable[..., Any], *args: Any) -> Any:
    """`func(*args)` in a thread of `pool`: what it raises, a StopIteration too, is raised here
    (a workflow's sync step, called with its ctx first; a checkpoint's sync function)."""
    value = await asyncio.get_running_loop().run_in_executor(pool, functools.partial(stop_caught, func, *args))
    if isinstance(value, Raised):
        raise value.exc
    return value


def wait_on_loop(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop, stopped: str) -> T:
    """Run `coro` on the runtime's `loop` and wait for its result in this thread (a sync job's),
    as long as the loop runs: once it stopped, or cancelled the call as it stopped, raise
    RuntimeStoppedError(`stopped`), within LOOP_CHECK of the stop. A call with a timeout of its
    own is looked at as often: that timeout fires on the loop, and a stopped loop fires none."""
    if not loop.is_running():  # stopped or closed already: nothing would ever run the call
        coro.close()  # never to run: no "never awaited" warning later
        raise RuntimeStoppedError(stopped)
    try:
        future = asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # the loop closed since the look above
        coro.close()
        raise RuntimeStoppedError(stopped) from None
    while not concurrent.futures.wait([future], LOOP_CHECK).done:
        if not loop.is_running():
            # Called off on the loop, should it run again (a call that commits behind the job's
            # back must not). Not future.cancel(): on a loop closed meanwhile, its callback fails
            # inside concurrent.futures, which logs that failure with a traceback.
            with contextlib.suppress(RuntimeError):  # closed: nothing will ever run the call
                loop.call_soon_threadsafe(future.cancel)
            raise RuntimeStoppedError(stopped)
    if future.cancelled():  # only the loop's own end cancels a call handed to it from a thread
        raise RuntimeStoppedError(stopped)
    return future.result()


class JobThreads(concurrent.futures.Executor):
    """The threads a runtime runs user code in: up to `max_workers`, reused, started on demand.
    Daemon threads, unlike ThreadPoolExecutor's: a sync job past its timeout, or given back at a
    stop, runs on in its thread with its lease gone, and a process (a drain() in a test session,
    an embedded runtime's program) waited for it at exit, for ever for a call that never returns."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._max_workers = max_workers
        self._name = name
        self._work: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None] = \
            queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by each thread that waits for work
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut = False
        # A pool let go of without a shutdown (a runtime's, replaced once its threads hung: see
        # Runtime._thread_stuck) ends its idle threads; its threads hold no reference to it.
        weakref.finalize(self, self._work.put, None)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._work.put((future, functools.partial(fn, *args, **kwargs)))
            # A thread waiting for work takes it; else a new one, up to the bound (as
            # ThreadPoolExecutor does: beyond it, work waits for a thread to free).
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                thread = threading.Thread(target=_serve, args=(self._work, self._idle),
                                          name=f"{self._name}_{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            if cancel_futures:
                while True:
                    try:
                        item = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def _serve(work: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None],
           idle: threading.Semaphore) -> None:
    """A JobThreads thread: run calls until the pool is shut down or let go of (None)."""
    while True:
        item = work.get()
        if item is None:
            work.put(None)  # wakes the next thread: every one ends
            return
        future, call = item
        if future.set_running_or_notify_cancel():
            try:
                result = call()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
                future.set_exception(exc)
            else:
                future.set_result(result)
        del item, future, call  # not held while idle
        idle.release()
