"""The executor: runs one claimed job and classifies how it ended.

Async jobs run on the loop, their timeouts kept by the runtime (runtime/deadlines.py): it
cancels a job past its own and marks `ctx._timed_out`. Sync jobs run in the runtime's thread
pool. A sync job cannot be killed: past its timeout the attempt fails and the runtime moves
on, the thread runs to its end, and whatever it returns is fenced off (its lease is gone).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import inspect
import logging
import numbers
from collections.abc import Callable
from typing import Any

from ...errors import ArgumentTypeError
from ...postgres.text import storable_text
from ..api.args import PAST_ONE_MESSAGE, check_sendable, encode
from ..api.awaited import RUNNING
from ..api.functions import default_backoff
from ...types import as_seconds, shown
from ..errors import (
    CheckpointInputConflict,
    ChildFailed,
    DuplicateStepError,
    GroupClosedError,
    GroupLimitError,
    InvalidArgumentsError,
    InvalidResultError,
    JobCancelled,
    MessageTooLarge,
    Parked,
    Reattempt,
    ReplayMismatch,
    RunAbandoned,
    SignalTimeout,
    WorkflowStepWaitError,
    refused_durable_call,
)
from .context import JobContext, SyncJobContext
from .deadlines import effective
from .threads import Raised, ThreadEnd

log = logging.getLogger("livepush.jobs")


@dataclasses.dataclass
class Outcome:
    """How one attempt ended, for the completer to write."""

    ctx: JobContext
    kind: str  # succeeded | retry | fail | cancelled | released
    error: str | None = None
    delay: float = 0.0
    result: str | None = None  # the return value as JSON text, when it succeeded and returned one


# Failures that a retry would meet again, unchanged: the same code returns the same thing, and a
# replay finds the same stored facts (a child's failure, a signal's timeout, a stored input); a
# task group never loses members, so an add past its limit is refused again; and a group never
# opens again once sealed, cancelled or finished, so an add it refused is refused again; and
# livepush refuses the same arguments the same way (an enqueue, a child, a group's add, a fan-out
# batch of ones that are not JSON, too large, or more than the target takes) on every attempt.
NEVER_RETRIED = (CheckpointInputConflict, ChildFailed, DuplicateStepError, GroupClosedError, GroupLimitError,
                 InvalidArgumentsError, InvalidResultError, ReplayMismatch, SignalTimeout, WorkflowStepWaitError)

# A retry is never put off longer than this, whatever a job's own backoff= says (a huge or
# infinite delay would not fit Postgres' interval and fail the completer's whole batch).
MAX_RETRY_DELAY = 366 * 24 * 3600.0


def _error_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - user code: a SystemExit from a __str__ ended the process
        text = "(its message could not be read: str() raised)"
    return storable_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


async def execute(
    fn: Any, ctx: JobContext, pool: concurrent.futures.Executor | None,
    arm: Callable[[Any, JobContext], None] | None = None,
    stuck: Callable[[concurrent.futures.Executor | None], Callable[[], None]] | None = None,
) -> Outcome | None:
    """Run `fn` for `ctx._job` and return its outcome, or None when there is nothing to write: the
    runtime released the job meanwhile (it recorded that), or the job parked (its parking
    transaction wrote that). `arm(fn, ctx)` starts an async job's timeout, just before its
    function runs; `stuck(pool)` is told when a sync job's thread runs on past its timeout, and
    what it returns is called once that thread has ended."""
    job = ctx._job
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    try:
        if job.callback_of is not None:
            await ctx._load_group()  # a group callback: ctx.group shows the finished group
        if fn._is_async:
            # Its timeout is the runtime's: it cancels the task and sets ctx._timed_out, handled below.
            if arm is not None and fn.timeout is not None:
                arm(fn, ctx)
            started = loop.time()
            # The jobs API's async writes it makes (other_job.aenqueue(), ...) are handed to its
            # ctx, which finds one whose `await` it forgot (api/awaited.py); not those of a task it
            # starts, which may await them after it returned.
            running = RUNNING.set((ctx, task))
            try:
                value = await fn.func(ctx, *job.args)
                limit = effective(fn.timeout)
                if limit is not None and loop.time() - started > limit:
                    # A blocking call (time.sleep) held the loop past its timeout, so no cancel
                    # could reach it: it ran past its timeout all the same, and fails by it.
                    ctx._timed_out = True
            finally:
                RUNNING.reset(running)
                # Checkpoints it left running (beside one that raised) store before its outcome.
                durable = ctx._durable_run
                if durable is not None:
                    await durable.settle()
            if ctx._made:  # most jobs make no ctx call: nothing to look at
                ctx._forgotten(fn.name)  # a ctx call whose `await` it forgot never ran
        else:
            sync_ctx = SyncJobContext(ctx, loop)
            # run() catches a StopIteration (stop_caught): it would never complete the future
            # (asyncio refuses it), and the job would stay `running` until its timeout, or for ever.
            thread = ThreadEnd()
            future = loop.run_in_executor(pool, functools.partial(thread.run, fn.func, sync_ctx, *job.args))
            done, _ = await asyncio.wait({future}, timeout=effective(fn.timeout))
            if not done:
                # The thread keeps running; its result is dropped and its lease is gone by then.
                # Its progress too (SyncJobContext.progress): written it would be fenced off, but
                # queued it took the job's place in the completer's progress queue (one per job
                # id), keeping out the progress of the job's next attempt, should this runtime
                # run that meanwhile.
                ctx._timed_out = True
                future.cancel()
                if stuck is not None:
                    thread.tell(loop, stuck(pool))
                log.warning("sync job %s (%s) passed its %g s timeout; its thread runs on, its outcome will be ignored",
                            job.id, fn.name, fn.timeout)
                return timeout_failure(fn, ctx)
            value = future.result()  # raises the job's exception
            if isinstance(value, Raised):
                raise value.exc  # caught below, in this frame (leaving it, it would become a RuntimeError)
        if inspect.iscoroutine(value):
            refuse_coroutine(fn.name, fn._is_async, value)
    except Parked:
        return None
    except RunAbandoned as exc:
        log.warning("job %s (%s): %s", job.id, fn.name, exc)
        return _abandoned(fn, ctx, task)
    except Reattempt as again:
        return Outcome(ctx, "released", delay=min(again.seconds, MAX_RETRY_DELAY))
    except asyncio.CancelledError as exc:
        if ctx._released:
            if task is not None:
                task.uncancel()
            return None
        if ctx._cancel_requested:
            if task is not None:
                task.uncancel()
            return Outcome(ctx, "cancelled", error="cancelled")
        if ctx._timed_out:
            if task is not None:
                task.uncancel()
            return timeout_failure(fn, ctx)
        if task is not None and task.cancelling() == 0:
            # Nobody cancelled this task: the job raised it (it awaited a future something else
            # cancelled, or raised it itself). Let through, the runtime took it for its own
            # cancel and gave the job back with its attempt unspent, to run and do it again for
            # ever: it fails the attempt like any other exception.
            return _failure(fn, ctx, exc)
        raise
    except JobCancelled as exc:
        if ctx._released:
            return None
        return _gave_up(ctx, fn.name, exc)
    except BaseException as exc:  # noqa: BLE001 - any failure of user code fails the attempt
        # SystemExit and KeyboardInterrupt too: raised here they are the job's own (sys.exit() in
        # code it calls; the runtime handles SIGINT itself, and a sync job's come from its
        # thread). Re-raised, they ended the whole process at once: every job in hand lost its
        # attempt to the rescue, and the runtime's row stayed until then.
        if ctx._released:
            return None
        if _run_ended(exc, job.id, fn.name):
            return _abandoned(fn, ctx, task)
        if ctx._timed_out:
            # It turned the timeout's cancel into an error of its own: the attempt still failed
            # by its timeout.
            if task is not None:
                task.uncancel()
            return timeout_failure(fn, ctx)
        if isinstance(exc, BaseExceptionGroup) and exc.split(JobCancelled)[1] is None:
            return _gave_up(ctx, fn.name, first_raised(exc))  # raised in its tasks (an asyncio.TaskGroup)
        if _used_a_coroutine(exc):
            try:
                ctx._forgotten(fn.name, exc)  # a ctx call's coroutine, its `await` forgotten, used as its result
            except InvalidResultError as forgotten:
                return _failure(fn, ctx, forgotten)
        return _failure(fn, ctx, exc)
    if ctx._released:
        return None
    if ctx._cancel_requested and (ctx._told_cancelled or (task is not None and task.cancelling())):
        # It swallowed its cancel (the task's cancellation, or JobCancelled, which a sync job
        # meets at ctx.progress()) and returned: it was cancelled all the same, and what it
        # returned came too late (as a job that swallows it and runs on: _time_out).
        if task is not None and task.cancelling():
            task.uncancel()
        return Outcome(ctx, "cancelled", error="cancelled")
    if ctx._timed_out:
        # It swallowed the timeout's cancel and returned: it still ran past its timeout, and
        # whatever it returned came too late.
        if task is not None:
            task.uncancel()
        return timeout_failure(fn, ctx)
    if value is None:
        return Outcome(ctx, "succeeded")
    try:
        result = encode(value, "result", InvalidResultError, "job results")
        # Alone past one message to Postgres, it could never be written: said now, rather than
        # once the completer encoded it again into each statement it tried (seconds of the loop).
        check_sendable({"result": result})
    except InvalidResultError as exc:
        # A workflow step's job names the step and its output, not the result wrapping it.
        explained = fn._refused_result(value) if fn._refused_result is not None else None
        return _failure(fn, ctx, explained or exc)
    except MessageTooLarge:
        return _failure(fn, ctx, InvalidResultError(result_too_large(PAST_ONE_MESSAGE)))
    return Outcome(ctx, "succeeded", result=result)


def _used_a_coroutine(exc: BaseException) -> bool:
    """Whether `exc` is what Python raises for a coroutine used as a value (`len(rows)`, `for r in
    rows`, `rows["id"]`, `rows.id`): a ctx call whose `await` was forgotten, its result used. Any
    other error, raised while a call made first waits to be awaited (gathered later), is the job's own."""
    return isinstance(exc, (TypeError, AttributeError)) and "'coroutine'" in _error_text(exc)


