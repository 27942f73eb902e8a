"""`ctx`: what a running job sees (docs/reference.md#4-python-api): job_id, attempt, progress(), group,
and the durable calls (docs/durable.md): checkpoint(), run_child(), run_children(),
wait_for_signal(), sleep().

`progress()` only records the latest value in memory and returns; the completer writes it, and
rings the job's topic, at most ~10 times a second per job, in batches with other jobs, so a job
may report progress in a tight loop without touching the database each time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import math
import time
from datetime import datetime, timedelta
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from typing import TYPE_CHECKING, Any, Never, Protocol, TypeVar, overload

from ...postgres.text import storable_text
from ...errors import ArgumentTypeError
from ..errors import InvalidProgressError, InvalidResultError, JobCancelled, durable_call_refusal
from ...types import Seconds, as_seconds, is_finite, shown
from ..api.registry import JobRequest
from ..durable.fingerprint import NO_INPUT
from ..events.views import PROGRESS_INTERVAL
from .threads import wait_on_loop

if TYPE_CHECKING:
    from ..durable.run import DurableRun
    from ..groups.context import GroupContext, SyncGroupContext  # imported on first use: it imports the jobs API

T = TypeVar("T")

MAX_MESSAGE = 1000  # characters of a progress message kept


def _number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidProgressError(
            f"ctx.progress() takes a number for {name}, got {shown(value, typed=True, width=80)}")
    try:
        finite = math.isfinite(value)  # an int too large for a float raises here
    except OverflowError:
        finite = False
    if not finite:
        raise InvalidProgressError(
            f"ctx.progress() takes a finite number for {name}, got {shown(value, width=80)}: JSON has no NaN or infinity")


def progress_value(done: Any, total: Any, message: Any) -> dict[str, Any]:
    """ctx.progress()'s arguments as stored. Numbers are checked here, in the job's own call,
    because a NaN or a string reaching Postgres fails the completer's batch; the message becomes
    a str of at most MAX_MESSAGE characters Postgres can store (a NUL in one made the completer's
    whole batch fail, again on every retry)."""
    _number("done", done)
    if total is not None:
        _number("total", total)
    if message is not None:
        message = storable_text(str(message)[:MAX_MESSAGE])
    return {"done": done, "total": total, "message": message}


@dataclasses.dataclass
class ClaimedJob:
    """One claimed row: what the executor needs, plus the lease that fences its outcome."""

    id: int
    name: str
    queue: str
    priority: int
    attempt: int
    max_attempts: int
    lease: int
    args: list[Any]
    run_at: datetime
    group_id: int | None = None  # the group this job is a member of
    callback_of: int | None = None  # the group this job is a callback of
    cancel_requested: bool = False
    version: int = 0  # of its state topic, as the claim left it (its `started` version)
    has_steps: bool = False  # durable steps stored by earlier runs (to replay)
    workflow_id: int | None = None  # the workflow run this job is a step of

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ClaimedJob:
        return cls(
            id=row["id"], name=row["name"], queue=row["queue"], priority=row["priority"],
            attempt=row["attempt"], max_attempts=row["max_attempts"], lease=row["lease"],
            args=row["args"], run_at=row["run_at"], group_id=row["group_id"], callback_of=row["callback_of"],
            cancel_requested=row["cancel_requested"], version=row["version"], has_steps=row["has_steps"],
            workflow_id=row["workflow_id"],
        )


class ProgressSink(Protocol):
    """Where a context hands its progress (the runtime's completer)."""

    def progress(self, ctx: JobContext) -> None: ...


class _Required:
    """The default of an argument a durable call cannot go without: left out, the call refuses it
    as its own mistake and the job fails at once. Python's TypeError was the job's, retried, and
    every retry ran the code between the job's steps again to meet it again."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<required>"  # what help() and inspect.signature() show as its default


LEFT_OUT: Any = _Required()


def _seconds_written(value: Any) -> str:
    """`value` as the seconds of the call the advice writes out, when that call would run (a
    number from 0 up, of at most 128 bits, or a timedelta); else 3600: an int's size ("an int of
    1329 bits"), nan or -5 written there is no call to copy, or one refused again."""
    seconds = as_seconds(value)
    if (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not is_finite(seconds)
            or seconds < 0 or (isinstance(seconds, int) and seconds.bit_length() > 128)):
        return "3600"
    return repr(value)


def _sleep_left_out(name: Any, seconds: Any) -> str:
    if name is LEFT_OUT:
        given = "3600" if seconds is LEFT_OUT else _seconds_written(seconds)
        return f"ctx.sleep() takes a name, then the seconds: ctx.sleep('nap', {given})"
    if isinstance(name, (int, float, timedelta)) and not isinstance(name, bool):
        return (f"ctx.sleep(name, seconds) takes a name first, then the seconds: ctx.sleep('nap', {_seconds_written(name)}) "
                f"for ctx.sleep({shown(name, width=40)})")
    if isinstance(name, str):
        return (f"ctx.sleep({shown(name, width=80)}) takes the seconds to sleep (or a timedelta) after its name: "
                f"ctx.sleep({shown(name, width=80)}, 3600)")
    # Neither a name nor seconds (True, None): the call's form, not advice to keep it as the name.
    return (f"ctx.sleep(name, seconds) takes a name and the seconds to sleep: ctx.sleep('nap', 3600) "
            f"for ctx.sleep({shown(name, width=40)})")


class JobContext:
    """The `ctx` of an async job (sync jobs get a SyncJobContext around one of these).

    `_pool`, `_url`, `_group_progress` and `_threads` are the runtime's (its connection pool, its
    database, its group progress publisher, the threads its sync jobs run in), so what a job does
    through ctx (ctx.group.enqueue, a workflow's sync step) uses them. Its public names are the
    `ctx.` calls the docs describe; the underscored ones are the runtime's state and hooks, which
    the runtime, the completer, task groups and durable calls read and set."""

    _group: GroupContext | None = None  # made on first use (or loaded first, for a callback)
    _durable: DurableRun | None = None  # made on first use

    def __init__(self, job: ClaimedJob, completer: ProgressSink | None, *, pool: Any = None, url: str | None = None,
                 group_progress: Any = None, threads: concurrent.futures.Executor | None = None) -> None:
        self._job = job
        self._completer = completer
        self._pool = pool
        self._threads = threads
        self._url = url
        self._group_progress = group_progress
        self._cancel_requested = job.cancel_requested
        self._released = False  # set by the runtime when it hands the job back (drain)
        self._timed_out = False  # set by the runtime when a job passed its timeout (an async one is cancelled)
        # Set when JobCancelled was raised to the job: one that returns after that swallowed it.
        self._told_cancelled = False
        self._latest: dict[str, Any] | None = None  # newest progress, written or not
        self._dirty = False  # latest not yet written
        self._published = 0  # progress writes so far
        self._next_publish_at = 0.0  # monotonic time before which no new progress is written
        # The runtime's loop, which owns this state: progress reported from a thread the job
        # started is handed to it (none when made outside a loop, as a test may).
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        # The durable calls, ctx.group.enqueue and the jobs API's async writes (api/awaited.py)
        # made on the loop, each with how to name it: one whose `await` was forgotten never runs,
        # and the run's end finds it (_forgotten).
        self._made: list[tuple[Coroutine[Any, Any, Any], str]] = []
        self._made_limit = _MADE_PRUNE

    @property
    def group(self) -> GroupContext | None:
        """The job's task group (jobs.groups.context.GroupContext), or None for a lone job."""
        if self._group is None and (self._job.group_id is not None or self._job.callback_of is not None):
            from ..groups.context import GroupContext

            self._group = GroupContext(self)
        return self._group

    @property
    def _durable_calls(self) -> DurableRun:
        if self._durable is None:
            from ..durable.run import DurableRun

            self._durable = DurableRun(self)
        return self._durable

    def checkpoint(self, name: str, fn: Callable[..., Any], *args: Any,
                   input: Any = NO_INPUT, **keywords: Never) -> Coroutine[Any, Any, Any]:
        """Run `fn(*args)` (sync or async) once for this job, whatever the replays: the first
        success stores its result (JSON), every later run returns that without calling `fn`.
        `input=`: its fingerprint is stored too, and a replay given a different one raises
        CheckpointInputConflict before `fn` runs. Keywords for `fn` are refused (typed Never, so
        that a type checker says so too): pass functools.partial(fn, ...)."""
        return self._track(self._checkpoint(name, fn, *args, input=input, **keywords),
                           f"ctx.checkpoint({shown(name, width=60)})")

    async def _checkpoint(self, name: str, fn: Callable[..., Any], *args: Any, input: Any, **keywords: Any) -> Any:
        return await self._durable_calls.checkpoint(name, fn, *args, input=input, **keywords)

    def run_child(self, request: JobRequest) -> Coroutine[Any, Any, Any]:
        """Run a child job (`some_job.request(*args)`, on this job's queue unless the request names
        one) and return its result. Parks this job until the child has finished; raises ChildFailed
        if it did not succeed."""
        return self._track(self._run_child(request), "ctx.run_child()")

    async def _run_child(self, request: JobRequest) -> Any:
        from ..durable.run import child_asked

        return (await self._durable_calls.run_children([child_asked(request)]))[0]

    def run_children(self, requests: Iterable[JobRequest]) -> Coroutine[Any, Any, list[Any]]:
        """Run child jobs as a task group and return their results, in order. Parks this job until
        every child has finished; raises ChildFailed naming those that did not succeed."""
        return self._track(self._run_children(requests), "ctx.run_children()")

    async def _run_children(self, requests: Iterable[JobRequest]) -> list[Any]:
        return await self._durable_calls.run_children(requests)

    @overload
    def wait_for_signal(self, name: str, timeout: float | None = None) -> Coroutine[Any, Any, Any]: ...
    @overload
    def wait_for_signal(self, name: str, timeout: timedelta) -> Coroutine[Any, Any, Any]: ...

    def wait_for_signal(self, name: Any = LEFT_OUT, timeout: Seconds | None = None) -> Coroutine[Any, Any, Any]:
        """The data of the next signal `name` sent to this job (jobs.signal), parking until one
        comes; raises SignalTimeout after `timeout` seconds (or a timedelta) without one, counted
        from the first time a run reached this wait: that deadline is stored, and a timeout= changed
        since does not move it."""
        if name is LEFT_OUT:
            given = "" if timeout is None else f", timeout={shown(timeout, width=40)}"
            raise durable_call_refusal(ArgumentTypeError(
                f"ctx.wait_for_signal() takes the name of the signal to wait for: ctx.wait_for_signal('approved'{given})"))
        return self._track(self._wait_for_signal(name, timeout), f"ctx.wait_for_signal({shown(name, width=60)})")

    async def _wait_for_signal(self, name: str, timeout: Seconds | None) -> Any:
        return await self._durable_calls.wait_for_signal(name, timeout)

    @overload
    def sleep(self, name: str, seconds: float) -> Coroutine[Any, Any, None]: ...
    @overload
    def sleep(self, name: str, seconds: timedelta) -> Coroutine[Any, Any, None]: ...

    def sleep(self, name: Any = LEFT_OUT, seconds: Seconds = LEFT_OUT) -> Coroutine[Any, Any, None]:
        """A durable sleep: park for `seconds` (or a timedelta; no slot held), then go on. `name` is
        unique in a job."""
        if name is LEFT_OUT or seconds is LEFT_OUT:
            raise durable_call_refusal(ArgumentTypeError(_sleep_left_out(name, seconds)))
        return self._track(self._sleep(name, seconds), f"ctx.sleep({shown(name, width=60)})")

    async def _sleep(self, name: str, seconds: Seconds) -> None:
        await self._durable_calls.sleep(name, seconds)

    def _track(self, call: Coroutine[Any, Any, Any], shown: str) -> Coroutine[Any, Any, Any]:
        """`call`, remembered when made on the runtime's loop (a sync job's thread hands its calls
        to the loop, which awaits them). The list keeps only calls not yet started once it grows,
        pruned at doubling sizes: a job making a million checkpoints holds none it awaited."""
        if self._loop is not None and _on_loop(self._loop):
            if len(self._made) >= self._made_limit:
                self._made = [(c, s) for c, s in self._made if inspect.getcoroutinestate(c) == inspect.CORO_CREATED]
                self._made_limit = max(_MADE_PRUNE, 2 * len(self._made))
            self._made.append((call, shown))
        return call

    def _forgotten(self, name: str, raised: BaseException | None = None) -> None:
        """After an async job's function returned (or raised `raised`): raise InvalidResultError
        naming the calls it made and never awaited (nor handed to a task), each closed so that
        Python does not warn of it later. Such a call never ran: the checkpoint's side effect, the
        child, the member added, the job enqueued or cancelled never happened, and the result the
        job returned stands on them; what it raised came of using the call's coroutine as its
        result (executor._used_a_coroutine)."""
        left = [(c, s) for c, s in self._made if inspect.getcoroutinestate(c) == inspect.CORO_CREATED]
        self._made = []
        if not left:
            return
        # A task not yet started (create_task() of a call, the run ending first) holds its call:
        # it starts, and meets the run's end there, as the durable calls say.
        held = {task.get_coro() for task in asyncio.all_tasks()}
        forgotten = [(c, s) for c, s in left if c not in held]
        if not forgotten:
            return
        for call, _ in forgotten:
            call.close()
        names = list(dict.fromkeys(s for _, s in forgotten))
        shown = ", ".join(names)
        how = (f"returned without awaiting {shown}" if raised is None
               else f"raised {type(raised).__name__} after it called {shown} without `await`")
        if all(s.startswith("ctx.") for s in names):
            why = ("a ctx call of an async job runs only when awaited, so it never ran (nothing was stored, created "
                   "or added); write `await ctx....` before the call")
        else:
            why = ("an async call runs only when awaited, so it never ran (nothing was enqueued, cancelled, sent, "
                   "stored or added); add `await` before the call, or hand it to a task (asyncio.gather, "
                   "asyncio.create_task)")
        raise InvalidResultError(f"{name} {how}: {why}") from raised

    @property
    def _durable_run(self) -> Any:
        """The durable calls of this run (durable.run.DurableRun), or None if it made none."""
        return self._durable

    async def _load_group(self) -> None:
        """Before a group callback runs: load its group's final state into ctx.group."""
        if self._job.callback_of is not None:
            from ..groups.context import load_callback_context

            self._group = await load_callback_context(self)

    @property
    def job_id(self) -> int:
        return self._job.id

    @property
    def attempt(self) -> int:
        return self._job.attempt

    @property
    def name(self) -> str:
        return self._job.name

    @property
    def queue(self) -> str:
        """The queue the job was claimed from: where a child or follow-up of the same kind goes."""
        return self._job.queue

    @property
    def _args(self) -> list[Any]:
        return self._job.args

    @property
    def cancelled(self) -> bool:
        """Whether the job's cancel was requested. Read as True, the job was told, as by the
        JobCancelled of ctx.progress(): one that stops early and returns ends `cancelled`, not
        `succeeded` with what it got done as its result."""
        if self._cancel_requested:
            self._told_cancelled = True
        return self._cancel_requested

    def _check_cancelled(self) -> None:
        if self._cancel_requested:
            self._told_cancelled = True
            raise JobCancelled(f"job {self._job.id} was cancelled")

    def _record_progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """The non-blocking core of progress(): remember the latest value, mark it dirty."""
        self._check_cancelled()
        self._record(progress_value(done, total, message))

    def _record(self, value: dict[str, Any]) -> None:
        if self._released:
            # Given back, or ended without its task (an async job deaf to its cancels, which runs
            # on): its lease is gone. Queued, it took the job's place in the completer's progress
            # queue (one per job id), keeping out the progress of the job's next attempt, should
            # this runtime run that meanwhile.
            return
        # Stored with its attempt: the row keeps it after the attempt ends (`retrying` shows how
        # far it got), and the view hides it from the next attempt (events.views.job_view).
        self._latest = {**value, "attempt": self._job.attempt}
        self._dirty = True
        if self._completer is not None:
            self._completer.progress(self)

    def _record_progress_quiet(self, value: dict[str, Any]) -> None:
        """_record_progress() for a value a sync job's thread checked (progress_value)."""
        # Cancelled: the thread raises JobCancelled on its next call. Timed out: its lease is gone.
        if not self._cancel_requested and not self._timed_out:
            self._record(value)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> Awaitable[None]:
        """Report progress: `done` of `total`, with an optional message. Raises JobCancelled once
        the job's cancel was requested. Cheap: no database round trip. Recorded at the call; what
        it returns is to be awaited (a cancellation point), but nothing is lost if it is not."""
        if self._loop is not None and not _on_loop(self._loop):
            hand_progress_over(self, self._loop, done, total, message)  # a thread the job started
        else:
            self._record_progress(done, total, message)
        return _ONE_LOOP_TURN

    def _mark_published(self) -> None:
        self._published += 1
        self._next_publish_at = time.monotonic() + PROGRESS_INTERVAL


# The number of calls a context remembers before it first drops those already started.
_MADE_PRUNE = 64


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def hand_progress_over(ctx: JobContext, loop: asyncio.AbstractEventLoop, done: float, total: float | None,
                       message: str | None) -> None:
    """Progress reported in a thread other than the loop's (a sync job's, or one an async job
    started): checked there, where a bad value or a cancel is raised, then recorded on the loop,
    which owns the context's state (asyncio's objects are not thread-safe)."""
    ctx._check_cancelled()
    if ctx._released or ctx._timed_out:
        return  # given back, or failed by its timeout: this attempt's lease is gone
    value = progress_value(done, total, message)
    loop.call_soon_threadsafe(ctx._record_progress_quiet, value)


class _OneLoopTurn:
    """What an async job's ctx.progress() returns: awaited, it gives the loop one turn, as
    asyncio.sleep(0) does (a cancellation point, and fair to other jobs in a tight loop). Not a
    coroutine: as one, a call whose `await` was forgotten never ran, and its progress was lost."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield  # a bare yield: the task runs again at the loop's next turn


_ONE_LOOP_TURN = _OneLoopTurn()


class SyncJobContext:
    """`ctx` of a sync job, running in a worker thread: the same names, blocking calls."""

    def __init__(self, inner: JobContext, loop: asyncio.AbstractEventLoop) -> None:
        self._inner = inner
        self._loop = loop

    @property
    def group(self) -> SyncGroupContext | None:
        """The job's task group (blocking calls), or None for a lone job."""
        inner = self._inner.group
        if inner is None:
            return None
        from ..groups.context import SyncGroupContext

        return SyncGroupContext(inner, self._loop)

    @property
    def job_id(self) -> int:
        return self._inner.job_id

    @property
    def attempt(self) -> int:
        return self._inner.attempt

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def queue(self) -> str:
        return self._inner.queue

    @property
    def cancelled(self) -> bool:
        return self._inner.cancelled

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one of the job context's coroutines on the runtime's loop and wait for it here, as
        long as that loop runs (RuntimeStoppedError once it stopped)."""
        return wait_on_loop(coro, self._loop, f"job {self._inner.job_id}'s ctx call got no answer: the job runtime's "
                            "event loop stopped while it waited (the runtime shut down under this sync job). This "
                            "run ends here; the job was given back or will be rescued, and runs again as its "
                            "retries allow")

    def checkpoint(self, name: str, fn: Callable[..., Any], *args: Any, input: Any = NO_INPUT,
                   **keywords: Never) -> Any:
        """JobContext.checkpoint, blocking; `fn` runs in this thread (an async `fn` on the loop)."""
        from ..durable.run import check_callable

        check_callable(name, fn, keywords)
        durable = self._inner._durable_calls
        found, value, fingerprint = self._call(durable.lookup(name, input))
        if found:
            return value
        self._call(durable.sync_body_may_start())
        try:
            result = fn(*args)
            if inspect.iscoroutine(result):  # an async fn, or a sync one that returned a coroutine
                result = self._call(result)
        except BaseException:
            durable.unstored("checkpoint", name)
            raise
        return self._call(durable.store(name, result, fingerprint))

    def run_child(self, request: JobRequest) -> Any:
        return self._call(self._inner.run_child(request))

    def run_children(self, requests: Iterable[JobRequest]) -> list[Any]:
        from ..durable.run import children_asked

        return self._call(self._inner.run_children(children_asked(requests)))

    @overload
    def wait_for_signal(self, name: str, timeout: float | None = None) -> Any: ...
    @overload
    def wait_for_signal(self, name: str, timeout: timedelta) -> Any: ...

    def wait_for_signal(self, name: Any = LEFT_OUT, timeout: Seconds | None = None) -> Any:
        return self._call(self._inner.wait_for_signal(name, timeout))

    @overload
    def sleep(self, name: str, seconds: float) -> None: ...
    @overload
    def sleep(self, name: str, seconds: timedelta) -> None: ...

    def sleep(self, name: Any = LEFT_OUT, seconds: Seconds = LEFT_OUT) -> None:
        self._call(self._inner.sleep(name, seconds))

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report progress (see JobContext.progress). Raises JobCancelled once cancelled."""
        hand_progress_over(self._inner, self._loop, done, total, message)