def result_too_large(said: str) -> str:
    """InvalidResultError's text for a result Postgres cannot take (`said`: which limit)."""
    return (f"the job's result is too large for Postgres to store ({said}): keep large data elsewhere (a table, "
            "a file) and return a reference to it")


def refuse_coroutine(name: str, is_async: bool, value: Any) -> None:
    """Raise InvalidResultError for a coroutine a job function (or a workflow step, `name` saying
    which) returned unrun, saying why it was not run, rather than as a result that is not JSON
    (whose fix, "pass an id", is no fix); close it, so that it does not warn later that it was
    never awaited."""
    value.close()
    if is_async:
        raise InvalidResultError(f"{name} returned a coroutine it did not await: write `return await ...`")
    # Not run, and it cannot be: it was made with the sync ctx.
    raise InvalidResultError(
        f"{name} returned a coroutine without running it: its function is not `async def` (a decorator's "
        "sync wrapper around an async function?), so it ran in a thread as a sync job: make the wrapper "
        "`async def` and await the function it wraps")


def _gave_up(ctx: JobContext, name: str, exc: BaseException) -> Outcome:
    """The outcome of a run that raised JobCancelled: its cancel reaching it, or the job giving up
    on purpose (its work no longer wanted), which ends as a cancelled job does, its error
    `cancelled` as every cancel's; its reason is logged, where an operator looks for why."""
    if not ctx._cancel_requested:
        log.info("job %s (%s) raised JobCancelled itself, and ends cancelled: %s", ctx.job_id, name, _error_text(exc))
    return Outcome(ctx, "cancelled", error="cancelled")


def _abandoned(fn: Any, ctx: JobContext, task: asyncio.Task[Any] | None) -> Outcome | None:
    """The outcome of a run a durable call ended as abandoned: none (its lease is gone, or it
    parked), but for an async job past its timeout that swallowed the cancel and went on: its
    attempt failed by its timeout, and its lease is still held for that failure to be written."""
    if ctx._timed_out and not ctx._released:
        if task is not None:
            task.uncancel()
        return timeout_failure(fn, ctx)
    return None


def _run_ended(exc: BaseException, job_id: int, name: str) -> bool:
    """Whether `exc` is a group (asyncio.TaskGroup wraps what its tasks raised) of nothing but
    parks and lost claims: the run ended as by one of them unwrapped, with nothing to write."""
    if not isinstance(exc, BaseExceptionGroup):
        return False
    ended, rest = exc.split((Parked, RunAbandoned))
    if ended is None or rest is not None:
        return False
    abandoned, _ = ended.split(RunAbandoned)
    if abandoned is not None:
        log.warning("job %s (%s): %s", job_id, name, abandoned.exceptions[0])
    return True


def retry_delay(fn: Any, job_id: int, attempt: int) -> float:
    """Seconds before the retry of a job whose `attempt` failed: its function's backoff=, or the
    default backoff when `fn` is None (a rescuer that does not define the job) or its backoff=
    fails; at most MAX_RETRY_DELAY."""
    if fn is None:
        return min(default_backoff(attempt), MAX_RETRY_DELAY)
    try:
        seconds = as_seconds(fn.backoff(attempt))
        # A str or a bool would pass float(), and a NaN (the one value unequal to itself) would
        # pass max() as no wait at all.
        if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or seconds != seconds:
            raise ArgumentTypeError(f"backoff= returned {shown(seconds, typed=True, width=40)}, "
                                    f"not a number of seconds: return an int, a float or a timedelta")
        # Capped before float(): an int no float holds (10**400) is a wait past the cap, which
        # float() would refuse with a bare OverflowError.
        capped: Any = min(max(0.0, seconds), MAX_RETRY_DELAY)
        return float(capped)
    except Exception as backoff_error:  # noqa: BLE001 - user code: raising here lost the outcome
        # Raised from here, the failure would never be written: the job would stay `running`,
        # held by a live runtime that no longer knows it. It retries on the default backoff.
        log.error("job %s (%s): its backoff= failed for attempt %s (%s); retrying on the default backoff",
                  job_id, fn.name, attempt, backoff_error, exc_info=backoff_error)
        return min(default_backoff(attempt), MAX_RETRY_DELAY)


def timeout_failure(fn: Any, ctx: JobContext) -> Outcome:
    """The attempt failed by passing its function's timeout."""
    return _failure(fn, ctx, TimeoutError(f"timed out after {fn.timeout:g} s"), timed_out=True)


def _never_retried(exc: BaseException, never: tuple[type[BaseException], ...]) -> bool:
    """Whether `exc` is of the `never` retried kinds (ours, and the function's never_retry), or a
    durable ctx call's refusal of its own arguments, which the same code makes again."""
    return isinstance(exc, never) or refused_durable_call(exc)


def _never_retried_in_group(exc: BaseException, never: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first error a retry would meet again (_never_retried) inside an exception group
    (asyncio.TaskGroup wraps what its tasks raised), else None: the retry replays the same tasks
    and meets it again."""
    if not isinstance(exc, BaseExceptionGroup):
        return None
    found = exc.subgroup(lambda e: _never_retried(e, never))
    return None if found is None else first_raised(found)


def first_raised(exc: BaseException) -> BaseException:
    """The first error in `exc` that is not a group: what a task raised inside nested
    asyncio.TaskGroups, each wrapping it in a group of its own (`exc` itself if it is no group)."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _met_its_groups_cancel(exc: BaseException, group_id: int | None) -> bool:
    """Whether `exc` is the refusal of an add to the job's own group because that group was
    cancelled: the cancel reached the member there before its own notice did (cancel_group marks
    the group first, then tells its running members chunk by chunk), so it ends as one told."""
    return (group_id is not None and isinstance(exc, GroupClosedError) and exc.state == "cancelled"
            and exc.group_id == group_id)


def _failure(fn: Any, ctx: JobContext, exc: BaseException, *, timed_out: bool = False) -> Outcome:
    job = ctx._job
    # Recorded as itself, not as the group's "unhandled errors in a TaskGroup", which names nothing.
    never = NEVER_RETRIED + fn.never_retry
    exc = _never_retried_in_group(exc, never) or exc
    error = _error_text(exc)
    if ctx._cancel_requested or _met_its_groups_cancel(exc, job.group_id):
        return Outcome(ctx, "cancelled", error="cancelled")
    if not timed_out and _never_retried(exc, never):
        log.warning("job %s (%s) failed for good (%s): %s", job.id, fn.name,
                    "never_retry" if isinstance(exc, fn.never_retry) else "a retry would fail the same way", error,
                    exc_info=exc)
        return Outcome(ctx, "fail", error=error)
    if job.attempt >= job.max_attempts:
        log.warning("job %s (%s) failed its last attempt (%s of %s): %s", job.id, fn.name, job.attempt,
                    job.max_attempts, error, exc_info=None if timed_out else exc)
        return Outcome(ctx, "fail", error=error)
    delay = retry_delay(fn, job.id, job.attempt)
    log.info("job %s (%s) attempt %s failed, retrying in %.1f s: %s", job.id, fn.name, job.attempt, delay, error,
             exc_info=None if timed_out else exc)
    return Outcome(ctx, "retry", error=error, delay=delay)
